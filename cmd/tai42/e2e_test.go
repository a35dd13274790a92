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
)

// TestBinary builds the real binary and runs it as a user would: exit codes,
// streams, stdin from a pipe, signals and a closed stdout.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "tai42")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	state := t.TempDir()
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		// A clean environment: the state directory comes from it.
		cmd.Env = []string{"TAI42_STATE_DIR=" + state, "PATH=" + os.Getenv("PATH"), "SECRET=from-caller"}
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
