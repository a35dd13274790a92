package container_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// newPooled is a provider on runtime rt keeping a warm pool of size
// sessions of image on network none.
func newPooled(b *testing.B, rt, image string, size int) *tracked {
	b.Helper()
	sb, _ := newProviderWith(b, rt, func(o *container.Options) {
		o.Pool = []kit.PoolShape{{Image: image, Network: sandbox.NetworkNone, Size: size}}
	})
	return sb
}

// waitPool waits (up to a minute) until sb's pool is full.
func waitPool(b *testing.B, sb *tracked) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sb.WaitPool(ctx); err != nil {
		b.Fatal(err)
	}
}

// pooledCreateFirstExec is oursCreateFirstExec from a warm pool at rest:
// before each timed op the pool is refilled (not timed), and every create
// must be served from it.
func pooledCreateFirstExec(b *testing.B, rt, image string) {
	sb := newPooled(b, rt, image, 2)
	ctx := context.Background()
	var l latencies
	op := func() {
		waitPool(b, sb)
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, sessionSpec(image))
		if err == nil {
			err = execTrue(ctx, s)
		}
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		l.add(d)
		if err := sb.DestroySession(ctx, s.ID()); err != nil {
			b.Fatal(err)
		}
	}
	op() // warm-up, not counted
	l = nil
	for b.Loop() {
		b.StopTimer()
		op()
		b.StartTimer()
	}
	if st := sb.PoolStats(); st[0].Misses > 0 {
		b.Fatalf("%d of the creates were made cold: %+v", st[0].Misses, st)
	}
	l.report(b)
}

// BenchmarkBurst: BENCH_BURST (default 50) concurrent creates, each to
// its first exec of /bin/true, until all are done (all-ns), on crun and
// runc with the busybox image: cold, and from a warm pool as large as the
// burst, full at its start (-pool). The destroys and the refill are not
// timed. Also reports each create's p50 and p99 within the burst.
func BenchmarkBurst(b *testing.B) {
	n := envInt(b, "BENCH_BURST", 50)
	var peers []peer
	for _, rt := range []string{"crun", "runc"} {
		peers = append(peers,
			peer{rt, func(b *testing.B) {
				sb, _ := newProvider(b, rt)
				burst(b, sb, n, nil)
			}},
			peer{rt + "-pool", func(b *testing.B) {
				sb := newPooled(b, rt, containertest.Busybox, n)
				burst(b, sb, n, func() { waitPool(b, sb) })
			}})
	}
	runPeers(b, peers)
}

func burst(b *testing.B, sb *tracked, n int, ready func()) {
	ctx := context.Background()
	var all, each latencies
	for b.Loop() {
		b.StopTimer()
		if ready != nil {
			ready()
		}
		ids := make([]string, n)
		durs := make([]time.Duration, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				t0 := time.Now()
				s, err := sb.CreateSession(ctx, sessionSpec(containertest.Busybox))
				if err == nil {
					ids[i] = s.ID()
					err = execTrue(ctx, s)
				}
				durs[i], errs[i] = time.Since(t0), err
			})
		}
		b.StartTimer()
		t0 := time.Now()
		close(start)
		wg.Wait()
		all.add(time.Since(t0))
		b.StopTimer()
		for i := range n {
			if errs[i] != nil {
				b.Fatalf("create %d of the burst: %v", i, errs[i])
			}
			each.add(durs[i])
			if err := sb.DestroySession(ctx, ids[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	if ready != nil {
		if st := sb.PoolStats(); st[0].Misses > 0 {
			b.Fatalf("%d creates of the bursts were made cold: %+v", st[0].Misses, st)
		}
	}
	b.ReportMetric(float64(all.percentile(0.5).Nanoseconds()), "all-ns")
	each.report(b)
}

// BenchmarkPoolRefillCost: what a warm pool's refill costs a load of
// execs. Each op is two windows of BENCH_REFILL_WINDOW (default 1s) of
// BENCH_REFILL_LOAD (default 4) goroutines running /bin/true in live
// sessions back to back, on crun with the busybox image and a pool of 8:
// in one window the pool is at rest; just before the other, all 8 are
// taken, so that the refill makes 8 sessions while the execs run. The
// windows alternate in order. Reports the execs per second of each
// (idle-execs/s, refill-execs/s), their ratio (refill/idle, as ratio-pct),
// and how many sessions the refill made within its window (refilled).
func BenchmarkPoolRefillCost(b *testing.B) {
	const size = 8
	window := envDuration(b, "BENCH_REFILL_WINDOW", time.Second)
	load := envInt(b, "BENCH_REFILL_LOAD", 4)
	sb := newPooled(b, "crun", containertest.Busybox, size)
	ctx := context.Background()
	var sessions []sandbox.Session
	for range load {
		s, err := sb.CreateSession(ctx, sessionSpec(containertest.Busybox))
		if err != nil {
			b.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	waitPool(b, sb)
	runWindow := func() float64 {
		var n atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(window)
		for _, s := range sessions {
			wg.Go(func() {
				for time.Now().Before(stop) {
					if err := execTrue(ctx, s); err != nil {
						b.Error(err)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return float64(n.Load()) / window.Seconds()
	}
	var idle, refill, made []float64
	for i := 0; b.Loop(); i++ {
		takeAndRefill := func() {
			var taken []string
			for range size {
				s, err := sb.CreateSession(ctx, sessionSpec(containertest.Busybox))
				if err != nil {
					b.Fatal(err)
				}
				taken = append(taken, s.ID())
			}
			before := sb.PoolStats()[0].Refills
			refill = append(refill, runWindow())
			made = append(made, float64(sb.PoolStats()[0].Refills-before))
			for _, id := range taken {
				if err := sb.DestroySession(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
			waitPool(b, sb)
		}
		if i%2 == 0 {
			idle = append(idle, runWindow())
			takeAndRefill()
		} else {
			takeAndRefill()
			idle = append(idle, runWindow())
		}
	}
	mi, mr := medianOf(idle), medianOf(refill)
	b.ReportMetric(mi, "idle-execs/s")
	b.ReportMetric(mr, "refill-execs/s")
	b.ReportMetric(100*mr/mi, "ratio-pct")
	b.ReportMetric(medianOf(made), "refilled")
	if st := sb.PoolStats(); st[0].Misses > 0 {
		b.Logf("%d takes found the pool empty: %s", st[0].Misses, fmt.Sprint(st))
	}
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
