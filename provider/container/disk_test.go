package container_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// diskMB is the small cap the disk tests run with.
const diskMB = 48

// newDiskProvider makes a provider on runtime rt with a disk cap of mb MiB
// and inodes inodes (0: the default ratio), closed at the end of t.
func newDiskProvider(t testing.TB, rt string, mb, inodes int) *testProvider {
	t.Helper()
	opts := containertest.Options(t, rt, permissive)
	opts.ReapInterval = -1
	opts.DiskMB, opts.DiskInodes = mb, inodes
	return &testProvider{sb: containertest.New(t, opts), opts: opts, rt: rt}
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

// allocated sums the bytes the host's filesystem holds for paths.
func allocated(t testing.TB, paths []string) int64 {
	t.Helper()
	var n int64
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		n += st.Blocks * 512
	}
	return n
}

// openersOf lists the open file descriptors, of any process, on paths
// (removed or not).
func openersOf(t testing.TB, paths []string) []string {
	t.Helper()
	want := map[string]bool{}
	for _, p := range paths {
		want[p], want[p+" (deleted)"] = true, true
	}
	fds, err := filepath.Glob("/proc/[0-9]*/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && want[target] {
			out = append(out, fd+" -> "+target)
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
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
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
		imgs := p.images(t)
		if len(imgs) == 0 {
			t.Fatal("no disk image while a session lives")
		}
		// The host's space is the images' allocated blocks: a comparison of
		// the host's free space would count what other tests write meanwhile.
		if used := allocated(t, imgs); used < diskMB<<20*7/10 {
			t.Errorf("the full session's disk images hold %d MiB of the host, want about the cap (%d MiB)", used>>20, diskMB)
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
		// Unlinked and detached, an image's blocks are free unless a process
		// still holds it open.
		if held := openersOf(t, imgs); len(held) != 0 {
			t.Errorf("destroyed disk images still held open, so their space is not back: %v", held)
		}
	})
}

// TestDiskCopies: with no pool, each create copies the provider's empty
// disk: every session's disk has a filesystem of its own (a UUID of its
// own, seen as statfs' f_fsid of its /workspace), holds its owner's
// directories and nothing a session before it wrote, and takes little of
// the host until written to.
func TestDiskCopies(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		opts := containertest.Options(t, rt, permissive)
		opts.ReapInterval, opts.DiskPool = -1, -1
		p := &testProvider{sb: containertest.New(t, opts), opts: opts, rt: rt}
		fsids := map[string]bool{}
		for i := range 3 {
			sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
			if used := allocated(t, p.images(t)); used > 1<<20 {
				t.Errorf("session %d's new disk holds %d KiB of the host, want under 1 MiB", i, used>>10)
			}
			out := mustSh(t, sess, `stat -f -c %i /workspace; ls -A /workspace /tmp; stat -c '%a %u' / /tmp /workspace`)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			fsids[lines[0]] = true
			if want := []string{"/tmp:", "", "/workspace:", "755 0", "1777 0", "700 0"}; !slices.Equal(lines[1:], want) {
				t.Errorf("session %d's disk: %q; want an empty /tmp and /workspace, modes and owner %q", i, lines[1:], want)
			}
			mustSh(t, sess, `echo left > /workspace/f; echo left > /tmp/f; echo left > /f`)
			if err := sess.Destroy(ctxFor(t)); err != nil {
				t.Fatal(err)
			}
		}
		if len(fsids) != 3 {
			t.Errorf("3 sessions' disks have the filesystem ids %v; want 3 different ones", fsids)
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
	sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
	other := newDiskProvider(t, "crun", diskMB, 0)
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	wg.Go(func() {
		sp := spec(containertest.Busybox, sandbox.NetworkNone)
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

// TestDiskRecover: after a crash (the provider abandoned, as a SIGKILL
// leaves it), a provider with the same ledger keeps the kept sessions'
// disks working (a write to the cap still ends in ENOSPC, /tmp's files are
// there) and sweeps the rest: the crashed provider's pool disks and the
// disk of a session the ledger no longer holds. After its Close no loop
// device, disk mount or ephemeral image is left; the persistent image is.
func TestDiskRecover(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		opts := recoverOptions(t, rt, container.UserNamespaceAuto)
		opts.DiskMB = diskMB
		sbA, ledger, crash := crashable(t, opts)
		sp := spec(containertest.Busybox, sandbox.NetworkNone)
		sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "disk-"+randomToken(6)
		kept := []*crashSession{
			{name: "ephemeral", spec: spec(containertest.Busybox, sandbox.NetworkNone)},
			{name: "persistent", spec: sp},
		}
		for _, s := range kept {
			makeCrashSession(t, sbA, s)
		}
		gone := &crashSession{name: "dropped", spec: spec(containertest.Busybox, sandbox.NetworkNone)}
		makeCrashSession(t, sbA, gone)
		crash()
		if err := ledger.Delete(ctxFor(t), gone.id); err != nil {
			t.Fatal(err)
		}
		opts.Ledger = ledger
		sb, err := container.New(opts)
		if err != nil {
			t.Fatalf("a new provider with the crashed one's ledger: %v", err)
		}
		p := &testProvider{sb: sb, opts: opts, rt: rt}
		for _, s := range kept {
			sess, err := sb.GetSession(ctxFor(t), s.id)
			if err != nil {
				t.Fatalf("%s: GetSession after the recovery: %v", s.name, err)
			}
			if out := strings.TrimSpace(mustSh(t, sess, `cat /workspace/hello; echo; cat /tmp/bg.pid >/dev/null && echo tmp`)); out != s.token+"\ntmp" {
				t.Errorf("%s: its workspace file and its /tmp after the recovery: %q", s.name, out)
			}
			res := sh(t, sess, `dd if=/dev/zero of=/workspace/big bs=1M 2>&1`)
			if res.ExitCode == 0 || !strings.Contains(res.Stdout, "No space left") {
				t.Errorf("%s: dd past the cap after the recovery: exit %d, %q", s.name, res.ExitCode, res.Stdout)
			}
			mustSh(t, sess, `rm /workspace/big`)
		}
		// The dropped session's image and the crashed pool's are gone:
		// what is left is the kept sessions' disks (each has one, the
		// persistent one for its root's upper layer) and the new pool's.
		records, err := ledger.Load(ctxFor(t))
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, r := range records {
			var h struct{ Disk string }
			if err := json.Unmarshal(r.Handle, &h); err != nil || h.Disk == "" {
				t.Fatalf("session %s's handle %s names no disk (%v)", r.ID, r.Handle, err)
			}
			want = append(want, filepath.Join(p.root(), "disks", h.Disk+".img"))
		}
		if len(want) != len(kept) {
			t.Fatalf("the ledger holds %d sessions, want the %d kept", len(want), len(kept))
		}
		pool := poolDisks(t, sb)
		if len(pool) != container.DefaultDiskPool {
			t.Errorf("the new provider's pool holds %d disks, want %d", len(pool), container.DefaultDiskPool)
		}
		for _, d := range pool {
			want = append(want, d+".img")
		}
		disks, _ := filepath.Glob(filepath.Join(p.root(), "disks", "*.img"))
		slices.Sort(want)
		if !slices.Equal(disks, want) {
			t.Errorf("after the recovery the disks directory holds %v; want the kept sessions' and the new pool's: %v", disks, want)
		}
		if loops := loopsUnder(t, filepath.Join(p.root(), "disks")); len(loops) != len(want) {
			t.Errorf("after the recovery the loop devices on the state directory's files are %v; want one for each of %v", loops, want)
		}
		// The persistent workspace outlives the sessions, with its files.
		if err := sb.Close(ctxFor(t)); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if imgs := p.images(t); len(imgs) != 1 || filepath.Base(imgs[0]) != sp.WorkspaceKey+".img" {
			t.Errorf("images after Close: %v; want the persistent workspace's alone", imgs)
		}
		if l := loopsUnder(t, p.root()); len(l) != 0 {
			t.Errorf("loop devices left after Close: %v", l)
		}
		if m, err := mountsUnder("/proc/self/mountinfo", p.root()); err != nil || len(m) != 0 {
			t.Errorf("mounts left after Close: %v %v", m, err)
		}
		opts.Ledger = nil
		again := &testProvider{sb: containertest.New(t, opts), opts: opts, rt: rt}
		sess := again.session(t, sp)
		if out := strings.TrimSpace(mustSh(t, sess, `cat /workspace/hello; ls -A /workspace`)); out != kept[1].token+"hello" {
			t.Errorf("the persistent workspace in a later session: %q", out)
		}
	})
}

// TestDiskPersistent: a persistent workspace is an image kept with its
// key: its files survive a session that filled it to the cap; df shows the
// cap; lost+found is not in it; workspace ls gives the image's host size
// and rm deletes it; a legacy plain directory is moved into an image at the
// key's next create.
func TestDiskPersistent(t *testing.T) {
	p := newDiskProvider(t, "crun", diskMB, 0)
	key := "pers-" + randomToken(6)
	sp := spec(containertest.Busybox, sandbox.NetworkNone)
	sp.Durability, sp.WorkspaceKey = sandbox.Persistent, key
	sess := p.session(t, sp)
	if size := dfSize(t, sess, "/workspace"); size > diskMB<<10 || size < diskMB<<10*7/10 {
		t.Errorf("df /workspace shows %d KiB, want about the cap (%d KiB)", size, diskMB<<10)
	}
	mustSh(t, sess, `echo keep > /workspace/keep && [ ! -e /workspace/lost+found ]`)
	res := sh(t, sess, `dd if=/dev/zero of=/workspace/big bs=1M 2>&1`)
	if res.ExitCode == 0 || !strings.Contains(res.Stdout, "No space left") {
		t.Fatalf("dd past the cap: exit %d, %q", res.ExitCode, res.Stdout)
	}
	if err := sess.Destroy(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	ws, err := p.sb.ListWorkspaces(ctxFor(t))
	if err != nil || len(ws) != 1 || ws[0].Key != key || ws[0].SizeBytes < diskMB<<20*7/10 {
		t.Fatalf("Workspaces: %+v, %v; want %s at about the cap (the full image's host blocks)", ws, err, key)
	}
	sess = p.session(t, sp)
	if out := strings.TrimSpace(mustSh(t, sess, `cat /workspace/keep; rm /workspace/big; ls /workspace`)); out != "keep\nkeep" {
		t.Errorf("the workspace after a session that filled it: %q", out)
	}
	if err := sess.Destroy(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if err := p.sb.RemoveWorkspace(ctxFor(t), key); err != nil {
		t.Fatal(err)
	}
	if imgs, _ := filepath.Glob(filepath.Join(p.root(), "workspaces", "*.img*")); len(imgs) != 0 {
		t.Errorf("workspace images after the workspace's removal: %v", imgs)
	}
	// A plain directory of an earlier version: moved into an image.
	legacy := filepath.Join(p.root(), "workspaces", "old")
	if err := os.MkdirAll(filepath.Join(legacy, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, "sub", "f"), []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/f", filepath.Join(legacy, "link")); err != nil {
		t.Fatal(err)
	}
	sp.WorkspaceKey = "old"
	sess = p.session(t, sp)
	if out := strings.TrimSpace(mustSh(t, sess, `cat /workspace/link; stat -c %a /workspace/sub/f; readlink /workspace/link`)); out != "old640\nsub/f" {
		t.Errorf("the migrated workspace: %q", out)
	}
	if _, err := os.Lstat(legacy); !os.IsNotExist(err) {
		t.Errorf("the legacy directory after its move into an image: %v", err)
	}
}

// TestDiskTooSmall: a cap below what a session's start needs fails the
// create, naming the cap, and leaves no mount, loop device or image.
func TestDiskTooSmall(t *testing.T) {
	p := newDiskProvider(t, "crun", 1, 16)
	_, err := p.sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone))
	if err == nil || !strings.Contains(err.Error(), "cap") {
		t.Fatalf("a create with a 1 MiB, 16 inode disk: %v; want an error naming the cap", err)
	}
	t.Log(err)
	p.closeWait(t)
	if imgs := p.images(t); len(imgs) != 0 {
		t.Errorf("images left: %v", imgs)
	}
	if l := loopsUnder(t, p.root()); len(l) != 0 {
		t.Errorf("loop devices left: %v", l)
	}
	if m, err := mountsUnder("/proc/self/mountinfo", p.root()); err != nil || len(m) != 0 {
		t.Errorf("mounts left: %v %v", m, err)
	}
}

// TestDiskReserve: a create is refused when the state directory's
// filesystem has less free than the reserve, naming both.
func TestDiskReserve(t *testing.T) {
	opts := containertest.Options(t, "crun", permissive)
	opts.ReapInterval = -1
	opts.DiskMB, opts.DiskReserveMB = diskMB, 1<<30 // 1 PiB: more than any disk here
	sb := containertest.New(t, opts)
	_, err := sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone))
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "MiB free, less than the disk reserve of 1073741824 MiB") {
		t.Fatalf("a create under the reserve: %v; want a SandboxError naming the free space and the reserve", err)
	}
}

// TestDiskNoReservedBlocks: a session's disk, ephemeral or a persistent
// workspace's image, keeps no blocks for root alone (mkfs.ext4 reserves
// 5 % by default, which the session would not see as available; the cap
// tests' 70-80 % thresholds would not notice): statfs in the session shows
// as many blocks available as free, but for the kernel's own reserve
// (reserved_clusters: 2 % or 4096 clusters, whichever is fewer), which
// ext4 keeps for the metadata of writes already accepted and which is not
// zeroed: without it a full disk could fail a write back after its
// write(2) returned.
func TestDiskNoReservedBlocks(t *testing.T) {
	p := newDiskProvider(t, "crun", diskMB, 0)
	pers := spec(containertest.Busybox, sandbox.NetworkNone)
	pers.Durability, pers.WorkspaceKey = sandbox.Persistent, "reserved-"+randomToken(6)
	for _, c := range []struct {
		name  string
		sp    sandbox.SessionSpec
		paths []string
	}{
		{"ephemeral", spec(containertest.Busybox, sandbox.NetworkNone), []string{"/", "/tmp", "/workspace"}},
		{"persistent", pers, []string{"/workspace"}},
	} {
		sess := p.session(t, c.sp)
		resv := kernelReserve(t, p)
		for _, path := range c.paths {
			out := strings.Fields(mustSh(t, sess, `stat -f -c '%S %f %a' "$1"`, path))
			if len(out) != 3 || out[0] != "4096" {
				t.Fatalf("%s: stat -f %s: %q; want a block size of 4096 and two counts", c.name, path, out)
			}
			free, _ := strconv.ParseInt(out[1], 10, 64)
			avail, _ := strconv.ParseInt(out[2], 10, 64)
			if free-avail != resv {
				t.Errorf("%s: statfs of %s shows %d blocks free and %d available: %d reserved beyond the kernel's own %d", c.name, path, free, avail, free-avail-resv, resv)
			}
		}
	}
}

// kernelReserve is the clusters (blocks: no bigalloc) the kernel keeps
// back on each of the provider's disks, all of one size; it fails t when
// they differ or there is none.
func kernelReserve(t testing.TB, p *testProvider) int64 {
	t.Helper()
	resv := int64(-1)
	for _, l := range loopsUnder(t, p.root()) {
		dev, _, _ := strings.Cut(l, "=")
		b, err := os.ReadFile(filepath.Join("/sys/fs/ext4", dev, "reserved_clusters"))
		if err != nil {
			continue // attached, not mounted yet
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || (resv >= 0 && n != resv) {
			t.Fatalf("the kernel's reserve on %s: %q (%v); the others' %d", l, b, err, resv)
		}
		resv = n
	}
	if resv < 0 {
		t.Fatal("no disk of the provider is mounted")
	}
	return resv
}

// TestDiskWorkspaceKeysEndingInNew: a workspace key may end in ".new" (or
// ".img.new"), which a migration's image and mount point were once named
// by: such a key's workspace is never taken for a migration's leftover.
// While a session of "data.new" runs, the plain directory of key "data"
// moves into its image; a provider starting on the state directory keeps
// the plain directories of keys "notes.img.new" and "empty.img.new" (from
// before the disk cap) and removes what an earlier version's interrupted
// migration left (old.img.new, +mnt/old.new); then every key's files are
// there.
func TestDiskWorkspaceKeysEndingInNew(t *testing.T) {
	containertest.Require(t)
	opts := containertest.Options(t, "crun", permissive)
	opts.ReapInterval = -1
	opts.DiskMB = diskMB
	sb, err := container.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			sb.Close(context.Background())
		}
	})
	p := &testProvider{sb: sb, opts: opts, rt: "crun"}
	perDir := filepath.Join(p.root(), "workspaces")
	persistent := func(key string) sandbox.SessionSpec {
		sp := spec(containertest.Busybox, sandbox.NetworkNone)
		sp.Durability, sp.WorkspaceKey = sandbox.Persistent, key
		return sp
	}
	plainDir := func(key, content string) {
		t.Helper()
		dir := filepath.Join(perDir, key)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if content != "" {
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	create := func(sb *kit.Sandbox, key string) sandbox.Session {
		t.Helper()
		sess, err := sb.CreateSession(ctxFor(t), persistent(key))
		if err != nil {
			t.Fatalf("CreateSession of key %q: %v", key, err)
		}
		return sess
	}
	destroy := func(sess sandbox.Session) {
		t.Helper()
		if err := sess.Destroy(ctxFor(t)); err != nil {
			t.Fatal(err)
		}
	}

	dataNew := create(sb, "data.new")
	mustSh(t, dataNew, `echo new > /workspace/f`)
	plainDir("data", "old")
	data := create(sb, "data")
	if out := mustSh(t, data, `cat /workspace/f`); out != "old" {
		t.Errorf("key data, moved into its image while key data.new's session ran: %q", out)
	}
	destroy(data)
	destroy(dataNew)

	plainDir("notes.img.new", "notes")
	plainDir("empty.img.new", "")
	if err := os.WriteFile(filepath.Join(perDir, "old.img.new"), []byte("half an image"), 0o600); err != nil {
		t.Fatal(err)
	}
	plainDir(filepath.Join("+mnt", "old.new"), "")
	if err := sb.Close(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	closed = true

	sb = containertest.New(t, opts)
	for _, left := range []string{"old.img.new", "+mnt/old.new"} {
		if _, err := os.Lstat(filepath.Join(perDir, left)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, left by an interrupted migration of an earlier version, is still there after a start (%v)", left, err)
		}
	}
	ws, err := sb.ListWorkspaces(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, w := range ws {
		keys = append(keys, w.Key)
	}
	if want := []string{"data", "data.new", "empty.img.new", "notes.img.new"}; !slices.Equal(keys, want) {
		t.Errorf("the workspaces after a start: %q, want %q", keys, want)
	}
	for key, want := range map[string]string{"data": "old", "data.new": "new\n", "notes.img.new": "notes", "empty.img.new": ""} {
		sess := create(sb, key)
		if out := mustSh(t, sess, `cat /workspace/f 2>/dev/null; true`); out != want {
			t.Errorf("key %s after a start: its file holds %q, want %q", key, out, want)
		}
		destroy(sess)
	}
}
