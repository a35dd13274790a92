package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/buildtest"
)

// buildBinary builds tai42 into a temporary directory (skipped with -short),
// static (CGO_ENABLED=0).
func buildBinary(t *testing.T) string {
	t.Helper()
	return buildBinaryCgo(t, false)
}

// buildBinaryCgo builds tai42 into a temporary directory, with cgo when cgo
// is set (skipped with -short).
func buildBinaryCgo(t *testing.T, cgo bool) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "tai42")
	if err := buildtest.Tai42(t.Context(), bin, cgo); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestBinary builds the real binary and runs it as a user would: exit codes,
// streams, stdin from a pipe, signals and a closed stdout.
func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	state := t.TempDir()
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		// A clean environment: the state directory comes from it.
		cmd.Env = []string{"TAI42_STATE_DIR=" + state, "PATH=" + os.Getenv("PATH"), "SECRET=from-caller", "TAI42_PROVIDER=host"}
		return cmd
	}
	exitCode := func(err error) int {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		return 0
	}

	t.Run("streams and exit code", func(t *testing.T) {
		cmd := command("run", "--env", "SECRET", "--", "sh", "-c", `cat; echo "$SECRET" >&2; exit 7`)
		cmd.Stdin = strings.NewReader("piped input\n")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if code := exitCode(cmd.Run()); code != 7 {
			t.Errorf("exit %d, want 7 (stderr %q)", code, errb.String())
		}
		if out.String() != "piped input\n" || errb.String() != "from-caller\n" {
			t.Errorf("stdout %q stderr %q", out.String(), errb.String())
		}
		assertNoLeak(t, state)
	})

	t.Run("version", func(t *testing.T) {
		out, err := command("version").Output()
		if err != nil || !strings.HasPrefix(string(out), "tai42 dev "+runtime.Version()) {
			t.Errorf("tai42 version: %q, %v", out, err)
		}
	})

	t.Run("rejected", func(t *testing.T) {
		var errb bytes.Buffer
		cmd := command("run", "--network", "internal", "--", "true")
		cmd.Stderr = &errb
		if code := exitCode(cmd.Run()); code != 2 || !strings.Contains(errb.String(), "spec rejected") {
			t.Errorf("exit %d stderr %q", code, errb.String())
		}
	})

	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGTERM, 143}, {syscall.SIGINT, 130}} {
		t.Run("signal "+tc.sig.String(), func(t *testing.T) {
			if tc.sig == syscall.SIGINT && signal.Ignored(syscall.SIGINT) {
				t.Skip("SIGINT is ignored here, so tai42 keeps it ignored")
			}
			cmd := command("run", "--", "sh", "-c", "echo $$; exec sleep 60")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("reading the command's pid: %v", err)
			}
			start := time.Now()
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if code := exitCode(err); code != tc.code {
					t.Errorf("exit %d, want %d", code, tc.code)
				}
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("tai42 did not end after the signal")
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("took %v to end", d)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(line))
			if err != nil {
				t.Fatalf("pid line %q", line)
			}
			waitFor(t, "the command to end", func() bool { return !alive(pid) })
			assertNoLeak(t, state)
		})
	}

	t.Run("closed stdout", func(t *testing.T) {
		cmd := command("run", "--", "yes")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 10)
		if _, err := stdout.Read(buf); err != nil {
			t.Fatal(err)
		}
		stdout.Close() // like "| head -c 10"
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if code := exitCode(err); code != 141 {
				t.Errorf("exit %d, want 141", code)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("tai42 did not end after its stdout closed")
		}
		assertNoLeak(t, state)
	})
}

// daemonProc is a "tai42 serve" process.
type daemonProc struct {
	cmd    *exec.Cmd
	addr   string        // from its listening line
	stderr *syncBuffer   // all it wrote on stderr
	done   chan struct{} // closed once it has exited
	err    error         // its Wait, once done is closed
}

// startDaemonProc starts "BIN serve ARGS..." with env and waits for its
// listening line.
func startDaemonProc(t *testing.T, bin string, env []string, args ...string) *daemonProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	cmd.Env = env
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			_, _ = d.stderr.Write([]byte(sc.Text() + "\n"))
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				lines <- m[1]
			}
		}
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
		}
	})
	select {
	case d.addr = <-lines:
	case <-time.After(20 * time.Second):
		t.Fatalf("tai42 serve did not start; stderr:\n%s", d.stderr.String())
	}
	return d
}

// stop sends SIGTERM and returns the exit code and how long it took.
func (d *daemonProc) stop(t *testing.T) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
		took := time.Since(start)
		var ee *exec.ExitError
		if errors.As(d.err, &ee) {
			return ee.ExitCode(), took
		}
		if d.err != nil {
			t.Fatal(d.err)
		}
		return 0, took
	case <-time.After(30 * time.Second):
		t.Fatalf("tai42 serve did not stop after SIGTERM; stderr:\n%s", d.stderr.String())
	}
	return -1, 0
}

// TestBinaryDaemon runs "tai42 serve" as a process and the client commands
// against it: over TCP with a generated token, then over a unix socket; a
// SIGTERM stops it with exit 0, destroying the sessions and keeping the
// persistent workspaces.
func TestBinaryDaemon(t *testing.T) {
	bin := buildBinary(t)
	state := t.TempDir()
	path := "PATH=" + os.Getenv("PATH")
	d := startDaemonProc(t, bin, []string{path, "TAI42_PROVIDER=host"}, "--listen", "127.0.0.1:0", "--state-dir", state)
	tokenFile := filepath.Join(state, "token")
	if !strings.Contains(d.stderr.String(), "tai42: token written to "+tokenFile) {
		t.Errorf("no token line:\n%s", d.stderr.String())
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{path, "TAI42_URL=http://" + d.addr, "TAI42_TOKEN=" + strings.TrimSpace(string(token))}
	tai42 := func(stdin string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("tai42 %v: %v", args, err)
		}
		if code != 0 && code != 3 {
			t.Errorf("tai42 %v: exit %d, stderr %q", args, code, errb.String())
		}
		return out.String(), code
	}

	out, _ := tai42("", "create")
	eph := strings.TrimSpace(out)
	if out, code := tai42("", "exec", eph, "--", "echo", "hi"); out != "hi\n" || code != 0 {
		t.Errorf("exec echo hi: %q, exit %d", out, code)
	}
	if _, code := tai42("", "exec", eph, "--", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("exec exit 3: exit %d", code)
	}
	local := filepath.Join(t.TempDir(), "f.txt")
	if err := os.WriteFile(local, []byte("file content\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tai42("", "cp", local, eph+":f.txt")
	if out, _ := tai42("", "cp", eph+":f.txt", "-"); out != "file content\n" {
		t.Errorf("cp out: %q", out)
	}
	out, _ = tai42("", "create", "--persistent", "keep")
	per := strings.TrimSpace(out)
	tai42("kept across the daemon\n", "cp", "-", per+":notes.txt")
	if out, _ := tai42("", "ls", "-q"); strings.Count(out, "\n") != 2 {
		t.Errorf("ls -q: %q", out)
	}
	ephDir := filepath.Join(state, "host", "sessions", eph)
	if _, err := os.Stat(ephDir); err != nil {
		t.Fatalf("ephemeral workspace: %v", err)
	}

	code, took := d.stop(t)
	if code != 0 || took > 5*time.Second {
		t.Errorf("after SIGTERM: exit %d in %v; stderr:\n%s", code, took, d.stderr.String())
	}
	if _, err := os.Stat(ephDir); !os.IsNotExist(err) {
		t.Errorf("ephemeral workspace after SIGTERM: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(state, "host", "workspaces", "keep", "notes.txt")); err != nil || string(b) != "kept across the daemon\n" {
		t.Errorf("persistent workspace after SIGTERM: %q, %v", b, err)
	}
	if strings.Contains(d.stderr.String(), strings.TrimSpace(string(token))) {
		t.Error("the token is on the daemon's stderr")
	}

	// A unix socket, the token reused from the state directory.
	sock := filepath.Join(t.TempDir(), "tai42.sock")
	d = startDaemonProc(t, bin, []string{path, "TAI42_STATE_DIR=" + state, "TAI42_PROVIDER=host"}, "--listen", "unix:"+sock, "--log-format", "text")
	if d.addr != "unix:"+sock || strings.Contains(d.stderr.String(), "token written") {
		t.Errorf("unix daemon: addr %q, stderr:\n%s", d.addr, d.stderr.String())
	}
	env = []string{path, "TAI42_URL=unix:" + sock, "TAI42_STATE_DIR=" + state} // the token from the state directory
	if out, _ := tai42("", "run", "--persistent", "keep", "--", "cat", "notes.txt"); out != "kept across the daemon\n" {
		t.Errorf("run over unix: %q", out)
	}
	out, _ = tai42("", "create")
	if out, code := tai42("echo hi; exit 3\n", "shell", strings.TrimSpace(out)); out != "hi\n" || code != 3 {
		t.Errorf("shell: %q, exit %d", out, code)
	}
	if code, _ := d.stop(t); code != 0 {
		t.Errorf("unix daemon: exit %d after SIGTERM", code)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket after SIGTERM: %v", err)
	}
}
