package container_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// BenchmarkDiskCap: create → first exec finished (as
// BenchmarkCreateFirstExec) on three providers, alternately in one run so
// that all see the same machine: with the disk cap (the default 10 GiB)
// and its pool full before each create ("warm": the create takes a disk
// made ahead), with the cap and no pool ("cold": each create makes its own
// disk, as one does when a burst has emptied the pool), and without the
// cap (DiskOff). Before each timed create every provider gets the same
// wait: its pool refilled (container.WaitDiskPool, at once for the two
// without one), then 30 ms, the refill's own quiet time included. It
// reports the p50 of each and what the cap adds to it, warm and cold
// (warm-added-ns, cold-added-ns). Runtime crun, image busybox (where a
// create is shortest, so any cost shows most); set BENCH_RT=runc for
// runc.
func BenchmarkDiskCap(b *testing.B) {
	rt := "crun"
	if v := os.Getenv("BENCH_RT"); v != "" {
		rt = v
	}
	warm, _ := newProviderWith(b, rt, nil)
	cold, _ := newProviderWith(b, rt, func(o *container.Options) { o.DiskPool = -1 })
	uncapped, _ := newProviderWith(b, rt, func(o *container.Options) { o.DiskOff = true })
	ctx := context.Background()
	op := func(sb *tracked) (time.Duration, error) {
		if _, err := container.WaitDiskPool(ctx, sb.Sandbox); err != nil {
			return 0, err
		}
		time.Sleep(30 * time.Millisecond)
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, sessionSpec(containertest.Busybox))
		if err != nil {
			return 0, err
		}
		err = execTrue(ctx, s)
		d := time.Since(t0)
		if derr := sb.DestroySession(ctx, s.ID()); err == nil {
			err = derr
		}
		return d, err
	}
	arms := []*tracked{warm, cold, uncapped}
	for _, sb := range arms { // warm-up, not timed
		if _, err := op(sb); err != nil {
			b.Fatal(err)
		}
	}
	lat := map[*tracked]*latencies{warm: {}, cold: {}, uncapped: {}}
	i := 0
	for b.Loop() {
		b.StopTimer()
		for k := range arms {
			sb := arms[(i+k)%len(arms)]
			d, err := op(sb)
			if err != nil {
				b.Fatal(err)
			}
			lat[sb].add(d)
		}
		i++
		b.StartTimer()
	}
	p50 := func(sb *tracked) float64 { return float64(lat[sb].percentile(0.50).Nanoseconds()) }
	b.ReportMetric(p50(warm), "warm-p50-ns")
	b.ReportMetric(p50(cold), "cold-p50-ns")
	b.ReportMetric(p50(uncapped), "nocap-p50-ns")
	b.ReportMetric(p50(warm)-p50(uncapped), "warm-added-ns")
	b.ReportMetric(p50(cold)-p50(uncapped), "cold-added-ns")
}
