package host_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nobody is the uid and gid the unprivileged run takes.
const nobody = 65534

// TestUnprivileged runs the host runner's conformance suite again as
// nobody, when this test runs as root (as CI does): the runner is also
// documented to work for an ordinary user, where network none and caps are
// rejected, a file of mode 000 cannot be read (Files/PermissionDenied runs)
// and a tai42-host tracking cgroup a root run left behind cannot be
// written. It re-runs this test binary, copied where nobody may execute it,
// with a home and temporary directory of nobody's own, and fails if that
// run fails.
func TestUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: TestConformance already runs as an unprivileged user here")
	}
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A directory of its own outside t.TempDir (0700, root's): nobody
	// must reach the binary and own its home.
	dir, err := os.MkdirTemp("", "tai42-host-nobody-")
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
	if err := os.Chown(home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "host.test")
	copyExecutable(t, self, bin)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestConformance$", "-test.count=1", "-test.v")
	cmd.Dir = home
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TMPDIR=" + home}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the conformance suite as uid %d failed: %v\n%s", nobody, err, failures(out))
	}
	// What the unprivileged run skipped: only what needs root (network
	// none, caps).
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, "--- SKIP") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

// failures keeps the lines of a verbose test run that tell what failed,
// and the end of the run.
func failures(out []byte) string {
	var b strings.Builder
	lines := strings.Split(string(out), "\n")
	for i, line := range lines {
		if strings.Contains(line, "--- FAIL") || strings.Contains(line, ".go:") || i >= len(lines)-20 {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func copyExecutable(t *testing.T, src, dst string) {
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
