package hardening

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"

	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
)

// TestMain removes what the tests built once (the probe, the shared rootfs)
// and fails the run on a leaked goroutine or file descriptor.
func TestMain(m *testing.M) {
	// Start os/exec's machinery (the poller's descriptors) before counting.
	_ = exec.Command("true").Run()
	fdsBefore, fdErr := openFDs()

	code := m.Run()

	if err := removeSharedRootfs(); err != nil {
		fmt.Fprintf(os.Stderr, "removing the shared rootfs: %v\n", err)
		code = 1
	}
	if err := escapeprobetest.Cleanup(); err != nil {
		fmt.Fprintf(os.Stderr, "removing the escape probe: %v\n", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "leaked goroutines: %v\n", err)
			code = 1
		}
	}
	if code == 0 && fdErr == nil {
		fdsAfter, err := openFDs()
		if err == nil && fdsAfter > fdsBefore {
			fmt.Fprintf(os.Stderr, "leaked file descriptors: %d open before the tests, %d after\n", fdsBefore, fdsAfter)
			code = 1
		}
	}
	os.Exit(code)
}

func openFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	return len(ents) - 1, nil // less the directory's own
}
