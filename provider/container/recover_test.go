package container_test

// The recovery tests: a provider "crashes" (container.Crash lets go of
// what it holds in this process, as its death would, and touches no
// session), and a new provider on the same state directory recovers: the
// sessions kept come back whole, everything else is removed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// recoverSeq numbers the providers' networks of this process's recovery
// tests.
var recoverSeq atomic.Int32

// recoverOptions are the options of a provider of runtime rt and user
// namespace mode with a network manager of its own (only that one adopts
// the networks of the sessions it brings back), of a name prefix and
// subnets of its own, and a fresh state directory.
func recoverOptions(t *testing.T, rt string, mode container.UserNamespaceMode) container.Options {
	t.Helper()
	if !containertest.HasRuntime(rt) {
		t.Skipf("%s is not installed (apt-get install -y %s)", rt, rt)
	}
	opts := containertest.Options(t, rt, permissive)
	n := int(recoverSeq.Add(1))
	opts.Network = nil
	opts.NetPrefix = fmt.Sprintf("r%04x%d", os.Getpid()&0xffff, n%10)
	k := byte((os.Getpid() + 17*n) % 127)
	opts.InternalSubnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 246, 2 * k, 0}), 24)
	opts.EgressSubnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 246, 2*k + 1, 0}), 24)
	opts.ReapInterval = -1
	opts.UserNamespace = mode
	// Whatever happens, a provider with no ledger sweeps the state
	// directory at the end, and its Close takes the network along.
	t.Cleanup(func() {
		sb, err := container.New(opts)
		if err != nil {
			t.Errorf("the final sweep of %s: %v", opts.StateDir, err)
			return
		}
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("the final sweep's Close: %v", err)
		}
	})
	return opts
}

// crashable makes a provider of opts whose kit records its sessions in a
// ledger the test reads, closed at the end of t unless crash was called.
func crashable(t *testing.T, opts container.Options) (sb *kit.Sandbox, ledger *kit.MemoryLedger, crash func()) {
	t.Helper()
	ledger = kit.NewMemoryLedger()
	opts.Ledger = ledger
	sb, err := container.New(opts)
	if err != nil {
		if opts.UserNamespace == container.UserNamespaceOn {
			t.Skipf("this host cannot run sessions in a user namespace: %v", err)
		}
		t.Fatal(err)
	}
	crashed := false
	t.Cleanup(func() {
		if !crashed {
			if err := sb.Close(context.Background()); err != nil {
				t.Errorf("closing the provider: %v", err)
			}
		}
	})
	return sb, ledger, func() {
		container.Crash(sb)
		crashed = true
	}
}

// crashSession is one session made before the crash, and what the test
// knows of it.
type crashSession struct {
	name  string
	spec  sandbox.SessionSpec
	keep  bool
	id    string
	token string // the content of its workspace file "hello"
	bg    string // the pid, in the session, of the process it left running
	init  int    // its container's PID 1 on the host
}

// makeCrashSession creates s on sb, puts its file and leaves a process
// running in it (setsid, out of any exec's group).
func makeCrashSession(t *testing.T, sb *kit.Sandbox, s *crashSession) {
	t.Helper()
	sess, err := sb.CreateSession(ctxFor(t), s.spec)
	if err != nil {
		t.Fatalf("CreateSession(%s): %v", s.name, err)
	}
	s.id, s.token = sess.ID(), "tai42-recover-"+randomToken(8)
	if err := sess.PutFile(ctxFor(t), "hello", []byte(s.token)); err != nil {
		t.Fatalf("PutFile in %s: %v", s.name, err)
	}
	mustSh(t, sess, `setsid sh -c 'echo $$ > /tmp/bg.pid; exec sleep 600' </dev/null >/dev/null 2>&1 &
for i in $(seq 100); do [ -s /tmp/bg.pid ] && exit 0; sleep 0.05; done; exit 1`)
	s.bg = strings.TrimSpace(mustSh(t, sess, `cat /tmp/bg.pid`))
}

// bundlePID reads session id's container's PID 1 from its bundle.
func bundlePID(t *testing.T, opts container.Options, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(opts.StateDir, "container", "sessions", id, "init.pid"))
	if err != nil {
		t.Fatalf("the pid file of session %s: %v", id, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("the pid file of session %s holds %q", id, b)
	}
	return pid
}

// nsOwnerOf returns the host uid that owns the user namespace of process
// pid, as the kernel says.
func nsOwnerOf(t *testing.T, pid int) int {
	t.Helper()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	uid, err := unix.IoctlGetUint32(int(ns.Fd()), unix.NS_GET_OWNER_UID)
	if err != nil {
		t.Fatalf("NS_GET_OWNER_UID of process %d: %v", pid, err)
	}
	return int(uid)
}

// waitDead waits up to 10 s for process pid to end (a zombie has ended).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		d := describePIDs([]int{pid})
		if len(d) == 0 || !strings.Contains(d[0], "state=") || strings.Contains(d[0], "state=Z") {
			return
		}
	}
	t.Fatalf("process %d did not end within 10s of its SIGKILL", pid)
}

// settle waits until this process's descriptor count holds still (a
// network manager's namespace pool refilling, a thread ending).
func settle(t *testing.T) {
	t.Helper()
	last, still := openFDs(t), 0
	for deadline := time.Now().Add(10 * time.Second); still < 5 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if n := openFDs(t); n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
}

// recoverBaseline is what this process holds after the crash: the old
// provider's descriptors and goroutines (see container.Crash) stay in it.
type recoverBaseline struct {
	fds        int
	fdList     []string
	goroutines goleak.Option
	foreignMnt []mountNSThread
}

func takeRecoverBaseline(t *testing.T) recoverBaseline {
	t.Helper()
	// The old provider's runtime thread ends shortly after Crash.
	var threads []mountNSThread
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		threads = threadsOutsideHostMountNS(t)
		if len(threads) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(threads) > 0 {
		t.Errorf("after the crash, threads of this process are still in another mount namespace: %v", threads)
	}
	settle(t)
	return recoverBaseline{fds: openFDs(t), fdList: fdTargets(t), goroutines: goleak.IgnoreCurrent(), foreignMnt: threads}
}

// wsPath is a path in the workspace as the kit resolves it.
func wsPath(rel string) kit.Path {
	return kit.Path{Rel: rel, Abs: filepath.Join("/workspace", rel), Orig: rel}
}

// resSh runs a shell script in the recovered session res.
func resSh(t *testing.T, res kit.Resources, script string, args ...string) sandbox.ExecResult {
	t.Helper()
	r, err := res.Exec(ctxFor(t), kit.ExecRequest{
		Argv:    append([]string{"sh", "-c", script, "sh"}, args...),
		Cwd:     wsPath("."),
		Timeout: execTimeout,
	})
	if err != nil {
		t.Fatalf("sh -c %q: %v", script, err)
	}
	return r
}

// sessionAddr is the IPv4 address of eth0 in a session.
func sessionAddr(t *testing.T, res kit.Resources) string {
	t.Helper()
	out := resSh(t, res, `ip -4 -o addr show dev eth0`)
	m := regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/`).FindStringSubmatch(out.Stdout)
	if m == nil {
		t.Fatalf("no IPv4 address on eth0: %+v", out)
	}
	return m[1]
}

// reaches checks that from connects to a one-shot server in to: the
// connection carries the server's answer back.
func reaches(t *testing.T, what string, from, to kit.Resources) {
	t.Helper()
	addr := sessionAddr(t, to)
	if r := resSh(t, to, `nc -l -p 7777 -e /bin/echo reached </dev/null >/dev/null 2>&1 &`); r.ExitCode != 0 {
		t.Fatalf("%s: starting the server: %+v", what, r)
	}
	r := resSh(t, from, `for i in $(seq 50); do
	[ "$(nc "$1" 7777 </dev/null 2>/dev/null)" = reached ] && exit 0
	sleep 0.1
done
exit 1`, addr)
	if r.ExitCode != 0 {
		t.Errorf("%s: no connection to %s:7777 (exit %d, stderr %q)", what, addr, r.ExitCode, r.Stderr)
	}
}

// checkGone checks that nothing of session id is left on the machine:
// bundle, runtime state, cgroups, processes, mounts (in this process's
// mount namespace and in every other of its threads), root mount point,
// network namespace file. init is its container's old PID 1.
// checkDiskGone checks that nothing is left of the disk named disk, of
// session name: its image, its mount point, a mount of it (in the host's
// mount namespace; crun's is checked by the caller's census at Close) or a
// loop device on it.
func checkDiskGone(t *testing.T, opts container.Options, name, disk string) {
	t.Helper()
	if disk == "" {
		return
	}
	dir := filepath.Join(opts.StateDir, "container", "disks")
	for _, p := range []string{filepath.Join(dir, disk+".img"), filepath.Join(dir, disk)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: its disk's %s is left (%v)", name, p, err)
		}
	}
	for _, m := range hostMountsUnder(t, dir) {
		if filepath.Base(m) == disk {
			t.Errorf("%s: its disk is still mounted at %s", name, m)
		}
	}
	for _, l := range loopsUnder(t, dir) {
		if strings.HasSuffix(l, "/"+disk+".img") {
			t.Errorf("%s: its disk is still on a loop device: %s", name, l)
		}
	}
}

func checkGone(t *testing.T, opts container.Options, name, id string, init int) {
	t.Helper()
	root := filepath.Join(opts.StateDir, "container")
	for _, p := range []string{
		filepath.Join(root, "sessions", id),
		filepath.Join(root, "runc", id),
		filepath.Join(root, "crun", id),
		filepath.Join(root, "netns", id),
	} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s (%s): %s is left (%v)", name, id, p, err)
		}
	}
	if d := cgroupDirs(id); len(d) > 0 {
		t.Errorf("%s (%s): cgroups left: %v", name, id, d)
		removeCgroups(t, id)
	}
	if left := liveProcsOf(t, id); len(left) > 0 {
		t.Errorf("%s (%s): processes left in its cgroups: %v", name, id, left)
	}
	if d := describePIDs([]int{init}); len(d) > 0 && strings.Contains(d[0], "state=") && !strings.Contains(d[0], "state=Z") {
		if b, err := os.ReadFile(filepath.Join("/proc", itoa(init), "cgroup")); err == nil && strings.Contains(string(b), id) {
			t.Errorf("%s (%s): its container's PID 1 runs on: %s", name, id, d[0])
		}
	}
	if m := hostMountsNaming(t, []string{id}); len(m) > 0 {
		t.Errorf("%s (%s): mounts left: %v", name, id, m)
	}
	for _, th := range threadsOutsideHostMountNS(t) {
		all, err := mountsUnder(fmt.Sprintf("/proc/self/task/%d/mountinfo", th.tid), "")
		if err != nil {
			continue // the thread ended
		}
		for _, m := range all {
			if strings.Contains(m, id) {
				t.Errorf("%s (%s): mount left in the mount namespace of thread %d: %s", name, id, th.tid, m)
			}
		}
	}
	if d := hostPathsNaming(t, "/run/tai42", []string{id}); len(d) > 0 {
		t.Errorf("%s (%s): left under /run/tai42: %v", name, id, d)
	}
}

// checkNetworkGone checks that nothing of the provider's own network
// manager is left: links of its prefix, its nftables table, namespace
// files.
func checkNetworkGone(t *testing.T, opts container.Options) {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, opts.NetPrefix+"v") || n == opts.NetPrefix+"-int" || n == opts.NetPrefix+"-egr" {
			t.Errorf("link left: %s", n)
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == opts.NetPrefix {
			t.Errorf("nftables table left: inet %s", tb.Name)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(opts.StateDir, "container", "netns"))
	for _, e := range entries {
		t.Errorf("network namespace file left: %s", e.Name())
	}
}

// veths lists the host-side veths of the provider's network manager.
func veths(t *testing.T, opts container.Options) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, opts.NetPrefix+"v") {
			out = append(out, n)
		}
	}
	return out
}

// checkProcessBack checks what this process holds against the baseline
// taken after the crash: descriptors, goroutines, threads in another
// mount namespace.
func checkProcessBack(t *testing.T, base recoverBaseline) {
	t.Helper()
	var added []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		added = added[:0]
		if openFDs(t) <= base.fds {
			break
		}
		for _, fd := range fdTargets(t) {
			if !slices.Contains(base.fdList, fd) {
				added = append(added, fd)
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("open descriptors: %d more than after the crash: %v", openFDs(t)-base.fds, added)
			break
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := goleak.Find(base.goroutines)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines left: %v", err)
			break
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		th := threadsOutsideHostMountNS(t)
		if len(th) <= len(base.foreignMnt) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("threads of this process still in another mount namespace after Close: %v", th)
			break
		}
	}
}

// TestRecover crashes a provider with sessions of every network tier,
// ephemeral and persistent, and recovers on a new provider with some of
// them kept: the kept ones come back (exec, their file, the process they
// left running, the internal ones reaching each other and a session made
// after the recovery); the others, one whose container died meanwhile and
// one whose handle names the other runtime leave nothing; a persistent
// workspace stays; destroying the recovered sessions and closing the
// provider leaves nothing. On runc with a user namespace and on crun
// without (crun's mounts die with the crashed process's mount namespace).
func TestRecover(t *testing.T) {
	containertest.Require(t)
	for _, c := range []struct {
		rt   string
		mode container.UserNamespaceMode
	}{{"runc", container.UserNamespaceOn}, {"crun", container.UserNamespaceOff}} {
		t.Run(c.rt+"-userns-"+string(c.mode), func(t *testing.T) { testRecover(t, c.rt, c.mode) })
	}
}

func testRecover(t *testing.T, rt string, mode container.UserNamespaceMode) {
	opts := recoverOptions(t, rt, mode)
	sbA, ledger, crash := crashable(t, opts)
	other := map[string]string{"runc": "crun", "crun": "runc"}[rt]

	persistent := func(sp sandbox.SessionSpec) sandbox.SessionSpec {
		sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "recover-"+randomToken(6)
		return sp
	}
	bb := containertest.Busybox
	sessions := []*crashSession{
		{name: "internal, ephemeral, kept", spec: spec(bb, sandbox.NetworkInternal), keep: true},
		{name: "internal, persistent, kept", spec: persistent(spec(bb, sandbox.NetworkInternal)), keep: true},
		{name: "egress, ephemeral, kept", spec: spec(bb, sandbox.NetworkEgress), keep: true},
		{name: "none, host image, kept", spec: spec(sandbox.HostImage, sandbox.NetworkNone), keep: true},
		{name: "none, persistent, not kept", spec: persistent(spec(bb, sandbox.NetworkNone))},
		{name: "egress, not kept", spec: spec(bb, sandbox.NetworkEgress)},
		{name: "internal, kept, its container killed", spec: spec(bb, sandbox.NetworkInternal), keep: true},
		{name: "none, kept, its handle naming " + other, spec: spec(bb, sandbox.NetworkNone), keep: true},
	}
	byName := map[string]*crashSession{}
	for _, s := range sessions {
		makeCrashSession(t, sbA, s)
		s.init = bundlePID(t, opts, s.id)
		byName[s.name] = s
	}
	records, err := ledger.Load(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	recs := map[string]kit.Record{}
	diskOf := map[string]string{} // a session's disk, by its handle
	for _, r := range records {
		recs[r.ID] = r
		var h map[string]any
		if err := json.Unmarshal(r.Handle, &h); err != nil {
			t.Fatalf("session %s's handle %s: %v", r.ID, r.Handle, err)
		}
		if diskOf[r.ID], _ = h["disk"].(string); diskOf[r.ID] == "" {
			t.Errorf("session %s's handle %s names no disk", r.ID, r.Handle)
		}
		if h["runtime"] != rt || h["remap"] != (mode == container.UserNamespaceOn) {
			t.Errorf("session %s's handle %s: want runtime %s, remap %v", r.ID, r.Handle, rt, mode == container.UserNamespaceOn)
		}
		if img, _ := h["image"].(string); (r.Spec.Image == sandbox.HostImage) != (img == "") || (img != "" && !strings.HasPrefix(img, "sha256:")) {
			t.Errorf("session %s (image %s)'s handle %s: want the image's digest, none for the host image", r.ID, r.Spec.Image, r.Handle)
		}
	}

	crash()
	dead := byName["internal, kept, its container killed"]
	if err := syscall.Kill(dead.init, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the PID 1 (%d) of session %s: %v", dead.init, dead.id, err)
	}
	waitDead(t, dead.init)
	base := takeRecoverBaseline(t)

	var keep []kit.Kept
	for _, s := range sessions {
		if !s.keep {
			continue
		}
		r := recs[s.id]
		h := r.Handle
		if strings.Contains(s.name, "handle naming") {
			h = json.RawMessage(strings.Replace(string(h), `"runtime":"`+rt+`"`, `"runtime":"`+other+`"`, 1))
		}
		keep = append(keep, kit.Kept{ID: s.id, Spec: r.Spec, Handle: h})
	}
	p, err := container.NewBare(opts)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			p.Close()
		}
	})
	start := time.Now()
	results, err := p.Recover(ctxFor(t), keep)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	t.Logf("Recover with %d sessions on disk, %d kept: %v", len(sessions), len(keep), time.Since(start))
	back := map[string]kit.Resources{}
	destroyAll := func() {
		for id, res := range back {
			if err := res.Destroy(context.Background()); err != nil {
				t.Errorf("destroying recovered session %s: %v", id, err)
			}
			delete(back, id)
		}
	}
	t.Cleanup(destroyAll)
	if len(results) != len(keep) {
		t.Errorf("Recover returned %d results for %d kept sessions: %+v", len(results), len(keep), results)
	}
	for _, res := range results {
		if res.Res != nil {
			back[res.ID] = res.Res
		}
	}
	if _, err := p.Recover(ctxFor(t), nil); err == nil {
		t.Error("a second Recover succeeded")
	}
	errOf := map[string]error{}
	for _, res := range results {
		errOf[res.ID] = res.Err
	}
	for _, s := range sessions {
		if !s.keep {
			continue
		}
		err, res := errOf[s.id], back[s.id]
		switch {
		case s == dead:
			if err == nil || !strings.Contains(err.Error(), "not running") {
				t.Errorf("%s: Recover's error %v, want one saying its container is not running", s.name, err)
			}
		case strings.Contains(s.name, "handle naming"):
			if err == nil || !strings.Contains(err.Error(), rt) || !strings.Contains(err.Error(), other) {
				t.Errorf("%s: Recover's error %v, want one naming %s and %s", s.name, err, rt, other)
			}
		case err != nil || res == nil:
			t.Errorf("%s: not brought back: %v", s.name, err)
		}
		if err != nil && res != nil {
			t.Errorf("%s: Recover returned both resources and the error %v", s.name, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// What was not brought back is gone; a persistent workspace stays.
	for _, s := range sessions {
		if back[s.id] == nil {
			checkGone(t, opts, s.name, s.id, s.init)
			checkDiskGone(t, opts, s.name, diskOf[s.id])
		}
	}
	gonePersistent := byName["none, persistent, not kept"]
	if b, err := readWorkspaceFile(t, opts.StateDir, gonePersistent.spec.WorkspaceKey, "hello"); err != nil || string(b) != gonePersistent.token {
		t.Errorf("the persistent workspace of a session not kept holds %q (%v), want its file", b, err)
	}
	if v := veths(t, opts); len(v) != 3 {
		t.Errorf("veths after the recovery: %v, want the 3 of the kept bridged sessions", v)
	}

	// What was brought back works as before the crash.
	for _, s := range sessions {
		res := back[s.id]
		if res == nil {
			continue
		}
		if r := resSh(t, res, `echo ok`); r.ExitCode != 0 || r.Stdout != "ok\n" {
			t.Errorf("%s: echo ok: %+v", s.name, r)
		}
		if b, err := res.GetFile(ctxFor(t), wsPath("hello")); err != nil || string(b) != s.token {
			t.Errorf("%s: GetFile(hello) = %q, %v; want %q", s.name, b, err, s.token)
		}
		// The process it left running, and its private /tmp, are still
		// there: the same container.
		r := resSh(t, res, `p=$(cat /tmp/bg.pid) && [ "$p" = "$1" ] && cat /proc/$p/cmdline`, s.bg)
		if r.ExitCode != 0 || r.Stdout != "sleep\x00600\x00" {
			t.Errorf("%s: the process it left running (pid %s): %+v", s.name, s.bg, r)
		}
		if got := bundlePID(t, opts, s.id); got != s.init {
			t.Errorf("%s: its container's PID 1 is %d, was %d", s.name, got, s.init)
		}
	}
	a, b := back[byName["internal, ephemeral, kept"].id], back[byName["internal, persistent, kept"].id]
	reaches(t, "recovered internal to recovered internal", a, b)
	reaches(t, "and back", b, a)

	// A session made after the recovery gets an address of its own and
	// reaches the recovered ones.
	newID := "recover-new-" + randomToken(4)
	fresh, err := p.Create(ctxFor(t), kit.CreateRequest{ID: newID, Spec: func() sandbox.SessionSpec {
		sp := spec(bb, sandbox.NetworkInternal)
		sp.Isolation = sandbox.IsolationContainer
		return sp
	}()})
	if err != nil {
		t.Fatalf("Create after the recovery: %v", err)
	}
	back[newID] = fresh
	if sessionAddr(t, fresh) == sessionAddr(t, a) || sessionAddr(t, fresh) == sessionAddr(t, b) {
		t.Error("the new session got the address of a recovered one")
	}
	reaches(t, "new internal to recovered internal", fresh, a)

	// Destroyed, the recovered sessions leave nothing; Close neither.
	ids := slices.Collect(maps.Keys(back))
	destroyAll()
	for _, s := range sessions {
		checkGone(t, opts, s.name, s.id, s.init)
		checkDiskGone(t, opts, s.name, diskOf[s.id])
	}
	checkGone(t, opts, "the session made after the recovery", newID, 0)
	kept := byName["internal, persistent, kept"]
	if b, err := readWorkspaceFile(t, opts.StateDir, kept.spec.WorkspaceKey, "hello"); err != nil || string(b) != kept.token {
		t.Errorf("the persistent workspace of a recovered session, after its destroy, holds %q (%v), want its file", b, err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed = true
	if m := hostMountsUnder(t, opts.StateDir); len(m) > 0 {
		t.Errorf("mounts left under the state directory: %v", m)
	}
	if l := loopsUnder(t, opts.StateDir); len(l) > 0 {
		t.Errorf("loop devices left: %v", l)
	}
	if entries, _ := os.ReadDir(filepath.Join(opts.StateDir, "container", "disks")); len(entries) > 0 {
		t.Errorf("left in the disks directory: %v", entries)
	}
	if entries, _ := os.ReadDir(filepath.Join(opts.StateDir, "container", "sessions")); len(entries) > 0 {
		t.Errorf("left in the sessions directory: %v", entries)
	}
	for _, kind := range []string{rt, other} {
		entries, _ := os.ReadDir(filepath.Join(opts.StateDir, "container", kind))
		if len(entries) > 0 {
			t.Errorf("left in %s's state: %v", kind, entries)
		}
	}
	checkNetworkGone(t, opts)
	checkProcessBack(t, base)
	t.Logf("%d sessions brought back, used, destroyed", len(ids))
}

// TestRecoverSweepsAll: a provider made with no ledger (the kit keeps
// nothing) removes every session the crashed one left, on crun with a
// user namespace: containers, roots mounted in the dead process's mount
// namespace and under /run/tai42/roots, cgroups, networks, bundles; a
// persistent workspace stays.
func TestRecoverSweepsAll(t *testing.T) {
	containertest.Require(t)
	opts := recoverOptions(t, "crun", container.UserNamespaceOn)
	sbA, _, crash := crashable(t, opts)
	sp := spec(containertest.Busybox, sandbox.NetworkEgress)
	sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "sweep-"+randomToken(6)
	sessions := []*crashSession{
		{name: "internal", spec: spec(containertest.Busybox, sandbox.NetworkInternal)},
		{name: "egress, persistent", spec: sp},
		{name: "none, host image", spec: spec(sandbox.HostImage, sandbox.NetworkNone)},
	}
	for _, s := range sessions {
		makeCrashSession(t, sbA, s)
		s.init = bundlePID(t, opts, s.id)
	}
	crash()
	base := takeRecoverBaseline(t)

	sb, err := container.New(opts)
	if err != nil {
		t.Fatalf("a new provider on the crashed one's state directory: %v", err)
	}
	for _, s := range sessions {
		checkGone(t, opts, s.name, s.id, s.init)
	}
	if v := veths(t, opts); len(v) > 0 {
		t.Errorf("veths left: %v", v)
	}
	if b, err := readWorkspaceFile(t, opts.StateDir, sp.WorkspaceKey, "hello"); err != nil || string(b) != sessions[1].token {
		t.Errorf("the persistent workspace holds %q (%v), want its file", b, err)
	}
	// The new provider works.
	sess, err := sb.CreateSession(ctxFor(t), sp)
	if err != nil {
		t.Fatalf("CreateSession after the sweep: %v", err)
	}
	if got, err := sess.GetFile(ctxFor(t), "hello"); err != nil || string(got) != sessions[1].token {
		t.Errorf("the persistent workspace in a new session: %q, %v", got, err)
	}
	if err := sb.Close(ctxFor(t)); err != nil {
		t.Errorf("Close: %v", err)
	}
	checkGone(t, opts, "the new session", sess.ID(), 0)
	checkNetworkGone(t, opts)
	checkProcessBack(t, base)
}

// TestRecoverRefuses: what Recover cannot bring back it reports, saying
// why; it runs once; a create before it fails.
func TestRecoverRefuses(t *testing.T) {
	containertest.Require(t)
	opts := containertest.Options(t, "runc", permissive) // a shared network manager
	opts.UserNamespace = container.UserNamespaceOff
	p, err := container.NewBare(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sp := spec(containertest.Busybox, sandbox.NetworkNone)
	sp.Isolation = sandbox.IsolationContainer
	if res, err := p.Create(ctxFor(t), kit.CreateRequest{ID: "before-recover", Spec: sp}); err == nil || !strings.Contains(err.Error(), "Recover") {
		t.Errorf("Create before Recover: %v, want an error saying so", err)
		if res != nil {
			_ = res.Destroy(context.Background())
		}
	}
	good := json.RawMessage(`{"v":1,"runtime":"runc","remap":false}`)
	cases := map[string]struct {
		handle json.RawMessage
		want   []string
	}{
		"shared-net":   {good, []string{"network manager"}},
		"no-handle":    {nil, []string{"no handle"}},
		"bad-json":     {json.RawMessage(`{"v":`), []string{"does not decode"}},
		"version":      {json.RawMessage(`{"v":2,"runtime":"runc"}`), []string{"format 2"}},
		"crun":         {json.RawMessage(`{"v":1,"runtime":"crun","remap":false}`), []string{"crun", "runc"}},
		"remap":        {json.RawMessage(`{"v":1,"runtime":"runc","remap":true}`), []string{"in a user namespace", "without"}},
		"bad-runtime":  {json.RawMessage(`{"v":1,"runtime":"kata"}`), []string{"kata"}},
		"../escape-id": {good, []string{"id"}},
	}
	var keep []kit.Kept
	for id, c := range cases {
		keep = append(keep, kit.Kept{ID: id, Spec: sp, Handle: c.handle})
	}
	results, err := p.Recover(ctxFor(t), keep)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(results) != len(cases) {
		t.Errorf("%d results for %d kept sessions", len(results), len(cases))
	}
	for _, r := range results {
		c, ok := cases[r.ID]
		if !ok {
			t.Errorf("a result for %q, which was not asked for", r.ID)
			continue
		}
		if r.Res != nil || r.Err == nil {
			t.Errorf("%s: Res %v, Err %v; want an error", r.ID, r.Res, r.Err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(r.Err.Error(), w) {
				t.Errorf("%s: %v; want it to say %q", r.ID, r.Err, w)
			}
		}
	}
	if _, err := p.Recover(ctxFor(t), nil); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a second Recover: %v, want an error saying it runs once", err)
	}
}

// TestRecoverRuntimeMissing: the container of a runtime that is no longer
// installed is removed by hand: its PID 1, read from the runtime's state
// and checked to be the container's, is killed, and the state entry
// removed. The session's destroy then finishes the rest.
func TestRecoverRuntimeMissing(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		p := newProvider(t, rt)
		sess, err := p.sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone))
		if err != nil {
			t.Fatal(err)
		}
		init := bundlePID(t, p.opts, sess.ID())
		if err := container.RemoveByHand(p.sb, rt, sess.ID()); err != nil {
			t.Errorf("RemoveByHand: %v", err)
		}
		waitDead(t, init)
		if _, err := os.Lstat(filepath.Join(p.runtimeRoot(), sess.ID())); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s's state entry of the container is left (%v)", rt, err)
		}
		destroyLeavesNothing(t, sess)
	})
}

// TestRecoverThroughKit: a provider made with the crashed one's ledger
// (on crun in a user namespace) gets its live sessions back through
// the kit: the kit hands Recover the ledger's sessions, with the handles
// Create gave, and serves the recovered ones under their ids.
func TestRecoverThroughKit(t *testing.T) {
	containertest.Require(t)
	opts := recoverOptions(t, "crun", container.UserNamespaceOn)
	sbA, ledger, crash := crashable(t, opts)
	sp := spec(containertest.Busybox, sandbox.NetworkNone)
	sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "kit-"+randomToken(6)
	sessions := []*crashSession{
		{name: "internal", spec: spec(containertest.Busybox, sandbox.NetworkInternal)},
		{name: "none, persistent", spec: sp},
	}
	for _, s := range sessions {
		makeCrashSession(t, sbA, s)
		s.init = bundlePID(t, opts, s.id)
	}
	crash()
	base := takeRecoverBaseline(t)

	opts.Ledger = ledger
	sb, err := container.New(opts)
	if err != nil {
		t.Fatalf("a new provider with the crashed one's ledger: %v", err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			sb.Close(context.Background())
		}
	})
	for _, s := range sessions {
		sess, err := sb.GetSession(ctxFor(t), s.id)
		if err != nil {
			t.Errorf("%s: GetSession after the recovery: %v", s.name, err)
			continue
		}
		if out := mustSh(t, sess, `cat /workspace/hello; echo; cat /proc/$(cat /tmp/bg.pid)/cmdline`); out != s.token+"\nsleep\x00600\x00" {
			t.Errorf("%s: its file and the process it left running: %q", s.name, out)
		}
		if info, err := sess.Info(ctxFor(t)); err != nil || info.WorkspacePath != "/workspace" {
			t.Errorf("%s: Info: %+v, %v; want workspace path /workspace", s.name, info, err)
		}
	}
	// The recovered sessions keep the owners of their user namespaces (see
	// container.UserNamespaceOwnerBase): the provider holds them, so that
	// no session made now gets one, of those made ahead or made at once.
	owners := map[int]string{}
	for _, s := range sessions {
		own := nsOwnerOf(t, s.init)
		owners[own] = s.name
		if !container.OwnerHeld(sb, own) {
			t.Errorf("%s: the owner of its user namespace, host uid %d, is not held after the recovery", s.name, own)
		}
	}
	if _, err := container.WaitDiskPool(ctxFor(t), sb); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		fresh, err := sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone))
		if err != nil {
			t.Fatalf("CreateSession after the recovery: %v", err)
		}
		if own := nsOwnerOf(t, bundlePID(t, opts, fresh.ID())); owners[own] != "" {
			t.Errorf("a session made after the recovery has the owner of recovered session %q's user namespace, host uid %d", owners[own], own)
		}
	}
	if err := sb.Close(ctxFor(t)); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed = true
	for _, s := range sessions {
		checkGone(t, opts, s.name, s.id, s.init)
	}
	if records, err := ledger.Load(ctxFor(t)); err != nil || len(records) != 0 {
		t.Errorf("the ledger after Close: %v, %v; want it empty", records, err)
	}
	checkNetworkGone(t, opts)
	checkProcessBack(t, base)
}

// TestRecoverImageReplaced: a kept session whose image name now holds
// another image than the one its root was made of (imported again while
// the provider was down; here its handle names another digest) is not
// brought back on the wrong image: Recover says why and removes it.
func TestRecoverImageReplaced(t *testing.T) {
	containertest.Require(t)
	opts := recoverOptions(t, "crun", container.UserNamespaceOn)
	sbA, ledger, crash := crashable(t, opts)
	s := &crashSession{name: "busybox, its image replaced", spec: spec(containertest.Busybox, sandbox.NetworkNone)}
	makeCrashSession(t, sbA, s)
	s.init = bundlePID(t, opts, s.id)
	records, err := ledger.Load(ctxFor(t))
	if err != nil || len(records) != 1 || records[0].ID != s.id {
		t.Fatalf("the ledger holds %+v (%v), want session %s", records, err, s.id)
	}
	var h map[string]any
	if err := json.Unmarshal(records[0].Handle, &h); err != nil {
		t.Fatal(err)
	}
	if img, _ := h["image"].(string); !strings.HasPrefix(img, "sha256:") {
		t.Fatalf("the session's handle %s names no image digest", records[0].Handle)
	}
	h["image"] = "sha256:" + strings.Repeat("0", 64)
	handle, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	crash()

	p, err := container.NewBare(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	results, err := p.Recover(ctxFor(t), []kit.Kept{{ID: s.id, Spec: records[0].Spec, Handle: handle}})
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(results) != 1 {
		t.Fatalf("Recover answered %d results for one kept session", len(results))
	}
	if r := results[0]; r.Res != nil || r.Err == nil || !strings.Contains(r.Err.Error(), "imported again") {
		t.Errorf("a kept session whose image is another now: brought back %v, Err %v; want it refused, saying its image was imported again", r.Res != nil, r.Err)
		if r.Res != nil {
			if err := r.Res.Destroy(ctxFor(t)); err != nil {
				t.Errorf("destroying it: %v", err)
			}
		}
	}
	checkGone(t, opts, s.name, s.id, s.init)
}

// TestRecoverLeavesLockedSessions: a provider starting on a state
// directory another live provider uses (concurrent `tai42 run`s share
// one) refuses to bring back a session whose lock the other holds, saying
// so, and removes none of the other's sessions, nor their disks, nor its
// pool's: they go on working, their disks mounted and on their loop
// devices.
func TestRecoverLeavesLockedSessions(t *testing.T) {
	containertest.Require(t)
	a := newProviderMode(t, "runc", container.UserNamespaceOff)
	var live []sandbox.Session
	for range 2 {
		sess := a.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		mustSh(t, sess, `echo kept > /workspace/f && echo kept > /root-f`)
		live = append(live, sess)
	}
	// Their disks and a's pool's (once full), as the host sees them.
	if _, err := container.WaitDiskPool(ctxFor(t), a.sb); err != nil {
		t.Fatal(err)
	}
	mounts, loops, imgs := hostMountsUnder(t, a.opts.StateDir), loopsUnder(t, a.opts.StateDir), a.images(t)
	if len(imgs) < 2 {
		t.Fatalf("the sessions' disks: %q, want one each", imgs)
	}
	// A provider of its own network manager (only such a one brings a
	// session back) on a's state directory, and with no disk pool, whose
	// disks would be counted among a's.
	opts := recoverOptions(t, "runc", container.UserNamespaceOff)
	opts.StateDir, opts.DiskPool = a.opts.StateDir, -1
	p, err := container.NewBare(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	handle := json.RawMessage(`{"v":1,"runtime":"runc","remap":false}`)
	results, err := p.Recover(ctxFor(t), []kit.Kept{{ID: live[0].ID(), Spec: spec(containertest.Busybox, sandbox.NetworkNone), Handle: handle}})
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(results) != 1 {
		t.Fatalf("Recover answered %d results for one kept session", len(results))
	}
	if r := results[0]; r.Res != nil || r.Err == nil || !strings.Contains(r.Err.Error(), "another live process runs it") {
		t.Errorf("a kept session another live provider holds: brought back %v, Err %v; want it refused, saying another process runs it", r.Res != nil, r.Err)
	}
	if now := hostMountsUnder(t, a.opts.StateDir); !slices.Equal(now, mounts) {
		t.Errorf("the other provider's mounts: %q, were %q", now, mounts)
	}
	if now := loopsUnder(t, a.opts.StateDir); !slices.Equal(now, loops) {
		t.Errorf("the other provider's loop devices: %q, were %q", now, loops)
	}
	if now := a.images(t); !slices.Equal(now, imgs) {
		t.Errorf("the other provider's disk images: %q, were %q", now, imgs)
	}
	for _, sess := range live {
		if out := mustSh(t, sess, `cat /workspace/f /root-f`); out != "kept\nkept\n" {
			t.Errorf("session %s of the other provider after the Recover: %q", sess.ID(), out)
		}
	}
}
