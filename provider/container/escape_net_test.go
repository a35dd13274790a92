package container_test

import (
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// refuseWithin is how fast a refused TCP connection must fail, measured
// inside the session by the probe: the fences answer the SYN with a reset.
const refuseWithin = 100 * time.Millisecond

// probeTook is the took= the probe measured for its attempt.
func probeTook(r probeResult) (time.Duration, bool) {
	for f := range strings.FieldsSeq(r.Detail) {
		if v, ok := strings.CutPrefix(f, "took="); ok {
			d, err := time.ParseDuration(v)
			return d, err == nil
		}
	}
	return 0, false
}

// refusedFast checks, from sess, that a TCP connection to to is refused
// (ECONNREFUSED: a reset) within refuseWithin as the probe measures it. A
// machine under load (other tests' containers) can delay one answer past
// it: a slow refusal is tried once more, and that one must be quick.
func refusedFast(t testing.TB, sess sandbox.Session, what string, to netip.AddrPort) {
	t.Helper()
	for try := 1; ; try++ {
		r := probeAsync(sess, "dial", to.String())
		d, ok := probeTook(r)
		switch {
		case strings.HasPrefix(r.Err, "exec: "):
			t.Errorf("%s (%s): %s", what, to, r.Err)
		case r.OK:
			t.Errorf("%s (%s) is reachable: %s; it must be refused", what, to, r.Detail)
		case r.Err != "ECONNREFUSED":
			t.Errorf("%s (%s): %s (%s), want ECONNREFUSED (a reset)", what, to, r.Err, r.Detail)
		case !ok:
			t.Errorf("%s (%s): the probe measured no time: %q", what, to, r.Detail)
		case d > refuseWithin && try == 1:
			t.Logf("%s (%s): refused in %v, slower than %v: trying again", what, to, d, refuseWithin)
			continue
		case d > refuseWithin:
			t.Errorf("%s (%s): refused in %v twice over %v", what, to, d, refuseWithin)
		default:
			t.Logf("%s (%s): refused in %v", what, to, d)
		}
		return
	}
}

// notReached checks that the probe's attempt (args) from sess got
// nowhere: not ok, and the probe ran.
func notReached(t testing.TB, sess sandbox.Session, what string, args ...string) probeResult {
	t.Helper()
	r := probeAsync(sess, args...)
	switch {
	case strings.HasPrefix(r.Err, "exec: "):
		t.Errorf("%s: %s", what, r.Err)
	case r.OK:
		t.Errorf("%s: escapeprobe %q got through: %s", what, args, r.Detail)
	}
	return r
}

// reached checks that the probe's attempt (args) from sess got through.
func reached(t testing.TB, sess sandbox.Session, what string, args ...string) probeResult {
	t.Helper()
	r := probeAsync(sess, args...)
	if !r.OK {
		t.Errorf("%s: escapeprobe %q failed: %s (%s)", what, args, r.Err, r.Detail)
	}
	return r
}

// refusedHosts are the upstream's test hosts no egress session reaches.
var refusedHosts = []string{sessnettest.Private10, sessnettest.Private172, sessnettest.Private192, sessnettest.Shared, sessnettest.Metadata}

// publicHosts are those egress sessions reach.
var publicHosts = []string{sessnettest.Public, sessnettest.Public2}

// TestEscapeNetwork: no tier reaches a service of the host (its loopback,
// the bridges' addresses, its address facing the upstream). Egress reaches
// the public-looking test hosts behind the upstream's router (TCP, UDP,
// ICMP echo), masqueraded to the host's address, and none of the private,
// shared and link-local ones nor the router (a host network): a TCP
// connection there is refused at once (a reset, within refuseWithin), UDP
// and ICMP get no answer from the host. An internal session that the test
// gives a default route (as root, in its namespace) gets no further: the
// host's forwarding drops it. A session cannot send ICMP itself (no raw
// socket, no ICMP datagram socket); the ICMP checks send from its network
// namespace, through the same fences.
func TestEscapeNetwork(t *testing.T) {
	containertest.Require(t)
	up := newUpstream(t)
	// The subtests share the upstream: what arrived there is checked
	// after all of them.
	var egressDials atomic.Int64
	t.Cleanup(func() {
		for _, name := range refusedHosts {
			if got := up.Hosts[name].TCP.Accepted(); len(got) > 0 {
				t.Errorf("the %s test host accepted connections from %v; no session may reach it", name, got)
			}
		}
		want := int(egressDials.Load())
		for _, name := range publicHosts {
			got := up.Hosts[name].TCP.WaitAccepted(want, 5*time.Second)
			if len(got) != want {
				t.Errorf("the %s test host accepted %d connections, want %d, one per egress session: %v", name, len(got), want, got)
			}
			for _, from := range got {
				if from != up.HostAddr {
					t.Errorf("the %s test host saw a connection from %s, want the host's %s (masquerade)", name, from, up.HostAddr)
				}
			}
		}
	})
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		// Most of the time here is waiting for dropped dials to time out:
		// the runtimes and modes wait together.
		t.Parallel()
		const routed = "internal, with a default route"
		type session struct {
			kind string
			sess sandbox.Session
		}
		var sessions []session
		for _, kind := range []string{string(sandbox.NetworkNone), string(sandbox.NetworkInternal), routed} {
			tier := sandbox.Network(kind)
			if kind == routed {
				tier = sandbox.NetworkInternal
			}
			sessions = append(sessions, session{kind, p.session(t, spec(containertest.Busybox, tier))})
		}
		for _, image := range images {
			sessions = append(sessions, session{"egress, " + imageName(image), p.session(t, spec(image, sandbox.NetworkEgress))})
		}
		for _, s := range sessions {
			installProbe(t, s.sess)
		}
		addDefaultRoute(t, sessionNetNS(t, sessions[2].sess.ID()), bridgeAddr(t, sandbox.NetworkInternal))
		hostServers := map[string]*sessnettest.Server{
			"the host's loopback":             listenHost(t, netip.MustParseAddr("127.0.0.1")),
			"the internal bridge (a gateway)": listenHost(t, bridgeAddr(t, sandbox.NetworkInternal)),
			"the egress bridge (a gateway)":   listenHost(t, bridgeAddr(t, sandbox.NetworkEgress)),
			"the host's address facing out":   listenHost(t, up.HostAddr),
		}
		for what, s := range hostServers {
			if _, err := sessnettest.Dial(s.Addr, 5*time.Second); err != nil {
				t.Fatalf("control: the host cannot reach its own listener on %s (%s): %v", s.Addr, what, err)
			}
		}
		router := sessnettest.Serve(t, up.Listen(t, "tcp4", netip.AddrPortFrom(up.RouterAddr, 0)))

		var wg sync.WaitGroup
		for _, s := range sessions {
			egress := strings.HasPrefix(s.kind, "egress")
			wg.Go(func() {
				// Dropped: each attempt waits out its timeout.
				var hosts sync.WaitGroup
				defer hosts.Wait()
				for what, srv := range hostServers {
					hosts.Go(func() { notReached(t, s.sess, s.kind+" -> "+what, "dial", srv.Addr.String()) })
				}
				if !egress {
					for name, h := range up.Hosts {
						hosts.Go(func() {
							notReached(t, s.sess, s.kind+" -> "+name+" TCP", "dial", h.TCP.Addr.String())
							notReached(t, s.sess, s.kind+" -> "+name+" UDP", "udp", h.UDP.String())
						})
					}
					return
				}
				egressDials.Add(1) // one TCP connection to each public host
				for _, name := range publicHosts {
					h := up.Hosts[name]
					reached(t, s.sess, s.kind+" -> "+name+" TCP", "dial", h.TCP.Addr.String())
					reached(t, s.sess, s.kind+" -> "+name+" UDP", "udp", h.UDP.String())
				}
				for _, name := range refusedHosts {
					h := up.Hosts[name]
					refusedFast(t, s.sess, s.kind+" -> "+name+" TCP", h.TCP.Addr)
					// An ICMP error or silence: the kernel rate-limits the
					// errors it sends one address.
					notReached(t, s.sess, s.kind+" -> "+name+" UDP", "udp", h.UDP.String())
				}
				refusedFast(t, s.sess, s.kind+" -> the router (a host network)", router.Addr)
				if r := probeAsync(s.sess, "ping", up.Hosts[sessnettest.Public].Addr.String()); r.Err != "EACCES" {
					t.Errorf("%s: the session's own ICMP echo: %+v, want EACCES (no ICMP datagram socket: ping_group_range excludes it)", s.kind, r)
				}
			})
		}
		wg.Wait()
		// ICMP from the egress sessions' namespaces, through their fences.
		for _, s := range sessions {
			if !strings.HasPrefix(s.kind, "egress") {
				continue
			}
			ns := sessionNetNS(t, s.sess.ID())
			for _, name := range append(publicHosts, refusedHosts...) {
				replied, _, err := sessnettest.Ping(ns, up.Hosts[name].Addr, 3*time.Second)
				public := name == sessnettest.Public || name == sessnettest.Public2
				switch {
				case err != nil:
					t.Errorf("%s -> %s ICMP echo: %v", s.kind, name, err)
				case replied != public:
					t.Errorf("%s -> %s ICMP echo: replied %v, want %v", s.kind, name, replied, public)
				}
			}
		}
		// Nothing arrived at the host's listeners beyond the controls.
		for what, s := range hostServers {
			if got := s.Accepted(); len(got) != 1 {
				t.Errorf("the listener on %s (%s) accepted %v; only the host's control connection may arrive", s.Addr, what, got)
			}
		}
		if got := router.Accepted(); len(got) > 0 {
			t.Errorf("the router accepted connections from %v; no session may reach it", got)
		}
	})
}

// udpSink records the datagrams that reach it.
type udpSink struct {
	addr netip.AddrPort
	mu   sync.Mutex
	got  []string // "source payload"
}

// newUDPSink listens on addr (any port) behind the upstream's router
// until the end of t.
func newUDPSink(t testing.TB, up *sessnettest.Upstream, addr netip.Addr) *udpSink {
	t.Helper()
	pc := up.ListenPacket(t, "udp4", netip.AddrPortFrom(addr, 0))
	s := &udpSink{addr: netip.MustParseAddrPort(pc.LocalAddr().String())}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got = append(s.got, from.String()+" "+string(buf[:n]))
			s.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		pc.Close()
		wg.Wait()
	})
	return s
}

func (s *udpSink) arrived() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// TestEscapeFences: an egress session cannot lift or go around its
// fences: nftables answers it nothing (EPERM over NETLINK_NETFILTER: the
// host's table is neither listed nor deleted), it cannot change its
// routes, addresses or policy rules (no CAP_NET_ADMIN over its network
// namespace), /proc/sys/net is read-only, and it cannot send from a
// source address not its own (IP_FREEBIND sends nothing beyond the host;
// IP_TRANSPARENT is refused).
func TestEscapeFences(t *testing.T) {
	containertest.Require(t)
	up := newUpstream(t)
	forEachSetup(t, func(t *testing.T, p *testProvider, image string) {
		sess := p.session(t, spec(image, sandbox.NetworkEgress))
		installProbe(t, sess)
		table := netPrefix(t)
		if table == "" {
			t.Fatal("the shared network manager has no bridge after an egress session's create")
		}
		r := probe(t, sess, "nft", table)
		items := r.items()
		if items["list"] != "EPERM" || items["delete"] != "EPERM" {
			t.Errorf("nftables over netlink from the session: %+v, want list=EPERM delete=EPERM", r)
		}
		if strings.Contains(r.Detail, "tables=") && strings.Contains(r.Detail, table) {
			t.Errorf("the session sees the host's nftables table %s: %s", table, r.Detail)
		}
		if out, err := exec.Command("nft", "list", "table", "inet", table).CombinedOutput(); err != nil {
			t.Errorf("the host's table inet %s after the session's attempts: %v\n%s", table, err, out)
		}

		r = probe(t, sess, "routing")
		for k, v := range r.items() {
			if v != "EPERM" {
				t.Errorf("routing from the session: %s=%s, want EPERM (%s)", k, v, r.Detail)
			}
		}
		for _, path := range []string{"/proc/sys/net/ipv4/conf/all/rp_filter", "/proc/sys/net/ipv4/ping_group_range", "/proc/sys/net/ipv4/conf/eth0/forwarding"} {
			if r := probe(t, sess, "write", path); r.OK || r.Err != "EROFS" {
				t.Errorf("write %s: %+v, want EROFS (a read-only /proc/sys)", path, r)
			}
		}

		// Spoofed sources: a public address, and another address of the
		// egress subnet (a neighbour's). Control first: the session's own
		// datagram arrives, from the host's address (masquerade).
		sink := newUDPSink(t, up, up.Hosts[sessnettest.Public].Addr)
		probe(t, sess, "udp", sink.addr.String()) // no echo: the sink only records
		if got := sink.arrived(); len(got) == 0 || !strings.HasPrefix(got[0], up.HostAddr.String()+":") {
			t.Fatalf("control: the session's datagram to %s arrived as %v, want from the host's %s", sink.addr, got, up.HostAddr)
		}
		neighbour := sessionIPv4(t, sess).Next()
		for _, src := range []netip.Addr{up.Hosts[sessnettest.Public2].Addr, neighbour} {
			before := len(sink.arrived())
			r := probe(t, sess, "spoof", src.String()+">"+sink.addr.String())
			if v := r.items()["transparent"]; v != "EPERM" {
				t.Errorf("spoofing %s with IP_TRANSPARENT: %s, want EPERM (%s)", src, v, r.Detail)
			}
			time.Sleep(300 * time.Millisecond)
			if got := sink.arrived()[before:]; len(got) > 0 {
				t.Errorf("a datagram spoofed from %s arrived: %v (%s)", src, got, r.Detail)
			}
			t.Logf("spoofing %s: %s", src, r.Detail)
		}
	})
}

// sessionIPv4 is the IPv4 address of sess's eth0, as the host reads it.
func sessionIPv4(t testing.TB, sess sandbox.Session) netip.Addr {
	t.Helper()
	h := sessnettest.Handle(t, sessionNetNS(t, sess.ID()))
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("the session's eth0: %v", err)
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("the session's eth0 has no IPv4 address (%v)", err)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP)
	return a.Unmap()
}
