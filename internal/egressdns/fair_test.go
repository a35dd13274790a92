package egressdns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The resolver tells sessions apart by their source address, as the
// fences leave it (they redirect a session's DNS without masquerading it).
// On loopback every 127.x.y.z address is the host's, so each test client
// below is a session of its own.
func clientAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 1, byte(i)}) }

// TestOneSessionCannotStarveTheOthers floods the resolver, from one
// session, with 600 queries for a name the upstream never answers (the
// attack of issue 31, hole 7): with one pool of slots for all, the flood
// held every slot and the other sessions' queries got SERVFAIL until the
// flood's timed out. Each session has its share: the others resolve.
func TestOneSessionCannotStarveTheOthers(t *testing.T) {
	up := newUpstream(t, false)
	// A timeout longer than the test: the flood's slots stay held while
	// the others ask.
	s := newResolver(t, up, Config{Timeout: time.Minute})
	const n = 600
	flood(t, s, clientAddr(1), silentName, n)
	held := waitFloodSettled(t, s, up, n)
	if held >= DefaultMaxInFlight {
		t.Errorf("one session holds %d of the %d slots", held, DefaultMaxInFlight)
	}
	for i := range 10 {
		from := clientAddr(10 + i)
		r, err := queryFrom(from, s.Addr(), "allowed.test.")
		if err != nil {
			t.Fatalf("session %s: %v", from, err)
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("session %s, during another's flood: %s %v, want the answer", from, rcode(r), r.Answer)
		}
	}
}

// TestManySessionsCannotStarveAnother fills every slot from several
// sessions, each within its own bound: a query from a session that holds
// none still gets a slot, taken from a session holding the most, whose
// query gets SERVFAIL.
func TestManySessionsCannotStarveAnother(t *testing.T) {
	up := newUpstream(t, false)
	s := newResolver(t, up, Config{MaxInFlight: 8, MaxInFlightPerClient: 2, Timeout: time.Minute})
	const flooders, each = 4, 50
	for i := range flooders {
		flood(t, s, clientAddr(1+i), silentName, each)
	}
	if held := waitFloodSettled(t, s, up, flooders*each); held != 8 {
		t.Fatalf("the flooding sessions hold %d slots, want all 8", held)
	}
	overloaded := s.Stats().Overloaded
	for i := range 10 {
		from := clientAddr(10 + i)
		r, err := queryFrom(from, s.Addr(), "allowed.test.")
		if err != nil {
			t.Fatalf("session %s: %v", from, err)
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("session %s, with every slot held by others: %s %v, want the answer", from, rcode(r), r.Answer)
		}
	}
	// A query that found the slots full took a flooder's (the flooder's
	// query ends SERVFAIL, counted overloaded); the later ones found the
	// slot it left free, unless they came before its release.
	waitFor(t, "the preempted query to be answered", func() bool { return s.Stats().Overloaded > overloaded })
	if n := s.Stats().Overloaded - overloaded; n > 10 {
		t.Errorf("%d flood queries gave their slots up to 10 queries", n)
	}
	if n := s.Stats().UpstreamFailures; n != 0 {
		t.Errorf("%d upstream failures: the flood's slots were freed by a timeout, not taken", n)
	}
}

// TestSlots checks the sharing rules one by one: a client's bound, and a
// full pool's slot taken only from a client holding at least two more.
func TestSlots(t *testing.T) {
	p := newSlots(4, 3)
	a, b, c := clientAddr(1), clientAddr(2), clientAddr(3)
	var as []*slot
	var actx []context.Context
	for range 3 {
		sl, ctx, _ := p.acquire(t.Context(), a)
		if sl == nil {
			t.Fatal("a client under its bound got no slot")
		}
		as, actx = append(as, sl), append(actx, ctx)
	}
	if sl := p.take(a, func() {}); sl != nil {
		t.Fatal("a client got a slot over its bound")
	}
	bs := p.take(b, func() {})
	if bs == nil {
		t.Fatal("the last free slot was not given")
	}
	// Full: c (0) takes a's oldest (a holds 3).
	cs := p.take(c, func() {})
	if cs == nil {
		t.Fatal("a client holding none got no slot from one holding 3")
	}
	if !as[0].preempted.Load() || actx[0].Err() == nil {
		t.Error("the slot taken: its query was not told, or its context not ended")
	}
	if as[1].preempted.Load() || actx[1].Err() != nil {
		t.Error("not the oldest query of the client gave its slot up")
	}
	// Full: b (1) and a (2) find nobody holding two more than they do.
	if sl := p.take(b, func() {}); sl != nil {
		t.Error("b (1) took a slot from a (2)")
	}
	if sl := p.take(a, func() {}); sl != nil {
		t.Error("a (2) took a slot from a pool where nobody holds 4")
	}
	// The taken slot's release frees nothing; another's frees one.
	p.release(as[0])
	if sl := p.take(b, func() {}); sl != nil {
		t.Error("releasing a taken slot freed one")
	}
	p.release(cs)
	if sl := p.take(b, func() {}); sl == nil {
		t.Error("a released slot was not given")
	}
	if p.total != 4 || len(p.clients[a]) != 2 || len(p.clients[b]) != 2 || len(p.clients[c]) != 0 {
		t.Errorf("total %d, held a %d b %d c %d; want 4, 2, 2, 0", p.total, len(p.clients[a]), len(p.clients[b]), len(p.clients[c]))
	}
}

// flood sends n queries for name from src over UDP, without waiting for
// answers, a batch at a time: each batch is taken in by the server before
// the next goes, so that none is lost to a full socket buffer.
func flood(t *testing.T, s *Server, src netip.Addr, name string, n int) {
	t.Helper()
	conn, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	const batch = 50
	base := s.Stats().Queries
	for i := 0; i < n; i += batch {
		end := min(i+batch, n)
		for j := i; j < end; j++ {
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			m.Id = uint16(j)
			b, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "the server to take in the flood", func() bool { return s.Stats().Queries >= base+uint64(end) })
	}
}

// waitFloodSettled waits until each of the n flood queries has been
// either turned away (overloaded) or sent upstream, and returns how many
// were sent (and so hold a slot: the upstream never answers them).
func waitFloodSettled(t *testing.T, s *Server, up *upstream, n int) int {
	t.Helper()
	var held int
	waitFor(t, "the flood to settle", func() bool {
		held = len(up.queries(silentName))
		return held+int(s.Stats().Overloaded) == n
	})
	return held
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// queryFrom asks addr, over UDP from src, for name's A records.
func queryFrom(src netip.Addr, addr netip.AddrPort, name string) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp", Timeout: 10 * time.Second, Dialer: &net.Dialer{
		Timeout:   10 * time.Second,
		LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)),
	}}
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, _, err := c.Exchange(m, addr.String())
	if err != nil {
		return nil, fmt.Errorf("query %s from %s: %w", name, src, err)
	}
	return r, nil
}

// TestTimeoutOverTwoSeconds: a Timeout past a dns.Client's own default
// read timeout (2 s) is the one that holds, not the default.
func TestTimeoutOverTwoSeconds(t *testing.T) {
	up := newUpstream(t, false)
	const timeout = 2500 * time.Millisecond
	s := newResolver(t, up, Config{Timeout: timeout})
	start := time.Now()
	r := query(t, "udp", s.Addr(), silentName, dns.TypeA, 0)
	if took := time.Since(start); r.Rcode != dns.RcodeServerFailure || took < timeout {
		t.Errorf("a query the upstream never answers: %s after %v, want SERVFAIL after the %v timeout", rcode(r), took, timeout)
	}
}

// TestTCPConnectionsShared: TCP connections are shared as the queries
// are. One session kept every connection the server holds open (a query
// on each every half second: never idle), and every other session's TCP
// queries waited in the kernel's backlog for as long; now it holds its
// bound, and a session finding them all held by others takes one.
func TestTCPConnectionsShared(t *testing.T) {
	up := newUpstream(t, false)
	cfg := Config{MaxInFlight: 4, MaxInFlightPerClient: 2}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); wg.Wait() })
	// hold returns once each connection's first query is answered, or
	// failed: the server has taken it, or turned it away.
	hold := func(s *Server, from netip.Addr, n int) {
		t.Helper()
		first := make(chan struct{}, n)
		defer func() {
			for range n {
				<-first
			}
		}()
		for range n {
			c, err := tcpClient(from).Dial(s.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				defer c.Close()
				m := new(dns.Msg)
				m.SetQuestion("other.test.", dns.TypeA)
				// Until the server closes the connection (over the
				// bound, or taken), or the test ends.
				for i := 0; ; i++ {
					_, _, err := tcpClient(from).ExchangeWithConn(m, c)
					if i == 0 {
						first <- struct{}{}
					}
					if err != nil {
						return
					}
					select {
					case <-stop:
						return
					case <-time.After(500 * time.Millisecond):
					}
				}
			})
		}
	}
	ask := func(s *Server, what string, from netip.Addr) {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		r, _, err := tcpClient(from).Exchange(m, s.Addr().String())
		if err != nil {
			t.Errorf("%s: a TCP query from %s: %v", what, from, err)
			return
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("%s: a TCP query from %s: %s %v, want the answer", what, from, rcode(r), r.Answer)
		}
	}
	// One session tries to hold all 4 connections.
	s := newResolver(t, up, cfg)
	hold(s, clientAddr(1), 4)
	ask(s, "one session holding its bound", clientAddr(10))
	// Two sessions hold all 4, each its bound (a server of its own: the
	// asker's connection above is let go some time after its close).
	s = newResolver(t, up, cfg)
	hold(s, clientAddr(1), 2)
	hold(s, clientAddr(2), 2)
	ask(s, "two sessions holding every connection", clientAddr(11))
}

func tcpClient(from netip.Addr) *dns.Client {
	return &dns.Client{Net: "tcp", Timeout: 10 * time.Second, Dialer: &net.Dialer{
		Timeout:   10 * time.Second,
		LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)),
	}}
}
