package egressdns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"
)

func TestAllowedNameResolves(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{Allow: []string{"allowed.test"}, OnAnswer: h.onAnswer})

	r := query(t, "udp", s.Addr(), "allowed.test.", dns.TypeA, 0)
	if r.Rcode != dns.RcodeSuccess || !slices.Equal(addrsOf(r.Answer), mustAddrs("203.0.113.10")) {
		t.Fatalf("answer %s %v, want NOERROR with 203.0.113.10", rcode(r), r.Answer)
	}
	if ttl := r.Answer[0].Header().Ttl; ttl != 300 {
		t.Errorf("the answer's TTL is %d, want the upstream's 300", ttl)
	}
	calls := h.got()
	if len(calls) != 1 || !slices.Equal(calls[0].addrs, mustAddrs("203.0.113.10")) || calls[0].ttl != 300*time.Second+DefaultGrace {
		t.Errorf("OnAnswer calls %+v, want one with 203.0.113.10 for 300s + %v", calls, DefaultGrace)
	}
	if st := s.Stats(); st.Queries != 1 || st.Forwarded != 1 || st.Refused != 0 {
		t.Errorf("Stats %+v, want 1 query forwarded", st)
	}
}

func TestCNAMEChainAndTTLFloor(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{Allow: []string{"*.allowed.test"}, OnAnswer: h.onAnswer, MinTTL: 10 * time.Second, Grace: 7 * time.Second})

	r := query(t, "udp", s.Addr(), "www.allowed.test.", dns.TypeA, 0)
	if got, want := addrsOf(r.Answer), mustAddrs("203.0.113.30", "203.0.113.31"); !slices.Equal(got, want) {
		t.Fatalf("answer addresses %v, want %v", got, want)
	}
	if len(r.Answer) != 4 {
		t.Errorf("the answer has %d records, want the 2 CNAMEs and 2 A as the upstream sent them", len(r.Answer))
	}
	// The names of the chain (cdn.test) are not on the list: the question
	// decides. The least TTL (2s) is floored at MinTTL.
	calls := h.got()
	if len(calls) != 1 || !slices.Equal(calls[0].addrs, mustAddrs("203.0.113.30", "203.0.113.31")) || calls[0].ttl != 17*time.Second {
		t.Errorf("OnAnswer calls %+v, want one with both final addresses for 10s + 7s", calls)
	}
}

func TestDeniedNameRefusedWithoutAskingUpstream(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{Allow: []string{"allowed.test", "*.allowed.test"}, OnAnswer: h.onAnswer})

	for _, tc := range []struct {
		name  string
		qtype uint16
	}{{"denied.test.", dns.TypeA}, {"denied.test.", dns.TypeTXT}, {"xallowed.test.", dns.TypeA}, {"allowed.test.evil.", dns.TypeA}, {".", dns.TypeNS}} {
		r := query(t, "udp", s.Addr(), tc.name, tc.qtype, 1232)
		if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s %s: %s %v, want REFUSED and no answer", tc.name, dns.Type(tc.qtype), rcode(r), r.Answer)
		}
		if !hasEDE(r, dns.ExtendedErrorCodeProhibited) {
			t.Errorf("%s: the refusal carries no extended error Prohibited: %v", tc.name, r.Extra)
		}
	}
	if q := up.queries(""); len(q) != 0 {
		t.Errorf("the upstream was asked %v, want nothing", q)
	}
	if len(h.got()) != 0 {
		t.Errorf("OnAnswer called for refused names: %v", h.got())
	}
	if st := s.Stats(); st.Refused != 5 || st.Forwarded != 0 {
		t.Errorf("Stats %+v, want 5 refused", st)
	}
}

func hasEDE(m *dns.Msg, code uint16) bool {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok && e.InfoCode == code {
				return true
			}
		}
	}
	return false
}

func TestWildcard(t *testing.T) {
	up := newUpstream(t, false)
	s := newResolver(t, up, Config{Allow: []string{"*.allowed.test"}})

	for name, want := range map[string]int{
		"www.allowed.test.":   dns.RcodeSuccess,
		"a.b.allowed.test.":   dns.RcodeNameError, // allowed, forwarded; the upstream has no such name
		"allowed.test.":       dns.RcodeRefused,   // the wildcard is for names below, not the name itself
		"xallowed.test.":      dns.RcodeRefused,
		"allowed.test.other.": dns.RcodeRefused,
	} {
		if r := query(t, "udp", s.Addr(), name, dns.TypeA, 0); r.Rcode != want {
			t.Errorf("%s: %s, want %s", name, rcode(r), dns.RcodeToString[want])
		}
	}
	if n := len(up.queries("allowed.test.")); n != 0 {
		t.Errorf("the upstream was asked for allowed.test %d times, want 0", n)
	}
}

func TestCaseInsensitive(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{Allow: []string{"Allowed.TEST.", "*.ALLOWED.test"}, OnAnswer: h.onAnswer})

	for _, name := range []string{"aLLowed.tEst.", "ALLOWED.TEST.", "Www.Allowed.Test."} {
		r := query(t, "udp", s.Addr(), name, dns.TypeA, 0)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Errorf("%s: %s %v, want an answer", name, rcode(r), r.Answer)
		}
	}
	if n := len(h.got()); n != 3 {
		t.Errorf("OnAnswer called %d times, want 3", n)
	}
}

func TestAAAAAndOtherTypes(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{Allow: []string{"*.allowed.test"}, OnAnswer: h.onAnswer})

	r := query(t, "udp", s.Addr(), "v6.allowed.test.", dns.TypeAAAA, 0)
	if !slices.Equal(addrsOf(r.Answer), mustAddrs("2001:db8::1")) {
		t.Fatalf("AAAA answer %v", r.Answer)
	}
	r = query(t, "udp", s.Addr(), "txt.allowed.test.", dns.TypeTXT, 0)
	if len(r.Answer) != 1 || r.Answer[0].(*dns.TXT).Txt[0] != "hello" {
		t.Fatalf("TXT answer %v, want the upstream's", r.Answer)
	}
	// An A query for a name with only AAAA: NOERROR without addresses.
	r = query(t, "udp", s.Addr(), "v6.allowed.test.", dns.TypeA, 0)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("A for v6.allowed.test: %s %v, want NOERROR, no records", rcode(r), r.Answer)
	}
	calls := h.got()
	if len(calls) != 1 || !slices.Equal(calls[0].addrs, mustAddrs("2001:db8::1")) || calls[0].ttl != 120*time.Second+DefaultGrace {
		t.Errorf("OnAnswer calls %+v, want only the AAAA's address for 120s + grace", calls)
	}
}

func TestTCPQuery(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{Allow: []string{"*.allowed.test"}, OnAnswer: h.onAnswer})

	r := query(t, "tcp", s.Addr(), "big.allowed.test.", dns.TypeA, 0)
	if r.Truncated || len(addrsOf(r.Answer)) != bigCount {
		t.Fatalf("TCP answer: truncated %v with %d addresses, want all %d", r.Truncated, len(r.Answer), bigCount)
	}
	if q := up.queries("big.allowed.test."); len(q) != 1 || q[0].net != "tcp" {
		t.Errorf("the upstream saw %+v, want one TCP query (the client came over TCP)", q)
	}
	if calls := h.got(); len(calls) != 1 || len(calls[0].addrs) != bigCount {
		t.Errorf("OnAnswer calls %+v, want one with %d addresses", calls, bigCount)
	}
}

func TestTruncationFallsBackToTCP(t *testing.T) {
	// An upstream that truncates big answers over UDP whatever the
	// client's EDNS0 size, as some resolvers do.
	up := newUpstream(t, true)
	h := &hook{}
	s := newResolver(t, up, Config{Allow: []string{"*.allowed.test"}, OnAnswer: h.onAnswer})

	r := query(t, "udp", s.Addr(), "big.allowed.test.", dns.TypeA, 4096)
	if r.Truncated || len(addrsOf(r.Answer)) != bigCount {
		t.Fatalf("UDP answer with room for it: truncated %v with %d addresses, want all %d", r.Truncated, len(r.Answer), bigCount)
	}
	var nets []string
	for _, q := range up.queries("big.allowed.test.") {
		nets = append(nets, q.net)
	}
	if !slices.Equal(nets, []string{"udp", "tcp"}) {
		t.Errorf("the upstream saw the query over %v, want udp then tcp", nets)
	}

	// Without EDNS0 the client takes 512 bytes: it gets what fits, flagged
	// truncated, and only those addresses are allowed.
	r = query(t, "udp", s.Addr(), "big.allowed.test.", dns.TypeA, 0)
	n := len(addrsOf(r.Answer))
	if !r.Truncated || n == 0 || n >= bigCount {
		t.Fatalf("UDP answer to a 512-byte client: truncated %v with %d addresses, want TC with some", r.Truncated, n)
	}
	if calls := h.got(); len(calls) != 2 || len(calls[1].addrs) != n {
		t.Errorf("OnAnswer calls %+v, want the second with the %d addresses sent", calls, n)
	}
}

func TestUpstreamDown(t *testing.T) {
	// silent never answers; closed refuses (nothing listens there).
	silent, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	closedUDP, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := netip.MustParseAddrPort(closedUDP.LocalAddr().String())
	closedUDP.Close()
	silentAddr := netip.MustParseAddrPort(silent.LocalAddr().String())

	const timeout = 300 * time.Millisecond
	s := newResolver(t, nil, Config{Upstreams: []netip.AddrPort{silentAddr, closed}, Timeout: timeout})
	start := time.Now()
	r := query(t, "udp", s.Addr(), "allowed.test.", dns.TypeA, 1232)
	took := time.Since(start)
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("answer %s, want SERVFAIL", rcode(r))
	}
	if !hasEDE(r, dns.ExtendedErrorCodeNoReachableAuthority) {
		t.Errorf("SERVFAIL without the extended error No Reachable Authority: %v", r.Extra)
	}
	// One timeout (the silent one) and a refusal; generous for a busy machine.
	if took > timeout+3*time.Second {
		t.Errorf("SERVFAIL after %v, want about the %v timeout", took, timeout)
	}
	if st := s.Stats(); st.UpstreamFailures != 1 {
		t.Errorf("Stats %+v, want 1 upstream failure", st)
	}

	// A dead upstream first, a live one next: the live one answers.
	up := newUpstream(t, false)
	s2 := newResolver(t, nil, Config{Upstreams: []netip.AddrPort{silentAddr, up.addr}, Timeout: timeout})
	if r := query(t, "udp", s2.Addr(), "allowed.test.", dns.TypeA, 0); !slices.Equal(addrsOf(r.Answer), mustAddrs("203.0.113.10")) {
		t.Errorf("with a live second upstream: %s %v", rcode(r), r.Answer)
	}
}

func TestOnAnswerErrorIsServfail(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{err: errors.New("nft: set is full")}
	s := newResolver(t, up, Config{Allow: []string{"allowed.test"}, OnAnswer: h.onAnswer})

	r := query(t, "udp", s.Addr(), "allowed.test.", dns.TypeA, 0)
	if r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Fatalf("answer %s %v, want SERVFAIL without the address", rcode(r), r.Answer)
	}
	if st := s.Stats(); st.HookFailures != 1 || st.Forwarded != 0 {
		t.Errorf("Stats %+v, want 1 hook failure", st)
	}
}

func TestOnAnswerBeforeTheAnswerIsSent(t *testing.T) {
	up := newUpstream(t, false)
	entered, gate := make(chan struct{}), make(chan struct{})
	hold := func(context.Context, []netip.Addr, time.Duration) error {
		close(entered)
		<-gate
		return nil
	}
	s := newResolver(t, up, Config{Allow: []string{"allowed.test"}, OnAnswer: hold})
	answered := make(chan *dns.Msg, 1)
	go func() {
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		r, _ := exchange("udp", s.Addr(), m)
		answered <- r
	}()
	<-entered
	select {
	case r := <-answered:
		t.Fatalf("the answer %v came while OnAnswer had not returned", r)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	if r := <-answered; r == nil || len(r.Answer) != 1 {
		t.Errorf("answer after OnAnswer returned: %v", r)
	}
}

func TestOnAnswerHangingTimesOut(t *testing.T) {
	up := newUpstream(t, false)
	hang := func(ctx context.Context, _ []netip.Addr, _ time.Duration) error {
		<-ctx.Done()
		return ctx.Err()
	}
	s := newResolver(t, up, Config{Allow: []string{"allowed.test"}, OnAnswer: hang, Timeout: 200 * time.Millisecond})
	if r := query(t, "udp", s.Addr(), "allowed.test.", dns.TypeA, 0); r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Fatalf("answer %s %v, want SERVFAIL once the hook's time is up", rcode(r), r.Answer)
	}
	if st := s.Stats(); st.HookFailures != 1 {
		t.Errorf("Stats %+v, want 1 hook failure", st)
	}
}

func TestNoFilterForwardsEverything(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{OnAnswer: h.onAnswer})

	for name, want := range map[string]string{"denied.test.": "203.0.113.20", "allowed.test.": "203.0.113.10", "OTHER.test.": "203.0.113.40"} {
		r := query(t, "udp", s.Addr(), name, dns.TypeA, 0)
		if !slices.Equal(addrsOf(r.Answer), mustAddrs(want)) {
			t.Errorf("%s: %s %v, want %s", name, rcode(r), r.Answer, want)
		}
	}
	if r := query(t, "udp", s.Addr(), "nowhere.test.", dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Errorf("nowhere.test: %s, want the upstream's NXDOMAIN", rcode(r))
	}
	if n := len(h.got()); n != 0 {
		t.Errorf("OnAnswer called %d times without a filter, want 0", n)
	}
	if st := s.Stats(); st.Forwarded != 4 || st.Refused != 0 {
		t.Errorf("Stats %+v, want 4 forwarded", st)
	}
}

func TestIDAndEDNS0PassThrough(t *testing.T) {
	up := newUpstream(t, false)
	s := newResolver(t, up, Config{})

	var upIDs []uint16
	for range 3 {
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		m.Id = 4242
		m.SetEdns0(1400, true)
		r, err := exchange("udp", s.Addr(), m)
		if err != nil {
			t.Fatal(err) // miekg/dns refuses an answer with another ID
		}
		if r.Id != 4242 {
			t.Fatalf("answer ID %d, want the client's 4242", r.Id)
		}
		if opt := r.IsEdns0(); opt == nil || !opt.Do() {
			t.Errorf("the answer lost the upstream's OPT record: %v", r.Extra)
		}
	}
	for _, q := range up.queries("allowed.test.") {
		upIDs = append(upIDs, q.id)
		if q.opt == nil || q.opt.UDPSize() != 1400 || !q.opt.Do() {
			t.Errorf("the upstream saw OPT %v, want the client's (size 1400, DO)", q.opt)
		}
	}
	if len(upIDs) != 3 || upIDs[0] == 4242 && upIDs[1] == 4242 && upIDs[2] == 4242 {
		t.Errorf("upstream IDs %v: want fresh ones, not the client's", upIDs)
	}
}

func TestMalformed(t *testing.T) {
	up := newUpstream(t, false)
	s := newResolver(t, up, Config{})

	two := new(dns.Msg)
	two.SetQuestion("allowed.test.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "denied.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	if r, err := exchange("udp", s.Addr(), two); err != nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("two questions: %v %v, want FORMERR", r, err)
	}
	notify := new(dns.Msg)
	notify.SetNotify("allowed.test.")
	if r, err := exchange("udp", s.Addr(), notify); err != nil || r.Rcode != dns.RcodeNotImplemented {
		t.Errorf("NOTIFY: %v %v, want NOTIMP", r, err)
	}
	if q := up.queries(""); len(q) != 0 {
		t.Errorf("the upstream saw %v, want nothing", q)
	}
	if st := s.Stats(); st.Malformed != 2 || st.Queries != 2 {
		t.Errorf("Stats %+v, want 2 malformed queries", st)
	}
}

func TestConcurrencyCap(t *testing.T) {
	up := newUpstream(t, false)
	s := newResolver(t, up, Config{MaxInFlight: 2, MaxInFlightPerClient: 2})

	var wg sync.WaitGroup
	results := make([]*dns.Msg, 2)
	for i := range results {
		wg.Go(func() { results[i] = query(t, "udp", s.Addr(), "slow.allowed.test.", dns.TypeA, 0) })
	}
	for range 2 {
		select {
		case <-up.slowC:
		case <-time.After(10 * time.Second):
			t.Fatal("the slow queries did not reach the upstream")
		}
	}
	// Both slots are held: a third query gets SERVFAIL without going upstream.
	for _, network := range []string{"udp", "tcp"} {
		if r := query(t, network, s.Addr(), "allowed.test.", dns.TypeA, 0); r.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s query over the cap: %s, want SERVFAIL", network, rcode(r))
		}
	}
	if n := len(up.queries("allowed.test.")); n != 0 {
		t.Errorf("the upstream saw %d queries over the cap", n)
	}
	up.unblock()
	wg.Wait()
	for i, r := range results {
		if r != nil && r.Rcode != dns.RcodeNameError {
			t.Errorf("slow query %d: %s, want the upstream's NXDOMAIN", i, rcode(r))
		}
	}
	if r := query(t, "udp", s.Addr(), "allowed.test.", dns.TypeA, 0); len(r.Answer) != 1 {
		t.Errorf("after the slow queries: %s %v", rcode(r), r.Answer)
	}
	if st := s.Stats(); st.Overloaded != 2 {
		t.Errorf("Stats %+v, want 2 overloaded", st)
	}
}

func TestCloseIdempotentAndReleases(t *testing.T) {
	up := newUpstream(t, false)
	before := goleak.IgnoreCurrent()
	s, err := New(Config{Listen: netip.MustParseAddrPort("127.0.0.1:0"), Upstreams: []netip.AddrPort{up.addr}})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	if r := query(t, "tcp", addr, "allowed.test.", dns.TypeA, 0); len(r.Answer) != 1 {
		t.Fatalf("before Close: %s %v", rcode(r), r.Answer)
	}
	// A query in flight when Close comes is ended, not waited on for ever.
	done := make(chan *dns.Msg, 1)
	go func() {
		m := new(dns.Msg)
		m.SetQuestion("slow.allowed.test.", dns.TypeA)
		r, _ := exchange("udp", addr, m)
		done <- r
	}()
	<-up.slowC
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		up.unblock()
		t.Fatal("Close hangs on a query in flight")
	}
	if r := <-done; r == nil || r.Rcode != dns.RcodeServerFailure {
		t.Errorf("the query in flight at Close got %v, want SERVFAIL", r)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// The test upstream still holds the slow query; it is not the Server's.
	goleak.VerifyNone(t, before, goleak.IgnoreTopFunction("github.com/tai42/sandbox/internal/egressdns.(*upstream).ServeDNS"))
	// Both sockets are gone: the address binds again.
	pc, ln, err := listen(addr)
	if err != nil {
		t.Fatalf("the address is still held after Close: %v", err)
	}
	pc.Close()
	ln.Close()
}

func TestListenSamePortAndFixedPort(t *testing.T) {
	up := newUpstream(t, false)
	s := newResolver(t, up, Config{})
	for _, network := range []string{"udp", "tcp"} {
		if r := query(t, network, s.Addr(), "allowed.test.", dns.TypeA, 0); len(r.Answer) != 1 {
			t.Errorf("%s on %s: %s", network, s.Addr(), rcode(r))
		}
	}
	// A port in use is an error naming it.
	if _, err := New(Config{Listen: s.Addr(), Upstreams: []netip.AddrPort{up.addr}}); err == nil || !strings.Contains(err.Error(), s.Addr().String()) {
		t.Errorf("New on a port in use: %v, want an error naming %s", err, s.Addr())
	}
	// Forwarding to itself is refused.
	pc, ln, err := listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	self := netip.MustParseAddrPort(ln.Addr().String())
	pc.Close()
	ln.Close()
	if _, err := New(Config{Listen: self, Upstreams: []netip.AddrPort{self}}); err == nil || !strings.Contains(err.Error(), "loop") {
		t.Errorf("New forwarding to itself: %v, want an error about a loop", err)
	}
}

func TestFreebind(t *testing.T) {
	// 192.0.2.1 (TEST-NET-1) is on no interface here; nothing is ever sent
	// to it, it is only bound.
	nonLocal := netip.MustParseAddrPort("192.0.2.1:0")
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_nonlocal_bind"); err == nil && strings.TrimSpace(string(b)) == "0" {
		if pc, err := net.ListenPacket("udp4", nonLocal.String()); err == nil {
			pc.Close()
			t.Fatal("192.0.2.1 binds without IP_FREEBIND: the host has it, the test proves nothing")
		}
	}
	s, err := New(Config{Listen: nonLocal, Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}})
	if err != nil {
		t.Fatalf("binding an address the host does not have: %v", err)
	}
	if s.Addr().Addr() != nonLocal.Addr() || s.Addr().Port() == 0 {
		t.Errorf("Addr %s, want 192.0.2.1 with the port picked", s.Addr())
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

func TestResolvConf(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write("resolv.conf", `# generated
; another comment
search example.internal
nameserver 10.0.0.2
options edns0 trust-ad timeout:1
nameserver   2001:db8::53
nameserver fe80::1%eth0
nameserver not-an-address
#nameserver 10.9.9.9
nameserver 127.0.0.53 # stub
`)
	got, err := readResolvConf(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{
		netip.MustParseAddrPort("10.0.0.2:53"), netip.MustParseAddrPort("[2001:db8::53]:53"),
		netip.MustParseAddrPort("[fe80::1%eth0]:53"), netip.MustParseAddrPort("127.0.0.53:53"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("readResolvConf = %v, want %v", got, want)
	}

	for name, text := range map[string]string{
		"empty":    "",
		"no-ns":    "search x\noptions ndots:2\n# nameserver 1.1.1.1\n",
		"bad-ns":   "nameserver\nnameserver dns.example\n",
		"comments": "# only\n; comments\n",
	} {
		_, err := New(Config{Listen: netip.MustParseAddrPort("127.0.0.1:0"), ResolvConf: write(name, text)})
		if err == nil || !strings.Contains(err.Error(), "none found in") {
			t.Errorf("%s: New = %v, want an error saying no resolver was found", name, err)
		}
		if name == "bad-ns" && err != nil && !strings.Contains(err.Error(), `"dns.example"`) {
			t.Errorf("%s: %v, want the unusable line named", name, err)
		}
	}
	if _, err := New(Config{Listen: netip.MustParseAddrPort("127.0.0.1:0"), ResolvConf: filepath.Join(dir, "missing")}); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: New = %v, want a not-exist error", err)
	}
	// A usable file: New listens (nothing is sent; 127.0.0.1:53 is never asked).
	s, err := New(Config{Listen: netip.MustParseAddrPort("127.0.0.1:0"), ResolvConf: write("ok", "nameserver 127.0.0.1\n")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	up := netip.MustParseAddrPort("127.0.0.1:53")
	lo := netip.MustParseAddrPort("127.0.0.1:0")
	for name, cfg := range map[string]Config{
		"no listen":     {Upstreams: []netip.AddrPort{up}},
		"bad pattern":   {Listen: lo, Upstreams: []netip.AddrPort{up}, Allow: []string{"ok.test", "bad..test"}},
		"upstream port": {Listen: lo, Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}},
		"negative":      {Listen: lo, Upstreams: []netip.AddrPort{up}, Grace: -time.Second},
	} {
		if s, err := New(cfg); err == nil {
			s.Close()
			t.Errorf("%s: New succeeded", name)
		}
	}
	var pe *PatternError
	if _, err := New(Config{Listen: lo, Upstreams: []netip.AddrPort{up}, Allow: []string{"bad..test"}}); !errors.As(err, &pe) || pe.Pattern != "bad..test" {
		t.Errorf("bad pattern: %v, want a *PatternError naming it", err)
	}
}

// TestSetAllow: the allowlist changes for the queries that follow: on from
// no filter, replaced, and off again; a bad pattern changes nothing.
func TestSetAllow(t *testing.T) {
	up := newUpstream(t, false)
	h := &hook{}
	s := newResolver(t, up, Config{OnAnswer: h.onAnswer})
	resolves := func(name string) bool {
		return query(t, "udp", s.Addr(), name, dns.TypeA, 0).Rcode == dns.RcodeSuccess
	}
	if !resolves("denied.test.") || len(h.got()) != 0 {
		t.Fatalf("without a filter: denied.test must resolve and OnAnswer stay uncalled (%v)", h.got())
	}
	if err := s.SetAllow([]string{"allowed.test"}); err != nil {
		t.Fatal(err)
	}
	if resolves("denied.test.") || !resolves("allowed.test.") {
		t.Error("after SetAllow(allowed.test): denied.test resolves, or allowed.test does not")
	}
	if got := h.got(); len(got) != 1 || !slices.Equal(got[0].addrs, mustAddrs("203.0.113.10")) {
		t.Errorf("OnAnswer after the filter went on: %v, want allowed.test's address once", got)
	}
	var pe *PatternError
	if err := s.SetAllow([]string{"ok.test", "bad..test"}); !errors.As(err, &pe) || pe.Pattern != "bad..test" {
		t.Errorf("SetAllow with a bad pattern: %v, want a *PatternError naming it", err)
	}
	if resolves("denied.test.") || !resolves("allowed.test.") {
		t.Error("a refused SetAllow changed the filter")
	}
	if err := s.SetAllow([]string{"denied.test"}); err != nil {
		t.Fatal(err)
	}
	if !resolves("denied.test.") || resolves("allowed.test.") {
		t.Error("after SetAllow(denied.test): the list was not replaced")
	}
	if err := s.SetAllow(nil); err != nil {
		t.Fatal(err)
	}
	if !resolves("denied.test.") || !resolves("allowed.test.") {
		t.Error("after SetAllow(nil): the filter is still on")
	}
}
