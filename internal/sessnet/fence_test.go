package sessnet

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	sandbox "github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
)

// blockedLog collects what Config.OnBlocked reports.
type blockedLog struct {
	mu  sync.Mutex
	got []Blocked
}

func (l *blockedLog) add(b Blocked) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, b)
}

// wait returns the first report matching ok within a few seconds.
func (l *blockedLog) wait(ok func(Blocked) bool) (Blocked, bool) {
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		for _, b := range l.got {
			if ok(b) {
				l.mu.Unlock()
				return b, true
			}
		}
		l.mu.Unlock()
	}
	return Blocked{}, false
}

// newFenceManager makes a test Manager whose blocked attempts go to the
// returned log, and an upstream its egress sessions reach.
func newFenceManager(t *testing.T, f Fences) (*Manager, *sessnettest.Upstream, *blockedLog) {
	t.Helper()
	requireRoot(t)
	log := &blockedLog{}
	subnets := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 24, 2)
	cfg := Config{Dir: t.TempDir(), Prefix: testPrefix(), InternalSubnet: subnets[0], EgressSubnet: subnets[1],
		Fences: f, OnBlocked: log.add}
	m := newManagerWith(t, cfg)
	return m, newUpstream(t, cfg.Prefix, subnets[1]), log
}

func blocked(t *testing.T, m *Manager) map[string]uint64 {
	t.Helper()
	b, err := m.Blocked()
	if err != nil {
		t.Fatalf("Blocked: %v", err)
	}
	return b
}

// TestFencesBuiltin: an egress session reaches the public internet (TCP,
// UDP, ICMP echo) and none of the private, shared, link-local or host
// networks, each refusal at once, counted and reported.
func TestFencesBuiltin(t *testing.T) {
	t.Parallel()
	m, up, log := newFenceManager(t, Fences{})
	e := setup(t, m, "sb-egr", sandbox.NetworkEgress)
	pub := up.Hosts[sessnettest.Public]
	if from := reach(t, "egress -> public TCP", e.Path(), pub.TCP.Addr); from != up.HostAddr {
		t.Errorf("the public host saw the connection come from %s, want the host's %s (masquerade)", from, up.HostAddr)
	}
	udpEchoes(t, "egress -> public UDP", e.Path(), pub.UDP)
	if replied, _ := ping(t, e.Path(), pub.Addr, 3*time.Second); !replied {
		t.Errorf("egress -> public ICMP echo: no reply from %s", pub.Addr)
	}
	reach(t, "egress -> second public TCP", e.Path(), up.Hosts[sessnettest.Public2].TCP.Addr)

	for i, c := range []struct{ host, reason string }{
		{sessnettest.Private10, ReasonPrivate}, {sessnettest.Private172, ReasonPrivate}, {sessnettest.Private192, ReasonPrivate},
		{sessnettest.Shared, ReasonShared}, {sessnettest.Metadata, ReasonLinkLocal},
	} {
		h := up.Hosts[c.host]
		// A session of its own for each: the kernel rate-limits the ICMP
		// errors it sends to one address (net.ipv4.icmp_ratelimit, a
		// burst of 6), which two per host would soon exhaust.
		e := setup(t, m, fmt.Sprintf("sb-egr-%d", i), sandbox.NetworkEgress)
		before := blocked(t, m)[c.reason]
		// A reset fails the dial at once; under load a first SYN is at
		// times answered only on its retransmission (1 s on): well below
		// the dial's 3 s timeout.
		if took := refusedFast(t, "egress -> "+c.host+" TCP", e.Path(), h.TCP.Addr); took > 2*time.Second {
			t.Errorf("egress -> %s TCP: the refusal took %v", c.host, took)
		}
		if got := blocked(t, m)[c.reason]; got != before+1 {
			t.Errorf("after one refused SYN to %s the %s counter went from %d to %d, want +1", c.host, c.reason, before, got)
		}
		udpRefused(t, "egress -> "+c.host+" UDP", e.Path(), h.UDP)
		if replied, unreach := ping(t, e.Path(), h.Addr, blockTimeout); replied || !unreach {
			t.Errorf("egress -> %s ICMP echo: replied %v, refused %v; want refused, no reply", c.host, replied, unreach)
		}
		b, ok := log.wait(func(b Blocked) bool { return b.Dst == h.TCP.Addr && b.Proto == "tcp" })
		switch {
		case !ok:
			t.Errorf("OnBlocked never reported the connection to %s", h.TCP.Addr)
		case b.Reason != c.reason || b.Session != e.ID() || b.Src != e.Addr():
			t.Errorf("OnBlocked reported %+v, want reason %s, session %s from %s", b, c.reason, e.ID(), e.Addr())
		}
	}

	// The router's own address is on a network of the host's (the link's
	// subnet): refused as such, like the host's other networks.
	router := serve(t, sessnettest.Path(up.NS), up.RouterAddr)
	reach(t, "host -> router (control)", "", router.Addr)
	before := blocked(t, m)[ReasonHostNetwork]
	refusedFast(t, "egress -> a host network", e.Path(), router.Addr)
	if got := blocked(t, m)[ReasonHostNetwork]; got != before+1 {
		t.Errorf("host_network counter went from %d to %d, want +1", before, got)
	}
	// Kept current: a network the host gains after the table is made is
	// refused too. The router moves to a new address on a new subnet.
	extra := freePrefixes(t, netip.MustParsePrefix("198.18.0.0/15"), 24, 1)[0]
	hostLink, err := netlink.LinkByName(up.HostLink)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(hostLink, &netlink.Addr{IPNet: sessnettest.IPNet(netip.PrefixFrom(extra.Addr().Next(), 24))}); err != nil {
		t.Fatal(err)
	}
	eth0, err := up.Router.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Router.AddrAdd(eth0, &netlink.Addr{IPNet: sessnettest.IPNet(netip.PrefixFrom(extra.Addr().Next().Next(), 24))}); err != nil {
		t.Fatal(err)
	}
	late := serve(t, sessnettest.Path(up.NS), extra.Addr().Next().Next())
	reach(t, "host -> router's new address (control)", "", late.Addr)
	waitFor(t, "the new host network to be fenced", func() bool {
		_, err := dial(t, e.Path(), late.Addr, blockTimeout)
		return err != nil && strings.Contains(err.Error(), "refused")
	})

	counts := blocked(t, m)
	for _, r := range BlockReasons() {
		if _, ok := counts[r]; !ok {
			t.Errorf("Blocked has no count for %s: %v", r, counts)
		}
	}
	t.Logf("blocked: %v", counts)
}

// TestFencesOperator: Allow opens an exception, Deny closes a public host,
// both changed by SetFences on a live session; malformed fences are
// refused.
func TestFencesOperator(t *testing.T) {
	t.Parallel()
	m, up, _ := newFenceManager(t, Fences{})
	e := setup(t, m, "sb-egr", sandbox.NetworkEgress)
	priv, pub := up.Hosts[sessnettest.Private10], up.Hosts[sessnettest.Public]
	refusedFast(t, "egress -> private (before)", e.Path(), priv.TCP.Addr)
	reach(t, "egress -> public (before)", e.Path(), pub.TCP.Addr)

	f := Fences{Allow: []netip.Prefix{netip.PrefixFrom(priv.Addr, 32)}, Deny: []netip.Prefix{netip.PrefixFrom(pub.Addr, 28).Masked()}}
	if err := m.SetFences(f); err != nil {
		t.Fatalf("SetFences: %v", err)
	}
	reach(t, "egress -> allowed private", e.Path(), priv.TCP.Addr)
	udpEchoes(t, "egress -> allowed private UDP", e.Path(), priv.UDP)
	before := blocked(t, m)[ReasonOperatorDeny]
	refusedFast(t, "egress -> denied public", e.Path(), pub.TCP.Addr)
	if got := blocked(t, m)[ReasonOperatorDeny]; got != before+1 {
		t.Errorf("operator_deny went from %d to %d, want +1", before, got)
	}
	reach(t, "egress -> public not denied", e.Path(), up.Hosts[sessnettest.Public2].TCP.Addr)
	// Allow comes first, even against Deny; and opens nothing of the host.
	gw := serve(t, "", e.Gateway())
	if err := m.SetFences(Fences{Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, Deny: f.Deny}); err != nil {
		t.Fatalf("SetFences: %v", err)
	}
	reach(t, "egress -> public both allowed and denied", e.Path(), pub.TCP.Addr)
	unreachable(t, "egress -> its gateway, all allowed", e.Path(), gw.Addr)

	if err := m.SetFences(Fences{}); err != nil {
		t.Fatalf("SetFences: %v", err)
	}
	refusedFast(t, "egress -> private (after)", e.Path(), priv.TCP.Addr)
	reach(t, "egress -> public (after)", e.Path(), pub.TCP.Addr)

	for _, bad := range []struct {
		f    Fences
		want string
	}{
		{Fences{Allow: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}}, "IPv4-mapped"},
		{Fences{Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.7/24")}}, "host bits"},
		{Fences{Deny: []netip.Prefix{{}}}, "Fences.Deny[0]"},
	} {
		err := m.SetFences(bad.f)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("SetFences(%v) = %v, want an error saying %q", bad.f, err, bad.want)
		}
		if _, err := New(Config{Dir: t.TempDir(), Fences: bad.f}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("New with Fences %v = %v, want an error saying %q", bad.f, err, bad.want)
		}
	}
	reach(t, "egress -> public (after refused SetFences)", e.Path(), pub.TCP.Addr)
}

// TestFencesDomainFilter: with DomainFilter, a public host is refused until
// AllowAddrs lets it through, and again once its time runs out.
func TestFencesDomainFilter(t *testing.T) {
	t.Parallel()
	m, up, _ := newFenceManager(t, Fences{})
	e := setup(t, m, "sb-egr", sandbox.NetworkEgress)
	pub := up.Hosts[sessnettest.Public]
	if err := m.SetFences(Fences{DomainFilter: true, Allow: []netip.Prefix{netip.PrefixFrom(up.Hosts[sessnettest.Public2].Addr, 32)}}); err != nil {
		t.Fatalf("SetFences: %v", err)
	}
	before := blocked(t, m)[ReasonNotAllowedDomain]
	refusedFast(t, "egress -> public, not allowed", e.Path(), pub.TCP.Addr)
	if got := blocked(t, m)[ReasonNotAllowedDomain]; got != before+1 {
		t.Errorf("not_allowed_domain went from %d to %d, want +1", before, got)
	}
	reach(t, "egress -> public in Allow", e.Path(), up.Hosts[sessnettest.Public2].TCP.Addr)
	refusedFast(t, "egress -> private, even allowed as a domain", e.Path(), up.Hosts[sessnettest.Private10].TCP.Addr)

	const ttl = 2 * time.Second
	if err := m.AllowAddrs([]netip.Addr{pub.Addr, up.Hosts[sessnettest.Private10].Addr, netip.MustParseAddr("2001:db8::1")}, ttl); err != nil {
		t.Fatalf("AllowAddrs: %v", err)
	}
	added := time.Now()
	reach(t, "egress -> public, allowed", e.Path(), pub.TCP.Addr)
	refusedFast(t, "egress -> private, allowed as a domain: the built-in fences come first", e.Path(), up.Hosts[sessnettest.Private10].TCP.Addr)
	// A connection made now outlives the address's time.
	var c net.Conn
	if err := inNS(t, e.Path(), func() error {
		var err error
		c, err = net.Dial("udp4", pub.UDP.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("echo-1"))
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 16)); err != nil {
		t.Fatalf("UDP to the allowed public host: %v", err)
	}
	time.Sleep(time.Until(added.Add(ttl + 500*time.Millisecond)))
	refusedFast(t, "egress -> public, after its time", e.Path(), pub.TCP.Addr)
	_, _ = c.Write([]byte("echo-2"))
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 16)); err != nil {
		t.Errorf("UDP on the connection made while allowed, after the address's time: %v", err)
	}

	// Refreshing: adding again restarts the time.
	if err := m.AllowAddrs([]netip.Addr{pub.Addr}, ttl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl * 3 / 4)
	if err := m.AllowAddrs([]netip.Addr{pub.Addr}, ttl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl * 3 / 4)
	reach(t, "egress -> public, refreshed", e.Path(), pub.TCP.Addr)

	for _, bad := range []struct {
		addrs []netip.Addr
		ttl   time.Duration
	}{{[]netip.Addr{pub.Addr}, 0}, {[]netip.Addr{{}}, time.Second}} {
		if err := m.AllowAddrs(bad.addrs, bad.ttl); err == nil {
			t.Errorf("AllowAddrs(%v, %v) succeeded", bad.addrs, bad.ttl)
		}
	}
}

// TestFencesResolver: with ResolverPort, DNS to the gateway reaches the
// resolver's port there, and nothing else of the host opens.
func TestFencesResolver(t *testing.T) {
	t.Parallel()
	m, _, _ := newFenceManager(t, Fences{})
	gw := m.EgressGateway()
	if !m.egress.subnet.Contains(gw) || gw != m.egress.subnet.Addr().Next() {
		t.Fatalf("EgressGateway = %s, want the first host address of %s", gw, m.egress.subnet)
	}
	// The resolver binds before the bridge exists.
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	var pc net.PacketConn
	err := nsthread.Locked(func() (bool, error) {
		var err error
		pc, err = lc.ListenPacket(t.Context(), "udp4", netip.AddrPortFrom(gw, 0).String())
		return false, err
	})
	if err != nil {
		t.Fatalf("binding the resolver's port on %s before the bridge exists: %v", gw, err)
	}
	port := netip.MustParseAddrPort(pc.LocalAddr().String()).Port()
	startEcho(t, pc)
	if err := m.SetFences(Fences{ResolverPort: port}); err != nil {
		t.Fatal(err)
	}
	e := setup(t, m, "sb-egr", sandbox.NetworkEgress)
	if e.Gateway() != gw {
		t.Errorf("the session's gateway %s is not EgressGateway %s", e.Gateway(), gw)
	}
	udpEchoes(t, "egress -> gateway:53, to the resolver", e.Path(), netip.AddrPortFrom(gw, dnsPort))
	other := serve(t, "", gw)
	reach(t, "host -> gateway listener (control)", "", other.Addr)
	unreachable(t, "egress -> another port of the gateway", e.Path(), other.Addr)
	unreachable(t, "egress -> TCP 53 of the gateway (no TCP resolver here)", e.Path(), netip.AddrPortFrom(gw, dnsPort))
	if err := m.SetFences(Fences{}); err != nil {
		t.Fatal(err)
	}
	if got, err := udpRoundTrip(t, e.Path(), netip.AddrPortFrom(gw, dnsPort), blockTimeout); err == nil {
		t.Errorf("without ResolverPort, DNS to the gateway was answered: %q", got)
	}
}

// waitFor polls cond for a few seconds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Errorf("timed out waiting for %s", what)
}
