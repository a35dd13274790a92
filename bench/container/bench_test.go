package container_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// ourPeers are the provider's variants: runtime and image.
var ourPeers = []struct{ rt, image string }{
	{"runc", containertest.Busybox},
	{"runc", sandbox.HostImage},
	{"crun", containertest.Busybox},
	{"crun", sandbox.HostImage},
}

// ourName is a provider variant's sub-benchmark name: runc-busybox.
func ourName(rt, image string) string {
	if image == containertest.Busybox {
		image = "busybox"
	}
	return rt + "-" + image
}

// BenchmarkCreateFirstExec: a new session until its first exec of
// /bin/true has finished (create + Exec; the destroy is not timed), made
// cold and (-pool) taken from a warm pool at rest (the wait for its
// refill is not timed); beside
// it `runc run` / `crun run` of /bin/true (create + start + exit +
// delete), `docker run --rm --network none IMAGE true` (the same through
// docker), and `docker create` + `docker start` + `docker exec` (a
// long-lived container to its first exec, its removal not timed).
func BenchmarkCreateFirstExec(b *testing.B) {
	var peers []peer
	for _, v := range ourPeers {
		peers = append(peers, peer{ourName(v.rt, v.image), func(b *testing.B) { oursCreateFirstExec(b, v.rt, v.image) }})
	}
	for _, v := range ourPeers {
		peers = append(peers, peer{ourName(v.rt, v.image) + "-pool", func(b *testing.B) { pooledCreateFirstExec(b, v.rt, v.image) }})
	}
	peers = append(peers,
		peer{"bare-runc", func(b *testing.B) { bareRun(b, "runc") }},
		peer{"bare-crun", func(b *testing.B) { bareRun(b, "crun") }},
		peer{"docker-run", dockerRunTrue},
		peer{"docker-create-start-exec", dockerCreateStartExec},
	)
	runPeers(b, peers)
}

// BenchmarkCreateFirstExecAgent is BenchmarkCreateFirstExec's own
// variants with the static agent (CGO_ENABLED=0) and with the dynamically
// linked one (tai42 built with cgo, run through its own loader and
// libraries, bound under /.tai42/lib).
func BenchmarkCreateFirstExecAgent(b *testing.B) {
	for _, v := range ourPeers {
		b.Run(ourName(v.rt, v.image)+"-static", func(b *testing.B) { oursCreateFirstExecAgent(b, v.rt, v.image, "") })
		b.Run(ourName(v.rt, v.image)+"-dynamic", func(b *testing.B) {
			oursCreateFirstExecAgent(b, v.rt, v.image, containertest.DynamicAgent(b))
		})
	}
}

func oursCreateFirstExec(b *testing.B, rt, image string) {
	oursCreateFirstExecAgent(b, rt, image, "")
}

func oursCreateFirstExecAgent(b *testing.B, rt, image, agent string) {
	sb, _ := newProviderAgent(b, rt, agent)
	ctx := context.Background()
	op := func() (time.Duration, string, error) {
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, sessionSpec(image))
		if err != nil {
			return 0, "", err
		}
		err = execTrue(ctx, s)
		return time.Since(t0), s.ID(), err
	}
	if _, id, err := op(); err != nil { // warm-up, not timed
		b.Fatal(err)
	} else if err := sb.DestroySession(ctx, id); err != nil {
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		d, id, err := op()
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		l.add(d)
		if err := sb.DestroySession(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
}

func bareRun(b *testing.B, name string) {
	rootfs := busyboxRootfs(b)
	r := newBareRuntime(b, name)
	bundle := r.bundle(b, rootfs, trueArgv...)
	ctx := context.Background()
	if err := r.run(ctx, bundle); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		err := r.run(ctx, bundle)
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

func dockerRunTrue(b *testing.B) {
	d := newDocker(b)
	ctx := context.Background()
	argv := []string{"run", "--rm", "--network", "none", d.image, "true"}
	if _, err := d.do(ctx, argv...); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		_, err := d.do(ctx, argv...)
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

func dockerCreateStartExec(b *testing.B) {
	d := newDocker(b)
	ctx := context.Background()
	op := func() (time.Duration, string, error) {
		t0 := time.Now()
		id, err := d.createStart(ctx)
		if err == nil {
			err = d.execTrue(ctx, id)
		}
		return time.Since(t0), id, err
	}
	if _, id, err := op(); err != nil { // warm-up
		b.Fatal(err)
	} else if err := d.remove(ctx, id); err != nil {
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		dur, id, err := op()
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		l.add(dur)
		if err := d.remove(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
}

// BenchmarkExecTrue: the round trip of one exec of /bin/true to its end in
// a live session (the agent, over its socket), beside `docker exec ID
// true` and `runc exec` / `crun exec` in a live container.
func BenchmarkExecTrue(b *testing.B) {
	var peers []peer
	for _, v := range ourPeers {
		peers = append(peers, peer{ourName(v.rt, v.image), func(b *testing.B) { oursExec(b, v.rt, v.image) }})
	}
	peers = append(peers,
		peer{"bare-runc-exec", func(b *testing.B) { bareExec(b, "runc") }},
		peer{"bare-crun-exec", func(b *testing.B) { bareExec(b, "crun") }},
		peer{"docker-exec", dockerExec},
	)
	runPeers(b, peers)
}

func oursExec(b *testing.B, rt, image string) {
	sb, _ := newProvider(b, rt)
	ctx := context.Background()
	s, err := sb.CreateSession(ctx, sessionSpec(image))
	if err != nil {
		b.Fatal(err)
	}
	if err := execTrue(ctx, s); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		err := execTrue(ctx, s)
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

func bareExec(b *testing.B, name string) {
	rootfs := busyboxRootfs(b)
	r := newBareRuntime(b, name)
	bundle := r.bundle(b, rootfs, idleArgv...)
	ctx := context.Background()
	log, err := os.Create(filepath.Join(b.TempDir(), "log"))
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	id, err := r.runDetached(ctx, bundle, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := r.delete(context.Background(), id); err != nil {
			b.Error(err)
		}
	})
	if err := r.exec(ctx, id, trueArgv...); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		err := r.exec(ctx, id, trueArgv...)
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

func dockerExec(b *testing.B) {
	d := newDocker(b)
	ctx := context.Background()
	id, err := d.runIdle(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.execTrue(ctx, id); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		err := d.execTrue(ctx, id)
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

// BenchmarkCreateDestroy: a session created and destroyed (no exec),
// beside `docker run -d` + `docker rm -f` of an idle container, and `runc
// run -d` + `runc delete -f` (crun the same).
func BenchmarkCreateDestroy(b *testing.B) {
	var peers []peer
	for _, v := range ourPeers {
		peers = append(peers, peer{ourName(v.rt, v.image), func(b *testing.B) { oursCreateDestroy(b, v.rt, v.image) }})
	}
	peers = append(peers,
		peer{"bare-runc", func(b *testing.B) { bareCreateDestroy(b, "runc") }},
		peer{"bare-crun", func(b *testing.B) { bareCreateDestroy(b, "crun") }},
		peer{"docker-run-rm", dockerCreateDestroy},
	)
	runPeers(b, peers)
}

func oursCreateDestroy(b *testing.B, rt, image string) {
	sb, _ := newProvider(b, rt)
	ctx := context.Background()
	op := func() error {
		s, err := sb.CreateSession(ctx, sessionSpec(image))
		if err != nil {
			return err
		}
		return sb.DestroySession(ctx, s.ID())
	}
	if err := op(); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		err := op()
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

func bareCreateDestroy(b *testing.B, name string) {
	rootfs := busyboxRootfs(b)
	r := newBareRuntime(b, name)
	bundle := r.bundle(b, rootfs, idleArgv...)
	ctx := context.Background()
	log, err := os.Create(filepath.Join(b.TempDir(), "log"))
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	op := func() error {
		id, err := r.runDetached(ctx, bundle, log)
		if err != nil {
			return err
		}
		return r.delete(ctx, id)
	}
	if err := op(); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		err := op()
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

func dockerCreateDestroy(b *testing.B) {
	d := newDocker(b)
	ctx := context.Background()
	op := func() error {
		id, err := d.runIdle(ctx)
		if err != nil {
			return err
		}
		return d.remove(ctx, id)
	}
	if err := op(); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		err := op()
		l.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	l.report(b)
}

// BenchmarkIdleMemory: what an idle session costs in memory, as the median
// over BENCH_IDLE_SESSIONS sessions that each ran one exec and then idled
// for BENCH_IDLE_SETTLE: its cgroup's charge plus the agent's PSS; made
// cold, and (-pool) taken from a warm pool of as many, full first; beside
// an idle docker container (`sleep`, after one `docker exec`): its
// cgroup's charge plus its containerd shim's PSS. Run it with -benchtime
// 1x; ns/op means nothing here.
func BenchmarkIdleMemory(b *testing.B) {
	var peers []peer
	for _, v := range ourPeers {
		peers = append(peers, peer{ourName(v.rt, v.image), func(b *testing.B) { oursIdle(b, v.rt, v.image, false) }})
	}
	for _, rt := range []string{"runc", "crun"} {
		peers = append(peers, peer{ourName(rt, containertest.Busybox) + "-pool", func(b *testing.B) { oursIdle(b, rt, containertest.Busybox, true) }})
	}
	peers = append(peers, peer{"docker", dockerIdle})
	runPeers(b, peers)
}

// reportMemory reports the medians of ms as cgroup-B, pss-B and total-B,
// of their parts as cgroup-anon-B, cgroup-file-B, pss-anon-B and
// pss-file-B, and of what they hold counted once as unique-B.
func reportMemory(b *testing.B, ms []idleMemory) {
	med := func(f func(idleMemory) int64) float64 {
		v := make([]int64, len(ms))
		for i, m := range ms {
			v[i] = f(m)
		}
		slices.Sort(v)
		return float64(v[len(v)/2])
	}
	b.ReportMetric(med(func(m idleMemory) int64 { return m.cgroup }), "cgroup-B")
	b.ReportMetric(med(func(m idleMemory) int64 { return m.pss }), "pss-B")
	b.ReportMetric(med(idleMemory.total), "total-B")
	b.ReportMetric(med(func(m idleMemory) int64 { return m.cgroupAnon }), "cgroup-anon-B")
	b.ReportMetric(med(func(m idleMemory) int64 { return m.cgroupFile }), "cgroup-file-B")
	b.ReportMetric(med(func(m idleMemory) int64 { return m.pssAnon }), "pss-anon-B")
	b.ReportMetric(med(func(m idleMemory) int64 { return m.pssFile }), "pss-file-B")
	b.ReportMetric(med(idleMemory.unique), "unique-B")
}

func oursIdle(b *testing.B, rt, image string, pooled bool) {
	n := envInt(b, "BENCH_IDLE_SESSIONS", 5)
	settle := envDuration(b, "BENCH_IDLE_SETTLE", 2*time.Second)
	var sb *tracked
	if pooled {
		sb = newPooled(b, rt, image, n)
	} else {
		sb, _ = newProvider(b, rt)
	}
	ctx := context.Background()
	var ms []idleMemory
	for b.Loop() {
		if pooled {
			waitPool(b, sb)
		}
		ids := make([]string, 0, n)
		for range n {
			s, err := sb.CreateSession(ctx, sessionSpec(image))
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, s.ID())
			if err := execTrue(ctx, s); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(settle)
		for _, id := range ids {
			m, err := oursIdleMemory(id)
			if err != nil {
				b.Fatal(err)
			}
			ms = append(ms, m)
		}
		for _, id := range ids {
			if err := sb.DestroySession(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}
	if pooled {
		if st := sb.PoolStats(); st[0].Misses > 0 {
			b.Fatalf("%d of the sessions were made cold: %+v", st[0].Misses, st)
		}
	}
	reportMemory(b, ms)
}

func dockerIdle(b *testing.B) {
	n := envInt(b, "BENCH_IDLE_SESSIONS", 5)
	settle := envDuration(b, "BENCH_IDLE_SETTLE", 2*time.Second)
	d := newDocker(b)
	ctx := context.Background()
	var ms []idleMemory
	for b.Loop() {
		ids := make([]string, 0, n)
		for range n {
			id, err := d.runIdle(ctx)
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, id)
			if err := d.execTrue(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(settle)
		for _, id := range ids {
			out, err := d.do(ctx, "inspect", "--format", "{{.State.Pid}}", id)
			if err != nil {
				b.Fatal(err)
			}
			pid, err := strconv.Atoi(out)
			if err != nil || pid <= 0 {
				b.Fatalf("docker inspect: the pid of %s is %q", id, out)
			}
			m, err := dockerIdleMemory(pid)
			if err != nil {
				b.Fatal(err)
			}
			ms = append(ms, m)
		}
		for _, id := range ids {
			if err := d.remove(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}
	reportMemory(b, ms)
}

// sessionIDs are the ids of ss.
func sessionIDs(ss []sandbox.Session) []string {
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = s.ID()
	}
	return ids
}
