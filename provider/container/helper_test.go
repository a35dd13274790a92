package container_test

// Helpers of the escape, caps and leak tests: providers and sessions made
// for a test and torn down at its end, the escape probe put into a session
// and run there, the provider's on-disk and cgroup layout as the host sees
// it, and an upstream of test hosts in network namespaces of the test's
// own.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// permissive lets every network tier and persistence through the kit.
var permissive = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationContainer, Durable: true}

// runtimes and images are what each test runs on.
var (
	runtimes = []string{"runc", "crun"}
	images   = []string{sandbox.HostImage, containertest.Busybox}
)

// callTimeout bounds one provider call of a test.
const callTimeout = 60 * time.Second

// execTimeout is the Timeout of an ordinary exec.
const execTimeout = 30 * time.Second

// forEachRuntime runs fn as a subtest per OCI runtime, skipping a runtime
// that is not installed.
func forEachRuntime(t *testing.T, fn func(t *testing.T, rt string)) {
	t.Helper()
	containertest.Require(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			if !containertest.HasRuntime(rt) {
				t.Skipf("%s is not installed (apt-get install -y %s)", rt, rt)
			}
			fn(t, rt)
		})
	}
}

// forEachRuntimeImage runs fn as a subtest per runtime and image, with
// one provider (of the default user namespace mode) per runtime shared by
// the images' subtests.
func forEachRuntimeImage(t *testing.T, fn func(t *testing.T, p *testProvider, image string)) {
	t.Helper()
	forEachRuntime(t, func(t *testing.T, rt string) {
		p := newProvider(t, rt)
		for _, image := range images {
			t.Run(imageName(image), func(t *testing.T) { fn(t, p, image) })
		}
	})
}

// userNSModes are the user namespace modes the escape battery runs in:
// remapped (root in a session is an unprivileged host uid), and not (root
// in a session is host root, held back by the hardening alone).
var userNSModes = []container.UserNamespaceMode{container.UserNamespaceOn, container.UserNamespaceOff}

// forEachRuntimeMode runs fn as a subtest per runtime and user namespace
// mode, with a provider of that runtime and mode; mode on is skipped,
// saying why, where the host cannot remap.
func forEachRuntimeMode(t *testing.T, fn func(t *testing.T, p *testProvider)) {
	t.Helper()
	forEachRuntime(t, func(t *testing.T, rt string) { forEachMode(t, rt, fn) })
}

// forEachMode runs fn as a subtest per user namespace mode, with a
// provider of runtime rt and that mode.
func forEachMode(t *testing.T, rt string, fn func(t *testing.T, p *testProvider)) {
	for _, mode := range userNSModes {
		t.Run("userns-"+string(mode), func(t *testing.T) { fn(t, newProviderMode(t, rt, mode)) })
	}
}

// forEachEscapeMode is forEachRuntimeMode with, per runtime, a "pool"
// subtest besides: a provider (user namespace on) with a warm pool of
// every image on every tier, every session of those shapes served from it
// (and at least one), to show that a session made ahead holds no more than
// one made for its create. The escape battery runs on it.
func forEachEscapeMode(t *testing.T, fn func(t *testing.T, p *testProvider)) {
	t.Helper()
	forEachRuntime(t, func(t *testing.T, rt string) {
		forEachMode(t, rt, fn)
		t.Run("pool", func(t *testing.T) {
			p := newProviderMode(t, rt, container.UserNamespaceOn, func(o *container.Options) {
				for _, image := range images {
					containertest.Pool(o, image)
				}
			})
			var hits containertest.PoolHits
			t.Cleanup(func() { // after ServedFromPool's, which counts the hits
				if hits.Load() == 0 && !t.Failed() && !t.Skipped() {
					t.Error("no session was served from the pool")
				}
			})
			containertest.ServedFromPool(t, p.sb, &hits)
			fn(t, p)
		})
	})
}

// forEachSetup runs fn as a subtest per runtime, user namespace mode (and
// pool: forEachEscapeMode) and image, with one provider per runtime and
// mode shared by the images' subtests.
func forEachSetup(t *testing.T, fn func(t *testing.T, p *testProvider, image string)) {
	t.Helper()
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		for _, image := range images {
			t.Run(imageName(image), func(t *testing.T) { fn(t, p, image) })
		}
	})
}

// imageName is image as a subtest name.
func imageName(image string) string {
	if image == containertest.Busybox {
		return "busybox"
	}
	return image
}

// testProvider is a container provider of a test: its kit sandbox and the
// options it was made with.
type testProvider struct {
	sb   *kit.Sandbox
	opts container.Options
	rt   string
}

// newProvider makes a provider on runtime rt with a fresh state
// directory, closed at the end of t.
func newProvider(t testing.TB, rt string) *testProvider {
	t.Helper()
	opts := containertest.Options(t, rt, permissive)
	opts.ReapInterval = -1 // the tests destroy what they make
	return &testProvider{sb: containertest.New(t, opts), opts: opts, rt: rt}
}

// newProviderMode makes a provider on runtime rt in user namespace mode
// mode, its options changed by set, closed at the end of t; it skips t
// when mode is on and the host cannot remap.
func newProviderMode(t testing.TB, rt string, mode container.UserNamespaceMode, set ...func(*container.Options)) *testProvider {
	t.Helper()
	opts := containertest.Options(t, rt, permissive)
	opts.ReapInterval = -1
	opts.UserNamespace = mode
	for _, f := range set {
		f(&opts)
	}
	sb, err := container.New(opts)
	if err != nil {
		if mode == container.UserNamespaceOn {
			t.Skipf("this host cannot run sessions in a user namespace: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the container sandbox: %v", err)
		}
	})
	if got := container.RemapsUsers(sb); got != (mode == container.UserNamespaceOn) {
		t.Fatalf("a provider in user namespace mode %s: RemapsUsers = %v", mode, got)
	}
	return &testProvider{sb: sb, opts: opts, rt: rt}
}

// root is the provider's own directory under its state directory.
func (p *testProvider) root() string { return filepath.Join(p.opts.StateDir, "container") }

// sessionsDir holds the sessions' bundles: root overlays, ephemeral
// workspaces, configs, agent sockets.
func (p *testProvider) sessionsDir() string { return filepath.Join(p.root(), "sessions") }

// bundle is session id's bundle directory on the host.
func (p *testProvider) bundle(id string) string { return filepath.Join(p.sessionsDir(), id) }

// config is the OCI config the provider wrote into session id's bundle.
func (p *testProvider) config(t testing.TB, id string) specs.Spec {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.bundle(id), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// upper is the upper layer of session id's root overlay, where the
// session's writes to its root land, as this process reads it (through the
// runtime's mount namespace: see sessionDirs).
func (p *testProvider) upper(t testing.TB, id string) string {
	t.Helper()
	upper, _ := sessionDirs(t, p.sb, id)
	return upper
}

// workspace is the directory bound at session id's /workspace, as this
// process reads it.
func (p *testProvider) workspace(t testing.TB, id string) string {
	t.Helper()
	_, ws := sessionDirs(t, p.sb, id)
	return ws
}

// view is path as the provider's OCI runtime sees it, from this process.
func (p *testProvider) view(path string) string { return container.RuntimeView(p.sb) + path }

// sessionDirs are session id's root upper layer and workspace, readable
// (and writable) from this process: the provider mounts them, on the
// session's disk, where its runtime runs (for crun, a mount namespace of
// its own), so they are reached through that namespace's view.
func sessionDirs(t testing.TB, sb *kit.Sandbox, id string) (upper, ws string) {
	t.Helper()
	upper, ws, err := container.SessionDirs(sb, id)
	if err != nil {
		t.Fatalf("the directories of session %s: %v", id, err)
	}
	view := container.RuntimeView(sb)
	return view + upper, view + ws
}

// withWorkspace runs fn on the directory of persistent workspace key of
// the provider whose state directory is stateDir, a key no session holds:
// its image mounted read-only here for fn's time (unmounted, and its loop
// device detached, before withWorkspace returns, so that the next session
// attaches the image afresh), or its plain directory when it has none.
func withWorkspace(t testing.TB, stateDir, key string, fn func(ws string)) {
	t.Helper()
	dir := filepath.Join(stateDir, "container", "workspaces")
	img := filepath.Join(dir, key+".img")
	if _, err := os.Stat(img); err != nil {
		fn(filepath.Join(dir, key))
		return
	}
	mnt := t.TempDir()
	// noload: no journal replay, nothing written to the image.
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "ro,loop,noload", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mounting the workspace image %s: %v: %s", img, err, out)
	}
	defer func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("unmounting the workspace image %s: %v: %s", img, err, out)
			return
		}
		for deadline := time.Now().Add(5 * time.Second); slices.ContainsFunc(loopsUnder(t, dir), func(l string) bool { return strings.HasSuffix(l, "="+img) }); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("the workspace image %s is still on a loop device 5s after its unmount", img)
				return
			}
		}
	}()
	fn(filepath.Join(mnt, "ws"))
}

// readWorkspaceFile reads file rel of persistent workspace key (see
// withWorkspace).
func readWorkspaceFile(t testing.TB, stateDir, key, rel string) (b []byte, err error) {
	t.Helper()
	withWorkspace(t, stateDir, key, func(ws string) { b, err = os.ReadFile(filepath.Join(ws, rel)) })
	return b, err
}

// poolDisks are the mount points of the disks p's pool made ahead, once
// it is full: they belong to the open provider, not to any session.
func poolDisks(t testing.TB, sb *kit.Sandbox) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	pool, err := container.WaitDiskPool(ctx, sb)
	if err != nil {
		t.Fatalf("the provider's disk pool: %v", err)
	}
	return pool
}

// notPool is paths without the pool's disks (their mount points, images
// and loop devices as loopsUnder describes them).
func notPool(paths, pool []string) []string {
	var out []string
	for _, p := range paths {
		if !slices.ContainsFunc(pool, func(d string) bool {
			return p == d || p == d+".img" || strings.HasSuffix(p, "="+d+".img")
		}) {
			out = append(out, p)
		}
	}
	return out
}

// runtimeRoot is the OCI runtime's state directory.
func (p *testProvider) runtimeRoot() string { return filepath.Join(p.root(), p.rt) }

// spec is an ephemeral session spec of image on network.
func spec(image string, network sandbox.Network) sandbox.SessionSpec {
	return sandbox.SessionSpec{
		Image:      image,
		Durability: sandbox.Ephemeral,
		Network:    network,
		TTLSeconds: 600,
	}
}

// ctxFor is a context for one call of t, cancelled at its end.
func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// session creates a session of sp, destroyed at the end of t.
func (p *testProvider) session(t testing.TB, sp sandbox.SessionSpec) sandbox.Session {
	t.Helper()
	sess, err := p.sb.CreateSession(ctxFor(t), sp)
	if err != nil {
		t.Fatalf("CreateSession(image %s, network %s): %v", sp.Image, sp.Network, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := sess.Destroy(ctx); err != nil {
			t.Errorf("destroying session %s: %v", sess.ID(), err)
		}
		if dirs := cgroupDirs(sess.ID()); len(dirs) > 0 {
			t.Errorf("cgroups left after destroying session %s: %v", sess.ID(), dirs)
			removeCgroups(t, sess.ID())
		}
	})
	return sess
}

// removeCgroups removes what the provider left of session id's cgroups,
// so that a failed test does not litter the machine: a cgroup whose last
// process has not been reaped yet is busy for a while.
func removeCgroups(t testing.TB, id string) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for {
		dirs := cgroupDirs(id)
		var errs []error
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			t.Logf("removed the cgroups the provider left, %v after the first try", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Logf("could not remove the cgroups the provider left: %v", errors.Join(errs...))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// run runs argv in sess, failing t when Exec errs.
func run(t testing.TB, sess sandbox.Session, argv ...string) sandbox.ExecResult {
	t.Helper()
	res, err := sess.Exec(ctxFor(t), argv, sandbox.ExecOptions{Timeout: execTimeout})
	if err != nil {
		t.Fatalf("Exec(%q) in %s: %v", argv, sess.ID(), err)
	}
	return res
}

// sh runs a shell script in sess and returns its result.
func sh(t testing.TB, sess sandbox.Session, script string, args ...string) sandbox.ExecResult {
	t.Helper()
	return run(t, sess, append([]string{"sh", "-c", script, "sh"}, args...)...)
}

// mustSh runs a shell script that must succeed and returns its stdout.
func mustSh(t testing.TB, sess sandbox.Session, script string, args ...string) string {
	t.Helper()
	res := sh(t, sess, script, args...)
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q in %s: exit %d, stdout %q, stderr %q", script, sess.ID(), res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// probePath is where the escape probe is put in a session.
const probePath = "/workspace/escapeprobe"

var probeBytes struct {
	once sync.Once
	b    []byte
	err  error
}

// installProbe puts the escape probe into sess's workspace and makes it
// executable.
func installProbe(t testing.TB, sess sandbox.Session) {
	t.Helper()
	path := escapeprobetest.Build(t)
	probeBytes.once.Do(func() { probeBytes.b, probeBytes.err = os.ReadFile(path) })
	if probeBytes.err != nil {
		t.Fatalf("reading the escape probe: %v", probeBytes.err)
	}
	if err := sess.PutFile(ctxFor(t), "escapeprobe", probeBytes.b); err != nil {
		t.Fatalf("PutFile(escapeprobe): %v", err)
	}
	run(t, sess, "chmod", "+x", probePath)
}

// probeResult is the escape probe's one JSON line.
type probeResult struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	Detail string `json:"detail"`
}

// items splits a several-attempt detail into NAME -> RESULT.
func (p probeResult) items() map[string]string {
	m := map[string]string{}
	for f := range strings.FieldsSeq(p.Detail) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// probe runs the escape probe in sess (installed by installProbe) and
// returns its answer.
func probe(t testing.TB, sess sandbox.Session, args ...string) probeResult {
	t.Helper()
	res, err := sess.Exec(ctxFor(t), append([]string{probePath}, args...), sandbox.ExecOptions{Timeout: execTimeout})
	if err != nil {
		t.Fatalf("escapeprobe %q: %v", args, err)
	}
	return parseProbe(t, args, res)
}

func parseProbe(t testing.TB, args []string, res sandbox.ExecResult) probeResult {
	t.Helper()
	var p probeResult
	if res.ExitCode != 0 {
		t.Fatalf("escapeprobe %q: exit %d, stdout %q, stderr %q", args, res.ExitCode, res.Stdout, res.Stderr)
	}
	if err := jsonLine(res.Stdout, &p); err != nil {
		t.Fatalf("escapeprobe %q: %v (stderr %q)", args, err, res.Stderr)
	}
	return p
}

// jsonLine decodes the probe's one JSON line from its stdout.
func jsonLine(stdout string, p *probeResult) error {
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout)), p); err != nil {
		return fmt.Errorf("stdout %q is not the probe's JSON line: %w", stdout, err)
	}
	return nil
}

// randomToken is a fresh random hex string.
func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// canary is a host file holding a random secret, removed at the end of
// the test.
type canary struct {
	dir, path, secret string
}

// newCanary writes a canary in a new directory under parent ("" for the
// default temporary directory).
func newCanary(t testing.TB, parent string) canary {
	t.Helper()
	var dir string
	if parent == "" {
		dir = t.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(parent, "tai42-canary-"); err != nil {
			t.Fatalf("canary directory in %s: %v", parent, err)
		}
		t.Cleanup(func() {
			if err := os.RemoveAll(dir); err != nil {
				t.Errorf("removing the canary directory %s: %v", dir, err)
			}
		})
	}
	c := canary{dir: dir, path: filepath.Join(dir, "canary"), secret: "tai42-secret-" + randomToken(16)}
	if err := os.WriteFile(c.path, []byte(c.secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// intact checks that the canary's file holds its secret alone and that its
// directory holds nothing else.
func (c canary) intact(t testing.TB, after string) {
	t.Helper()
	b, err := os.ReadFile(c.path)
	if err != nil || string(b) != c.secret+"\n" {
		t.Errorf("after %s: the host canary %s holds %q (%v), want its secret unchanged", after, c.path, b, err)
	}
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		t.Fatalf("after %s: %v", after, err)
	}
	for _, e := range entries {
		if e.Name() != "canary" {
			t.Errorf("after %s: %s appeared on the host in the canary's directory", after, filepath.Join(c.dir, e.Name()))
		}
	}
}

// cgroupDirs are session id's cgroup directories on the host, one per v1
// controller hierarchy (or the one v2 directory), that exist.
func cgroupDirs(id string) []string {
	matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/tai42", id))
	if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/tai42", id)); len(m) > 0 {
		matches = append(matches, m...)
	}
	return matches
}

// cgroupFile is file of session id's cgroup in the first hierarchy that
// has it (v1: /sys/fs/cgroup/<controller>/tai42/<id>/file, v2:
// /sys/fs/cgroup/tai42/<id>/file); "" if none has it.
func cgroupFile(id, file string) string {
	for _, d := range cgroupDirs(id) {
		p := filepath.Join(d, file)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// readCgroupInt reads a number from session id's cgroup file.
func readCgroupInt(t testing.TB, id, file string) int64 {
	t.Helper()
	p := cgroupFile(id, file)
	if p == "" {
		t.Fatalf("session %s has no cgroup file %s (cgroups: %v)", id, file, cgroupDirs(id))
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not a number", p, b)
	}
	return n
}

// readCgroupKeyed reads key's value from a "key value" cgroup file of
// session id (cpu.stat, pids.events, memory.oom_control, ...).
func readCgroupKeyed(t testing.TB, id, file, key string) int64 {
	t.Helper()
	p := cgroupFile(id, file)
	if p == "" {
		t.Fatalf("session %s has no cgroup file %s (cgroups: %v)", id, file, cgroupDirs(id))
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %s = %q is not a number", p, key, v)
			}
			return n
		}
	}
	t.Fatalf("%s has no %s: %q", p, key, b)
	return 0
}

// sessionPIDs are the host pids of session id's processes, from its cgroup.
func sessionPIDs(t testing.TB, id string) []int {
	t.Helper()
	p := cgroupFile(id, "cgroup.procs")
	if p == "" {
		t.Fatalf("session %s has no cgroup (cgroups: %v)", id, cgroupDirs(id))
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// hostPIDs lists the machine's processes (as this process's pid namespace
// sees them).
func hostPIDs(t testing.TB) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// ---- network: the shared manager's links, an upstream of test hosts ----

// netPrefix is the name prefix of the shared network manager's links, read
// from its bridges (<prefix>-int, <prefix>-egr); "" while it has none.
func netPrefix(t testing.TB) string {
	t.Helper()
	left, err := containertest.Network(t).Leftovers()
	if err != nil {
		t.Fatalf("the network manager's leftovers: %v", err)
	}
	for _, l := range left {
		name, ok := strings.CutPrefix(l, "link ")
		if !ok {
			continue
		}
		if p, ok := strings.CutSuffix(name, "-int"); ok {
			return p
		}
		if p, ok := strings.CutSuffix(name, "-egr"); ok {
			return p
		}
	}
	return ""
}

// bridgeAddr is the IPv4 address of the shared manager's bridge of tier
// (internal or egress): the tier's gateway on the host.
func bridgeAddr(t testing.TB, tier sandbox.Network) netip.Addr {
	t.Helper()
	prefix := netPrefix(t)
	if prefix == "" {
		t.Fatal("the shared network manager has no bridge yet: create a session of the tier first")
	}
	name := prefix + "-int"
	if tier == sandbox.NetworkEgress {
		name = prefix + "-egr"
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("the bridge %s: %v", name, err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("the bridge %s has no IPv4 address (%v)", name, err)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP)
	return a.Unmap()
}

// listenHost starts a sessnettest.Server on addr (any port) in this
// process's network namespace.
func listenHost(t testing.TB, addr netip.Addr) *sessnettest.Server {
	t.Helper()
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	return sessnettest.Serve(t, ln)
}

// newUpstream makes the internet the test's egress sessions reach: a
// router with test hosts behind it, routed to from the test providers'
// egress subnets only (see sessnettest.Upstream), removed at the end of t.
// The shared network manager's subnet is always routed; so are extra, the
// subnets of providers with a network manager of their own.
func newUpstream(t testing.TB, extra ...netip.Prefix) *sessnettest.Upstream {
	t.Helper()
	u := sessnettest.NewUpstream(t, "tz"+randomToken(4), containertest.EgressSubnet(t))
	for _, p := range extra {
		u.RouteFrom(t, p)
	}
	return u
}

// sessionNetNS opens the network namespace of session id, through its
// PID 1 (the agent) as the host sees it.
func sessionNetNS(t testing.TB, id string) *os.File {
	t.Helper()
	pids := sessionPIDs(t, id)
	if len(pids) == 0 {
		t.Fatalf("session %s has no process", id)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pids[0]))
	if err != nil {
		t.Fatalf("the network namespace of session %s: %v", id, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// addDefaultRoute adds a default route via gw in the namespace ns.
func addDefaultRoute(t testing.TB, ns *os.File, gw netip.Addr) {
	t.Helper()
	h := sessnettest.Handle(t, ns)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("the session's eth0: %v", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil && !errors.Is(err, unix.EEXIST) {
		t.Fatalf("adding a default route via %s in the session: %v", gw, err)
	}
}

// mountsUnder lists the mount points at or under dir in a mountinfo file
// (all of them for dir "").
func mountsUnder(mountinfo, dir string) ([]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := fields[4] // octal escapes stay: the test's paths have none
		if dir == "" || mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", mountinfo, err)
	}
	return out, nil
}

// hostPIDsQuiet is hostPIDs for a goroutine other than the test's: nil
// when /proc cannot be read.
func hostPIDsQuiet() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// readInt reads a file holding one number.
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parseInt(strings.TrimSpace(string(b)))
}

func parseInt(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func itoa(n int) string { return strconv.Itoa(n) }

// describePIDs names processes for a failure message: pid, state, parent,
// command line.
func describePIDs(pids []int) []string {
	var out []string
	for _, pid := range pids {
		d := itoa(pid)
		if b, err := os.ReadFile(filepath.Join("/proc", d, "stat")); err == nil {
			// pid (comm) state ppid ...
			if i := strings.LastIndexByte(string(b), ')'); i > 0 {
				f := strings.Fields(string(b[i+1:]))
				if len(f) >= 2 {
					d += " state=" + f[0] + " ppid=" + f[1]
				}
			}
		}
		if b, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "cmdline")); err == nil {
			d += " cmd=" + strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		}
		out = append(out, d)
	}
	return out
}
