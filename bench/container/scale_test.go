package container_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// BenchmarkIdleSessions holds BENCH_SCALE_SESSIONS (default 500) live idle
// sessions at once (runc, busybox, network none): it creates them with
// BENCH_SCALE_CONCURRENCY (default 8) creates in flight, checks that each
// answers an exec of /bin/true, lets them idle for BENCH_IDLE_SETTLE,
// measures each one's memory (cgroup charge + agent PSS) and the
// machine's MemAvailable, destroys them all, and checks that nothing is
// left: the provider's sessions directory empty, no root mount point, no
// cgroup of theirs under tai42, no mount. Run it with -benchtime 1x;
// ns/op is the whole run.
//
// A create or an exec check that fails is a result, not the end: the
// benchmark goes on with the sessions it has, reports how many failed
// and logs the first errors. A failed destroy, or anything left, fails it.
//
// Metrics: wanted (sessions asked for), sessions (created and answering
// the exec check), create-failed, exec-failed; create-total-ns (wall time
// of all creates), create-p50-ns and create-p99-ns (each create, under
// that concurrency); exec-total-ns (the exec check of all, same
// concurrency); cgroup-B, pss-B, total-B, unique-B and their parts
// (medians per session, see reportMemory) and mean-B (mean total);
// memavail-before-B, memavail-live-B (all live and idle),
// memavail-after-B (all destroyed) and memavail-per-session-B ((before -
// live) / sessions: everything a session costs the machine, kernel
// included, but also whatever else ran meanwhile); destroy-total-ns;
// left-sessions, left-cgroups, left-mounts.
func BenchmarkIdleSessions(b *testing.B) {
	n := envInt(b, "BENCH_SCALE_SESSIONS", 500)
	conc := envInt(b, "BENCH_SCALE_CONCURRENCY", 8)
	settle := envDuration(b, "BENCH_IDLE_SETTLE", 2*time.Second)
	sb, opts := newProvider(b, "runc")
	sessDir := filepath.Join(opts.StateDir, "container", "sessions")
	ctx := context.Background()

	for b.Loop() {
		before, err := memAvailable()
		if err != nil {
			b.Fatal(err)
		}
		made := make([]sandbox.Session, n)
		creates, createWall, createErr := parallel(n, conc, func(i int) error {
			s, err := sb.CreateSession(ctx, sessionSpec(containertest.Busybox))
			made[i] = s
			return err
		})
		if createErr != nil {
			b.Logf("creating %d sessions, %d at once: %v", n, conc, createErr)
		}
		var sessions []sandbox.Session
		for _, s := range made {
			if s != nil {
				sessions = append(sessions, s)
			}
		}
		answered := make([]bool, len(sessions))
		_, execWall, execErr := parallel(len(sessions), conc, func(i int) error {
			err := execTrue(ctx, sessions[i])
			answered[i] = err == nil
			return err
		})
		if execErr != nil {
			b.Logf("the exec check of %d live sessions: %v", len(sessions), execErr)
		}
		time.Sleep(settle)
		live, err := memAvailable()
		if err != nil {
			b.Fatal(err)
		}
		var ms []idleMemory
		for i, s := range sessions {
			if !answered[i] {
				continue
			}
			m, err := oursIdleMemory(s.ID())
			if err != nil {
				b.Fatal(err)
			}
			ms = append(ms, m)
		}
		_, destroyWall, err := parallel(len(sessions), conc, func(i int) error { return sb.DestroySession(ctx, sessions[i].ID()) })
		if err != nil {
			b.Errorf("destroying %d sessions: %v", len(sessions), err)
		}
		after, err := memAvailable()
		if err != nil {
			b.Fatal(err)
		}
		pool, err := container.WaitDiskPool(ctx, sb.Sandbox)
		if err != nil {
			b.Fatal(err)
		}
		leftSessions, leftCgroups, leftMounts := leftovers(sessDir, opts.StateDir, sessionIDs(sessions), pool)
		if len(leftSessions)+len(leftCgroups)+len(leftMounts) > 0 {
			b.Errorf("left after destroying every session: session dirs %v, cgroups %v, mounts %v", leftSessions, leftCgroups, leftMounts)
		}

		b.ReportMetric(float64(n), "wanted")
		b.ReportMetric(float64(len(ms)), "sessions")
		b.ReportMetric(float64(n-len(sessions)), "create-failed")
		b.ReportMetric(float64(len(sessions)-len(ms)), "exec-failed")
		b.ReportMetric(float64(createWall.Nanoseconds()), "create-total-ns")
		b.ReportMetric(float64(creates.percentile(0.50).Nanoseconds()), "create-p50-ns")
		b.ReportMetric(float64(creates.percentile(0.99).Nanoseconds()), "create-p99-ns")
		b.ReportMetric(float64(execWall.Nanoseconds()), "exec-total-ns")
		if len(ms) > 0 {
			reportMemory(b, ms)
			var sum int64
			for _, m := range ms {
				sum += m.total()
			}
			b.ReportMetric(float64(sum)/float64(len(ms)), "mean-B")
			b.ReportMetric(float64(before-live)/float64(len(sessions)), "memavail-per-session-B")
		}
		b.ReportMetric(float64(before), "memavail-before-B")
		b.ReportMetric(float64(live), "memavail-live-B")
		b.ReportMetric(float64(after), "memavail-after-B")
		b.ReportMetric(float64(destroyWall.Nanoseconds()), "destroy-total-ns")
		b.ReportMetric(float64(len(leftSessions)), "left-sessions")
		b.ReportMetric(float64(len(leftCgroups)), "left-cgroups")
		b.ReportMetric(float64(len(leftMounts)), "left-mounts")
	}
}

// parallel calls fn(i) for every i in [0, n), conc calls at a time, and
// returns each call's duration, the wall time of all, and the errors
// (the first few, and how many there were).
func parallel(n, conc int, fn func(i int) error) (latencies, time.Duration, error) {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
		nerr  int
		durs  = make(latencies, n)
		start = time.Now()
	)
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				err := fn(i)
				durs[i] = time.Since(t0)
				if err != nil {
					mu.Lock()
					nerr++
					if len(errs) < 5 {
						errs = append(errs, fmt.Errorf("#%d: %w", i, err))
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	if nerr > 0 {
		return durs, wall, fmt.Errorf("%d of %d failed: %w", nerr, n, errors.Join(errs...))
	}
	return durs, wall, nil
}

// rootsDir is where a provider that remaps users mounts its sessions'
// roots, one directory per session (see container.Options.UserNamespace).
const rootsDir = "/run/tai42/roots"

// leftovers lists what the sessions ids left: entries of the sessions
// directory and their root mount points under rootsDir, their cgroups (in
// any hierarchy, under tai42), mounts under stateDir or on a path through
// a directory named by one of the ids, the disk cap's images and mount
// points in the disks directory (with dirs) and loop devices on files
// under stateDir (with mounts). pool are the mount points of the disks a
// provider still open made ahead for no session (container.WaitDiskPool):
// they, their images and loop devices are not left.
func leftovers(sessDir, stateDir string, ids, pool []string) (dirs, cgroups, mounts []string) {
	isPool := func(p string) bool {
		return slices.ContainsFunc(pool, func(d string) bool { return p == d || p == d+".img" })
	}
	entries, err := os.ReadDir(sessDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		dirs = append(dirs, fmt.Sprintf("cannot read %s: %v", sessDir, err))
	}
	for _, e := range entries {
		dirs = append(dirs, filepath.Join(sessDir, e.Name()))
	}
	ours := make(map[string]bool, len(ids))
	for _, id := range ids {
		ours[id] = true
		if p := filepath.Join(rootsDir, id); exists(p) {
			dirs = append(dirs, p)
		}
	}
	hierarchies := []string{cgroupRoot}
	if !cgroupV2() {
		hierarchies = nil
		all, _ := os.ReadDir(cgroupRoot)
		for _, h := range all {
			if h.IsDir() {
				hierarchies = append(hierarchies, filepath.Join(cgroupRoot, h.Name()))
			}
		}
	}
	for _, h := range hierarchies {
		for _, id := range ids {
			if p := filepath.Join(h, "tai42", id); exists(p) {
				cgroups = append(cgroups, p)
			}
		}
	}
	info, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) <= 4 {
			continue
		}
		mine := strings.HasPrefix(f[4], stateDir+"/")
		for _, el := range strings.Split(f[4], "/") {
			mine = mine || ours[el]
		}
		if mine && !isPool(f[4]) {
			mounts = append(mounts, f[4])
		}
	}
	disks, _ := filepath.Glob(filepath.Join(stateDir, "container", "disks", "*"))
	for _, d := range disks {
		if !isPool(d) {
			dirs = append(dirs, d)
		}
	}
	blocks, _ := os.ReadDir("/sys/block")
	for _, e := range blocks {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if f := strings.TrimSpace(string(b)); err == nil && strings.HasPrefix(f, stateDir+"/") && !isPool(f) {
			mounts = append(mounts, "/dev/"+e.Name()+" on "+f)
		}
	}
	return dirs, cgroups, mounts
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
