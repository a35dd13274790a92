package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/syncbuf"
)

// result is one in-process invocation's outcome.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs tai42 in-process with args, no signals and an environment
// holding only env (no HOME: a test never touches a real state directory).
func runCLI(t *testing.T, stdin io.Reader, env map[string]string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, stdin, &out, &errb, lookupFrom(env))
	return result{code, out.String(), errb.String()}
}

// runIn runs "tai42 run --state-dir dir ARGS..." and checks that no
// session's directory is left behind.
func runIn(t *testing.T, dir string, stdin io.Reader, args ...string) result {
	t.Helper()
	r := runCLI(t, stdin, nil, append([]string{"run", "--state-dir", dir}, args...)...)
	assertNoLeak(t, dir)
	return r
}

// assertNoLeak checks that the host provider's per-session directories
// (ephemeral workspaces and temp directories) are all gone.
func assertNoLeak(t *testing.T, dir string) {
	t.Helper()
	for _, sub := range []string{"sessions", "tmp"} {
		ents, err := os.ReadDir(filepath.Join(dir, "host", sub))
		if err != nil && !os.IsNotExist(err) {
			t.Errorf("reading state dir: %v", err)
		}
		for _, e := range ents {
			t.Errorf("leaked %s/%s", sub, e.Name())
		}
	}
}

func (r result) want(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %q\nstderr: %q", r.code, code, r.stdout, r.stderr)
	}
}

func TestExitCodePassthrough(t *testing.T) {
	dir := t.TempDir()
	for _, code := range []int{0, 1, 7, 42} {
		r := runIn(t, dir, nil, "--", "sh", "-c", "exit "+strconv.Itoa(code))
		r.want(t, code)
		if r.stderr != "" {
			t.Errorf("exit %d: unexpected stderr %q", code, r.stderr)
		}
	}
	// Killed by a signal: 128+sig, as the provider reports it.
	runIn(t, dir, nil, "--", "sh", "-c", "kill -9 $$").want(t, 137)
	// Not found: 127 with the provider's message on stderr.
	r := runIn(t, dir, nil, "--", "no-such-command-tai42")
	r.want(t, 127)
	if !strings.Contains(r.stderr, "not found") {
		t.Errorf("stderr %q, want a not-found message", r.stderr)
	}
	// No "--" is needed: everything from CMD on belongs to CMD.
	runIn(t, dir, nil, "sh", "-c", "exit 3").want(t, 3)
}

func TestStdoutStderrRouting(t *testing.T) {
	r := runIn(t, t.TempDir(), nil, "--", "sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2")
	r.want(t, 0)
	if r.stdout != "out1\nout2\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	if r.stderr != "err1\nerr2\n" {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestStdinStreamed(t *testing.T) {
	dir := t.TempDir()
	r := runIn(t, dir, strings.NewReader("hello\nworld\n"), "--", "cat")
	r.want(t, 0)
	if r.stdout != "hello\nworld\n" {
		t.Errorf("stdout %q", r.stdout)
	}

	// A large input arrives intact and in order.
	big := make([]byte, 3<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	r = runIn(t, dir, bytes.NewReader(big), "--", "cat")
	r.want(t, 0)
	if !bytes.Equal([]byte(r.stdout), big) {
		t.Errorf("cat of %d random bytes returned %d bytes, not equal", len(big), len(r.stdout))
	}

	// No stdin at all: the command sees EOF at once.
	r = runIn(t, dir, nil, "--", "wc", "-c")
	r.want(t, 0)
	if strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("wc -c of no stdin: %q", r.stdout)
	}
}

func TestStdinNeverClosing(t *testing.T) {
	dir := t.TempDir()
	// A pipe nobody writes to or closes, like an idle terminal: the
	// command's exit still ends the run promptly.
	pr, pw := io.Pipe()
	defer pw.Close()
	start := time.Now()
	r := runIn(t, dir, pr, "--", "sh", "-c", "echo done; exit 5")
	r.want(t, 5)
	if r.stdout != "done\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("run took %v", d)
	}

	// --no-stdin gives the command an empty stdin instead.
	pr2, pw2 := io.Pipe()
	defer pw2.Close()
	r = runIn(t, dir, pr2, "--no-stdin", "--", "cat")
	r.want(t, 0)
	if r.stdout != "" {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestEnv(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"FROM_CALLER": "caller-value"}
	r := runCLI(t, nil, env, "run", "--state-dir", dir,
		"--env", "A=hunter2", "-e", "B=x=y", "--env", "FROM_CALLER", "--env", "NOT_SET_ANYWHERE",
		"--", "sh", "-c", `echo "$A|$B|$FROM_CALLER|${NOT_SET_ANYWHERE-unset}"`)
	assertNoLeak(t, dir)
	r.want(t, 0)
	if r.stdout != "hunter2|x=y|caller-value|unset\n" {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestEnvValueNeverPrinted(t *testing.T) {
	dir := t.TempDir()
	const secret = "hunter2-secret"
	for name, args := range map[string][]string{
		"rejected spec": {"--env", "TOKEN=" + secret, "--network", "internal", "--", "true"},
		"policy":        {"--env", "TOKEN=" + secret, "--policy-egress", "none", "--network", "egress", "--", "true"},
		"NUL in value":  {"--env", "TOKEN=" + secret + "\x00", "--", "true"},
		"empty key":     {"--env", "=" + secret, "--", "true"},
		"timeout":       {"--env", "TOKEN=" + secret, "--timeout", "1s", "--", "sh", "-c", "echo $TOKEN; sleep 30"},
		"bad cwd":       {"--env", "TOKEN=" + secret, "--workdir", "nope", "--", "true"},
	} {
		r := runIn(t, dir, nil, args...)
		if r.code == 0 {
			t.Errorf("%s: exit 0, want a failure", name)
		}
		if r.stderr == "" {
			t.Errorf("%s: no message on stderr", name)
		}
		if strings.Contains(r.stderr, secret) {
			t.Errorf("%s: stderr shows the env value: %q", name, r.stderr)
		}
	}
}

func TestPut(t *testing.T) {
	dir := t.TempDir()
	local := t.TempDir()
	a := filepath.Join(local, "a.txt")
	b := filepath.Join(local, "script.sh")
	if err := os.WriteFile(a, []byte("alpha\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("echo from-script\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := runIn(t, dir, nil, "--put", a+":sub/dir/a.txt", "--put", b, "--put", a+":name:with:colons",
		"--", "sh", "-c", "cat sub/dir/a.txt; sh script.sh; cat name:with:colons")
	r.want(t, 0)
	if r.stdout != "alpha\nfrom-script\nalpha\n" {
		t.Errorf("stdout %q", r.stdout)
	}

	// A local file that cannot be read is a usage error, before any session.
	r = runIn(t, dir, nil, "--put", filepath.Join(local, "missing"), "--", "true")
	r.want(t, 2)
	if !strings.Contains(r.stderr, "missing") {
		t.Errorf("stderr %q", r.stderr)
	}
	// A workspace path that climbs out is refused by the sandbox.
	r = runIn(t, dir, nil, "--put", a+":../escape.txt", "--", "true")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "escape.txt") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestWorkdir(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(t.TempDir(), "f.txt")
	if err := os.WriteFile(f, []byte("in-sub\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runIn(t, dir, nil, "--put", f+":sub/f.txt", "--workdir", "sub", "--", "sh", "-c", "pwd; cat f.txt")
	r.want(t, 0)
	lines := strings.Split(r.stdout, "\n")
	if len(lines) < 2 || !strings.HasSuffix(lines[0], "/sub") || lines[1] != "in-sub" {
		t.Errorf("stdout %q", r.stdout)
	}
	// A missing working directory is a sandbox error.
	r = runIn(t, dir, nil, "-w", "does-not-exist", "--", "true")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "does-not-exist") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestTimeout(t *testing.T) {
	start := time.Now()
	r := runIn(t, t.TempDir(), nil, "--timeout", "1s", "--", "sh", "-c", "printf abc; printf de >&2; sleep 30")
	r.want(t, 124)
	if r.stdout != "abc" {
		t.Errorf("stdout %q", r.stdout)
	}
	if !strings.Contains(r.stderr, "timed out") || !strings.Contains(r.stderr, "stdout 3 bytes, stderr 2 bytes") {
		t.Errorf("stderr %q, want the timeout with the lengths", r.stderr)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("run took %v", d)
	}
}

func TestRejectedSpec(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		msg  string
	}{
		"network over policy":  {[]string{"--policy-egress", "none", "--network", "egress"}, "egress ceiling"},
		"internal on host":     {[]string{"--network", "internal"}, "internal network"},
		"persistent forbidden": {[]string{"--policy-durable=false", "--persistent", "k"}, "durable off"},
		"isolation floor":      {[]string{"--policy-isolation", "container"}, "isolation floor"},
		"isolation on host":    {[]string{"--isolation", "vm"}, "stronger than provider"},
		"image":                {[]string{"--image", "ubuntu"}, "honours only image"},
		"bad network":          {[]string{"--network", "lan"}, "not one of"},
		"bad workspace key":    {[]string{"--persistent", "../x"}, "workspace_key"},
	} {
		r := runIn(t, dir, nil, append(tc.args, "--", "true")...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.msg) || !strings.Contains(r.stderr, "spec rejected") {
			t.Errorf("%s: exit %d, stderr %q; want 2 with %q", name, r.code, r.stderr, tc.msg)
		}
	}
}

func TestPersistentAcrossRuns(t *testing.T) {
	dir := t.TempDir()
	runIn(t, dir, nil, "--persistent", "proj", "--", "sh", "-c", "echo kept > notes.txt").want(t, 0)
	r := runIn(t, dir, nil, "--persistent", "proj", "--", "cat", "notes.txt")
	r.want(t, 0)
	if r.stdout != "kept\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	// Another key, and an ephemeral session, see none of it.
	runIn(t, dir, nil, "--persistent", "other", "--", "test", "!", "-e", "notes.txt").want(t, 0)
	runIn(t, dir, nil, "--", "test", "!", "-e", "notes.txt").want(t, 0)
	// Ephemeral files do not survive.
	runIn(t, dir, nil, "--", "sh", "-c", "echo x > eph.txt").want(t, 0)
	runIn(t, dir, nil, "--", "test", "!", "-e", "eph.txt").want(t, 0)

	// While another tai42 process holds the key, a run is rejected.
	lock, err := lockWorkspaceKey(dir, "proj")
	if err != nil {
		t.Fatal(err)
	}
	r = runIn(t, dir, nil, "--persistent", "proj", "--", "true")
	lock.Close()
	r.want(t, 2)
	if !strings.Contains(r.stderr, "in use") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestUnknownProvider(t *testing.T) {
	r := runIn(t, t.TempDir(), nil, "--provider", "docker", "--", "true")
	r.want(t, 2)
	if !strings.Contains(r.stderr, `"docker"`) || !strings.Contains(r.stderr, "registered: host, container, kubernetes") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"no command after --": {"run", "--state-dir", dir, "--"},
		"no command":          {"run", "--state-dir", dir},
		"unknown flag":        {"run", "--state-dir", dir, "--bogus", "--", "true"},
		"bad duration":        {"run", "--state-dir", dir, "--ttl", "forever", "--", "true"},
		"short ttl":           {"run", "--state-dir", dir, "--ttl", "100ms", "--", "true"},
		"zero timeout":        {"run", "--state-dir", dir, "--timeout", "0s", "--", "true"},
		"bad label":           {"run", "--state-dir", dir, "--label", "nokey", "--", "true"},
		"bad policy":          {"run", "--state-dir", dir, "--policy-egress", "everything", "--", "true"},
		"unknown command":     {"frobnicate"},
		"version with args":   {"version", "extra"},
	} {
		r := runCLI(t, nil, nil, args...)
		if r.code != 2 || r.stderr == "" {
			t.Errorf("%s: exit %d, stderr %q; want 2 with a message", name, r.code, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("%s: stdout %q", name, r.stdout)
		}
	}
	assertNoLeak(t, dir)

	// Without --state-dir and with no environment to find one in.
	r := runCLI(t, nil, nil, "run", "--", "true")
	r.want(t, 2)
	if !strings.Contains(r.stderr, "state directory") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestStateDirFromEnv(t *testing.T) {
	dir := t.TempDir()
	r := runCLI(t, nil, map[string]string{"TAI42_STATE_DIR": dir}, "run", "--persistent", "p", "--", "sh", "-c", "echo x > f")
	r.want(t, 0)
	if _, err := os.Stat(filepath.Join(dir, "host", "workspaces", "p", "f")); err != nil {
		t.Errorf("TAI42_STATE_DIR not used: %v", err)
	}
	xdg := t.TempDir()
	r = runCLI(t, nil, map[string]string{"XDG_STATE_HOME": xdg}, "run", "--persistent", "p", "--", "sh", "-c", "echo x > f")
	r.want(t, 0)
	if _, err := os.Stat(filepath.Join(xdg, "tai42", "host", "workspaces", "p", "f")); err != nil {
		t.Errorf("XDG_STATE_HOME/tai42 not used: %v", err)
	}
	assertNoLeak(t, dir)
	assertNoLeak(t, filepath.Join(xdg, "tai42"))
}

func TestTTLExpiryEndsRun(t *testing.T) {
	// The session lives --ttl: past it the reaper destroys it, which ends
	// the command with a sandbox error.
	start := time.Now()
	r := runIn(t, t.TempDir(), nil, "--ttl", "1s", "--timeout", "60s", "--", "sleep", "30")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "destroyed") {
		t.Errorf("stderr %q", r.stderr)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("run took %v", d)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := runCLI(t, nil, nil, args...)
		r.want(t, 0)
		want := "tai42 dev " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
		if r.stdout != want {
			t.Errorf("%v: stdout %q, want %q", args, r.stdout, want)
		}
	}
}

func TestHelp(t *testing.T) {
	r := runCLI(t, nil, nil, "--help")
	r.want(t, 0)
	for _, s := range []string{"Usage:", "Examples:", "tai42 run --", "run", "version"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("tai42 --help lacks %q:\n%s", s, r.stdout)
		}
	}
	r = runCLI(t, nil, nil, "run", "--help")
	r.want(t, 0)
	for _, s := range []string{"--network", "--policy-egress", "--put", "--persistent", "--state-dir", "Exit codes", "Examples:"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("tai42 run --help lacks %q", s)
		}
	}
}

// syncBuffer is a log or output sink safe to read while it is written.
type syncBuffer = syncbuf.Buffer

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSignalKillsAndDestroys(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			sigs := make(chan os.Signal, 1)
			var out, errb syncBuffer
			c := &cli{stdout: &out, stderr: &errb, lookupEnv: lookupFrom(nil), signals: sigs}
			done := make(chan int, 1)
			go func() {
				done <- c.main([]string{"run", "--state-dir", dir, "--", "sh", "-c", "sleep 60 & echo $!; echo $$; sleep 60"})
			}()
			waitFor(t, "the command to start", func() bool { return strings.Count(out.String(), "\n") >= 2 })
			sigs <- tc.sig
			select {
			case code := <-done:
				if code != tc.code {
					t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errb.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("run did not end after the signal")
			}
			assertNoLeak(t, dir)
			for _, f := range strings.Fields(out.String()) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatalf("stdout %q", out.String())
				}
				waitFor(t, "the command's processes to end", func() bool { return !alive(pid) })
			}
		})
	}
}

// alive reports whether pid runs (a zombie, killed and waiting for its
// reaper, does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// epipeWriter accepts n writes, then fails like a closed pipe.
type epipeWriter struct{ n int }

func (w *epipeWriter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}
	}
	w.n--
	return len(p), nil
}

func TestBrokenStdout(t *testing.T) {
	dir := t.TempDir()
	var errb bytes.Buffer
	start := time.Now()
	code := run([]string{"run", "--state-dir", dir, "--", "yes"}, nil, &epipeWriter{n: 2}, &errb, lookupFrom(nil))
	if code != 141 {
		t.Errorf("exit %d, want 141 (stderr %q)", code, errb.String())
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("run took %v", d)
	}
	assertNoLeak(t, dir)
}
