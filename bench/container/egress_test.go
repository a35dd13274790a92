package container_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// The egress benchmark's knobs: the download's size and the lookups per
// session per round.
const (
	downloadBytes   = 100 << 20
	lookupsPerRound = 50
	egressName      = "allowed.test"
)

// BenchmarkEgress: what the domain filter costs an egress session,
// against a session of a provider without one, both resolving through
// their provider's resolver (on their gateway) forwarding to a test DNS
// server behind a router namespace, and downloading from a test host
// there. One op is one round: for each of the two sessions, in turns (the
// first alternating), lookupsPerRound A lookups of allowed.test, timed one
// by one inside the session (the probe's dns), and one 100 MB download
// (raw TCP, read to EOF inside the session). With the filter each answer
// also goes into the nftables sets (AllowAddrs) before it is sent, and
// every new connection meets the sets.
//
// Metrics: filtered-dns-p50-us, open-dns-p50-us and dns-p50-diff-us (the
// filter's cost per lookup); filtered-MBps, open-MBps (the downloads'
// medians) and filter-cost-% (how much slower the filtered download is).
func BenchmarkEgress(b *testing.B) {
	containertest.Require(b)
	if !containertest.HasRuntime("runc") {
		b.Skip("runc is not installed (apt-get install -y runc)")
	}
	subnets := sessnettest.FreePrefixes(b, netip.MustParsePrefix("10.247.0.0/16"), 24, 4)
	up := sessnettest.NewUpstream(b, fmt.Sprintf("be%04x", os.Getpid()&0xffff), subnets[1])
	up.RouteFrom(b, subnets[3])
	host := up.Hosts[sessnettest.Public]
	dnsSrv := up.ServeDNS(b, up.RouterAddr, 300, map[string]netip.Addr{egressName: host.Addr})
	dl := serveDownload(b, up, host.Addr)

	type variant struct {
		name string
		sess sandbox.Session
		dns  latencies
		mbps []float64
	}
	probe := escapeprobetest.Build(b)
	probeBytes, err := os.ReadFile(probe)
	if err != nil {
		b.Fatal(err)
	}
	variants := []*variant{{name: "filtered"}, {name: "open"}}
	for i, v := range variants {
		opts := containertest.Options(b, "runc", sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationContainer})
		opts.ReapInterval = -1
		opts.Network = nil
		opts.NetPrefix = fmt.Sprintf("b%04x%d", os.Getpid()&0xffff, i)
		opts.InternalSubnet, opts.EgressSubnet = subnets[2*i], subnets[2*i+1]
		opts.EgressDNS = []netip.AddrPort{dnsSrv.Addr}
		if v.name == "filtered" {
			opts.EgressAllowDomains = []string{egressName}
		}
		sb := containertest.New(b, opts)
		v.sess = egressSession(b, sb, probeBytes)
	}

	ctx := context.Background()
	round := func(v *variant) {
		r := runProbe(b, ctx, v.sess, "dns", fmt.Sprintf("%s*%d", egressName, lookupsPerRound))
		if !r.OK {
			b.Fatalf("%s: the lookups failed: %+v", v.name, r)
		}
		for f := range strings.FieldsSeq(r.Detail) {
			if s, ok := strings.CutPrefix(f, "took="); ok {
				d, err := time.ParseDuration(s)
				if err != nil {
					b.Fatalf("%s: the probe's %q: %v", v.name, f, err)
				}
				v.dns.add(d)
			}
		}
		r = runProbe(b, ctx, v.sess, "download", net.JoinHostPort(egressName, strconv.Itoa(int(dl.Port()))))
		var n int64
		var took time.Duration
		for f := range strings.FieldsSeq(r.Detail) {
			if s, ok := strings.CutPrefix(f, "bytes="); ok {
				n, _ = strconv.ParseInt(s, 10, 64)
			}
			if s, ok := strings.CutPrefix(f, "took="); ok {
				took, _ = time.ParseDuration(s)
			}
		}
		if !r.OK || n != downloadBytes || took <= 0 {
			b.Fatalf("%s: the download: %+v, want %d bytes", v.name, r, downloadBytes)
		}
		v.mbps = append(v.mbps, float64(n)/(1<<20)/took.Seconds())
	}
	round(variants[0]) // warm-up: the first answer, the sets' first element
	round(variants[1])
	for _, v := range variants {
		v.dns, v.mbps = nil, nil
	}
	i := 0
	for b.Loop() {
		first := i % 2
		round(variants[first])
		round(variants[1-first])
		i++
	}
	f, o := variants[0], variants[1]
	fp, op := f.dns.percentile(0.5), o.dns.percentile(0.5)
	b.ReportMetric(float64(fp.Microseconds()), "filtered-dns-p50-us")
	b.ReportMetric(float64(op.Microseconds()), "open-dns-p50-us")
	b.ReportMetric(float64((fp - op).Microseconds()), "dns-p50-diff-us")
	fm, om := median(f.mbps), median(o.mbps)
	b.ReportMetric(fm, "filtered-MBps")
	b.ReportMetric(om, "open-MBps")
	b.ReportMetric(100*(om-fm)/om, "filter-cost-%")
}

// egressSession makes an egress session of sb with the probe in its
// workspace, destroyed at the end of b.
func egressSession(b *testing.B, sb *kit.Sandbox, probe []byte) sandbox.Session {
	b.Helper()
	ctx := context.Background()
	s, err := sb.CreateSession(ctx, sandbox.SessionSpec{Image: containertest.Busybox, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 3600})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := s.Destroy(context.Background()); err != nil {
			b.Errorf("destroying %s: %v", s.ID(), err)
		}
	})
	if err := s.PutFile(ctx, "escapeprobe", probe); err != nil {
		b.Fatal(err)
	}
	if r, err := s.Exec(ctx, []string{"chmod", "+x", "/workspace/escapeprobe"}, sandbox.ExecOptions{Timeout: execTimeout}); err != nil || r.ExitCode != 0 {
		b.Fatalf("chmod of the probe: %+v %v", r, err)
	}
	return s
}

// probeOut is the escape probe's JSON line.
type probeOut struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	Detail string `json:"detail"`
}

func runProbe(b *testing.B, ctx context.Context, s sandbox.Session, args ...string) probeOut {
	b.Helper()
	res, err := s.Exec(ctx, append([]string{"/workspace/escapeprobe"}, args...), sandbox.ExecOptions{Timeout: 2 * time.Minute})
	if err != nil {
		b.Fatalf("escapeprobe %q: %v", args, err)
	}
	var p probeOut
	if res.ExitCode != 0 || json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &p) != nil {
		b.Fatalf("escapeprobe %q: exit %d, stdout %q, stderr %q", args, res.ExitCode, res.Stdout, res.Stderr)
	}
	return p
}

// serveDownload serves downloadBytes to each connection on addr (any
// port) behind the router until the end of b; it returns the address.
func serveDownload(b *testing.B, up *sessnettest.Upstream, addr netip.Addr) netip.AddrPort {
	ln := up.Listen(b, "tcp4", netip.AddrPortFrom(addr, 0))
	var wg sync.WaitGroup
	wg.Go(func() {
		chunk := make([]byte, 1<<20)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.CopyBuffer(c, io.LimitReader(zeros{}, downloadBytes), chunk)
			})
		}
	})
	b.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
