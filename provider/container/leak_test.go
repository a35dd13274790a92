package container_test

// The leak tests: many sessions of every kind created and destroyed (or
// left live for the provider's Close), then a census of everything a
// session is made of, on the machine and in this process. Nothing may
// remain but the network manager's shared bridges and its fixed table.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// leakCycles is how many sessions TestLeakCycles makes per runtime in
// each user namespace mode, and leakWorkers how many at once.
var leakCycles = map[container.UserNamespaceMode]int{container.UserNamespaceOn: 100, container.UserNamespaceOff: 50}

const leakWorkers = 4

// TestLeakCycles creates and destroys leakCycles sessions per runtime and
// user namespace mode, mixing images, network tiers, caps, an exec still
// running at the destroy (blocking and interactive), a process that left
// its group (setsid), a streamed exec and file transfers; then checks that
// nothing of them remains, and that this process's descriptors and
// goroutines are back to where they were.
func TestLeakCycles(t *testing.T) {
	forEachRuntimeMode(t, func(t *testing.T, p *testProvider) {
		cycles := leakCycles[p.opts.UserNamespace]
		warmUp(t, p)
		base := takeBaseline(t)

		var mu sync.Mutex
		var ids []string
		var wg sync.WaitGroup
		start := time.Now()
		for w := range leakWorkers {
			wg.Go(func() {
				for i := w; i < cycles; i += leakWorkers {
					id, err := leakCycle(p, images[i%2], i)
					if id != "" {
						mu.Lock()
						ids = append(ids, id)
						mu.Unlock()
					}
					if err != nil {
						t.Errorf("cycle %d (session %s): %v", i, id, err)
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d sessions created and destroyed in %v", len(ids), time.Since(start))
		if len(ids) != cycles {
			t.Errorf("%d of %d cycles made a session", len(ids), cycles)
		}
		checkNoLeaks(t, p, ids, base, true)
	})
}

// TestLeakClose leaves sessions of every kind live, with execs running in
// them, and closes the provider: the Close must destroy them all and
// leave nothing, the runtime's own mount namespace included.
func TestLeakClose(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		// The shared network manager's bridges, table and namespace pool
		// belong to the process, not to this provider: make them first.
		warm := newProvider(t, rt)
		warmUp(t, warm)
		if err := warm.sb.Close(ctxFor(t)); err != nil {
			t.Fatalf("closing the warm-up provider: %v", err)
		}
		base := takeBaseline(t)

		p := newProvider(t, rt)
		var ids []string
		var waits []func() error
		for i := range 8 {
			sp := spec(images[i%2], []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress}[i%3])
			if i%4 == 0 {
				sp.CPU, sp.MemoryMB = 0.5, 128
			}
			sess, err := p.sb.CreateSession(ctxFor(t), sp)
			if err != nil {
				t.Fatalf("CreateSession: %v", err)
			}
			ids = append(ids, sess.ID())
			w, err := leaveRunning(sess, i)
			if err != nil {
				t.Fatalf("session %s: %v", sess.ID(), err)
			}
			waits = append(waits, w)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		if err := p.sb.Close(ctx); err != nil {
			t.Errorf("Close with %d live sessions: %v", len(ids), err)
		}
		t.Logf("Close destroyed %d live sessions in %v", len(ids), time.Since(start))
		for i, w := range waits {
			if err := w(); err != nil {
				t.Errorf("session %s: %v", ids[i], err)
			}
		}
		if _, err := p.sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone)); err == nil {
			t.Error("CreateSession succeeded after Close")
		}
		checkNoLeaks(t, p, ids, base, false)
	})
}

// warmUp makes and destroys a session of each bridged tier, so that the
// shared network manager's bridges, table and namespace pool exist before
// a baseline is taken.
func warmUp(t *testing.T, p *testProvider) {
	t.Helper()
	for _, tier := range []sandbox.Network{sandbox.NetworkInternal, sandbox.NetworkEgress} {
		sess, err := p.sb.CreateSession(ctxFor(t), spec(containertest.Busybox, tier))
		if err != nil {
			t.Fatalf("warm-up session: %v", err)
		}
		run(t, sess, "true")
		if err := sess.Destroy(ctxFor(t)); err != nil {
			t.Fatalf("warm-up destroy: %v", err)
		}
	}
	// Let the network manager's namespace pool refill: wait until this
	// process's descriptor count holds still.
	last, still := openFDs(t), 0
	for deadline := time.Now().Add(10 * time.Second); still < 5 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		n := openFDs(t)
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
}

// baseline is what this process and the machine hold before the sessions.
type baseline struct {
	fds        int
	fdList     []string
	foreignMnt []mountNSThread // threads outside the host's mount namespace
	goroutines goleak.Option   // ignores the goroutines alive at the baseline
	nft        nftState
	prefix     string
}

func takeBaseline(t *testing.T) baseline {
	t.Helper()
	prefix := netPrefix(t)
	if prefix == "" {
		t.Fatal("the shared network manager has no bridges after the warm-up")
	}
	return baseline{
		fds: openFDs(t), fdList: fdTargets(t), foreignMnt: threadsOutsideHostMountNS(t),
		goroutines: goleak.IgnoreCurrent(), nft: readNFT(t, prefix), prefix: prefix,
	}
}

// leakCycle makes session i of the mix of image, uses it, destroys it, and
// checks that whatever was running in it ended as a destroy ends it.
func leakCycle(p *testProvider, image string, i int) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	sp := spec(image, []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress}[i%3])
	if i%4 == 0 {
		sp.CPU, sp.MemoryMB = 0.5, 128
	}
	sess, err := p.sb.CreateSession(ctx, sp)
	if err != nil {
		return "", fmt.Errorf("create (image %s, network %s): %w", sp.Image, sp.Network, err)
	}
	wait, err := leaveRunning(sess, i)
	if derr := sess.Destroy(ctx); derr != nil {
		err = errors.Join(err, fmt.Errorf("destroy: %w", derr))
	}
	if wait != nil {
		err = errors.Join(err, wait())
	}
	return sess.ID(), err
}

// leaveRunning uses sess according to i's place in the mix and returns a
// function that, once the session is destroyed, checks how what it left
// running ended.
func leaveRunning(sess sandbox.Session, i int) (func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	gone := func(what string, err error) error {
		if !errors.Is(err, sandbox.ErrSessionNotFound) {
			return fmt.Errorf("%s ended with %v at the destroy, want a session-not-found error", what, err)
		}
		return nil
	}
	switch i % 5 {
	case 0: // a plain exec and file transfers
		res, err := sess.Exec(ctx, []string{"echo", "ok"}, sandbox.ExecOptions{Timeout: execTimeout})
		if err != nil || res.Stdout != "ok\n" {
			return nil, fmt.Errorf("echo ok: %+v, %v", res, err)
		}
		data := []byte(strings.Repeat("tai42 ", 100000))
		if err := sess.PutFile(ctx, "dir/file", data); err != nil {
			return nil, fmt.Errorf("PutFile: %w", err)
		}
		rc, size, err := sess.(sandbox.FileStreamer).OpenFile(ctx, "dir/file")
		if err != nil {
			return nil, fmt.Errorf("OpenFile: %w", err)
		}
		_, rerr := io.ReadFull(rc, make([]byte, 4096)) // read a part, close early
		rc.Close()
		if rerr != nil || size != int64(len(data)) {
			return nil, fmt.Errorf("OpenFile: size %d, read %v", size, rerr)
		}
		return func() error { return nil }, nil
	case 1: // a blocking exec still running at the destroy
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := sess.Exec(ctx, []string{"sleep", "600"}, sandbox.ExecOptions{Timeout: 10 * time.Minute})
			errc <- err
		}()
		time.Sleep(50 * time.Millisecond) // let it start (or not: both are fine)
		return func() error {
			select {
			case err := <-errc:
				return gone("a running exec", err)
			case <-time.After(30 * time.Second):
				return errors.New("a running exec did not end within 30s of the destroy")
			}
		}, nil
	case 2: // an interactive exec still running at the destroy
		h, err := sess.ExecStart(ctx, []string{"sh", "-c", "echo started; exec sleep 600"}, sandbox.StartOptions{Timeout: 10 * time.Minute})
		if err != nil {
			return nil, fmt.Errorf("ExecStart: %w", err)
		}
		item, err := h.Next(ctx)
		if c, ok := item.(*sandbox.StreamChunk); err != nil || !ok || string(c.Data) != "started\n" {
			return nil, fmt.Errorf("the interactive exec's first item: %#v, %v", item, err)
		}
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for {
				if _, err := h.Next(ctx); err != nil {
					kerr := h.Kill(ctx)
					return errors.Join(gone("an interactive exec", err), kerr)
				}
			}
		}, nil
	case 3: // a streamed exec run to its end, and a process that left its group
		h, err := sess.ExecStart(ctx, []string{"sh", "-c", "echo out; echo err >&2; cat"}, sandbox.StartOptions{Timeout: execTimeout})
		if err != nil {
			return nil, fmt.Errorf("ExecStart: %w", err)
		}
		if err := h.WriteStdin(ctx, []byte("hello\n")); err != nil {
			return nil, fmt.Errorf("WriteStdin: %w", err)
		}
		if err := h.CloseStdin(ctx); err != nil {
			return nil, fmt.Errorf("CloseStdin: %w", err)
		}
		var out, errOut strings.Builder
		exit := -1
		for {
			item, err := h.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("the streamed exec: %w", err)
			}
			switch it := item.(type) {
			case *sandbox.StreamChunk:
				if it.Stream == sandbox.Stderr {
					errOut.Write(it.Data)
				} else {
					out.Write(it.Data)
				}
			case *sandbox.StreamExit:
				exit = it.ExitCode
			}
		}
		if out.String() != "out\nhello\n" || errOut.String() != "err\n" || exit != 0 {
			return nil, fmt.Errorf("the streamed exec: stdout %q, stderr %q, exit %d", out.String(), errOut.String(), exit)
		}
		res, err := sess.Exec(ctx, []string{"sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 &"}, sandbox.ExecOptions{Timeout: execTimeout})
		if err != nil || res.ExitCode != 0 {
			return nil, fmt.Errorf("starting a process that leaves its group: %+v, %v", res, err)
		}
		return func() error { return nil }, nil
	default: // both kinds of running exec at once
		w1, err := leaveRunning(sess, 1)
		if err != nil {
			return nil, err
		}
		w2, err := leaveRunning(sess, 2)
		if err != nil {
			return nil, errors.Join(err, w1())
		}
		return func() error { return errors.Join(w1(), w2()) }, nil
	}
}

// checkNoLeaks is the census after the sessions ids are gone. open says
// whether the provider is still open (its runtime's mount namespace, for
// crun on a host with hybrid cgroups, then still exists and is checked;
// and its pool's disks, made ahead for no session yet, are its own: they
// alone may be left, and only then).
func checkNoLeaks(t *testing.T, p *testProvider, ids []string, base baseline, open bool) {
	t.Helper()
	var pool []string
	if open {
		pool = poolDisks(t, p.sb)
	}
	// Processes: none running the agent binary, none in a session's cgroup.
	agentStat, err := os.Stat(containertest.Agent(t))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := leftProcesses(t, agentStat, ids)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("processes left: %v", left)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Mounts: nothing under the state directory, in the host's mount
	// namespace nor in the runtime's own.
	if m := notPool(hostMountsUnder(t, p.opts.StateDir), pool); len(m) > 0 {
		t.Errorf("mounts left under the state directory: %v", m)
	}
	if m := hostMountsNaming(t, ids); len(m) > 0 {
		t.Errorf("mounts left whose mount point names a destroyed session: %v", m)
	}
	if d := hostPathsNaming(t, "/run/tai42", ids); len(d) > 0 {
		t.Errorf("left under /run/tai42 (where remapped sessions' roots are mounted): %v", d)
	}
	threads := threadsOutsideHostMountNS(t)
	var added []mountNSThread
	for _, th := range threads {
		if !slices.ContainsFunc(base.foreignMnt, func(b mountNSThread) bool { return b.tid == th.tid }) {
			added = append(added, th)
		}
	}
	// A locked thread whose goroutine ended is destroyed by the Go
	// runtime shortly after, not at once.
	for deadline := time.Now().Add(5 * time.Second); !open && len(added) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		threads = threadsOutsideHostMountNS(t)
		added = slices.DeleteFunc(added, func(a mountNSThread) bool {
			return !slices.ContainsFunc(threads, func(th mountNSThread) bool { return th.tid == a.tid })
		})
	}
	look := added
	switch {
	case len(added) > 0 && !open:
		t.Errorf("threads of this process still in another mount namespace after Close: %v", added)
	case open:
		look = threads
		if len(threads) == 0 && p.rt == "crun" && hybridCgroups() {
			t.Error("crun on a host with hybrid cgroups, but no thread of this process is in the runtime's mount namespace: the check could not look there")
		}
	}
	for _, th := range look {
		mi := fmt.Sprintf("/proc/self/task/%d/mountinfo", th.tid)
		all, err := mountsUnder(mi, "")
		if err != nil {
			t.Errorf("reading the mount table of thread %d: %v", th.tid, err)
			continue
		}
		var left []string
		for _, m := range notPool(all, pool) {
			if m == p.opts.StateDir || strings.HasPrefix(m, p.opts.StateDir+"/") || slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(m, id) }) {
				left = append(left, m)
			}
		}
		if len(left) > 0 {
			t.Errorf("mounts left in the mount namespace of thread %d: %v", th.tid, left)
		} else {
			t.Logf("the runtime's mount namespace (thread %d, %d mounts) holds nothing of the state directory or of the sessions", th.tid, len(all))
		}
	}

	// Disks: no loop device on a file of the state directory, no image
	// or mount point in the disks directory, no workspace image mount
	// point or half-made image (the pool's alone while open).
	if l := notPool(loopsUnder(t, p.opts.StateDir), pool); len(l) > 0 {
		t.Errorf("loop devices left on files of the state directory: %v", l)
	}
	for _, glob := range []string{"disks/*", "workspaces/+mnt/*", "workspaces/*+new"} {
		m, err := filepath.Glob(filepath.Join(p.root(), glob))
		if err != nil {
			t.Fatal(err)
		}
		if left := notPool(m, pool); len(left) > 0 {
			t.Errorf("disks left: %v", left)
		}
	}

	// Cgroups.
	for _, id := range ids {
		if d := cgroupDirs(id); len(d) > 0 {
			t.Errorf("cgroups left of session %s: %v", id, d)
			removeCgroups(t, id)
		}
	}

	// Network: namespace files and mounts, veths, the table's rules.
	left, err := containertest.Network(t).Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	infra := []string{"link " + base.prefix + "-int", "link " + base.prefix + "-egr", "nft table inet " + base.prefix}
	for _, l := range left {
		if !slices.Contains(infra, l) {
			t.Errorf("the network manager has left: %s", l)
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	bridges := map[int]string{}
	for _, l := range links {
		if n := l.Attrs().Name; n == base.prefix+"-int" || n == base.prefix+"-egr" {
			bridges[l.Attrs().Index] = n
		}
	}
	for _, l := range links {
		a := l.Attrs()
		if strings.HasPrefix(a.Name, base.prefix+"v") {
			t.Errorf("veth left: %s", a.Name)
		}
		if br, ok := bridges[a.MasterIndex]; ok {
			t.Errorf("the bridge %s still has the port %s", br, a.Name)
		}
	}
	if now := readNFT(t, base.prefix); !now.equal(base.nft) {
		t.Errorf("the nftables table changed: %s, was %s", now, base.nft)
	}

	// Locks: a session's and a disk's go with them (the pool's disks
	// alone may hold theirs, while open).
	locks, err := filepath.Glob(filepath.Join(p.root(), "locks", "*.lock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		name := strings.TrimSuffix(filepath.Base(l), ".lock")
		if len(notPool([]string{filepath.Join(p.root(), "disks", name)}, pool)) > 0 {
			t.Errorf("lock file left: %s", l)
		}
	}

	// Bundles: overlays, workspaces, configs, sockets.
	entries, err := os.ReadDir(p.sessionsDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in the sessions directory: %s", e.Name())
	}

	// The runtime's state.
	out, err := exec.Command(p.rt, "--root", p.runtimeRoot(), "list", "-q").CombinedOutput()
	if err != nil {
		t.Errorf("%s list: %v: %s", p.rt, err, out)
	} else if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("containers left in %s's state: %q", p.rt, s)
	}

	// This process: descriptors and goroutines back to the baseline.
	deadline = time.Now().Add(10 * time.Second)
	for {
		n := openFDs(t)
		if n <= base.fds {
			break
		}
		if time.Now().After(deadline) {
			var added []string
			for _, fd := range fdTargets(t) {
				if !slices.Contains(base.fdList, fd) {
					added = append(added, fd)
				}
			}
			t.Errorf("open descriptors: %d, %d before the sessions; new since: %v", n, base.fds, added)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find(base.goroutines)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines left: %v", err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leftProcesses describes the live processes that run the agent binary
// (by inode: inside a container its path is another) or sit in a cgroup of
// one of ids.
func leftProcesses(t testing.TB, agent os.FileInfo, ids []string) []string {
	t.Helper()
	var left []int
	for _, pid := range hostPIDs(t) {
		d := filepath.Join("/proc", itoa(pid))
		if fi, err := os.Stat(filepath.Join(d, "exe")); err == nil && os.SameFile(fi, agent) {
			left = append(left, pid)
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cgroup"))
		if err != nil {
			continue
		}
		for _, id := range ids {
			if strings.Contains(string(b), id) {
				left = append(left, pid)
				break
			}
		}
	}
	var out []string
	for _, d := range describePIDs(left) {
		if !strings.Contains(d, " state=Z ") { // dead, waiting for its parent to reap it
			out = append(out, d)
		}
	}
	return out
}

// mountNSThread is a thread of this process and its mount namespace.
type mountNSThread struct {
	tid  int
	main bool   // the process's main thread (its tid is the pid)
	ns   uint64 // the namespace's inode
}

func (m mountNSThread) String() string {
	if m.main {
		return fmt.Sprintf("thread %d (the main thread) in mount namespace %d", m.tid, m.ns)
	}
	return fmt.Sprintf("thread %d in mount namespace %d", m.tid, m.ns)
}

// hostMountNS is the mount namespace of this process's ordinary threads,
// read on one of them: /proc/self names the main thread's, which a locked
// goroutine may have taken elsewhere.
func hostMountNS(t testing.TB) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	err := nsthread.Locked(func() (bool, error) {
		return false, unix.Stat("/proc/thread-self/ns/mnt", &st)
	})
	if err != nil {
		t.Fatalf("this thread's mount namespace: %v", err)
	}
	return st
}

// hostMountsUnder lists the mount points under dir in the host's mount
// namespace, read on an ordinary thread.
func hostMountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := nsthread.Locked(func() (bool, error) {
		var err error
		out, err = mountsUnder("/proc/thread-self/mountinfo", dir)
		return false, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// hostMountsNaming lists the mount points in the host's mount namespace
// whose path holds one of ids.
func hostMountsNaming(t testing.TB, ids []string) []string {
	t.Helper()
	var out []string
	for _, m := range hostMountsUnder(t, "") {
		for _, id := range ids {
			if strings.Contains(m, id) {
				out = append(out, m)
				break
			}
		}
	}
	return out
}

// hostPathsNaming lists the files under dir whose name holds one of ids.
func hostPathsNaming(t testing.TB, dir string, ids []string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, id := range ids {
			if strings.Contains(d.Name(), id) {
				out = append(out, path)
				if d.IsDir() {
					return filepath.SkipDir
				}
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", dir, err)
	}
	return out
}

// threadsOutsideHostMountNS lists this process's threads whose mount
// namespace is not the host's: crun's (see the provider's runtime.go).
func threadsOutsideHostMountNS(t testing.TB) []mountNSThread {
	t.Helper()
	host := hostMountNS(t)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []mountNSThread
	for _, e := range tasks {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join("/proc/self/task", e.Name(), "ns/mnt"), &st); err != nil {
			continue // the thread ended
		}
		if st.Ino != host.Ino || st.Dev != host.Dev {
			if tid, ok := parseInt(e.Name()); ok {
				out = append(out, mountNSThread{tid: int(tid), main: int(tid) == os.Getpid(), ns: st.Ino})
			}
		}
	}
	return out
}

// hybridCgroups reports cgroups v1 with a cgroup2 mount beside them: the
// host where the provider runs crun in a mount namespace of its own.
func hybridCgroups() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup/unified", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// fdTargets lists what this process's descriptors lead to, for a failure
// message.
func fdTargets(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			target = err.Error()
		}
		if strings.HasPrefix(target, "socket:") {
			target += socketKind(e.Name())
		}
		out = append(out, e.Name()+"->"+target)
	}
	return out
}

// nftState is the shared manager's nftables table: its rules, by chain, as
// their handles, and its sets.
type nftState struct {
	exists bool
	rules  map[string][]uint64
	sets   []string
}

func (s nftState) equal(o nftState) bool {
	if s.exists != o.exists || len(s.rules) != len(o.rules) || !slices.Equal(s.sets, o.sets) {
		return false
	}
	for chain, handles := range s.rules {
		if !slices.Equal(handles, o.rules[chain]) {
			return false
		}
	}
	return true
}

func (s nftState) String() string {
	if !s.exists {
		return "no table"
	}
	var parts []string
	for chain, handles := range s.rules {
		parts = append(parts, fmt.Sprintf("%s: %d rules %v", chain, len(handles), handles))
	}
	slices.Sort(parts)
	return fmt.Sprintf("{%s; sets %v}", strings.Join(parts, ", "), s.sets)
}

// readNFT reads the table inet <prefix>.
func readNFT(t testing.TB, prefix string) nftState {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatalf("nftables: %v", err)
	}
	table, err := c.ListTableOfFamily(prefix, nftables.TableFamilyINet)
	if errors.Is(err, unix.ENOENT) {
		return nftState{}
	}
	if err != nil {
		t.Fatalf("the nftables table inet %s: %v", prefix, err)
	}
	s := nftState{exists: true, rules: map[string][]uint64{}}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatalf("nftables chains: %v", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != prefix {
			continue
		}
		rules, err := c.GetRules(table, ch)
		if err != nil {
			t.Fatalf("nftables rules of %s: %v", ch.Name, err)
		}
		handles := []uint64{}
		for _, r := range rules {
			handles = append(handles, r.Handle)
		}
		s.rules[ch.Name] = handles
	}
	sets, err := c.GetSets(table)
	if err != nil {
		t.Fatalf("nftables sets: %v", err)
	}
	for _, set := range sets {
		if set.Name == "host4" || set.Name == "host6" {
			// They mirror the machine's own addresses, which other
			// processes change meanwhile (a test cluster's bridge gets its
			// gateway address, a test host's veth comes and goes): not a
			// session's to leak.
			s.sets = append(s.sets, set.Name+"(the host's)")
			continue
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			t.Fatalf("nftables set %s: %v", set.Name, err)
		}
		s.sets = append(s.sets, fmt.Sprintf("%s(%d)", set.Name, len(elems)))
	}
	slices.Sort(s.sets)
	return s
}

// socketKind names the domain and protocol of this process's socket fd
// (a decimal string), for a failure message.
func socketKind(fd string) string {
	n, ok := parseInt(fd)
	if !ok {
		return ""
	}
	domain, err := unix.GetsockoptInt(int(n), unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return ""
	}
	proto, _ := unix.GetsockoptInt(int(n), unix.SOL_SOCKET, unix.SO_PROTOCOL)
	names := map[int]string{unix.AF_UNIX: "unix", unix.AF_INET: "inet", unix.AF_INET6: "inet6", unix.AF_NETLINK: "netlink"}
	name := names[domain]
	if name == "" {
		name = fmt.Sprintf("domain%d", domain)
	}
	return fmt.Sprintf("(%s/%d)", name, proto)
}

// TestLeakExecConnections: an exec, interactive or not, that ended (by
// itself, by Kill, by its timeout, by its caller's cancel) leaves no
// descriptor open in this process. The garbage collector is off while it
// runs: a connection dropped without a Close is then seen, not closed
// behind the provider's back by a finalizer.
func TestLeakExecConnections(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		p := newProvider(t, rt)
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		run(t, sess, "true")
		// What is made ahead is made again after the create, in the
		// background, and holds descriptors (a disk its lock file, a user
		// namespace its handle): counted once all is made, they are in
		// before as in after.
		poolDisks(t, p.sb)
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
		before := fdTargets(t)
		const n = 10
		for range n {
			run(t, sess, "true")
		}
		for range n {
			h, err := sess.ExecStart(ctxFor(t), []string{"echo", "hi"}, sandbox.StartOptions{Timeout: execTimeout})
			if err != nil {
				t.Fatal(err)
			}
			for {
				if _, err := h.Next(ctxFor(t)); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Fatalf("an interactive echo: %v", err)
					}
					break
				}
			}
			if err := h.Kill(ctxFor(t)); err != nil {
				t.Fatalf("Kill after the end: %v", err)
			}
		}
		for range n {
			h, err := sess.ExecStart(ctxFor(t), []string{"sleep", "600"}, sandbox.StartOptions{Timeout: execTimeout})
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Kill(ctxFor(t)); err != nil {
				t.Fatalf("Kill: %v", err)
			}
			for {
				if _, err := h.Next(ctxFor(t)); err != nil {
					break
				}
			}
		}
		for range n {
			_, err := sess.Exec(ctxFor(t), []string{"sleep", "600"}, sandbox.ExecOptions{Timeout: 50 * time.Millisecond})
			if !errors.Is(err, sandbox.ErrExecTimeout) {
				t.Fatalf("an exec past its timeout: %v", err)
			}
		}
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			_, err := sess.Exec(ctx, []string{"sleep", "600"}, sandbox.ExecOptions{Timeout: execTimeout})
			cancel()
			if err == nil {
				t.Fatal("an exec whose call was cancelled returned no error")
			}
		}
		var after []string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			after = fdTargets(t)
			if len(after) <= len(before) || time.Now().After(deadline) {
				break
			}
		}
		if len(after) > len(before) {
			var added []string
			for _, fd := range after {
				if !slices.Contains(before, fd) {
					added = append(added, fd)
				}
			}
			t.Errorf("%d execs that ended (10 of each: run to the end, interactive to the end then Kill, interactive killed, timed out, cancelled) left %d descriptors open (%d before, %d after): %v; "+
				"the contract lets a handle keep provider resources only until Kill has returned or its session is destroyed", 5*n, len(after)-len(before), len(before), len(after), added)
		}
	})
}

// TestLeakCrunMountNamespace: the mount namespace the provider makes for
// crun (on a host with hybrid cgroups) goes with its Close: no thread of
// this process stays in it, the main thread included.
func TestLeakCrunMountNamespace(t *testing.T) {
	containertest.Require(t)
	if !containertest.HasRuntime("crun") {
		t.Skip("crun is not installed (apt-get install -y crun)")
	}
	if !hybridCgroups() {
		t.Skip("the provider makes a mount namespace of its own for crun only on a host with hybrid cgroups, which this one is not")
	}
	// No provider is open at this point: a thread outside the host's
	// mount namespace was left there by an earlier provider's Close.
	before := threadsOutsideHostMountNS(t)
	if len(before) > 0 {
		t.Errorf("before this test made a provider, %v: the mount namespace of a crun provider closed earlier outlives it", before)
	}
	isBefore := func(th mountNSThread) bool {
		return slices.ContainsFunc(before, func(b mountNSThread) bool { return b.tid == th.tid && b.ns == th.ns })
	}
	for i := range 20 {
		opts := containertest.Options(t, "crun", permissive)
		opts.ReapInterval = -1
		sb, err := container.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			sess, err := sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone))
			if err != nil {
				t.Fatal(err)
			}
			run(t, sess, "true")
		}
		if len(slices.DeleteFunc(threadsOutsideHostMountNS(t), isBefore)) == 0 {
			t.Fatal("an open crun provider, but no thread of this process is in another mount namespace: the test cannot see the runtime's")
		}
		if err := sb.Close(ctxFor(t)); err != nil {
			t.Fatal(err)
		}
		// The thread of a locked goroutine that ended goes shortly after.
		var left []mountNSThread
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			left = slices.DeleteFunc(threadsOutsideHostMountNS(t), isBefore)
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Fatalf("after the Close of crun provider %d, %v: the runtime's mount namespace outlives the provider (a goroutine locked to the main thread cannot end that thread; the Go runtime parks it for good, still inside)", i+1, left)
		}
	}
}

// TestLeakCrunTempFile: the file crun makes at each call to run a copy of
// its own binary (crun.XXXXXX, removed at once unless crun is killed
// first) is made in the session's bundle, which the destroy and the next
// start's sweep remove, and not in the host's /tmp, where one a killed
// crun left would stay.
func TestLeakCrunTempFile(t *testing.T) {
	containertest.Require(t)
	if !containertest.HasRuntime("crun") {
		t.Skip("crun is not installed (apt-get install -y crun)")
	}
	p := newProvider(t, "crun")
	ino, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ino)
	container.FailCreateSteps(p.sb, func(id, step string) error {
		if step != "container" {
			return nil
		}
		_, err := unix.InotifyAddWatch(ino, filepath.Join(p.sessionsDir(), id), unix.IN_CREATE)
		return err
	})
	sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
	var made []string
	buf := make([]byte, 64<<10)
	n, err := unix.Read(ino, buf)
	if err != nil {
		t.Fatalf("the bundle's inotify events: %v", err)
	}
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
		made = append(made, strings.TrimRight(string(name), "\x00"))
		off += unix.SizeofInotifyEvent + int(ev.Len)
	}
	if !slices.ContainsFunc(made, func(n string) bool { return strings.HasPrefix(n, "crun.") }) {
		t.Errorf("crun's run made %q in the session's bundle; want its crun.XXXXXX temporary file there", made)
	}
	left, err := filepath.Glob(filepath.Join(p.sessionsDir(), sess.ID(), "crun.*"))
	if err != nil || len(left) != 0 {
		t.Errorf("crun's temporary files still in the bundle after the create: %v %v", left, err)
	}
}
