package sandboxtest

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func (s *suite) execClauses() []clause {
	return []clause{
		{"ExitCode", s.testExecExitCode},
		{"Signal", s.testExecSignal},
		{"NotFound", s.testExecNotFound},
		{"NotExecutable", s.testExecNotExecutable},
		{"BadTimeout", s.testExecBadTimeout},
		{"EmptyArgv", s.testExecEmptyArgv},
		{"Timeout", s.testExecTimeout},
		{"TimeoutHeldOutput", s.testExecTimeoutHeld},
		{"Env", s.testExecEnv},
		{"SecretsNotInErrors", s.testExecSecretsNotInErrors},
		{"SecretsNotInLogs", s.testExecSecretsNotInLogs},
		{"Cwd", s.testExecCwd},
		{"Stdin", s.testExecStdin},
		{"NilStdin", s.testExecNilStdin},
		{"LeftoverChild", s.testExecLeftoverChild},
		{"OutputLimit", s.testExecOutputLimit},
		{"Concurrent", s.testExecConcurrent},
	}
}

// A non-zero exit is a result, not an error; stdout and stderr are kept
// apart.
func (s *suite) testExecExitCode(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	res := run(t, ctx, sess, sandbox.ExecOptions{}, shArgv("printf out; printf err >&2; exit 3")...)
	if want := (sandbox.ExecResult{ExitCode: 3, Stdout: "out", Stderr: "err"}); res != want {
		t.Errorf("Exec(sh -c 'printf out; printf err >&2; exit 3') = %+v; want %+v (a non-zero exit is a result, not an error)", res, want)
	}
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, "true"); res != (sandbox.ExecResult{}) {
		t.Errorf("Exec(true) = %+v; want exit code 0 and no output", res)
	}
}

// A command killed by a signal reports 128+signal.
func (s *suite) testExecSignal(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, shArgv("kill -9 $$")...); res.ExitCode != 137 {
		t.Errorf("Exec(sh -c 'kill -9 $$').ExitCode = %d; want 137 (128+SIGKILL, as a shell reports)", res.ExitCode)
	}
}

// A command that cannot be found is exit code 127 with the reason on stderr,
// not an error.
func (s *suite) testExecNotFound(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, name := range []string{"tai42-no-such-command", "/tai42-no-such-dir/tai42-no-such-command"} {
		res, err := sess.Exec(ctx, []string{name}, sandbox.ExecOptions{Timeout: execTimeout})
		switch {
		case err != nil:
			t.Errorf("Exec(%q): %v; a missing command is a result (exit code 127), not an error", name, err)
		case res.ExitCode != 127:
			t.Errorf("Exec(%q).ExitCode = %d; want 127 for a command that cannot be found", name, res.ExitCode)
		case res.Stderr == "":
			t.Errorf("Exec(%q) has an empty stderr; want the reason the command was not found there", name)
		}
	}
}

// A command that exists but cannot be executed is exit code 126.
func (s *suite) testExecNotExecutable(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustSh(t, ctx, sess, `printf '#!/bin/sh\necho ran\n' > noexec && chmod 644 noexec`)
	p := path.Join(sess.WorkspacePath(), "noexec")
	res, err := sess.Exec(ctx, []string{p}, sandbox.ExecOptions{Timeout: execTimeout})
	switch {
	case err != nil:
		t.Errorf("Exec(%q) of a non-executable file: %v; want a result with exit code 126, not an error", p, err)
	case res.ExitCode != 126:
		t.Errorf("Exec(%q) of a non-executable file: exit code %d; want 126", p, res.ExitCode)
	case res.Stderr == "":
		t.Errorf("Exec(%q) of a non-executable file has an empty stderr; want the reason there", p)
	}
}

// A timeout of 0 or less is refused, never taken as "no timeout", by Exec and
// ExecStart alike.
func (s *suite) testExecBadTimeout(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: d})
		wantBadArg(t, err, "Exec with Timeout "+d.String())
		h, err := sess.ExecStart(ctx, []string{"true"}, sandbox.StartOptions{Timeout: d})
		wantBadArg(t, err, "ExecStart with Timeout "+d.String())
		if h != nil {
			_ = h.Kill(ctx)
		}
	}
}

// An empty argv is refused by Exec and ExecStart.
func (s *suite) testExecEmptyArgv(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, argv := range [][]string{nil, {}} {
		_, err := sess.Exec(ctx, argv, sandbox.ExecOptions{Timeout: execTimeout})
		wantBadArg(t, err, "Exec with an empty argv")
		h, err := sess.ExecStart(ctx, argv, sandbox.StartOptions{Timeout: execTimeout})
		wantBadArg(t, err, "ExecStart with an empty argv")
		if h != nil {
			_ = h.Kill(ctx)
		}
	}
}

// wantBadArg fails unless err refuses a bad argument: a *SandboxError that
// is no timeout.
func wantBadArg(t *testing.T, err error, what string) {
	t.Helper()
	if wantKind(t, err, sandbox.ErrSandbox, what) && errors.Is(err, sandbox.ErrExecTimeout) {
		t.Errorf("%s: got an ExecTimeoutError %q; want the argument refused before anything runs", what, err)
	}
}

// On timeout the exec is killed and an *ExecTimeoutError carries the exact
// lengths of the output produced, never its content.
func (s *suite) testExecTimeout(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	secret := secretValue("timeout")
	const timeout = time.Second
	begin := time.Now()
	_, err := sess.Exec(ctx, shArgv(`printf %s "$TAI42_OUT"; printf de >&2; sleep 30`), sandbox.ExecOptions{
		Env:     map[string]sandbox.Secret{"TAI42_OUT": sandbox.NewSecret(secret)},
		Timeout: timeout,
	})
	if took := time.Since(begin); took > timeout+prompt {
		t.Errorf("Exec with Timeout %v returned after %v; on expiry the exec is killed and Exec returns promptly", timeout, took)
	}
	wantTimeout(t, err, timeout, len(secret), 2, "Exec(sh -c 'printf <secret>; printf de >&2; sleep 30')")
	noSecret(t, "the ExecTimeoutError", err, secret)
}

// A timeout whose output a process outside the exec's process group (setsid)
// still holds after the kill says so in its Note, and counts the output
// received up to the stop; a provider that ends that process too owes no
// note.
func (s *suite) testExecTimeoutHeld(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, shArgv("command -v setsid")...); res.ExitCode != 0 {
		t.Skip("the session has no setsid to start a process outside the exec's process group")
	}
	const timeout = time.Second
	_, err := sess.Exec(ctx, shArgv(`setsid sleep 30 & echo $! > held.pid; printf x; sleep 30`), sandbox.ExecOptions{Timeout: timeout})
	pid := ""
	if b, gerr := sess.GetFile(ctx, "held.pid"); gerr == nil {
		pid = strings.TrimSpace(string(b))
	}
	if _, aerr := strconv.Atoi(pid); aerr != nil {
		t.Fatalf("held.pid holds %q; want the pid of the process started with setsid", pid)
	}
	held := alive(t, ctx, sess, pid)
	t.Cleanup(func() {
		ctx, cancel := cleanupContext()
		defer cancel()
		_, _ = sess.Exec(ctx, []string{"kill", "-9", pid}, sandbox.ExecOptions{Timeout: execTimeout})
	})
	const what = "Exec(sh -c 'setsid sleep 30 & printf x; sleep 30') past its timeout"
	if !wantKind(t, err, sandbox.ErrExecTimeout, what) {
		return
	}
	var te *sandbox.ExecTimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("%s: %q does not convert to *sandbox.ExecTimeoutError", what, err)
	}
	if te.StdoutLen != 1 || te.StderrLen != 0 {
		t.Errorf("%s: lengths stdout %d, stderr %d; want 1 and 0, the output received", what, te.StdoutLen, te.StderrLen)
	}
	if held && te.Note == "" {
		t.Errorf("%s: the process %s started with setsid still runs, holding the output, and the ExecTimeoutError %q has no Note; when a process the command started holds the output after the kill, the note says so", what, pid, err)
	}
}

// wantTimeout fails unless err is an *ExecTimeoutError with these fields.
func wantTimeout(t *testing.T, err error, timeout time.Duration, stdoutLen, stderrLen int, what string) {
	t.Helper()
	if !wantKind(t, err, sandbox.ErrExecTimeout, what) {
		return
	}
	var te *sandbox.ExecTimeoutError
	if !errors.As(err, &te) {
		t.Errorf("%s: %q does not convert to *sandbox.ExecTimeoutError", what, err)
		return
	}
	if te.Timeout != timeout {
		t.Errorf("%s: ExecTimeoutError.Timeout = %v; want %v", what, te.Timeout, timeout)
	}
	if te.StdoutLen != int64(stdoutLen) || te.StderrLen != int64(stderrLen) {
		t.Errorf("%s: ExecTimeoutError lengths stdout %d, stderr %d; want %d and %d, every byte the exec produced", what, te.StdoutLen, te.StderrLen, stdoutLen, stderrLen)
	}
}

// The exec's env overlays the session's (the exec wins), values arrive
// byte-exact, and nothing of the host's environment leaks in.
func (s *suite) testExecEnv(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, func(sp *sandbox.SessionSpec) {
		sp.Env = sandbox.SecretEnv(map[string]string{"TAI42_A": "spec-a", "TAI42_B": "spec-b"})
	})
	tricky := "x y\n'\"$HOME\\ *"
	res := run(t, ctx, sess, sandbox.ExecOptions{Env: sandbox.SecretEnv(map[string]string{"TAI42_B": "exec-b", "TAI42_C": "exec-c", "TAI42_D": tricky})},
		shArgv(`printf '%s|%s|%s|%s' "$TAI42_A" "$TAI42_B" "$TAI42_C" "$TAI42_D"`)...)
	if want := "spec-a|exec-b|exec-c|" + tricky; res.Stdout != want {
		t.Errorf("A|B|C|D = %q; want %q (spec env overlaid by exec env, the exec's value winning on collision)", res.Stdout, want)
	}
	res = run(t, ctx, sess, sandbox.ExecOptions{}, shArgv(`printf '%s|%s|%s' "$TAI42_A" "$TAI42_B" "$TAI42_C"`)...)
	if want := "spec-a|spec-b|"; res.Stdout != want {
		t.Errorf("A|B|C in a later exec without env = %q; want %q (an exec's env is its own)", res.Stdout, want)
	}
	res = run(t, ctx, sess, sandbox.ExecOptions{}, "env")
	for line := range strings.Lines(res.Stdout) {
		if strings.HasPrefix(line, markerVar+"=") {
			t.Errorf("the exec's environment holds %s, set in the test process only; an exec's environment is minimal and never inherits the host's", markerVar)
		}
	}
}

// Env values never appear in an error, whatever fails.
func (s *suite) testExecSecretsNotInErrors(t *testing.T) {
	ctx := s.testContext(t)
	specSecret, execSecret := secretValue("spec"), secretValue("exec")
	sb, sess := s.fresh(t, func(sp *sandbox.SessionSpec) {
		sp.Env = map[string]sandbox.Secret{"TAI42_S": sandbox.NewSecret(specSecret)}
	})
	env := map[string]sandbox.Secret{"TAI42_E": sandbox.NewSecret(execSecret)}
	_, err := sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Env: env, Cwd: "../..", Timeout: execTimeout})
	wantKind(t, err, sandbox.ErrSandbox, "Exec with a cwd climbing out")
	noSecret(t, "the error of an Exec with a refused cwd", err, specSecret, execSecret)
	// A cwd that is refused only once the provider looks: the error is
	// the provider's own, made with the environment at hand.
	mustPut(t, ctx, sess, "file", []byte("x"))
	for _, cwd := range []string{"no-such-dir", "file"} {
		_, err = sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Env: env, Cwd: cwd, Timeout: execTimeout})
		wantKind(t, err, sandbox.ErrSandbox, "Exec with the cwd "+cwd)
		noSecret(t, "the error of an Exec with the cwd "+cwd, err, specSecret, execSecret)
		_, err = sess.ExecStart(ctx, []string{"true"}, sandbox.StartOptions{Env: env, Cwd: cwd, Timeout: execTimeout})
		wantKind(t, err, sandbox.ErrSandbox, "ExecStart with the cwd "+cwd)
		noSecret(t, "the error of an ExecStart with the cwd "+cwd, err, specSecret, execSecret)
	}
	_, err = sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Env: env})
	wantKind(t, err, sandbox.ErrSandbox, "Exec with no Timeout")
	noSecret(t, "the error of an Exec without a timeout", err, specSecret, execSecret)
	_, err = sess.Exec(ctx, shArgv(`printf %s "$TAI42_S$TAI42_E" >&2; sleep 30`), sandbox.ExecOptions{Env: env, Timeout: 500 * time.Millisecond})
	wantKind(t, err, sandbox.ErrExecTimeout, "Exec past its timeout")
	noSecret(t, "the ExecTimeoutError", err, specSecret, execSecret)

	bad := secretValue("badkey")
	_, err = sb.CreateSession(ctx, s.spec(func(sp *sandbox.SessionSpec) {
		sp.Env = map[string]sandbox.Secret{"TAI42=BAD": sandbox.NewSecret(bad)}
	}))
	wantKind(t, err, sandbox.ErrSpecRejected, "CreateSession with an env key holding '='")
	noSecret(t, "the SpecRejectedError of a bad env key", err, bad)

	info, err := sess.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	noSecret(t, "Info", info, specSecret)
	list, err := sb.ListSessions(ctx)
	if err != nil {
		t.Fatalf("ListSessions: %v", err)
	}
	noSecret(t, "ListSessions", list, specSecret)
}

// Env values never reach a log line, at any level: through create, execs
// that print them, fail, time out or are killed, a rejected spec, a
// destroy and the reaper, the provider logs through Config.Logger and no
// line holds a secret.
func (s *suite) testExecSecretsNotInLogs(t *testing.T) {
	if !s.opts.Logs {
		t.Skip("Options.Logs is false: the factory does not pass Config.Logger to the provider")
	}
	ctx := s.testContext(t)
	specSecret, execSecret, bad := secretValue("spec"), secretValue("exec"), secretValue("badkey")
	secrets := []string{specSecret, execSecret, bad}
	sb := s.newSandbox(t, Config{Policy: permissive, ReapInterval: 100 * time.Millisecond})
	withSecret := func(sp *sandbox.SessionSpec) {
		sp.Env = map[string]sandbox.Secret{"TAI42_S": sandbox.NewSecret(specSecret)}
	}
	sess := s.newSession(t, sb, withSecret)
	expiring := s.newSession(t, sb, func(sp *sandbox.SessionSpec) { withSecret(sp); sp.TTLSeconds = 1 })
	// Read now: by the time the calls below are done (a loaded machine),
	// it may have expired already.
	expInfo, err := expiring.Info(ctx)
	if err != nil {
		t.Fatalf("Info of a session just made: %v", err)
	}
	env := map[string]sandbox.Secret{"TAI42_E": sandbox.NewSecret(execSecret)}
	both := `printf '%s %s' "$TAI42_S" "$TAI42_E"; printf '%s %s' "$TAI42_S" "$TAI42_E" >&2`
	run(t, ctx, sess, sandbox.ExecOptions{Env: env}, shArgv(both+"; exit 3")...)
	_, _ = sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Env: env, Cwd: "no-such-dir", Timeout: execTimeout})
	_, _ = sess.Exec(ctx, []string{"tai42-no-such-command"}, sandbox.ExecOptions{Env: env, Timeout: execTimeout})
	_, _ = sess.Exec(ctx, shArgv(both+"; sleep 30"), sandbox.ExecOptions{Env: env, Timeout: 300 * time.Millisecond})
	killed := start(t, ctx, sess, sandbox.StartOptions{Env: env}, shArgv(both+"; sleep 30")...)
	killed.next(ctx)
	if err := killed.h.Kill(ctx); err != nil {
		t.Errorf("Kill: %v", err)
	}
	killed.drain(ctx, prompt)
	timedOut := start(t, ctx, sess, sandbox.StartOptions{Env: env, Timeout: 300 * time.Millisecond}, shArgv(both+"; sleep 30")...)
	timedOut.drain(ctx, prompt)
	_, _ = sb.CreateSession(ctx, s.spec(func(sp *sandbox.SessionSpec) {
		sp.Env = map[string]sandbox.Secret{"TAI42=BAD": sandbox.NewSecret(bad)}
	}))
	sleepCtx(ctx, time.Until(expInfo.ExpiresAt)+100*time.Millisecond)
	if !eventually(ctx, 5*time.Second, func() bool {
		_, err := sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: execTimeout})
		_, gone := expiring.Info(ctx)
		return err == nil && errors.Is(gone, sandbox.ErrSessionNotFound)
	}) {
		t.Errorf("the session of ttl_seconds 1 was not reaped within 5 s of its expiry (ReapInterval 100ms)")
	}
	if err := sb.DestroySession(ctx, sess.ID()); err != nil {
		t.Errorf("DestroySession: %v", err)
	}
	logs := clauseLog(t).String()
	if logs == "" {
		t.Fatal("nothing was logged through Config.Logger by a create, execs, a reap and a destroy; Options.Logs says the provider logs through it")
	}
	for line := range strings.Lines(logs) {
		for _, secret := range secrets {
			if strings.Contains(line, secret) {
				t.Errorf("a log line shows an env value: %q; env values are secrets and never appear in logs", line)
			}
		}
	}
}

// cwd is workspace-relative ("" is the workspace itself), must stay inside
// the workspace, and must exist.
func (s *suite) testExecCwd(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	ws := sess.WorkspacePath()
	if !path.IsAbs(ws) {
		t.Fatalf("WorkspacePath() = %q; want an absolute path", ws)
	}
	mustPut(t, ctx, sess, "sub/x", []byte("x"))
	mustSh(t, ctx, sess, `ln -s / out`)
	sub := path.Join(ws, "sub")
	for cwd, want := range map[string]string{"": ws, "sub": sub, "./sub/": sub, "sub/../sub": sub, sub: sub, ws: ws} {
		res, err := sess.Exec(ctx, shArgv("pwd"), sandbox.ExecOptions{Cwd: cwd, Timeout: execTimeout})
		if err != nil {
			t.Errorf("Exec(pwd) with Cwd %q: %v", cwd, err)
		} else if got := strings.TrimSuffix(res.Stdout, "\n"); got != want {
			t.Errorf("Exec(pwd) with Cwd %q ran in %q; want %q (cwd resolves against the workspace)", cwd, got, want)
		}
	}
	refused := []string{"..", "sub/../..", "../" + path.Base(ws) + "x", "out", "out/tmp", "missing", "sub/missing"}
	if s.opts.AbsoluteOutsideWorkspaceRefused {
		refused = append(refused, "/", path.Dir(ws))
	}
	for i, cwd := range refused {
		marker := path.Join(ws, "ran"+strconv.Itoa(i))
		_, err := sess.Exec(ctx, shArgv(`printf ran > "$1"`, marker), sandbox.ExecOptions{Cwd: cwd, Timeout: execTimeout})
		wantKind(t, err, sandbox.ErrSandbox, "Exec with Cwd "+strconv.Quote(cwd)+" (outside the workspace, or missing)")
		if exists(t, ctx, sess, marker) {
			t.Errorf("Exec with the refused Cwd %q ran the command; a refused exec runs nothing", cwd)
		}
	}
}

// Exec delivers its Stdin byte-exact.
func (s *suite) testExecStdin(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	in := randomBytes(1 << 20)
	res := run(t, ctx, sess, sandbox.ExecOptions{Stdin: in}, "cat")
	if res.ExitCode != 0 || res.Stdout != string(in) {
		t.Errorf("Exec(cat) with 1 MiB of random Stdin: exit code %d, %d bytes out, equal %v; want exit 0 and the input echoed byte for byte",
			res.ExitCode, len(res.Stdout), res.Stdout == string(in))
	}
}

// A nil (or empty) Stdin gives the command end-of-input at once.
func (s *suite) testExecNilStdin(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, in := range [][]byte{nil, {}} {
		res, err := sess.Exec(ctx, []string{"cat"}, sandbox.ExecOptions{Stdin: in, Timeout: 10 * time.Second})
		if err != nil {
			t.Errorf("Exec(cat) with Stdin %#v: %v; want cat to see end-of-input at once and exit 0", in, err)
		} else if res != (sandbox.ExecResult{}) {
			t.Errorf("Exec(cat) with Stdin %#v = %+v; want exit 0 and no output", in, res)
		}
	}
}

// A process the command leaves running, holding the output pipes, does not
// keep Exec from returning once the command itself has exited.
func (s *suite) testExecLeftoverChild(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	begin := time.Now()
	res, err := sess.Exec(ctx, shArgv(`sleep 30 & echo $!`), sandbox.ExecOptions{Timeout: 10 * time.Second})
	took := time.Since(begin)
	if err != nil {
		t.Fatalf("Exec(sh -c 'sleep 30 & echo $!') after %v: %v; want the result of sh once it exits", took, err)
	}
	if took > prompt {
		t.Errorf("Exec(sh -c 'sleep 30 & echo $!') took %v; it must return once sh exits, not wait for the child holding its output", took)
	}
	pid := strings.TrimSpace(res.Stdout)
	if _, err := strconv.Atoi(pid); err != nil || res.ExitCode != 0 {
		t.Errorf("Exec(sh -c 'sleep 30 & echo $!') = %+v; want exit 0 and the child's pid on stdout", res)
		return
	}
	_, _ = sess.Exec(ctx, []string{"kill", pid}, sandbox.ExecOptions{Timeout: execTimeout})
}

// Output beyond what the provider holds in memory fails Exec with an
// *OutputLimitError carrying the lengths received, exact when the output
// stops past the limit; it is never silently truncated.
func (s *suite) testExecOutputLimit(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	const n = 100 << 20
	res, err := sess.Exec(ctx, []string{"head", "-c", strconv.Itoa(n), "/dev/zero"}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err == nil {
		if res.ExitCode != 0 || len(res.Stdout) != n {
			t.Errorf("Exec(head -c %d /dev/zero) = exit code %d with %d bytes of stdout and no error; want all %d bytes, or an *OutputLimitError: output is never silently truncated",
				n, res.ExitCode, len(res.Stdout), n)
		}
		return
	}
	const what = "Exec of 100 MiB of output"
	if !wantKind(t, err, sandbox.ErrOutputLimit, what) {
		return
	}
	var ol *sandbox.OutputLimitError
	if !errors.As(err, &ol) {
		t.Fatalf("%s: %q does not convert to *sandbox.OutputLimitError", what, err)
	}
	if ol.StdoutLen <= 0 || ol.StdoutLen < ol.Limit {
		t.Errorf("%s: OutputLimitError{Limit: %d, StdoutLen: %d}; want the stdout length received, past the limit", what, ol.Limit, ol.StdoutLen)
	}
	// An output that stops one byte past the limit, the command then
	// waiting: every byte was received, so the lengths are exact.
	_, err = sess.Exec(ctx, shArgv(`printf abc >&2; head -c "$1" /dev/zero; sleep 30`, strconv.FormatInt(ol.Limit+1, 10)), sandbox.ExecOptions{Timeout: 30 * time.Second})
	limitWhat := fmt.Sprintf("Exec of 3 bytes of stderr, then %d bytes of stdout (one past the limit)", ol.Limit+1)
	if wantKind(t, err, sandbox.ErrOutputLimit, limitWhat) {
		if !errors.As(err, &ol) {
			t.Fatalf("%s: %q does not convert to *sandbox.OutputLimitError", limitWhat, err)
		}
		if ol.StdoutLen != ol.Limit+1 || ol.StderrLen != 3 {
			t.Errorf("%s: OutputLimitError lengths stdout %d, stderr %d; want %d and 3, every byte received", limitWhat, ol.StdoutLen, ol.StderrLen, ol.Limit+1)
		}
	}
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, "echo", "ok"); res.Stdout != "ok\n" {
		t.Errorf("Exec(echo ok) after an output-limit failure = %+v; the session stays usable", res)
	}
}

// Execs on one session may run concurrently.
func (s *suite) testExecConcurrent(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			want := strconv.Itoa(i)
			res, err := sess.Exec(ctx, shArgv(`sleep 0.1; printf %s "$1"`, want), sandbox.ExecOptions{Timeout: execTimeout})
			if err != nil || res != (sandbox.ExecResult{Stdout: want}) {
				t.Errorf("concurrent Exec %d = %+v, %v; want stdout %q", i, res, err, want)
			}
		})
	}
	wg.Wait()
}
