package egressdns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// silentName is the name the test upstream never answers.
const silentName = "silent.test."

// bigCount is how many A records big.allowed.test has: more than fit in 512
// bytes.
const bigCount = 40

// zone is the test upstream's data, by lowercased name.
var zone = map[string][]string{
	"allowed.test.":     {"allowed.test. 300 IN A 203.0.113.10"},
	"denied.test.":      {"denied.test. 300 IN A 203.0.113.20"},
	"other.test.":       {"other.test. 300 IN A 203.0.113.40"},
	"www.allowed.test.": {"www.allowed.test. 600 IN CNAME edge.cdn.test.", "edge.cdn.test. 60 IN CNAME final.cdn.test.", "final.cdn.test. 2 IN A 203.0.113.30", "final.cdn.test. 3 IN A 203.0.113.31"},
	"v6.allowed.test.":  {"v6.allowed.test. 120 IN AAAA 2001:db8::1"},
	"txt.allowed.test.": {`txt.allowed.test. 300 IN TXT "hello"`},
	"big.allowed.test.": bigRecords(),
}

func bigRecords() []string {
	var rrs []string
	for i := range bigCount {
		rrs = append(rrs, fmt.Sprintf("big.allowed.test. 100 IN A 198.51.100.%d", i+1))
	}
	return rrs
}

// upstream is a test DNS server on 127.0.0.1, UDP and TCP on one port. It
// answers from zone (NXDOMAIN for other names; slow.allowed.test. waits
// for release; silent.test. is never answered), truncates over UDP what does not fit the query's size (or
// big.allowed.test. always, with truncUDP), and records what it saw.
type upstream struct {
	addr     netip.AddrPort
	truncUDP bool

	mu    sync.Mutex
	seen  []seenQuery
	slowC chan struct{} // a value for each slow query that has arrived

	release chan struct{} // closed to let slow queries be answered
	stop    func()
}

type seenQuery struct {
	net  string // udp or tcp
	name string
	id   uint16
	opt  *dns.OPT
}

func newUpstream(t testing.TB, truncUDP bool) *upstream {
	t.Helper()
	u := &upstream{truncUDP: truncUDP, slowC: make(chan struct{}, 64), release: make(chan struct{})}
	pc, ln, err := listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	u.addr = netip.MustParseAddrPort(ln.Addr().String())
	var wg sync.WaitGroup
	srvs := []*dns.Server{{PacketConn: pc, Handler: u}, {Listener: ln, Handler: u}}
	for _, srv := range srvs {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() {
			if err := srv.ActivateAndServe(); err != nil {
				t.Errorf("test upstream: %v", err)
			}
		})
		<-started
	}
	var once sync.Once
	u.stop = func() {
		once.Do(func() {
			u.unblock()
			for _, srv := range srvs {
				_ = srv.Shutdown()
			}
			wg.Wait()
		})
	}
	t.Cleanup(u.stop)
	return u
}

func (u *upstream) unblock() {
	select {
	case <-u.release:
	default:
		close(u.release)
	}
}

func (u *upstream) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	_, tcp := w.LocalAddr().(*net.TCPAddr)
	q := r.Question[0]
	name := dns.CanonicalName(q.Name)
	sq := seenQuery{net: "udp", name: name, id: r.Id, opt: r.IsEdns0()}
	if tcp {
		sq.net = "tcp"
	}
	u.mu.Lock()
	u.seen = append(u.seen, sq)
	u.mu.Unlock()

	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), opt.Do())
	}
	if name == silentName {
		return
	}
	if name == "slow.allowed.test." {
		u.slowC <- struct{}{}
		<-u.release
	}
	rrs, ok := zone[name]
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			panic(err)
		}
		if rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == dns.TypeCNAME {
			m.Answer = append(m.Answer, rr)
		}
	}
	if !tcp {
		if m.Len() > udpSize(r) || u.truncUDP && name == "big.allowed.test." {
			m.Answer = nil
			m.Truncated = true
		}
	}
	_ = w.WriteMsg(m)
}

// queries returns what the upstream saw for name ("" for all).
func (u *upstream) queries(name string) []seenQuery {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []seenQuery
	for _, q := range u.seen {
		if name == "" || q.name == dns.CanonicalName(name) {
			out = append(out, q)
		}
	}
	return out
}

// hook records OnAnswer's calls, and fails them with err when set.
type hook struct {
	mu    sync.Mutex
	calls []hookCall
	err   error
}

type hookCall struct {
	addrs []netip.Addr
	ttl   time.Duration
}

func (h *hook) onAnswer(_ context.Context, addrs []netip.Addr, ttl time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, hookCall{slices.Clone(addrs), ttl})
	return h.err
}

func (h *hook) got() []hookCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// newResolver starts a Server on 127.0.0.1 forwarding to up (when
// cfg.Upstreams is empty and up is not nil) and closes it at cleanup.
func newResolver(t testing.TB, up *upstream, cfg Config) *Server {
	t.Helper()
	if !cfg.Listen.IsValid() {
		cfg.Listen = netip.MustParseAddrPort("127.0.0.1:0")
	}
	if len(cfg.Upstreams) == 0 && up != nil {
		cfg.Upstreams = []netip.AddrPort{up.addr}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// query asks addr over network (udp or tcp) for name's qtype records,
// with EDNS0 (UDP size edns) when edns is not 0.
func query(t testing.TB, network string, addr netip.AddrPort, name string, qtype uint16, edns uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns != 0 {
		m.SetEdns0(edns, false)
	}
	r, err := exchange(network, addr, m)
	if err != nil {
		t.Fatalf("%s query %s %s to %s: %v", network, name, dns.Type(qtype), addr, err)
	}
	return r
}

func exchange(network string, addr netip.AddrPort, m *dns.Msg) (*dns.Msg, error) {
	c := &dns.Client{Net: network, Timeout: 10 * time.Second}
	r, _, err := c.Exchange(m, addr.String())
	return r, err
}

// addrsOf returns the A and AAAA addresses of an answer section, in order.
func addrsOf(rrs []dns.RR) []netip.Addr {
	var out []netip.Addr
	for _, rr := range rrs {
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, netip.MustParseAddr(rr.A.String()))
		case *dns.AAAA:
			out = append(out, netip.MustParseAddr(rr.AAAA.String()))
		}
	}
	return out
}

func mustAddrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func rcode(m *dns.Msg) string { return dns.RcodeToString[m.Rcode] }
