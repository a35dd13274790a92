package container_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// poolMembers lists the bundles in the provider's sessions directory that
// no session in ids owns: the pool's.
func poolMembers(t *testing.T, opts container.Options, ids ...string) []string {
	t.Helper()
	entries, err := os.ReadDir(opts.StateDir + "/container/sessions")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !slices.Contains(ids, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestPoolSweptAfterCrash: the sessions a pool made ahead are in no
// ledger: after a crash the next start sweeps them (containers, cgroups,
// mounts, network namespaces), and brings back the live session taken
// from the pool, with its caps.
func TestPoolSweptAfterCrash(t *testing.T) {
	containertest.Require(t)
	opts := recoverOptions(t, "crun", container.UserNamespaceOn)
	opts.Pool = []kit.PoolShape{
		{Image: containertest.Busybox, Network: sandbox.NetworkNone, Size: 2},
		{Image: sandbox.HostImage, Network: sandbox.NetworkInternal, Size: 1},
	}
	sbA, ledger, crash := crashable(t, opts)
	ctx := ctxFor(t)
	if err := sbA.WaitPool(ctx); err != nil {
		t.Fatal(err)
	}
	sp := spec(containertest.Busybox, sandbox.NetworkNone)
	sp.MemoryMB = 64
	live, err := sbA.CreateSession(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	if st := sbA.PoolStats(); st[0].Hits != 1 {
		t.Fatalf("PoolStats = %+v; want the create served from the pool", st)
	}
	if err := sbA.WaitPool(ctx); err != nil {
		t.Fatal(err)
	}
	members := poolMembers(t, opts, live.ID())
	if len(members) != 3 {
		t.Fatalf("the pool holds %d sessions (%v), want 3", len(members), members)
	}
	crash()

	opts.Pool = nil
	opts.Ledger = ledger
	sb, err := container.New(opts)
	if err != nil {
		t.Fatalf("a new provider on the crashed one's state directory: %v", err)
	}
	defer func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	for _, id := range members {
		checkGone(t, opts, "a pool's session", id, 0)
	}
	back, err := sb.GetSession(ctx, live.ID())
	if err != nil {
		t.Fatalf("the session taken from the pool is not back: %v", err)
	}
	// Its memory cap came back with it: a command past it is killed, and
	// said to be.
	r, err := back.Exec(ctx, []string{"sh", "-c", "head -c 200000000 /dev/zero | tail > /dev/null"}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 {
		t.Errorf("a command using 200 MB in a session of memory_mb 64 exited 0")
	}
}

// TestPoolDeadSessionNeverHandedOut: a session made ahead whose agent died
// while it waited is found at its take, destroyed, and not handed out;
// the create gets a working session.
func TestPoolDeadSessionNeverHandedOut(t *testing.T) {
	containertest.Require(t)
	opts := containertest.Options(t, "crun", permissive)
	opts.ReapInterval = -1
	opts.Pool = []kit.PoolShape{{Image: containertest.Busybox, Network: sandbox.NetworkNone, Size: 1}}
	sb := containertest.New(t, opts)
	ctx := ctxFor(t)
	if err := sb.WaitPool(ctx); err != nil {
		t.Fatal(err)
	}
	members := poolMembers(t, opts)
	if len(members) != 1 {
		t.Fatalf("the pool holds %v, want one session", members)
	}
	dead := members[0]
	pid := bundlePID(t, opts, dead)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitDead(t, pid)
	s, err := sb.CreateSession(ctx, spec(containertest.Busybox, sandbox.NetworkNone))
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() == dead {
		t.Fatalf("the session %s, whose agent was killed, was handed out", dead)
	}
	if out := mustSh(t, s, "echo alive"); out != "alive\n" {
		t.Errorf("the session handed out answers %q", out)
	}
	if st := sb.PoolStats(); st[0].Discarded != 1 {
		t.Errorf("PoolStats = %+v; want the dead session discarded", st)
	}
	checkGone(t, opts, "the dead pool session", dead, pid)
}

// TestPoolOOMNote: a session taken from the pool is given the create's
// spec, not only its caps: a command its memory limit kills is said to be
// (exit 137 and the provider's note naming memory_mb), as in a session
// made cold (TestCapsMemoryBomb).
func TestPoolOOMNote(t *testing.T) {
	containertest.Require(t)
	opts := containertest.Options(t, "crun", permissive)
	opts.ReapInterval = -1
	opts.Pool = []kit.PoolShape{{Image: containertest.Busybox, Network: sandbox.NetworkNone, Size: 1}}
	opts.PoolWait = true
	sb := containertest.New(t, opts)
	ctx := ctxFor(t)
	sp := spec(containertest.Busybox, sandbox.NetworkNone)
	sp.MemoryMB = 64
	sess, err := sb.CreateSession(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	if st := sb.PoolStats(); st[0].Hits != 1 {
		t.Fatalf("PoolStats = %+v; want the create served from the pool", st)
	}
	if got := memoryLimit(t, sess.ID()); got != 64<<20 {
		t.Fatalf("the session's memory limit is %d, want %d", got, 64<<20)
	}
	res, err := sess.Exec(ctx, []string{"sh", "-c", "dd if=/dev/zero bs=1M count=500 2>/dev/null | sort >/dev/null"},
		sandbox.ExecOptions{Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 137 || !strings.Contains(res.Stderr, "memory limit (memory_mb=64)") {
		t.Errorf("a command past the memory limit of a pooled session: exit %d, stderr %q; want 137 and the note naming memory_mb=64", res.ExitCode, res.Stderr)
	}
	if n := oomKills(t, sess.ID()); n < 1 {
		t.Errorf("the session's cgroup counts %d OOM kills, want at least 1", n)
	}
}

// TestDefaultAgent: with no AgentBinary, the provider runs tai42-agent
// where it is installed beside the executable (and executable), else the
// executable itself.
func TestDefaultAgent(t *testing.T) {
	dir := t.TempDir()
	exe := dir + "/tai42"
	if got := container.DefaultAgent(exe); got != exe {
		t.Errorf("no tai42-agent beside: %q, want %q", got, exe)
	}
	alone := dir + "/" + container.AgentAlone
	if err := os.WriteFile(alone, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := container.DefaultAgent(exe); got != exe {
		t.Errorf("a tai42-agent not executable beside: %q, want %q", got, exe)
	}
	if err := os.Chmod(alone, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := container.DefaultAgent(exe); got != alone {
		t.Errorf("tai42-agent beside: %q, want %q", got, alone)
	}
}
