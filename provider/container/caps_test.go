package container_test

// The caps as cgroup limits, seen to hold under attack: a fork bomb is held
// by the pids limit, a memory bomb is killed inside its session's cgroup
// and says so, a busy loop is throttled to its cpu cap.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// bomb is the fork bomb: a shell function that runs itself twice in the
// background, in a subshell of its own, while the exec's shell becomes a
// sleep (no fork): the exec runs until its timeout whatever the bomb's
// shells make of the forks the limit refuses them.
const bomb = `(f(){ f|f& }; f) & exec sleep 60`

// TestCapsForkBomb: a fork bomb fills its session's pids limit and no
// more; the host's process count stays bounded; the exec ends by its
// timeout; afterwards the session runs commands again, and its destroy
// leaves no process and no cgroup.
//
// The session also gets a cpu cap of 1, so that the bomb leaves a core to
// the rest of the machine; that is not what holds the process count. (No
// memory cap: the memory limit's OOM killer would end the bomb's shell
// before its timeout.)
func TestCapsForkBomb(t *testing.T) {
	forEachRuntimeImage(t, func(t *testing.T, p *testProvider, image string) {
		sp := spec(image, sandbox.NetworkNone)
		sp.CPU = 1
		sess := p.session(t, sp)
		id := sess.ID()
		if got := readCgroupInt(t, id, "pids.max"); got != container.DefaultPidsLimit {
			t.Fatalf("pids.max = %d, want the default limit %d", got, container.DefaultPidsLimit)
		}
		pidNS := sessionPidNS(t, id)
		hostBefore := hostProcsOutsideSessions(id)

		// Sample, while it runs, the session's processes as its cgroup
		// counts them and as the host sees them (every process in its pid
		// namespace, in its cgroup or not), and the host's.
		stop := make(chan struct{})
		var peakCgroup, peakNS, peakHost int
		var sampler sync.WaitGroup
		sampler.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				if f := cgroupFile(id, "pids.current"); f != "" {
					if n, ok := readInt(f); ok {
						peakCgroup = max(peakCgroup, int(n))
					}
				}
				inNS, all := countPidNS(pidNS)
				peakNS, peakHost = max(peakNS, inNS), max(peakHost, all)
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
		const timeout = 2 * time.Second
		start := time.Now()
		res, err := sess.Exec(ctxFor(t), []string{"sh", "-c", bomb}, sandbox.ExecOptions{Timeout: timeout})
		took := time.Since(start)
		close(stop)
		sampler.Wait()
		var te *sandbox.ExecTimeoutError
		switch {
		case err == nil:
			t.Errorf("the fork bomb's shell exited %d after %v, before its timeout; stderr ends %q", res.ExitCode, took, tail(res.Stderr, 300))
		case !errors.As(err, &te):
			t.Errorf("the fork bomb's exec ended with %v after %v; want an *ExecTimeoutError", err, took)
		}
		if took > timeout+10*time.Second {
			t.Errorf("the fork bomb's exec took %v, timeout %v", took, timeout)
		}
		if hit := readCgroupKeyed(t, id, "pids.events", "max"); hit == 0 {
			t.Errorf("the bomb never hit the pids limit (peak %d processes): the test proved nothing", peakCgroup)
		}
		t.Logf("peak: %d processes in the session's cgroup, %d in its pid namespace (limit %d); %d on the host (%d outside sessions before); the exec ended after %v",
			peakCgroup, peakNS, container.DefaultPidsLimit, peakHost, hostBefore, took)
		if peakCgroup > container.DefaultPidsLimit || peakNS > container.DefaultPidsLimit {
			t.Errorf("the session reached %d processes (cgroup) / %d (pid namespace), over its limit %d", peakCgroup, peakNS, container.DefaultPidsLimit)
		}

		// The kill ended the bomb: the session answers again.
		deadline := time.Now().Add(20 * time.Second)
		for {
			res, err := sess.Exec(ctxFor(t), []string{"echo", "ok"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
			if err == nil && res.ExitCode == 0 && res.Stdout == "ok\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("after the bomb the session does not run `echo ok`: %+v, %v (processes: %d)", res, err, len(sessionPIDs(t, id)))
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("after the kill: %d processes in the session", len(sessionPIDs(t, id)))

		destroyLeavesNothing(t, sess)
		// Other work on the machine comes and goes (other sessions' are
		// not counted): the bomb must have left nothing of its own.
		if after, slack := hostProcsOutsideSessions(id), 256; after > hostBefore+slack {
			t.Errorf("the host has %d processes outside sessions after the session's destroy, %d before the bomb", after, hostBefore)
		}
	})
}

// TestCapsForkBombDestroy: a bomb still running at its limit (its exec
// far from its timeout) does not keep the destroy from ending every
// process and removing the cgroup.
func TestCapsForkBombDestroy(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		p := newProvider(t, rt)
		sp := spec(containertest.Busybox, sandbox.NetworkNone)
		sp.CPU = 1
		sess := p.session(t, sp)
		id := sess.ID()
		h, err := sess.ExecStart(ctxFor(t), []string{"sh", "-c", bomb}, sandbox.StartOptions{Timeout: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for readCgroupKeyed(t, id, "pids.events", "max") == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the bomb did not reach the pids limit in 20s (%d processes)", readCgroupInt(t, id, "pids.current"))
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("the bomb is at %d processes", readCgroupInt(t, id, "pids.current"))
		destroyLeavesNothing(t, sess)
		// The handle ends: the session is gone. (What the bomb wrote before,
		// its shells' complaints that they cannot fork, comes first.)
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		start := time.Now()
		var items, size int
		for {
			item, err := h.Next(ctx)
			if err != nil {
				if !errors.Is(err, sandbox.ErrSessionNotFound) {
					t.Errorf("the bomb's stream ended with %v after %d items (%d bytes), want a session-not-found error", err, items, size)
				}
				break
			}
			items++
			if c, ok := item.(*sandbox.StreamChunk); ok {
				size += len(c.Data)
			}
		}
		t.Logf("the bomb's stream ended after %d more items (%d bytes) in %v", items, size, time.Since(start))
	})
}

// destroyLeavesNothing destroys sess and checks that no process of it and
// no cgroup of it remain.
func destroyLeavesNothing(t *testing.T, sess sandbox.Session) {
	t.Helper()
	id := sess.ID()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := sess.Destroy(ctx); err != nil {
		t.Errorf("destroying the session: %v", err)
	}
	if dirs := cgroupDirs(id); len(dirs) > 0 {
		t.Errorf("cgroups left after the destroy: %v", dirs)
		removeCgroups(t, id)
	}
	if left := liveProcsOf(t, id); len(left) > 0 {
		t.Errorf("processes left after the destroy, in cgroups of %s: %v", id, left)
	}
}

// liveProcsOf waits a little for the processes whose cgroup names id to
// be gone and describes those still alive. A zombie is not alive: it is
// dead, and its parent (for a container's PID 1, the host's init, once
// the runtime has gone) reaps it when it gets round to it.
func liveProcsOf(t testing.TB, id string) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var live, zombies []string
		for _, d := range describePIDs(pidsInCgroupOf(t, id)) {
			if strings.Contains(d, " state=Z ") {
				zombies = append(zombies, d)
			} else {
				live = append(live, d)
			}
		}
		if len(live) == 0 {
			if len(zombies) > 0 {
				t.Logf("dead processes of %s not yet reaped by their parent: %v", id, zombies)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return live
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pidsInCgroupOf lists the machine's processes whose cgroup path names id.
func pidsInCgroupOf(t testing.TB, id string) []int {
	t.Helper()
	var out []int
	for _, pid := range hostPIDs(t) {
		b, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "cgroup"))
		if err == nil && strings.Contains(string(b), id) {
			out = append(out, pid)
		}
	}
	return out
}

// TestCapsMemoryBomb: a session with memory_mb=64 allocating far more is
// killed inside its own cgroup: exit 137 with the provider's reason on
// stderr, never a silent 137. Meanwhile another session of the provider
// keeps answering, the test process (standing for the daemon) is not
// touched by the OOM killer, and afterwards the bombed session runs
// commands again (its agent survived).
func TestCapsMemoryBomb(t *testing.T) {
	forEachRuntimeImage(t, func(t *testing.T, p *testProvider, image string) {
		sp := spec(image, sandbox.NetworkNone)
		sp.MemoryMB = 64
		bomb := p.session(t, sp)
		other := p.session(t, spec(image, sandbox.NetworkNone))
		if got := memoryLimit(t, bomb.ID()); got != 64<<20 {
			t.Fatalf("the session's memory limit is %d, want %d", got, 64<<20)
		}
		argv := []string{"python3", "-c", "b = b'x' * (1 << 30)"}
		if image == containertest.Busybox {
			argv = []string{"sh", "-c", "dd if=/dev/zero bs=1M count=500 2>/dev/null | sort >/dev/null"}
		}
		selfOOM, selfOOMok := ownOOMKills()

		done := make(chan struct{})
		type probeOutcome struct {
			n       int
			slowest time.Duration
			errs    []string
		}
		var po probeOutcome
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				res, err := other.Exec(ctx, []string{"echo", "ok"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
				cancel()
				po.n++
				po.slowest = max(po.slowest, time.Since(start))
				if err != nil || res.Stdout != "ok\n" {
					po.errs = append(po.errs, errorOr(err, res.Stdout))
				}
				select {
				case <-done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
		start := time.Now()
		res, err := bomb.Exec(ctxFor(t), argv, sandbox.ExecOptions{Timeout: 60 * time.Second})
		took := time.Since(start)
		close(done)
		wg.Wait()
		if err != nil {
			t.Fatalf("the memory bomb: %v", err)
		}
		t.Logf("the memory bomb ended after %v: exit %d, stderr %q; the other session ran %d execs meanwhile (slowest %v)", took, res.ExitCode, res.Stderr, po.n, po.slowest)
		if res.ExitCode != 137 {
			t.Errorf("exit %d, want 137 (killed by the memory limit); stderr %q", res.ExitCode, res.Stderr)
		}
		if !strings.Contains(res.Stderr, "memory limit") {
			t.Errorf("stderr %q does not say the memory limit killed it", res.Stderr)
		}
		if n := oomKills(t, bomb.ID()); n < 1 {
			t.Errorf("the session's cgroup counts %d OOM kills, want at least 1", n)
		}
		if len(po.errs) > 0 {
			t.Errorf("the other session failed %d of %d execs during the bomb: %q", len(po.errs), po.n, po.errs)
		}
		if after, ok := ownOOMKills(); selfOOMok && ok && after != selfOOM {
			t.Errorf("the OOM killer acted in the test process's own memory cgroup (%d kills, were %d)", after, selfOOM)
		}
		if got := run(t, bomb, "echo", "ok"); got.Stdout != "ok\n" {
			t.Errorf("after the bomb its session answers %+v", got)
		}
		if got := run(t, other, "echo", "ok"); got.Stdout != "ok\n" {
			t.Errorf("after the bomb the other session answers %+v", got)
		}
	})
}

func errorOr(err error, stdout string) string {
	if err != nil {
		return err.Error()
	}
	return "stdout " + stdout
}

// ownOOMKills is the OOM kill count of this process's memory cgroup (v1),
// and whether it could be read.
func ownOOMKills() (int64, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) == 3 && parts[1] == "memory" {
			c, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.oom_control"))
			if err != nil {
				return 0, false
			}
			for l := range strings.Lines(string(c)) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "oom_kill "); ok {
					n, ok := parseInt(v)
					return n, ok
				}
			}
		}
	}
	return 0, false
}

// TestCapsCPU: a session with cpu 0.2 running a busy loop for about a
// second gets about a fifth of a CPU, and the kernel throttles it: the cap
// is enforced, not just accepted.
func TestCapsCPU(t *testing.T) {
	forEachRuntimeImage(t, func(t *testing.T, p *testProvider, image string) {
		sp := spec(image, sandbox.NetworkNone)
		sp.CPU = 0.2
		sess := p.session(t, sp)
		id := sess.ID()
		if q, per := cpuQuota(t, id); q != 20000 || per != 100000 {
			t.Errorf("the CFS quota is %d of a %d period, want 20000 of 100000", q, per)
		}
		usage0 := cpuUsage(t, id)
		throttled0 := readCgroupKeyed(t, id, "cpu.stat", "nr_throttled")
		start := time.Now()
		_, err := sess.Exec(ctxFor(t), []string{"sh", "-c", "while :; do :; done"}, sandbox.ExecOptions{Timeout: time.Second})
		wall := time.Since(start)
		var te *sandbox.ExecTimeoutError
		if !errors.As(err, &te) {
			t.Fatalf("the busy loop ended with %v, want its timeout", err)
		}
		used := cpuUsage(t, id) - usage0
		throttled := readCgroupKeyed(t, id, "cpu.stat", "nr_throttled") - throttled0
		t.Logf("a busy loop of %v wall time used %v of CPU, throttled %d times", wall, used, throttled)
		if limit := time.Duration(0.2*float64(wall)) + 100*time.Millisecond; used > limit {
			t.Errorf("the session used %v of CPU in %v; cpu 0.2 allows about %v", used, wall, limit)
		}
		if used < 50*time.Millisecond {
			t.Errorf("the busy loop used only %v of CPU: it did not run, and the test proved nothing", used)
		}
		if throttled == 0 {
			t.Error("the kernel never throttled the session: the cap was not what bounded it")
		}
	})
}

// memoryLimit is the memory limit of session id's cgroup, in bytes.
func memoryLimit(t testing.TB, id string) int64 {
	t.Helper()
	if cgroupFile(id, "memory.limit_in_bytes") != "" {
		return readCgroupInt(t, id, "memory.limit_in_bytes")
	}
	return readCgroupInt(t, id, "memory.max") // v2
}

// oomKills is how many processes the memory limit of session id's cgroup
// has killed.
func oomKills(t testing.TB, id string) int64 {
	t.Helper()
	if cgroupFile(id, "memory.oom_control") != "" {
		return readCgroupKeyed(t, id, "memory.oom_control", "oom_kill")
	}
	return readCgroupKeyed(t, id, "memory.events", "oom_kill") // v2
}

// cpuQuota is the CFS quota and period of session id's cgroup, in µs.
func cpuQuota(t testing.TB, id string) (quota, period int64) {
	t.Helper()
	if cgroupFile(id, "cpu.cfs_quota_us") != "" {
		return readCgroupInt(t, id, "cpu.cfs_quota_us"), readCgroupInt(t, id, "cpu.cfs_period_us")
	}
	p := cgroupFile(id, "cpu.max") // v2: "QUOTA PERIOD"
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("session %s's cpu.max: %v", id, err)
	}
	q, per, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	quota, _ = parseInt(q)
	period, _ = parseInt(per)
	return quota, period
}

// cpuUsage is the CPU time session id's cgroup has used.
func cpuUsage(t testing.TB, id string) time.Duration {
	t.Helper()
	if cgroupFile(id, "cpuacct.usage") != "" {
		return time.Duration(readCgroupInt(t, id, "cpuacct.usage"))
	}
	return time.Duration(readCgroupKeyed(t, id, "cpu.stat", "usage_usec")) * time.Microsecond // v2
}

// tail is the end of s, at most n bytes.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestCapsTimeoutBoundsLeftoverOutput: an exec whose command exits at once
// but leaves a process in its group that keeps writing to the output
// still ends within its timeout (by the exit grace, with the command's
// status, or by the timeout): the session cannot hold a caller past the
// timeout it set.
func TestCapsTimeoutBoundsLeftoverOutput(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		p := newProvider(t, rt)
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		const timeout = 2 * time.Second
		var wg sync.WaitGroup
		for _, script := range []string{
			`(while :; do echo x; sleep 0.01; done) & exit 3`,
			`(while :; do echo x >&2; done) & exit 3`,
		} {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout+4*time.Second)
				defer cancel()
				start := time.Now()
				res, err := sess.Exec(ctx, []string{"sh", "-c", script}, sandbox.ExecOptions{Timeout: timeout})
				took := time.Since(start)
				var te *sandbox.ExecTimeoutError
				switch {
				case took > timeout+3*time.Second:
					t.Errorf("sh -c %q with timeout %v returned after %v: %s, %v", script, timeout, took, summary(res), err)
				case err == nil && res.ExitCode == 3, errors.As(err, &te):
					t.Logf("sh -c %q: %s, %v, after %v", script, summary(res), err, took)
				default:
					t.Errorf("sh -c %q: %s, %v after %v; want its exit 3 (the left writer cut off by the exit grace) or its timeout", script, summary(res), err, took)
				}
			})
		}
		wg.Wait()
		// The writers are in the exec's group: the session's destroy (at
		// cleanup) ends them; meanwhile the session still answers.
		if got := run(t, sess, "echo", "ok"); got.Stdout != "ok\n" {
			t.Errorf("the session answers %+v", summary(got))
		}
	})
}

// summary is res without its (possibly large) output.
func summary(res sandbox.ExecResult) string {
	return fmt.Sprintf("exit %d, stdout %d bytes, stderr %d bytes", res.ExitCode, len(res.Stdout), len(res.Stderr))
}

// sessionPidNS is the pid namespace of session id (its agent's), as
// /proc/PID/ns/pid reads on the host.
func sessionPidNS(t testing.TB, id string) string {
	t.Helper()
	pids := sessionPIDs(t, id)
	if len(pids) == 0 {
		t.Fatalf("session %s has no process", id)
	}
	ns, err := os.Readlink(filepath.Join("/proc", itoa(pids[0]), "ns/pid"))
	if err != nil {
		t.Fatalf("the pid namespace of session %s: %v", id, err)
	}
	return ns
}

// countPidNS counts the machine's processes in the pid namespace ns, and
// all of them.
func countPidNS(ns string) (in, all int) {
	for _, pid := range hostPIDsQuiet() {
		all++
		if l, err := os.Readlink(filepath.Join("/proc", itoa(pid), "ns/pid")); err == nil && l == ns {
			in++
		}
	}
	return in, all
}

// hostProcsOutsideSessions counts the machine's processes less those in
// the container sessions' pids cgroups (of any provider on the machine:
// other tests' sessions come and go) but id's, which counts.
func hostProcsOutsideSessions(id string) int {
	n := len(hostPIDsQuiet())
	dirs, _ := filepath.Glob("/sys/fs/cgroup/pids/tai42/*")
	if v2, _ := filepath.Glob("/sys/fs/cgroup/tai42/*"); len(v2) > 0 {
		dirs = append(dirs, v2...)
	}
	for _, d := range dirs {
		if filepath.Base(d) == id {
			continue
		}
		if c, ok := readInt(filepath.Join(d, "pids.current")); ok {
			n -= int(c)
		}
	}
	return n
}
