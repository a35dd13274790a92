package sandboxtest

import (
	"bytes"
	"context"
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

func (s *suite) streamClauses() []clause {
	return []clause{
		{"Interleaved", s.testStreamInterleaved},
		{"ExitCode", s.testStreamExitCode},
		{"NotFound", s.testStreamNotFound},
		{"CwdAndEnv", s.testStreamCwdAndEnv},
		{"StdinConcurrent", s.testStreamStdinConcurrent},
		{"StdinLargeWrite", s.testStreamStdinLarge},
		{"CloseStdin", s.testStreamCloseStdin},
		{"WriteAfterExit", s.testStreamWriteAfterExit},
		{"WriteRacingExit", s.testStreamWriteRacingExit},
		{"WritersAtomic", s.testStreamWritersAtomic},
		{"WriteAfterClose", s.testStreamWriteAfterClose},
		{"Timeout", s.testStreamTimeout},
		{"TimeoutLengths", s.testStreamTimeoutLengths},
		{"KillBeforeRead", s.testKillBeforeRead},
		{"KillDuringRun", s.testKillDuringRun},
		{"KillPastDeadline", s.testKillPastDeadline},
		{"KillAfterExit", s.testKillAfterExit},
		{"KillTwice", s.testKillTwice},
		{"KillConcurrent", s.testKillConcurrent},
		{"KillKeepsReceivedOutput", s.testKillKeepsReceivedOutput},
		{"KillStopsLeftovers", s.testKillStopsLeftovers},
		{"ExitWatcher", s.testStreamExitWatcher},
	}
}

// The stream interleaves stdout and stderr in the order they were written,
// then ends with exactly one StreamExit, then io.EOF.
func (s *suite) testStreamInterleaved(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	// The command writes each line once the one before it has come
	// through the stream (it waits for a line on stdin, which the test
	// writes then): the order written is known whatever the machine's
	// load, which a pause between the writes could not promise.
	r := start(t, ctx, sess, sandbox.StartOptions{}, shArgv("echo o1; read x; echo e1 >&2; read x; echo o2")...)
	want := []sandbox.StreamChunk{{Stream: sandbox.Stdout, Data: []byte("o1\n")}, {Stream: sandbox.Stderr, Data: []byte("e1\n")}, {Stream: sandbox.Stdout, Data: []byte("o2\n")}}
	written := 0
	for _, w := range want[:2] {
		written += len(w.Data)
		for len(r.stdout)+len(r.stderr) < written && r.next(ctx) {
		}
		if err := r.h.WriteStdin(ctx, []byte("\n")); err != nil {
			t.Errorf("WriteStdin after %q came through: %v", w.Data, err)
		}
	}
	r.drain(ctx, execTimeout)
	r.wantExit(0, "the command exits 0")
	got := merged(r.chunks)
	if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
		t.Errorf("stream = %s; want %s (stdout and stderr interleaved in the order written)", transcript(got), transcript(want))
	}
}

func transcript(chunks []sandbox.StreamChunk) string {
	var b strings.Builder
	for _, c := range chunks {
		fmt.Fprintf(&b, "[%s %q]", c.Stream, c.Data)
	}
	return b.String()
}

// The StreamExit carries the exec's own exit code.
func (s *suite) testStreamExitCode(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, shArgv("exit 7")...)
	r.drain(ctx, execTimeout)
	r.wantExit(7, "the command exits 7")
}

// A command that cannot be found ends its stream with exit code 127, as Exec
// reports it.
func (s *suite) testStreamNotFound(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "tai42-no-such-command")
	r.drain(ctx, execTimeout)
	r.wantExit(127, "a command that cannot be found")
	if len(r.stderr) == 0 {
		t.Errorf("ExecStart of a missing command wrote nothing on stderr; want the reason there")
	}
}

// ExecStart follows Exec's cwd and env rules.
func (s *suite) testStreamCwdAndEnv(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, func(sp *sandbox.SessionSpec) {
		sp.Env = sandbox.SecretEnv(map[string]string{"TAI42_A": "spec-a", "TAI42_B": "spec-b"})
	})
	mustPut(t, ctx, sess, "sub/x", nil)
	r := start(t, ctx, sess, sandbox.StartOptions{Cwd: "sub", Env: sandbox.SecretEnv(map[string]string{"TAI42_B": "exec-b"})},
		shArgv(`pwd; printf '%s|%s' "$TAI42_A" "$TAI42_B"`)...)
	r.drain(ctx, execTimeout)
	r.wantExit(0, "the command succeeds")
	if want := path.Join(sess.WorkspacePath(), "sub") + "\nspec-a|exec-b"; string(r.stdout) != want {
		t.Errorf("ExecStart with Cwd sub: stdout %q; want %q (cwd relative to the workspace, exec env over spec env)", r.stdout, want)
	}
	for _, cwd := range []string{"..", "missing"} {
		h, err := sess.ExecStart(ctx, []string{"true"}, sandbox.StartOptions{Cwd: cwd, Timeout: execTimeout})
		wantKind(t, err, sandbox.ErrSandbox, "ExecStart with Cwd "+strconv.Quote(cwd))
		if h != nil {
			_ = h.Kill(ctx)
		}
	}
}

// echo pipes in through `cat`, writing with write while a goroutine reads
// the stream, and checks that what comes out is exactly what went in.
func echo(t *testing.T, ctx context.Context, sess sandbox.Session, write func(h sandbox.ExecHandle) []byte) {
	t.Helper()
	r := start(t, ctx, sess, sandbox.StartOptions{Timeout: 30 * time.Second}, "cat")
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.drain(ctx, 30*time.Second)
	}()
	want := write(r.h)
	if err := r.h.CloseStdin(ctx); err != nil {
		t.Errorf("CloseStdin: %v", err)
	}
	<-done
	r.wantExit(0, "cat exits 0 at end of input")
	if !bytes.Equal(r.stdout, want) {
		t.Errorf("cat echoed %d bytes (equal: false); want the %d bytes written, intact and in order", len(r.stdout), len(want))
	}
}

// WriteStdin is safe concurrently with Next and delivers each write intact
// and in order.
func (s *suite) testStreamStdinConcurrent(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	echo(t, ctx, sess, func(h sandbox.ExecHandle) []byte {
		var all []byte
		for i := range 500 {
			msg := fmt.Appendf(nil, "message %d %s\n", i, strings.Repeat("x", i%97))
			all = append(all, msg...)
			if err := h.WriteStdin(ctx, msg); err != nil {
				t.Errorf("WriteStdin %d: %v", i, err)
				break
			}
		}
		return all
	})
}

// One large WriteStdin is delivered intact while the output is read.
func (s *suite) testStreamStdinLarge(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	echo(t, ctx, sess, func(h sandbox.ExecHandle) []byte {
		data := randomBytes(8 << 20)
		if err := h.WriteStdin(ctx, bytes.Clone(data)); err != nil {
			t.Errorf("WriteStdin of 8 MiB: %v", err)
		}
		return data
	})
}

// CloseStdin signals end-of-input.
func (s *suite) testStreamCloseStdin(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "cat")
	if err := r.h.CloseStdin(ctx); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	r.drain(ctx, prompt)
	r.wantExit(0, "cat exits 0 at end of input")
}

// Once the exec has exited, WriteStdin fails with a *SandboxError and Kill
// is a no-op.
func (s *suite) testStreamWriteAfterExit(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "true")
	r.drain(ctx, execTimeout)
	r.wantExit(0, "true exits 0")
	err := r.h.WriteStdin(ctx, []byte("late\n"))
	wantKind(t, err, sandbox.ErrSandbox, "WriteStdin after the exec exited")
	if err := r.h.CloseStdin(ctx); err != nil && !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("CloseStdin after the exec exited: %T %q; want nil or a *SandboxError, never an arbitrary error", err, err)
	}
	if err := r.h.Kill(ctx); err != nil {
		t.Errorf("Kill after the exec exited: %v; once the exec has exited Kill never fails", err)
	}
}

// A WriteStdin under way when the exec exits (8 MiB into `head -c1`, which
// reads one byte and exits) returns nil or a *SandboxError, never the
// operating system's broken-pipe error: once the exec has exited,
// write_stdin raises a typed SandboxError.
func (s *suite) testStreamWriteRacingExit(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "head", "-c1")
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.drain(ctx, execTimeout)
	}()
	if err := r.h.WriteStdin(ctx, make([]byte, 8<<20)); err != nil {
		wantKind(t, err, sandbox.ErrSandbox, "WriteStdin of 8 MiB into head -c1, which exits after one byte (nil, or a *sandbox.SandboxError, never a raw operating-system error)")
	}
	<-done
	r.wantExit(0, "head -c1 exits 0 after one byte")
	if len(r.stdout) != 1 {
		t.Errorf("head -c1 wrote %d bytes; want the 1 byte it read", len(r.stdout))
	}
}

// WriteStdin calls from two goroutines at once each arrive whole: a call is
// atomic with respect to the other calls on the handle, so the echo of two
// writers of 16 KiB blocks is a sequence of whole blocks, each writer's in
// order.
func (s *suite) testStreamWritersAtomic(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	const (
		size    = 16 << 10
		writers = 2
		blocks  = 64
	)
	block := func(w, i int) []byte {
		b := bytes.Repeat([]byte{byte('a' + w)}, size)
		copy(b, fmt.Appendf(nil, "writer %d block %06d\n", w, i))
		b[size-1] = '\n'
		return b
	}
	r := start(t, ctx, sess, sandbox.StartOptions{Timeout: 30 * time.Second}, "cat")
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.drain(ctx, 30*time.Second)
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range blocks {
				if err := r.h.WriteStdin(ctx, block(w, i)); err != nil {
					t.Errorf("WriteStdin of block %d by writer %d: %v", i, w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := r.h.CloseStdin(ctx); err != nil {
		t.Errorf("CloseStdin: %v", err)
	}
	<-done
	r.wantExit(0, "cat exits 0 at end of input")
	if len(r.stdout) != writers*blocks*size {
		t.Fatalf("cat echoed %d bytes; want the %d bytes of %d writers' %d blocks of %d bytes", len(r.stdout), writers*blocks*size, writers, blocks, size)
	}
	var next [writers]int
	for off := 0; off < len(r.stdout); off += size {
		got := r.stdout[off : off+size]
		w := int(got[len("writer ")] - '0')
		if w < 0 || w >= writers || next[w] >= blocks || !bytes.Equal(got, block(w, next[w])) {
			t.Fatalf("the echo at offset %d is %.40q…, not a whole block of one writer in its order; a WriteStdin call is never split by another's bytes", off, got)
		}
		next[w]++
	}
}

// Once CloseStdin has returned, a WriteStdin while the exec still runs is
// input the exec never gets: it fails with a *SandboxError, or, if
// accepted, the stream ends with a *SandboxError, never silently dropped.
func (s *suite) testStreamWriteAfterClose(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "sleep", "30")
	if err := r.h.CloseStdin(ctx); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	err := r.h.WriteStdin(ctx, []byte("late\n"))
	if err != nil {
		wantKind(t, err, sandbox.ErrSandbox, "WriteStdin after CloseStdin")
	}
	if kerr := r.h.Kill(ctx); kerr != nil {
		t.Fatalf("Kill of a running exec: %v", kerr)
	}
	r.drain(ctx, killPrompt)
	if err == nil && r.err == nil {
		t.Errorf("WriteStdin after CloseStdin returned nil and the stream ended with %+v; input the exec never gets is refused with a *SandboxError, or ends the stream with one", r.exit)
	}
}

// On timeout the stream yields the output received, then an
// *ExecTimeoutError with the exact lengths, which Next keeps returning.
func (s *suite) testStreamTimeout(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	secret := secretValue("stream")
	const timeout = time.Second
	begin := time.Now()
	r := start(t, ctx, sess, sandbox.StartOptions{Env: map[string]sandbox.Secret{"TAI42_OUT": sandbox.NewSecret(secret)}, Timeout: timeout},
		shArgv(`printf %s "$TAI42_OUT"; printf de >&2; sleep 30`)...)
	r.drain(ctx, timeout+prompt)
	if took := time.Since(begin); took > timeout+prompt {
		t.Errorf("the stream of an exec with Timeout %v ended after %v; on expiry the exec is killed promptly", timeout, took)
	}
	if r.exit != nil {
		t.Fatalf("the stream ended with StreamExit %d; want an *ExecTimeoutError after the timeout", r.exit.ExitCode)
	}
	wantTimeout(t, r.err, timeout, len(secret), 2, "the stream of sh -c 'printf <secret>; printf de >&2; sleep 30'")
	noSecret(t, "the ExecTimeoutError", r.err, secret)
	if string(r.stdout) != secret || string(r.stderr) != "de" {
		t.Errorf("before the timeout the stream yielded stdout %d bytes, stderr %q; want the output received (%d bytes, \"de\")", len(r.stdout), r.stderr, len(secret))
	}
	_, again := r.h.Next(ctx)
	wantTimeout(t, again, timeout, len(secret), 2, "Next after the ExecTimeoutError")
	if err := r.h.Kill(ctx); err != nil {
		t.Errorf("Kill after the timeout killed the exec: %v; once the exec has exited Kill never fails", err)
	}
}

// The lengths in the ExecTimeoutError of an exec writing without end count
// every byte of its output, the pipes drained after the kill: they equal the
// bytes the stream yielded before the error. A slow reader keeps the pipes
// full at the deadline, so lengths taken then fall short.
func (s *suite) testStreamTimeoutLengths(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	const timeout = time.Second
	h := start(t, ctx, sess, sandbox.StartOptions{Timeout: timeout}, shArgv("cat /dev/zero >&2 & exec cat /dev/zero")...).h
	var lens [2]int64
	var err error
	for {
		var item sandbox.StreamItem
		if item, err = h.Next(ctx); err != nil {
			break
		}
		c, ok := item.(*sandbox.StreamChunk)
		if !ok {
			t.Fatalf("the stream of sh -c 'cat /dev/zero >&2 & exec cat /dev/zero' yielded %#v; want chunks until an *ExecTimeoutError", item)
		}
		if c.Stream == sandbox.Stderr {
			lens[1] += int64(len(c.Data))
		} else {
			lens[0] += int64(len(c.Data))
		}
		sleepCtx(ctx, 2*time.Millisecond) // a slow reader: the output backs up
	}
	var te *sandbox.ExecTimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("the stream of an exec writing without end ended with %v; want an *ExecTimeoutError after %v", err, timeout)
	}
	if te.Note != "" {
		t.Errorf("ExecTimeoutError.Note = %q; no process here leaves the exec's process group to hold its output", te.Note)
	}
	if te.StdoutLen != lens[0] || te.StderrLen != lens[1] {
		t.Errorf("ExecTimeoutError lengths stdout %d, stderr %d; the stream yielded %d and %d before it: the lengths count every byte, the pipes drained after the kill",
			te.StdoutLen, te.StderrLen, lens[0], lens[1])
	}
}

// killExit is the exit status a killed exec reports: 128+SIGKILL.
const killExit = 137

// Kill before any output is read ends the stream promptly with the exec's
// exit status.
func (s *suite) testKillBeforeRead(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "sleep", "30")
	if err := r.h.Kill(ctx); err != nil {
		t.Fatalf("Kill of a running exec: %v", err)
	}
	r.drain(ctx, killPrompt)
	r.wantExit(killExit, "the exec was killed")
}

// Kill while the exec runs and output flows: what was received before is
// still yielded in order, the stream ends promptly with one StreamExit, and
// no timeout is reported even when read past the deadline.
func (s *suite) testKillDuringRun(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	const timeout = 2 * time.Second
	begin := time.Now()
	r := start(t, ctx, sess, sandbox.StartOptions{Timeout: timeout},
		shArgv(`echo ready; i=0; while [ $i -lt 100000 ]; do echo $i; i=$((i+1)); done; sleep 30`)...)
	for !bytes.HasPrefix(r.stdout, []byte("ready\n")) && r.next(ctx) {
	}
	if !bytes.HasPrefix(r.stdout, []byte("ready\n")) {
		t.Fatalf("the stream yielded stdout %.40q, exit %v, error %v; want it to begin with \"ready\\n\"", r.stdout, r.exit, r.err)
	}
	if time.Since(begin) > timeout-500*time.Millisecond {
		t.Skipf("the exec took %v to print its first line, too close to its %v timeout to test a kill before it", time.Since(begin), timeout)
	}
	if err := r.h.Kill(ctx); err != nil {
		t.Fatalf("Kill of a running exec: %v", err)
	}
	sleepCtx(ctx, time.Until(begin.Add(timeout+500*time.Millisecond)))
	r.drain(ctx, killPrompt)
	if errors.Is(r.err, sandbox.ErrExecTimeout) {
		t.Errorf("the stream ended with %q; once Kill has returned, the stream reports no timeout, even read past the deadline", r.err)
	}
	r.wantExit(killExit, "the exec was killed")
	var want strings.Builder
	want.WriteString("ready\n")
	for i := 0; i < 100000 && want.Len() < len(r.stdout); i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if !strings.HasPrefix(want.String(), string(r.stdout)) {
		t.Errorf("the killed exec's %d bytes of stdout are not a prefix of what it wrote; the output received before a kill is yielded in order", len(r.stdout))
	}
}

// Kill called after the deadline passed, before the stream's end was read:
// once Kill has returned the stream raises no timeout, even past the
// deadline; the output received before is still yielded, then the exit.
func (s *suite) testKillPastDeadline(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{Timeout: 300 * time.Millisecond}, shArgv("printf early; sleep 30")...)
	sleepCtx(ctx, time.Second) // past the deadline; nothing read yet
	if err := r.h.Kill(ctx); err != nil {
		t.Fatalf("Kill past the deadline: %v", err)
	}
	r.drain(ctx, killPrompt)
	if errors.Is(r.err, sandbox.ErrExecTimeout) {
		t.Errorf("the stream ended with %q; once Kill has returned, the stream raises no timeout, even past the deadline", r.err)
	}
	if string(r.stdout) != "early" {
		t.Errorf("stdout %q; want \"early\", received before the kill", r.stdout)
	}
	if r.exit == nil {
		t.Errorf("the stream ended without a StreamExit (error %v); a killed exec's stream ends with one", r.err)
	}
}

// Kill after the exec exited (its exit item not yet read) is a no-op: the
// exit status stays the exec's own.
func (s *suite) testKillAfterExit(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, shArgv("exit 3")...)
	sleepCtx(ctx, 300*time.Millisecond) // the exec has exited; its exit item is unread
	if err := r.h.Kill(ctx); err != nil {
		t.Errorf("Kill after the exec exited: %v; once the exec has exited Kill never fails", err)
	}
	r.drain(ctx, killPrompt)
	r.wantExit(3, "the exec's own exit status, not the kill's")
	for range 2 {
		if err := r.h.Kill(ctx); err != nil {
			t.Errorf("Kill after the stream ended: %v; Kill is idempotent", err)
		}
	}
}

// Kill may be called more than once.
func (s *suite) testKillTwice(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "sleep", "30")
	for i := range 2 {
		if err := r.h.Kill(ctx); err != nil {
			t.Errorf("Kill #%d: %v; Kill may be called more than once", i+1, err)
		}
	}
	r.drain(ctx, killPrompt)
	r.wantExit(killExit, "the exec was killed")
}

// Kill is safe from many goroutines at once, during the run and after.
func (s *suite) testKillConcurrent(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "sleep", "30")
	killAll := func(when string) {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if err := r.h.Kill(ctx); err != nil {
					t.Errorf("concurrent Kill %s: %v; Kill may be called at any time, from any goroutine", when, err)
				}
			})
		}
		wg.Wait()
	}
	killAll("while the exec runs")
	r.drain(ctx, killPrompt)
	r.wantExit(killExit, "the exec was killed")
	killAll("after the exec exited")
}

// The output the provider received before the kill, read or not, is still
// yielded.
func (s *suite) testKillKeepsReceivedOutput(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, shArgv("printf hello; sleep 30")...)
	// The contract keeps the output the provider had taken in before the
	// kill. 300ms after a printf, any provider has taken it in; nothing is
	// read from the stream before the kill.
	sleepCtx(ctx, 300*time.Millisecond)
	if err := r.h.Kill(ctx); err != nil {
		t.Fatalf("Kill of a running exec: %v", err)
	}
	r.drain(ctx, killPrompt)
	if string(r.stdout) != "hello" {
		t.Errorf("after Kill the stream yielded stdout %q; want \"hello\", received before the kill", r.stdout)
	}
	r.wantExit(killExit, "the exec was killed")
}

// Documented behaviour (Options.KillStopsLeftovers): Kill after the command
// exited also ends the processes it left running.
func (s *suite) testKillStopsLeftovers(t *testing.T) {
	if !s.opts.KillStopsLeftovers {
		t.Skip("Options.KillStopsLeftovers is false: the provider does not document that Kill ends leftover processes")
	}
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, shArgv("sleep 30 >/dev/null 2>&1 </dev/null & echo $!")...)
	r.drain(ctx, execTimeout)
	r.wantExit(0, "sh exits 0 after starting the child")
	pid := strings.TrimSpace(string(r.stdout))
	if _, err := strconv.Atoi(pid); err != nil {
		t.Fatalf("stdout %q; want the pid of the child left running", r.stdout)
	}
	if !alive(t, ctx, sess, pid) {
		t.Logf("the child %s had already ended before Kill", pid)
	}
	if err := r.h.Kill(ctx); err != nil {
		t.Fatalf("Kill after the exec exited: %v", err)
	}
	if !eventually(ctx, killPrompt, func() bool { return !alive(t, ctx, sess, pid) }) {
		t.Errorf("the process %s the command left running still runs %v after Kill; the provider documents that Kill ends it", pid, killPrompt)
	}
}

// alive reports whether pid runs in the session (a zombie does not count).
func alive(t *testing.T, ctx context.Context, sess sandbox.Session, pid string) bool {
	t.Helper()
	return run(t, ctx, sess, sandbox.ExecOptions{}, shArgv(`kill -0 "$1" 2>/dev/null || exit 1
case "$(cat "/proc/$1/stat" 2>/dev/null)" in *") Z "*) exit 1;; esac`, pid)...).ExitCode == 0
}
