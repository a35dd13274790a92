package host_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// The test binary doubles as a tiny network tool run inside sessions, so
// these tests need nothing but the host: TAI42_HOST_TEST_HELPER=dial ADDR
// dials a TCP address; =selfloop listens on the session's loopback and
// dials itself.
func TestMain(m *testing.M) {
	switch os.Getenv("TAI42_HOST_TEST_HELPER") {
	case "dial":
		c, err := net.DialTimeout("tcp", os.Args[len(os.Args)-1], 2*time.Second)
		if err != nil {
			fmt.Println("dial failed:", err)
			os.Exit(1)
		}
		c.Close()
		fmt.Println("connected")
		os.Exit(0)
	case "selfloop":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("listen failed:", err)
			os.Exit(1)
		}
		c, err := net.DialTimeout("tcp", l.Addr().String(), 2*time.Second)
		if err != nil {
			fmt.Println("dial failed:", err)
			os.Exit(1)
		}
		c.Close()
		fmt.Println("loopback works")
		os.Exit(0)
	case "sigign":
		os.Exit(sigignHelper())
	case "crash":
		os.Exit(crashHelper())
	}
	goleak.VerifyTestMain(m)
}

var openPolicy = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}

func newHost(t *testing.T, opts host.Options) (*kit.Sandbox, string) {
	t.Helper()
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	if opts.Policy == (sandbox.Policy{}) {
		opts.Policy = openPolicy
	}
	sb, err := host.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sb, opts.StateDir
}

func hostSpec(network sandbox.Network) sandbox.SessionSpec {
	return sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: network, TTLSeconds: 600}
}

func mustCreate(t *testing.T, sb sandbox.Sandbox, spec sandbox.SessionSpec) sandbox.Session {
	t.Helper()
	s, err := sb.CreateSession(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Destroy(context.Background()) })
	return s
}

func run(t *testing.T, s sandbox.Session, env map[string]string, argv ...string) sandbox.ExecResult {
	t.Helper()
	res, err := s.Exec(context.Background(), argv, sandbox.ExecOptions{Env: sandbox.SecretEnv(env), Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return res
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and cgroups are root's on this runner")
	}
}

// Network "none": the session has its own loopback and nothing else; a
// server on the host's loopback is out of reach. "egress" is the host's own
// network.
func TestNetworkNoneIsLoopbackOnly(t *testing.T) {
	needRoot(t)
	sb, _ := newHost(t, host.Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	none := mustCreate(t, sb, hostSpec(sandbox.NetworkNone))
	dev := run(t, none, nil, "cat", "/proc/net/dev")
	var ifaces []string
	for _, line := range strings.Split(dev.Stdout, "\n")[2:] {
		if name, _, ok := strings.Cut(line, ":"); ok {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if len(ifaces) != 1 || ifaces[0] != "lo" {
		t.Errorf("network none: interfaces %v, want only lo", ifaces)
	}
	if res := run(t, none, map[string]string{"TAI42_HOST_TEST_HELPER": "selfloop"}, self); res.ExitCode != 0 {
		t.Errorf("network none: the session's own loopback must work: %+v", res)
	}
	if res := run(t, none, map[string]string{"TAI42_HOST_TEST_HELPER": "dial"}, self, l.Addr().String()); res.ExitCode == 0 {
		t.Errorf("network none reached a server on the host's loopback: %+v", res)
	}
	// Two execs of one session share its namespace.
	a := run(t, none, nil, "readlink", "/proc/self/ns/net")
	b := run(t, none, nil, "readlink", "/proc/self/ns/net")
	hostNS, _ := os.Readlink("/proc/self/ns/net")
	if a.Stdout != b.Stdout || strings.TrimSpace(a.Stdout) == hostNS {
		t.Errorf("execs of one session share one namespace that is not the host's: %q %q host %q", a.Stdout, b.Stdout, hostNS)
	}
	egress := mustCreate(t, sb, hostSpec(sandbox.NetworkEgress))
	if res := run(t, egress, map[string]string{"TAI42_HOST_TEST_HELPER": "dial"}, self, l.Addr().String()); res.ExitCode != 0 {
		t.Errorf("network egress is the host's network and must reach its loopback: %+v", res)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// State is the field after the parenthesised command name; Z is a
	// zombie, already dead.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Errorf("%s: process %d still runs", what, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL) // end it: it is ours
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A process the command leaves running goes on after the exec, and ends
// with the session.
func TestLeftProcessEndsWithSession(t *testing.T) {
	sb, _ := newHost(t, host.Options{})
	s := mustCreate(t, sb, hostSpec(sandbox.NetworkEgress))
	res := run(t, s, nil, "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!")
	pid, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil {
		t.Fatalf("no pid: %+v", res)
	}
	if !alive(pid) {
		t.Fatal("the left process should keep running after the exec")
	}
	if err := s.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, "after destroy")
}

// With caps the session has a cgroup: even a process that left its
// process group (setsid) ends at destroy, and a timeout whose output is
// still held by it says so in its note.
func TestCgroupCatchesEscapedProcesses(t *testing.T) {
	needRoot(t)
	sb, _ := newHost(t, host.Options{ProviderOptions: kit.ProviderOptions{ExitGrace: 100 * time.Millisecond}})
	spec := hostSpec(sandbox.NetworkEgress)
	spec.MemoryMB, spec.CPU = 256, 1
	s := mustCreate(t, sb, spec)
	cg := run(t, s, nil, "cat", "/proc/self/cgroup")
	if !strings.Contains(cg.Stdout, "tai42-"+s.ID()) {
		t.Fatalf("the exec is not in the session's cgroup:\n%s", cg.Stdout)
	}
	_, err := s.Exec(context.Background(), []string{"sh", "-c", "setsid sleep 300 & echo $! >pid; printf x; sleep 300"},
		sandbox.ExecOptions{Timeout: 300 * time.Millisecond})
	var te *sandbox.ExecTimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("want a timeout, got %v", err)
	}
	if te.StdoutLen != 1 || te.Note == "" {
		t.Errorf("a held pipe: want stdout 1 and a note, got %+v", te)
	}
	b, err := s.GetFile(context.Background(), "pid")
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid == 0 || !alive(pid) {
		t.Fatalf("the escaped process should run until destroy (pid %q)", b)
	}
	if err := s.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, "escaped process after destroy")
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// Many sessions, each with execs of every kind, leave nothing behind: no
// directory, file descriptor, cgroup or process.
func TestNothingLeaks(t *testing.T) {
	before := countFDs(t)
	sb, state := newHost(t, host.Options{})
	ctx := context.Background()
	var pids []int
	for i := range 20 {
		spec := hostSpec(sandbox.NetworkEgress)
		if os.Geteuid() == 0 {
			if i%2 == 0 {
				spec.Network = sandbox.NetworkNone
			}
			if i%4 == 0 {
				spec.MemoryMB = 128
			}
		}
		s, err := sb.CreateSession(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		res := run(t, s, nil, "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!")
		pid, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
		pids = append(pids, pid)
		h, err := s.ExecStart(ctx, []string{"cat"}, sandbox.StartOptions{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.WriteStdin(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := s.PutFile(ctx, "d/f", []byte("data")); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 { // a handle left unkilled: destroy ends it
			if err := h.Kill(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, pid := range pids {
		waitGone(t, pid, "left process")
	}
	for _, d := range []string{"host/sessions", "host/tmp"} {
		ents, err := os.ReadDir(filepath.Join(state, d))
		if err != nil || len(ents) != 0 {
			t.Errorf("%s holds %d entries after every session was destroyed (%v)", d, len(ents), err)
		}
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := countFDs(t); after > before {
		t.Errorf("file descriptors: %d before the sandbox, %d after it closed", before, after)
	}
	if os.Geteuid() == 0 {
		out, _ := filepath.Glob("/sys/fs/cgroup/*/*/tai42-sb-*")
		out2, _ := filepath.Glob("/sys/fs/cgroup/*/tai42-sb-*")
		out3, _ := filepath.Glob("/sys/fs/cgroup/*/*/*/tai42-sb-*")
		if n := len(out) + len(out2) + len(out3); n != 0 {
			t.Errorf("%d session cgroups left: %v %v %v", n, out, out2, out3)
		}
	}
}

// Env values never reach the log, not even through errors.
func TestSecretsNeverLogged(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(lockedWriter{&buf, &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sb, _ := newHost(t, host.Options{Options: kit.Options{Logger: logger}})
	const secret = "s3cret-VALUE-42"
	spec := hostSpec(sandbox.NetworkEgress)
	spec.Env = sandbox.SecretEnv(map[string]string{"TOKEN": secret})
	s := mustCreate(t, sb, spec)
	_, err := s.Exec(context.Background(), []string{"sh", "-c", "echo $TOKEN; echo $TOKEN >&2; sleep 5"},
		sandbox.ExecOptions{Timeout: 200 * time.Millisecond, Env: sandbox.SecretEnv(map[string]string{"OTHER": secret})})
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("the timeout error must come and carry no output: %v", err)
	}
	_ = s.Destroy(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if buf.Len() == 0 {
		t.Fatal("the logger got nothing; the check would prove nothing")
	}
	if strings.Contains(buf.String(), secret) {
		t.Errorf("the log shows an env value:\n%s", buf.String())
	}
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// The host runner rejects what it cannot enforce and says why.
func TestRejectsUnenforceable(t *testing.T) {
	sb, _ := newHost(t, host.Options{})
	for _, c := range []struct {
		field string
		mut   func(*sandbox.SessionSpec)
	}{
		{"image", func(s *sandbox.SessionSpec) { s.Image = "alpine" }},
		{"network", func(s *sandbox.SessionSpec) { s.Network = sandbox.NetworkInternal }},
		{"isolation", func(s *sandbox.SessionSpec) { s.Isolation = sandbox.IsolationContainer }},
		{"cpu", func(s *sandbox.SessionSpec) { s.CPU = 0.001 }},
	} {
		spec := hostSpec(sandbox.NetworkEgress)
		c.mut(&spec)
		_, err := sb.CreateSession(context.Background(), spec)
		var rej *sandbox.SpecRejectedError
		if !errors.As(err, &rej) || rej.Field != c.field || rej.Reason != sandbox.ReasonUnenforceable {
			t.Errorf("%s: want an unenforceable rejection naming it, got %v", c.field, err)
		}
	}
}

// A persistent workspace lives under the state directory by key and
// survives its session.
func TestPersistentWorkspaceOnDisk(t *testing.T) {
	sb, state := newHost(t, host.Options{})
	spec := hostSpec(sandbox.NetworkEgress)
	spec.Durability, spec.WorkspaceKey = sandbox.Persistent, "proj"
	s := mustCreate(t, sb, spec)
	if err := s.PutFile(context.Background(), "keep.txt", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if s.WorkspacePath() != filepath.Join(state, "host", "workspaces", "proj") {
		t.Errorf("workspace path %s", s.WorkspacePath())
	}
	_ = s.Destroy(context.Background())
	if b, err := os.ReadFile(filepath.Join(state, "host", "workspaces", "proj", "keep.txt")); err != nil || string(b) != "kept" {
		t.Errorf("the persistent file is gone after destroy: %q %v", b, err)
	}
}

// Building sandboxes and network namespaces on many threads at once never
// leaves another thread of the process in a session's namespace: the
// process's own loopback connections keep working throughout. (The host's
// namespace was once read from /proc/self, the main thread, which could be
// inside another sandbox's setup at that moment.)
func TestNetnsSetupNeverStrandsThreads(t *testing.T) {
	needRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	stop := make(chan struct{})
	var refused atomic.Int64
	var dialers sync.WaitGroup
	for range 8 {
		dialers.Add(1)
		go func() {
			defer dialers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
				if err != nil {
					refused.Add(1)
					continue
				}
				c.Close()
			}
		}()
	}
	var builders sync.WaitGroup
	for range 24 {
		builders.Add(1)
		go func() {
			defer builders.Done()
			sb, err := host.New(host.Options{Options: kit.Options{Policy: openPolicy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
			if err != nil {
				t.Error(err)
				return
			}
			defer sb.Close(context.Background())
			s, err := sb.CreateSession(context.Background(), hostSpec(sandbox.NetworkNone))
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Exec(context.Background(), []string{"/bin/true"}, sandbox.ExecOptions{Timeout: 20 * time.Second}); err != nil {
				t.Error(err)
			}
		}()
	}
	builders.Wait()
	close(stop)
	dialers.Wait()
	if n := refused.Load(); n != 0 {
		t.Errorf("%d loopback dials failed while sandboxes were built: a thread was left in a session's network namespace", n)
	}
}

// The handle's Exited (sandbox.ExitWatcher) closes when the command exits,
// before its output is read, and not before.
func TestExitedBeforeOutputRead(t *testing.T) {
	sb, _ := newHost(t, host.Options{})
	s := mustCreate(t, sb, hostSpec(sandbox.NetworkEgress))
	ctx := context.Background()
	h, err := s.ExecStart(ctx, []string{"sh", "-c", "read x; head -c 100000 /dev/zero"}, sandbox.StartOptions{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Kill(ctx) }()
	w, ok := h.(sandbox.ExitWatcher)
	if !ok {
		t.Fatalf("the host's handle (%T) does not implement sandbox.ExitWatcher", h)
	}
	select {
	case <-w.Exited():
		t.Fatal("Exited closed while the command still waits on stdin")
	case <-time.After(200 * time.Millisecond):
	}
	if err := h.WriteStdin(ctx, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("Exited did not close after the command exited (its output unread)")
	}
}

// sigignHelper runs in a copy of the test binary started with SIGINT and
// SIGHUP ignored (as a background job of a script or nohup starts a
// daemon): it prints whether they were ignored here and the SigIgn mask of
// a command run through the host runner.
func sigignHelper() int {
	fmt.Printf("ignored-here=%v\n", signal.Ignored(syscall.SIGINT) && signal.Ignored(syscall.SIGHUP))
	dir, err := os.MkdirTemp("", "tai42-sigign-")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(dir)
	sb, err := host.New(host.Options{Options: kit.Options{Policy: openPolicy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer sb.Close(context.Background())
	s, err := sb.CreateSession(context.Background(), hostSpec(sandbox.NetworkEgress))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	r, err := s.Exec(context.Background(), []string{"grep", "SigIgn", "/proc/self/status"}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Print(r.Stdout)
	return 0
}

// A daemon started with SIGINT and SIGHUP ignored (a script's background
// job, nohup) still starts commands with their default action, so ^C
// reaches a shell's foreground job; the daemon itself goes on ignoring
// them.
func TestSignalsDefaultInCommands(t *testing.T) {
	cmd := exec.Command("sh", "-c", `trap "" INT HUP; exec "$0" -test.run '^$'`, os.Args[0])
	cmd.Env = append(os.Environ(), "TAI42_HOST_TEST_HELPER=sigign")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ignored-here=true") {
		t.Fatalf("the helper did not start with SIGINT and SIGHUP ignored:\n%s", out)
	}
	var mask uint64
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		if mask&(1<<(sig-1)) != 0 {
			t.Errorf("a command started by the host runner ignores %v (SigIgn %016x); it must get the default action", sig, mask)
		}
	}
}

// A put through a symlink that leads out of the workspace says so in
// words, whichever step of the put met the escape.
func TestEscapeMessage(t *testing.T) {
	sb, _ := newHost(t, host.Options{})
	s := mustCreate(t, sb, hostSpec(sandbox.NetworkEgress))
	run(t, s, nil, "ln", "-s", "/etc", "etclink")
	for _, p := range []string{"etclink/x", "etclink/sub/x"} {
		err := s.PutFile(context.Background(), p, []byte("x"))
		if err == nil || !strings.Contains(err.Error(), "leads out of the workspace") || strings.Contains(err.Error(), "path escapes from parent") {
			t.Errorf("PutFile(%q) through a symlink out of the workspace: %v; want it to say it leads out of the workspace", p, err)
		}
	}
}

// closeCountingLedger counts its Closes.
type closeCountingLedger struct {
	*kit.MemoryLedger
	closes atomic.Int32
}

func (l *closeCountingLedger) Close() error { l.closes.Add(1); return nil }

// TestNewClosesLedgerOnFailure: New owns the ledger it is given, so a
// caller never closes it after a failed New. Whether New fails before the
// kit (no state directory) or in it (a policy the kit rejects), the
// ledger is closed exactly once.
func TestNewClosesLedgerOnFailure(t *testing.T) {
	for name, opts := range map[string]host.Options{
		"before the kit": {},
		"in the kit":     {ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}, Options: kit.Options{Policy: sandbox.Policy{Egress: "wide"}}},
	} {
		l := &closeCountingLedger{MemoryLedger: kit.NewMemoryLedger()}
		opts.Ledger = l
		if sb, err := host.New(opts); err == nil {
			sb.Close(context.Background())
			t.Fatalf("%s: New succeeded", name)
		}
		if n := l.closes.Load(); n != 1 {
			t.Errorf("%s: ledger closed %d times, want 1", name, n)
		}
	}
}

// TestRegister: the host runner registers itself under its name, and its
// options are asked for only when it is Required (a durable ledger opened
// only for the provider asked for): once when that open succeeds; an
// error of theirs is the Require's.
func TestRegister(t *testing.T) {
	var reg sandbox.Registry
	asked := 0
	fail := errors.New("no state directory today")
	err := host.Register(&reg, func() (host.Options, error) {
		asked++
		if asked == 1 {
			return host.Options{}, fail
		}
		return host.Options{Options: kit.Options{Policy: openPolicy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if names := reg.Names(); len(names) != 1 || names[0] != host.Name || asked != 0 {
		t.Fatalf("registered %v, options asked %d times; want %q alone, not yet asked", names, asked, host.Name)
	}
	if _, err := reg.Require(host.Name); !errors.Is(err, fail) {
		t.Fatalf("Require with failing options = %v; want their error", err)
	}
	sb, err := reg.Require(host.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.(*kit.Sandbox).Close(context.Background())
	if _, err := reg.Require(host.Name); err != nil || asked != 2 {
		t.Errorf("a third Require = %v, options asked %d times; want the opened runner, asked twice in all", err, asked)
	}
}
