// Package unixusertest runs a test binary again as an unprivileged user
// (nobody): what a test running as root (as CI does) needs for the clauses
// that root bypasses, such as permissions. The host runner's tests, the
// conformance suite's mutants and the workspace store's tests use it.
package unixusertest

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Nobody is the uid and gid AsNobody runs a command as.
const Nobody = 65534

// AsNobody makes cmd, which runs this test binary again (cmd.Path
// os.Args[0] or os.Executable()), run it as Nobody: the binary copied where
// Nobody may execute it (a test binary's own directory is root's, 0700),
// a home and temporary directory of Nobody's own, cmd.Dir there, and an
// environment of PATH, HOME, TMPDIR and the TAI42_ variables cmd.Env
// holds. Everything is removed at the end of t. The host runner is
// documented to work for an ordinary user; CI runs as root, so this is how
// its clauses that root bypasses (permissions) run there.
func AsNobody(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	dir, err := os.MkdirTemp("", "tai42-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	home := filepath.Join(dir, "home")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, Nobody, Nobody); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(cmd.Path))
	copyExecutable(t, cmd.Path, bin)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TMPDIR=" + home}
	for _, kv := range cmd.Env {
		if strings.HasPrefix(kv, "TAI42_") {
			env = append(env, kv)
		}
	}
	cmd.Path, cmd.Dir, cmd.Env = bin, home, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: Nobody, Gid: Nobody}}
}

func copyExecutable(t testing.TB, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// CombinedOutput runs cmd (not started) under ctx as cmd.CombinedOutput
// does, starting it again
// while the kernel says its binary is busy (ETXTBSY): a process another
// goroutine forked while AsNobody's copy of the binary was open for
// writing holds that descriptor until it execs, a moment later.
func CombinedOutput(ctx context.Context, cmd *exec.Cmd) ([]byte, error) {
	for try := 0; ; try++ {
		c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
		c.Env, c.Dir, c.SysProcAttr, c.WaitDelay = cmd.Env, cmd.Dir, cmd.SysProcAttr, cmd.WaitDelay
		out, err := c.CombinedOutput()
		if !errors.Is(err, syscall.ETXTBSY) || try == 50 {
			return out, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
