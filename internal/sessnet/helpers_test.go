package sessnet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/netns"
	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	sandbox "github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
)

func TestMain(m *testing.M) {
	// 10.255.255.0/24 holds a fence edge TestFencesEdgesOnTheWire dials
	// (10.255.255.255): no session subnet may take it.
	sessnettest.Reserve(DefaultInternalSubnet, DefaultEgressSubnet, netip.MustParsePrefix("10.255.255.0/24"))
	goleak.VerifyTestMain(m)
}

// requireRoot skips t when this machine cannot make namespaces, links and
// nftables tables, saying why.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces, links and nftables tables")
	}
}

// freePrefixes picks n distinct /bits prefixes inside within that overlap
// no route of the host and none picked before by this process (see
// sessnettest.FreePrefixes; TestMain reserves the default subnets).
func freePrefixes(t testing.TB, within netip.Prefix, bits, n int) []netip.Prefix {
	t.Helper()
	return sessnettest.FreePrefixes(t, within, bits, n)
}

// testPrefix is a name prefix no daemon and no other test uses.
func testPrefix() string {
	return fmt.Sprintf("q%05x", rand.IntN(1<<20))
}

// newTestManager makes a Manager with a unique prefix, free subnets (/24s
// in 10.224.0.0/11) and a temporary Dir, closed at the end of the test;
// when Close leaves anything, the test fails and a fresh Manager sweeps it.
func newTestManager(t testing.TB) *Manager {
	t.Helper()
	requireRoot(t)
	subnets := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 24, 2)
	return newManagerWith(t, Config{Dir: t.TempDir(), Prefix: testPrefix(), InternalSubnet: subnets[0], EgressSubnet: subnets[1]})
}

func newManagerWith(t testing.TB, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		left, err := m.Leftovers()
		if err != nil {
			t.Errorf("Leftovers: %v", err)
		}
		if len(left) > 0 {
			t.Errorf("left after Close: %v", left)
			if m2, err := New(cfg); err == nil { // sweep it
				m2.Close()
			}
		}
	})
	return m
}

func setup(t testing.TB, m *Manager, id string, tier sandbox.Network) *Net {
	t.Helper()
	n, err := m.Setup(context.Background(), id, tier)
	if err != nil {
		t.Fatalf("Setup(%s, %s): %v", id, tier, err)
	}
	t.Cleanup(func() {
		if err := m.Teardown(n); err != nil {
			t.Errorf("Teardown(%s): %v", id, err)
		}
	})
	return n
}

// inNS runs fn on a thread inside the network namespace at path (a file),
// then returns the thread to the host's namespace; sockets fn creates
// belong to that namespace for life. A thread that cannot return is never
// reused.
func inNS(t testing.TB, path string, fn func() error) error {
	t.Helper()
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening namespace %s: %w", path, err)
	}
	defer ns.Close()
	return inNSFile(ns, fn)
}

func inNSFile(ns *os.File, fn func() error) error { return nsthread.InNetNS(ns, fn) }

// serve starts a server listening on addr (port 0: any), in the namespace
// at nsPath, or the host's when nsPath is "". Stopped at the end of t.
func serve(t testing.TB, nsPath string, addr netip.Addr) *sessnettest.Server {
	t.Helper()
	var ln net.Listener
	listen := func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(addr, 0).String())
		return err
	}
	var err error
	if nsPath == "" {
		err = listen()
	} else {
		err = inNS(t, nsPath, listen)
	}
	if err != nil {
		t.Fatalf("listening on %s (namespace %q): %v", addr, nsPath, err)
	}
	return sessnettest.Serve(t, ln)
}

// dial connects to to from the namespace at nsPath ("" for the host's) and
// returns the source address the server saw.
func dial(t testing.TB, nsPath string, to netip.AddrPort, timeout time.Duration) (from netip.Addr, err error) {
	t.Helper()
	connect := func() error {
		from, err = sessnettest.Dial(to, timeout)
		return err
	}
	if nsPath == "" {
		return from, connect()
	}
	if nerr := inNS(t, nsPath, connect); nerr != nil && err == nil {
		return from, nerr
	}
	return from, err
}

// reach checks that a connection from nsPath to to gets through; it returns
// the source address the server saw.
func reach(t testing.TB, what, nsPath string, to netip.AddrPort) netip.Addr {
	t.Helper()
	from, err := dial(t, nsPath, to, 5*time.Second)
	if err != nil {
		t.Errorf("%s: %s should be reachable: %v", what, to, err)
	}
	return from
}

// blockTimeout is how long a connection attempt that should fail may wait
// for an answer: dropped packets are only noticed by waiting. Connections
// that get through here take well under a millisecond.
const blockTimeout = 400 * time.Millisecond

// unreachable checks that a connection from nsPath to to fails.
func unreachable(t testing.TB, what, nsPath string, to netip.AddrPort) {
	t.Helper()
	from, err := dial(t, nsPath, to, blockTimeout)
	if err == nil {
		t.Errorf("%s: %s is reachable (the server saw %s); it must not be", what, to, from)
		return
	}
	t.Logf("%s: %s unreachable as it should be: %v", what, to, err)
}

// outside is a test host standing for the internet: a network namespace
// joined to the host by a veth pair with addresses from 198.18.0.0/15 (the
// benchmarking range), a TCP server inside it. Packets reach it through the
// host's own routing table (the veth's prefix route), as the internet would.
type outside struct {
	hostAddr netip.Addr // the host's side of the veth
	addr     netip.Addr // the outside host's own address
	srv      *sessnettest.Server
	hostLink string
	ns       *netns.NS
}

func newOutside(t testing.TB, prefix string) *outside {
	t.Helper()
	p := freePrefixes(t, netip.MustParsePrefix("198.18.0.0/15"), 24, 1)[0]
	o := &outside{hostAddr: p.Addr().Next(), hostLink: "o" + prefix}
	o.addr = o.hostAddr.Next()
	ns, err := netns.New(nsOptions)
	if err != nil {
		t.Fatalf("outside namespace: %v", err)
	}
	t.Cleanup(ns.Close)
	o.ns = ns
	la := netlink.NewLinkAttrs()
	la.Name = o.hostLink
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns.File().Fd())}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("outside veth: %v", err)
	}
	t.Cleanup(func() {
		if err := netlink.LinkDel(veth); err != nil {
			t.Errorf("deleting the outside veth %s: %v", o.hostLink, err)
		}
	})
	if err := netlink.LinkSetIP6AddrGenMode(veth, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: &net.IPNet{IP: o.hostAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	eth0, err := ns.Netlink().LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Netlink().AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: o.addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := ns.Netlink().LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	err = inNSFile(ns.File(), func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(o.addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("outside server: %v", err)
	}
	o.srv = sessnettest.Serve(t, ln)
	// Control: the host itself reaches the outside host.
	if _, err := dial(t, "", o.srv.Addr, 5*time.Second); err != nil {
		t.Fatalf("the host cannot reach its own outside test host: %v", err)
	}
	return o
}

// addRoute adds a route to dst via gw in the namespace at path.
func addRoute(t testing.TB, path string, dst netip.Prefix, gw netip.Addr) {
	t.Helper()
	err := inNS(t, path, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		return h.RouteAdd(&netlink.Route{
			Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)},
			Gw:  gw.AsSlice(),
		})
	})
	if err != nil {
		t.Fatalf("adding a route to %s via %s in %s: %v", dst, gw, path, err)
	}
}

// udpSink is a UDP socket that records the probes it gets: it detects
// traffic that gets through one way only, which a TCP connection cannot (a
// dropped answer fails it just like a dropped request). Each probe carries
// a token of its own, so that late copies of one probe never count for
// another.
type udpSink struct {
	addr netip.AddrPort
	mu   sync.Mutex
	got  map[string]netip.Addr // token -> where it came from
}

// newUDPSink listens on addr in the namespace at nsPath ("" for the host's)
// until the end of t.
func newUDPSink(t testing.TB, nsPath string, addr netip.Addr) *udpSink {
	t.Helper()
	var pc net.PacketConn
	listen := func() error {
		var err error
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(addr, 0).String())
		return err
	}
	var err error
	if nsPath == "" {
		err = listen()
	} else {
		err = inNS(t, nsPath, listen)
	}
	if err != nil {
		t.Fatalf("UDP sink on %s: %v", addr, err)
	}
	s := &udpSink{addr: netip.MustParseAddrPort(pc.LocalAddr().String()), got: map[string]netip.Addr{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got[string(buf[:n])] = netip.MustParseAddrPort(from.String()).Addr()
			s.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		pc.Close()
		wg.Wait()
	})
	return s
}

func (s *udpSink) arrived(token string) (netip.Addr, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	from, ok := s.got[token]
	return from, ok
}

// sendUDP sends a few copies of a new probe from the namespace at nsPath
// ("" for the host's), from the address src (zero: the kernel's choice), to
// to, and returns its token. A sending error (no route) is returned too:
// the caller judges it.
func sendUDP(t testing.TB, nsPath string, src netip.Addr, to netip.AddrPort) (string, error) {
	t.Helper()
	token := fmt.Sprintf("probe-%016x", rand.Uint64())
	var c net.Conn
	open := func() error {
		d := net.Dialer{}
		if src.IsValid() {
			d.LocalAddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		}
		var err error
		c, err = d.Dial("udp4", to.String())
		return err
	}
	var err error
	if nsPath == "" {
		err = open()
	} else {
		err = inNS(t, nsPath, open)
	}
	if err != nil {
		return token, err
	}
	defer c.Close()
	for range 3 {
		if _, err := c.Write([]byte(token)); err != nil {
			return token, err
		}
	}
	return token, nil
}

// arrives checks that a probe from nsPath reaches sink (a control).
func arrives(t testing.TB, what, nsPath string, sink *udpSink) {
	t.Helper()
	token, err := sendUDP(t, nsPath, netip.Addr{}, sink.addr)
	if err != nil {
		t.Errorf("%s: sending: %v", what, err)
		return
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, ok := sink.arrived(token); ok {
			return
		}
	}
	t.Errorf("%s: nothing arrived at %s", what, sink.addr)
}

// nothingArrives checks that a probe from nsPath (from src, when valid)
// never reaches sink.
func nothingArrives(t testing.TB, what, nsPath string, src netip.Addr, sink *udpSink) {
	t.Helper()
	token, serr := sendUDP(t, nsPath, src, sink.addr)
	time.Sleep(blockTimeout)
	if from, ok := sink.arrived(token); ok {
		t.Errorf("%s: the probe arrived at %s (from %s); it must not", what, sink.addr, from)
		return
	}
	t.Logf("%s: nothing arrived at %s, as it should be (sending: %v)", what, sink.addr, serr)
}

// addAddr adds a to eth0 in the namespace at path, as a /32.
func addAddr(t testing.TB, path string, a netip.Addr) {
	t.Helper()
	err := inNS(t, path, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		return h.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	})
	if err != nil {
		t.Fatalf("adding %s in %s: %v", a, path, err)
	}
}

// ipv6Addrs lists the IPv6 addresses of the link named name in the
// namespace at path ("" for the host's).
func ipv6Addrs(t testing.TB, path, name string) []string {
	t.Helper()
	var out []string
	list := func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V6)
		for _, a := range addrs {
			out = append(out, a.IPNet.String())
		}
		return err
	}
	var err error
	if path == "" {
		err = nsthread.Locked(func() (bool, error) { return false, list() })
	} else {
		err = inNS(t, path, list)
	}
	if err != nil {
		t.Fatalf("IPv6 addresses of %s in %q: %v", name, path, err)
	}
	return out
}

// linksIn lists the links of the namespace at path as "name:up".
func linksIn(t testing.TB, path string) []string {
	t.Helper()
	var out []string
	err := inNS(t, path, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		links, err := listLinks(h)
		for _, l := range links {
			up := "down"
			if l.Attrs().Flags&net.FlagUp != 0 {
				up = "up"
			}
			out = append(out, l.Attrs().Name+":"+up)
		}
		return err
	})
	if err != nil {
		t.Fatalf("links of %s: %v", path, err)
	}
	return out
}

// routesIn lists the IPv4 routes of the main table of the namespace at
// path.
func routesIn(t testing.TB, path string) []netlink.Route {
	t.Helper()
	var out []netlink.Route
	err := inNS(t, path, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		out, err = nsthread.RetryDump(func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_V4) })
		return err
	})
	if err != nil {
		t.Fatalf("routes of %s: %v", path, err)
	}
	return out
}

// assertClean checks, independently of Leftovers, that nothing of m is on
// the machine: no file or mount under Dir, no link whose name starts with
// the prefix (whatever its shape), no nftables table of that name in any
// family, and that Leftovers agrees.
func assertClean(t testing.TB, m *Manager) {
	t.Helper()
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in Dir: %s", e.Name())
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(mi)) {
		if strings.Contains(line, m.dir) {
			t.Errorf("left mounted: %s", strings.TrimSpace(line))
		}
	}
	links, err := nsthread.RetryDump(netlink.LinkList)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, m.prefix) {
			t.Errorf("left link: %s", l.Attrs().Name)
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == m.prefix {
			t.Errorf("left nftables table: family %d %s", tb.Family, tb.Name)
		}
	}
	left, err := m.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("Leftovers: %v", left)
	}
}

// run runs a command for inspection and returns its output.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed: %v", name, err)
	}
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// newUpstream makes an upstream whose test hosts the sessions of egress
// (an egress subnet) reach through the host (see sessnettest.Upstream).
func newUpstream(t testing.TB, prefix string, egress netip.Prefix) *sessnettest.Upstream {
	t.Helper()
	return sessnettest.NewUpstream(t, prefix, egress)
}

// startEcho sends every datagram pc gets back to its sender, until the end
// of t; it returns pc's address.
func startEcho(t testing.TB, pc net.PacketConn) netip.AddrPort { return sessnettest.Echo(t, pc) }

// refusedFast checks that a TCP connection from nsPath to to is refused
// (a reset: ECONNREFUSED), not left to time out; it returns how long the
// dial took.
func refusedFast(t testing.TB, what, nsPath string, to netip.AddrPort) time.Duration {
	t.Helper()
	start := time.Now()
	_, err := dial(t, nsPath, to, 3*time.Second)
	took := time.Since(start)
	switch {
	case err == nil:
		t.Errorf("%s: %s is reachable; it must be refused", what, to)
	case !errors.Is(err, unix.ECONNREFUSED):
		t.Errorf("%s: %s failed with %v after %v, want a reset (connection refused)", what, to, err, took)
	default:
		t.Logf("%s: %s refused in %v", what, to, took)
	}
	return took
}

// udpRoundTrip sends a datagram from nsPath to to on a connected socket
// and returns the echo, or the error the next read got (ECONNREFUSED or
// EHOSTUNREACH when an ICMP error came back).
func udpRoundTrip(t testing.TB, nsPath string, to netip.AddrPort, wait time.Duration) (string, error) {
	t.Helper()
	var c net.Conn
	err := inNS(t, nsPath, func() error {
		var err error
		c, err = net.Dial("udp4", to.String())
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	token := fmt.Sprintf("echo-%016x", rand.Uint64())
	if _, err := c.Write([]byte(token)); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// udpEchoes checks that a datagram from nsPath to an echo server at to
// comes back.
func udpEchoes(t testing.TB, what, nsPath string, to netip.AddrPort) {
	t.Helper()
	got, err := udpRoundTrip(t, nsPath, to, 3*time.Second)
	if err != nil || !strings.HasPrefix(got, "echo-") {
		t.Errorf("%s: no echo from %s: %q, %v", what, to, got, err)
	}
}

// udpRefused checks that a datagram from nsPath to to is answered by an
// ICMP error (the connected socket's read fails with ECONNREFUSED or
// EHOSTUNREACH), not by silence.
func udpRefused(t testing.TB, what, nsPath string, to netip.AddrPort) {
	t.Helper()
	start := time.Now()
	got, err := udpRoundTrip(t, nsPath, to, 3*time.Second)
	switch {
	case err == nil:
		t.Errorf("%s: %s echoed %q; it must be refused", what, to, got)
	case !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.EHOSTUNREACH):
		t.Errorf("%s: %s: %v after %v, want an ICMP error (connection refused or host unreachable)", what, to, err, time.Since(start))
	default:
		t.Logf("%s: %s refused in %v: %v", what, to, time.Since(start), err)
	}
}

// ping sends one ICMP echo request from the namespace at nsPath to dst
// and reports whether the echo reply came within wait, and whether an
// ICMP destination-unreachable error came instead (see sessnettest.Ping).
func ping(t testing.TB, nsPath string, dst netip.Addr, wait time.Duration) (replied, unreachable bool) {
	t.Helper()
	ns, err := os.Open(nsPath)
	if err != nil {
		t.Fatalf("opening namespace %s: %v", nsPath, err)
	}
	defer ns.Close()
	replied, unreachable, err = sessnettest.Ping(ns, dst, wait)
	if err != nil {
		t.Fatalf("ping %s from %s: %v", dst, nsPath, err)
	}
	return replied, unreachable
}
