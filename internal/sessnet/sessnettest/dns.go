package sessnettest

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/tai42/sandbox/internal/nsthread"
)

// DNSServer is a DNS server behind an Upstream's router: it answers A
// questions for the names it was given, NXDOMAIN for the others, and
// records where queries came from.
type DNSServer struct {
	Addr netip.AddrPort // port 53

	mu   sync.Mutex
	from []netip.Addr
}

// Sources are the addresses queries came from since the server started.
func (d *DNSServer) Sources() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.from)
}

// ServeDNS serves records (name -> address, answered with ttl seconds) on
// addr:53, UDP and TCP, in the router's namespace until the end of t.
// addr is the router's address (RouterAddr: a network of the host's own,
// which the host reaches and egress sessions do not) or a test host's. It
// checks that the server answers: from the host for RouterAddr, the way a
// resolver on the host goes; from the router's namespace for a test
// host's address, since the host routes there only what comes from the
// egress subnets.
func (u *Upstream) ServeDNS(t testing.TB, addr netip.Addr, ttl uint32, records map[string]netip.Addr) *DNSServer {
	t.Helper()
	d := &DNSServer{Addr: netip.AddrPortFrom(addr, 53)}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		if from, err := netip.ParseAddrPort(w.RemoteAddr().String()); err == nil {
			d.mu.Lock()
			d.from = append(d.from, from.Addr().Unmap())
			d.mu.Unlock()
		}
		r := new(dns.Msg)
		r.SetReply(q)
		r.Authoritative = true
		if len(q.Question) != 1 {
			r.Rcode = dns.RcodeFormatError
			_ = w.WriteMsg(r)
			return
		}
		qn := q.Question[0]
		a, ok := records[strings.TrimSuffix(strings.ToLower(qn.Name), ".")]
		switch {
		case !ok:
			r.Rcode = dns.RcodeNameError
		case qn.Qtype == dns.TypeA:
			r.Answer = append(r.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: qn.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
				A:   a.AsSlice(),
			})
		}
		_ = w.WriteMsg(r)
	})
	pc := u.ListenPacket(t, "udp4", d.Addr)
	ln := u.Listen(t, "tcp4", d.Addr)
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: ln, Handler: handler}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan error, 1)
		go func() { done <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("the test DNS server on %s: %v", d.Addr, err)
		}
		t.Cleanup(func() {
			_ = srv.Shutdown()
			<-done
		})
	}
	if len(records) == 0 {
		return d
	}
	var name string
	for name = range records {
		break
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	var r *dns.Msg
	ask := func() (err error) {
		r, _, err = (&dns.Client{Timeout: 5 * time.Second}).Exchange(q, d.Addr.String())
		return err
	}
	var err error
	if addr == u.RouterAddr {
		err = ask()
	} else {
		err = nsthread.InNetNS(u.NS, ask)
	}
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("control: the test DNS server %s does not answer: %v %v", d.Addr, r, err)
	}
	d.mu.Lock()
	d.from = nil
	d.mu.Unlock()
	return d
}
