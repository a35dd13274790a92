package host_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/unixuser/unixusertest"
)

// TestUnprivileged runs the host runner's conformance suite again as
// nobody, when this test runs as root (as CI does): the runner is also
// documented to work for an ordinary user, where network none and caps are
// rejected, a file of mode 000 cannot be read (Files/PermissionDenied runs)
// and a tai42-host tracking cgroup a root run left behind cannot be
// written, and an exec as another user is refused
// (TestExecUserUnprivileged). It re-runs this test binary, copied where
// nobody may execute it, with a home and temporary directory of nobody's
// own, and fails if that run fails.
func TestUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: TestConformance already runs as an unprivileged user here")
	}
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.Command(self, "-test.run=^(TestConformance|TestExecUserUnprivileged)$", "-test.count=1", "-test.v")
	unixusertest.AsNobody(t, cmd)
	out, err := unixusertest.CombinedOutput(ctx, cmd)
	if err != nil {
		t.Fatalf("the conformance suite as uid %d failed: %v\n%s", unixusertest.Nobody, err, failures(out))
	}
	if !strings.Contains(string(out), "--- PASS: TestExecUserUnprivileged") && !strings.Contains(string(out), "--- SKIP: TestExecUserUnprivileged") {
		t.Errorf("the run as uid %d did not run TestExecUserUnprivileged:\n%s", unixusertest.Nobody, failures(out))
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
