package container_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/containersuite"
)

// diskMB is the small cap the disk tests run with.
const diskMB = 48

// newDiskProvider makes a provider on runtime rt with a disk cap of mb MiB
// and inodes inodes (0: the default ratio), closed at the end of t.
func newDiskProvider(t testing.TB, rt string, mb, inodes int) *testProvider {
	t.Helper()
	opts := containersuite.Options(t, rt, permissive)
	opts.ReapInterval = -1
	opts.DiskMB, opts.DiskInodes = mb, inodes
	return &testProvider{sb: containersuite.New(t, opts), opts: opts, rt: rt}
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			out = append(out, e.Name()+"="+strings.TrimSpace(string(b)))
		}
	}
	return out
}

// images lists the image files under the provider's disks and workspaces
// directories.
func (p *testProvider) images(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, d := range []string{"disks", "workspaces"} {
		m, _ := filepath.Glob(filepath.Join(p.root(), d, "*.img*"))
		out = append(out, m...)
	}
	return out
}

// dfLine is `df -k PATH`'s figures in the session: size and available KiB.
func dfSize(t testing.TB, sess sandbox.Session, path string) int64 {
	t.Helper()
	out := mustSh(t, sess, `df -k "$1" | tail -n 1`, path)
	f := strings.Fields(out)
	if len(f) < 4 {
		t.Fatalf("df -k %s: %q", path, out)
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df -k %s: %q", path, out)
	}
	return n
}

// TestDiskCapEphemeral: writes in /, /tmp and /workspace share one cap: dd
// past it fails with "No space left", having written about the cap; df
// shows it in each; after destroy the image, its loop device and its mount
// are gone, and the host has its space back.
func TestDiskCapEphemeral(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		p := newDiskProvider(t, rt, diskMB, 0)
		var before unix.Statfs_t
		if err := unix.Statfs(p.root(), &before); err != nil {
			t.Fatal(err)
		}
		sess := p.session(t, spec(containersuite.Busybox, sandbox.NetworkNone))
		for _, path := range []string{"/", "/tmp", "/workspace"} {
			size := dfSize(t, sess, path)
			if size > diskMB<<10 || size < diskMB<<10*8/10 {
				t.Errorf("df %s in the session shows %d KiB, want about the cap (%d KiB)", path, size, diskMB<<10)
			}
		}
		for _, path := range []string{"/f", "/tmp/f", "/workspace/f"} {
			res := sh(t, sess, `dd if=/dev/zero of="$1" bs=1M 2>&1; rc=$?; ls -l "$1"; exit $rc`, path)
			if res.ExitCode == 0 || !strings.Contains(res.Stdout, "No space left") {
				t.Fatalf("dd to %s past the cap: exit %d, %q; want a failure saying No space left", path, res.ExitCode, res.Stdout)
			}
			f := strings.Fields(strings.TrimSpace(res.Stdout[strings.LastIndex(strings.TrimSpace(res.Stdout), "\n")+1:]))
			size, _ := strconv.ParseInt(f[4], 10, 64)
			if size < diskMB<<20*7/10 || size > diskMB<<20 {
				t.Errorf("dd to %s wrote %d bytes before ENOSPC, want about the cap (%d MiB)", path, size, diskMB)
			}
			mustSh(t, sess, `rm -f "$1"`, path)
		}
		// Full once more, then destroyed: its space comes back.
		sh(t, sess, `dd if=/dev/zero of=/workspace/f bs=1M`)
		if imgs := p.images(t); len(imgs) == 0 {
			t.Fatal("no disk image while a session lives")
		}
		if err := sess.Destroy(ctxFor(t)); err != nil {
			t.Fatal(err)
		}
		p.closeWait(t)
		if imgs := p.images(t); len(imgs) != 0 {
			t.Errorf("disk images left after destroy and close: %v", imgs)
		}
		if l := loopsUnder(t, p.root()); len(l) != 0 {
			t.Errorf("loop devices left after destroy and close: %v", l)
		}
		var after unix.Statfs_t
		if err := unix.Statfs(p.root(), &after); err != nil {
			t.Fatal(err)
		}
		// Other tests write meanwhile: allow them a quarter of the cap.
		if lost := (int64(before.Bavail) - int64(after.Bavail)) * before.Bsize; lost > diskMB<<20/4 {
			t.Errorf("the host's free space is %d MiB less than before the session", lost>>20)
		}
	})
}

// closeWait closes p's sandbox now (its cleanup closes it again, a no-op).
func (p *testProvider) closeWait(t testing.TB) {
	t.Helper()
	if err := p.sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestDiskCapInodes: a session that makes files runs out of inodes at its
// cap; meanwhile another provider's persistent session writes and
// creates and destroys go on.
func TestDiskCapInodes(t *testing.T) {
	p := newDiskProvider(t, "crun", diskMB, 2048)
	sess := p.session(t, spec(containersuite.Busybox, sandbox.NetworkNone))
	other := newDiskProvider(t, "crun", diskMB, 0)
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	wg.Go(func() {
		sp := spec(containersuite.Busybox, sandbox.NetworkNone)
		sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "busy"
		for i := range 4 {
			s, err := other.sb.CreateSession(ctxFor(t), sp)
			if err != nil {
				errs <- "create: " + err.Error()
				return
			}
			if err := s.PutFile(ctxFor(t), "f"+strconv.Itoa(i), []byte("x")); err != nil {
				errs <- "put: " + err.Error()
			}
			if r := sh(t, s, `ls /workspace | wc -l`); strings.TrimSpace(r.Stdout) != strconv.Itoa(i+1) {
				errs <- "ls: " + r.Stdout
			}
			if err := s.Destroy(ctxFor(t)); err != nil {
				errs <- "destroy: " + err.Error()
			}
		}
	})
	res := sh(t, sess, `i=0; while err=$(mkdir /workspace/f$i 2>&1); do i=$((i+1)); done; echo $i; echo "$err"`)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error("the other provider's persistent session: " + e)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	n, _ := strconv.Atoi(lines[0])
	if n < 1800 || n > 2048 || !strings.Contains(res.Stdout, "No space left") {
		t.Errorf("a session with 2048 inodes made %d files before %+v; want a little under 2048 and No space left", n, res)
	}
}
