package container_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// TestEscapeInitStdio: PID 1's stdout and stderr are no host file a
// session can reach through /proc/1/fd: writing 100 MiB there grows
// nothing on the state directory's filesystem (a session without a user
// namespace is host root, which could open the runtime's log file in the
// bundle and write past the disk cap), and /proc/1/fd names no host path.
func TestEscapeInitStdio(t *testing.T) {
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		// Control: the session sees PID 1's descriptors at all, so that
		// an empty answer below is not a probe that could not look.
		links := mustSh(t, sess, `for f in /proc/1/fd/*; do echo "$f $(readlink $f)"; done`)
		if !strings.Contains(links, "/proc/1/fd/1 ") {
			t.Fatalf("control: the session does not list PID 1's descriptors: %q", links)
		}
		for line := range strings.Lines(links) {
			if strings.Contains(line, p.opts.StateDir) || strings.Contains(line, sess.ID()) {
				t.Errorf("PID 1's descriptor names a host path: %q", strings.TrimSpace(line))
			}
		}

		before := allocatedUnder(t, p.opts.StateDir)
		const size = 100 << 20
		for _, fd := range []string{"1", "2"} {
			res := sh(t, sess, `dd if=/dev/zero of=/proc/1/fd/$1 bs=1M count=100 2>&1`, fd)
			t.Logf("dd to /proc/1/fd/%s: exit %d, %s", fd, res.ExitCode, strings.TrimSpace(res.Stdout))
		}
		if grown := allocatedUnder(t, p.opts.StateDir) - before; grown > size/4 {
			t.Errorf("writing %d MiB to PID 1's stdout and stderr grew the state directory's filesystem by %d MiB", 2*size>>20, grown>>20)
		}
	})
}

// allocatedUnder is the space the files under dir that are on dir's own
// filesystem take there (mounts below it, the sessions' roots and disks,
// are not walked).
func allocatedUnder(t testing.TB, dir string) int64 {
	t.Helper()
	var top syscall.Stat_t
	if err := syscall.Stat(dir, &top); err != nil {
		t.Fatal(err)
	}
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) || os.IsPermission(err) {
				return nil // gone meanwhile, or a session's root the walk may not enter
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || st.Dev != top.Dev {
			if d.IsDir() && path != dir {
				return filepath.SkipDir
			}
			return nil
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", dir, err)
	}
	return total
}
