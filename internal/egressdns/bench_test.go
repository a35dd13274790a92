package egressdns

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkLookup times an A lookup of an allowed name through the
// resolver (Allow set, OnAnswer a no-op) and the same lookup sent straight
// to the test upstream, interleaved in one run (alternating which goes
// first), and reports the medians of each (direct-p50-µs, resolver-p50-µs)
// and their difference (added-p50-µs): the resolver's and the filter's cost.
// Both go over UDP on loopback with a fresh socket per lookup, as a stub
// resolver does.
func BenchmarkLookup(b *testing.B) {
	up := newUpstream(b, false)
	s := newResolver(b, up, Config{
		Allow:    []string{"allowed.test", "*.example.org"},
		OnAnswer: func(context.Context, []netip.Addr, time.Duration) error { return nil },
	})
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	lookup := func(addr netip.AddrPort) time.Duration {
		start := time.Now()
		r, _, err := c.Exchange(m, addr.String())
		took := time.Since(start)
		if err != nil || len(r.Answer) != 1 {
			b.Fatalf("lookup via %s: %v %v", addr, r, err)
		}
		return took
	}
	direct := make([]time.Duration, 0, b.N)
	via := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			direct = append(direct, lookup(up.addr))
			via = append(via, lookup(s.Addr()))
		} else {
			via = append(via, lookup(s.Addr()))
			direct = append(direct, lookup(up.addr))
		}
	}
	d, v := median(direct), median(via)
	b.ReportMetric(float64(d.Nanoseconds())/1e3, "direct-p50-µs")
	b.ReportMetric(float64(v.Nanoseconds())/1e3, "resolver-p50-µs")
	b.ReportMetric(float64((v-d).Nanoseconds())/1e3, "added-p50-µs")
	if st := s.Stats(); st.Forwarded != uint64(len(via)) {
		b.Errorf("Stats %+v, want %d forwarded", st, len(via))
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}
