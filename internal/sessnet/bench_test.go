package sessnet

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	sandbox "github.com/tai42/sandbox"
)

// BenchmarkSetup times Setup and Teardown of each tier, one session at a
// time, and reports their medians (setup-ms, teardown-ms) besides the mean
// of the pair (ns/op). The shared bridges and table exist already, as they
// do for every session but a host's first. Dir is on tmpfs (/dev/shm, as
// /run would be in production) or on the test's temporary directory,
// wherever that is (creating the namespace file costs what the file system
// makes it cost).
func BenchmarkSetup(b *testing.B) {
	requireRoot(b)
	for _, tier := range tiers {
		for _, fs := range []string{"tmpfs", "tempdir"} {
			b.Run(string(tier)+"/"+fs, func(b *testing.B) { benchSetup(b, tier, fs) })
		}
	}
}

func benchSetup(b *testing.B, tier sandbox.Network, fs string) {
	dir := b.TempDir()
	if fs == "tmpfs" {
		var st unix.Statfs_t
		if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
			b.Skip("/dev/shm is not a tmpfs here")
		}
		d, err := os.MkdirTemp("/dev/shm", "sessnet-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	subnets := freePrefixes(b, netip.MustParsePrefix("10.224.0.0/11"), 24, 2)
	m := newManagerWith(b, Config{Dir: dir, Prefix: testPrefix(), InternalSubnet: subnets[0], EgressSubnet: subnets[1]})
	ctx := context.Background()
	for _, warm := range tiers {
		n, err := m.Setup(ctx, "sb-warm-"+string(warm), warm)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Teardown(n); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // let the pool fill
	var setups, teardowns []time.Duration
	for b.Loop() {
		t0 := time.Now()
		n, err := m.Setup(ctx, "sb-bench", tier)
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Teardown(n); err != nil {
			b.Fatal(err)
		}
		setups = append(setups, t1.Sub(t0))
		teardowns = append(teardowns, time.Since(t1))
	}
	b.ReportMetric(median(setups), "setup-ms")
	b.ReportMetric(median(teardowns), "teardown-ms")
}

func median(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2]) / float64(time.Millisecond)
}

// BenchmarkAllowAddrs: one DNS answer's worth (two IPv4 addresses, one
// IPv6) added to the domain filter's sets, as the resolver does per answer.
func BenchmarkAllowAddrs(b *testing.B) {
	m := newTestManager(b)
	setup(b, m, "sb-bench-egr", sandbox.NetworkEgress)
	addrs := []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11"), netip.MustParseAddr("2001:db8::10")}
	for b.Loop() {
		if err := m.AllowAddrs(addrs, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
