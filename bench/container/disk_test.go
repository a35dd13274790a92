package container_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/containersuite"
	"github.com/tai42/sandbox/provider/container"
)

// BenchmarkDiskCap: create → first exec finished (as
// BenchmarkCreateFirstExec) on a provider with the disk cap (the default
// 10 GiB, disks taken from its pool) and on one without (DiskOff),
// alternately in one run, so that both see the same machine; it reports
// the p50 of each and their difference (cap-added-ns). Runtime crun, image
// busybox (where a create is shortest, so any cost shows most); set
// BENCH_RT=runc for runc.
func BenchmarkDiskCap(b *testing.B) {
	rt := "crun"
	if v := os.Getenv("BENCH_RT"); v != "" {
		rt = v
	}
	capped, _ := newProviderWith(b, rt, nil)
	uncapped, _ := newProviderWith(b, rt, func(o *container.Options) { o.DiskOff = true })
	ctx := context.Background()
	op := func(sb *tracked) (time.Duration, error) {
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, sessionSpec(containersuite.Busybox))
		if err != nil {
			return 0, err
		}
		err = execTrue(ctx, s)
		d := time.Since(t0)
		if derr := sb.DestroySession(ctx, s.ID()); err == nil {
			err = derr
		}
		// The pool's refill is the capped provider's own work between
		// creates; let it finish, as between creates of a daemon.
		time.Sleep(30 * time.Millisecond)
		return d, err
	}
	for _, sb := range []*tracked{capped, uncapped} { // warm-up, not timed
		if _, err := op(sb); err != nil {
			b.Fatal(err)
		}
	}
	var withCap, without latencies
	i := 0
	for b.Loop() {
		b.StopTimer()
		order := []*tracked{capped, uncapped}
		if i%2 == 1 {
			order = []*tracked{uncapped, capped}
		}
		i++
		for _, sb := range order {
			d, err := op(sb)
			if err != nil {
				b.Fatal(err)
			}
			if sb == capped {
				withCap.add(d)
			} else {
				without.add(d)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(withCap.percentile(0.50).Nanoseconds()), "cap-p50-ns")
	b.ReportMetric(float64(without.percentile(0.50).Nanoseconds()), "nocap-p50-ns")
	b.ReportMetric(float64(withCap.percentile(0.50).Nanoseconds()-without.percentile(0.50).Nanoseconds()), "cap-added-ns")
}
