package sessnettest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/nsthread"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The test hosts of an Upstream, by name, and the ranges their addresses
// come from.
const (
	Public     = "public"     // 203.0.113.0/24 (TEST-NET-3)
	Public2    = "public2"    // 198.51.100.0/24 (TEST-NET-2)
	Private10  = "private10"  // 10/8 (10.200.0.0/13, away from the tests' session subnets)
	Private172 = "private172" // 172.16/12
	Private192 = "private192" // 192.168/16
	Shared     = "shared"     // 100.64/10
	Metadata   = "metadata"   // 169.254.169.254, a cloud's metadata service
)

// hostRanges are where the test hosts but Metadata take an address.
var hostRanges = map[string]string{
	Public: "203.0.113.0/24", Public2: "198.51.100.0/24", Private10: "10.200.0.0/13",
	Private172: "172.16.0.0/12", Private192: "192.168.0.0/16", Shared: "100.64.0.0/10",
}

// Host is one test host behind an Upstream's router: an address on the
// router's loopback, with a Server and a UDP echo server on it.
type Host struct {
	Addr netip.Addr
	TCP  *Server
	UDP  netip.AddrPort
}

// Upstream is the internet as the host reaches it: a router namespace
// joined to the host by a veth pair (addresses from a free /24 of
// 198.18.0.0/15, so that link's subnet is one of the host's own networks,
// which the egress fences refuse: the router's address is a host network),
// with the test hosts behind it. The host routes to the test hosts only
// traffic from the egress subnets given to NewUpstream and RouteFrom,
// through policy-routing rules to a routing table of the Upstream's own:
// the main table gains nothing but the veth's prefix route, so no real
// traffic (to a metadata service, say) is ever captured.
type Upstream struct {
	HostAddr   netip.Addr // the host's side of the link
	RouterAddr netip.Addr // the router's side: reachable from the host itself
	HostLink   string     // the host's end of the veth
	NS         *os.File   // the router's network namespace
	// Router is a rtnetlink handle in NS.
	Router *netlink.Handle
	// Hosts are the test hosts, by the names above.
	Hosts map[string]Host
	// Table is the routing table the rules point to.
	Table int
}

// NewUpstream makes an Upstream whose test hosts the sessions of egress (a
// session subnet) reach through the host; its links are named from
// prefix (at most 13 bytes). All of it is removed at the end of t.
func NewUpstream(t testing.TB, prefix string, egress netip.Prefix) *Upstream {
	t.Helper()
	link := FreePrefixes(t, netip.MustParsePrefix("198.18.0.0/15"), 24, 1)[0]
	u := &Upstream{HostAddr: link.Addr().Next(), HostLink: "u" + prefix, Hosts: map[string]Host{}}
	u.RouterAddr = u.HostAddr.Next()
	addrs := map[string]netip.Addr{Metadata: netip.MustParseAddr("169.254.169.254")}
	for name, within := range hostRanges {
		addrs[name] = FreePrefixes(t, netip.MustParsePrefix(within), 28, 1)[0].Addr().Next()
	}
	u.NS = NewNetNS(t)
	u.Router = Handle(t, u.NS)
	la := netlink.NewLinkAttrs()
	la.Name = u.HostLink
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(u.NS.Fd())}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("the upstream's veth %s: %v", u.HostLink, err)
	}
	t.Cleanup(func() {
		if err := netlink.LinkDel(veth); err != nil {
			t.Errorf("deleting the upstream's veth %s: %v", u.HostLink, err)
		}
	})
	if err := netlink.LinkSetIP6AddrGenMode(veth, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: IPNet(netip.PrefixFrom(u.HostAddr, 24))}); err != nil {
		t.Fatalf("the host's address on the upstream's veth: %v", err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	eth0, err := u.Router.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Router.AddrAdd(eth0, &netlink.Addr{IPNet: IPNet(netip.PrefixFrom(u.RouterAddr, 24))}); err != nil {
		t.Fatal(err)
	}
	if err := u.Router.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	lo, err := u.Router.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if err := u.Router.AddrAdd(lo, &netlink.Addr{IPNet: IPNet(netip.PrefixFrom(a, 32))}); err != nil {
			t.Fatalf("giving the router %s: %v", a, err)
		}
	}

	// The host's way there, in a table of the Upstream's own; only the
	// rules of RouteFrom lead to it. The routes go when the veth does.
	u.Table = 0x5a000000 + rand.IntN(1<<20)
	hostLink, err := netlink.LinkByName(u.HostLink)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		r := &netlink.Route{Dst: IPNet(netip.PrefixFrom(a, 32)), Gw: u.RouterAddr.AsSlice(), LinkIndex: hostLink.Attrs().Index, Table: u.Table}
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatalf("adding the route to %s in table %d: %v", a, u.Table, err)
		}
	}
	u.RouteFrom(t, egress)

	for name, a := range addrs {
		u.Hosts[name] = u.serveHost(t, a)
	}
	// Control: the router answers the host on the link.
	srv := Serve(t, u.Listen(t, "tcp4", netip.AddrPortFrom(u.RouterAddr, 0)))
	if from, err := Dial(srv.Addr, 5*time.Second); err != nil || from != u.HostAddr {
		t.Fatalf("the host cannot reach its upstream's router at %s: %v (seen from %s)", srv.Addr, err, from)
	}
	return u
}

// AddHost makes one more test host behind the router, at addr (IPv4):
// an address on the router's loopback, the host's route to it in the
// Upstream's table (so only the sessions' traffic goes there), and a TCP
// and a UDP echo server on it. For fixed addresses, as the edges of a
// fenced range: the caller sees that no route of the host's own covers
// addr, or accepts that one does.
func (u *Upstream) AddHost(t testing.TB, addr netip.Addr) Host {
	t.Helper()
	lo, err := u.Router.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Router.AddrAdd(lo, &netlink.Addr{IPNet: IPNet(netip.PrefixFrom(addr, 32))}); err != nil {
		t.Fatalf("giving the router %s: %v", addr, err)
	}
	hostLink, err := netlink.LinkByName(u.HostLink)
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{Dst: IPNet(netip.PrefixFrom(addr, 32)), Gw: u.RouterAddr.AsSlice(), LinkIndex: hostLink.Attrs().Index, Table: u.Table}
	if err := netlink.RouteAdd(r); err != nil {
		t.Fatalf("adding the route to %s in table %d: %v", addr, u.Table, err)
	}
	return u.serveHost(t, addr)
}

func (u *Upstream) serveHost(t testing.TB, a netip.Addr) Host {
	t.Helper()
	h := Host{Addr: a}
	h.TCP = Serve(t, u.Listen(t, "tcp4", netip.AddrPortFrom(a, 0)))
	h.UDP = Echo(t, u.ListenPacket(t, "udp4", netip.AddrPortFrom(a, 0)))
	return h
}

// RouteFrom routes traffic from src (a session subnet) to the test hosts,
// through a policy-routing rule removed at the end of t.
func (u *Upstream) RouteFrom(t testing.TB, src netip.Prefix) {
	t.Helper()
	rule := netlink.NewRule()
	rule.Src = IPNet(src)
	rule.Table = u.Table
	rule.Priority = 100
	if err := netlink.RuleAdd(rule); err != nil {
		t.Fatalf("adding the rule from %s to table %d: %v", src, u.Table, err)
	}
	t.Cleanup(func() {
		if err := netlink.RuleDel(rule); err != nil {
			t.Errorf("deleting the rule from %s to table %d: %v", src, u.Table, err)
		}
	})
}

// Listen listens on addr in the router's namespace; the listener is
// closed at the end of t.
func (u *Upstream) Listen(t testing.TB, network string, addr netip.AddrPort) net.Listener {
	t.Helper()
	var ln net.Listener
	err := nsthread.InNetNS(u.NS, func() error {
		var err error
		ln, err = net.Listen(network, addr.String())
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s %s behind the router: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ListenPacket is Listen for a datagram socket.
func (u *Upstream) ListenPacket(t testing.TB, network string, addr netip.AddrPort) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	err := nsthread.InNetNS(u.NS, func() error {
		var err error
		pc, err = net.ListenPacket(network, addr.String())
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s %s behind the router: %v", network, addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

// Ping sends one ICMP echo request from the network namespace ns to dst on
// a raw socket and reports whether the echo reply came within wait, and
// whether an ICMP destination-unreachable error quoting the request came
// instead. It errs when the socket cannot be made or the request sent.
func Ping(ns *os.File, dst netip.Addr, wait time.Duration) (replied, unreachable bool, err error) {
	var fd int
	err = nsthread.InNetNS(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	})
	if err != nil {
		return false, false, fmt.Errorf("a raw ICMP socket: %w", err)
	}
	defer unix.Close(fd)
	id := uint16(rand.Uint32())
	req := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 't', 'a', 'i', '4', '2'}
	sum := ICMPChecksum(req)
	req[2], req[3] = byte(sum>>8), byte(sum)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
		return false, false, fmt.Errorf("sending an echo request to %s: %w", dst, err)
	}
	deadline := time.Now().Add(wait)
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false, false, nil
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return false, false, fmt.Errorf("reading ICMP: %w", err)
		}
		p := buf[:n]
		if len(p) < 20 || len(p) < int(p[0]&0x0f)*4+8 {
			continue
		}
		icmp := p[int(p[0]&0x0f)*4:]
		switch icmp[0] {
		case 0: // echo reply
			if uint16(icmp[4])<<8|uint16(icmp[5]) == id {
				return true, false, nil
			}
		case 3: // destination unreachable, quoting our request
			if q := icmp[8:]; len(q) >= 28 && netip.AddrFrom4([4]byte(q[16:20])) == dst {
				quoted := q[int(q[0]&0x0f)*4:]
				if len(quoted) >= 6 && uint16(quoted[4])<<8|uint16(quoted[5]) == id {
					return false, true, nil
				}
			}
		}
	}
}

// ICMPChecksum is the Internet checksum of b.
func ICMPChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
