package sessnet

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"

	sandbox "github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
)

func TestNone(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	n := setup(t, m, "sb-none", sandbox.NetworkNone)
	if n.Path() != m.dir+"/sb-none" {
		t.Errorf("Path = %s, want %s/sb-none", n.Path(), m.dir)
	}
	if n.Addr().IsValid() {
		t.Errorf("Addr = %s, want none", n.Addr())
	}
	if got := linksIn(t, n.Path()); !slices.Equal(got, []string{"lo:up"}) {
		t.Errorf("links in a none namespace = %v, want only lo, up", got)
	}
	if routes := routesIn(t, n.Path()); len(routes) != 0 {
		t.Errorf("routes in a none namespace: %v", routes)
	}
	// The namespace's own loopback works...
	local := serve(t, n.Path(), netip.MustParseAddr("127.0.0.1"))
	if from := reach(t, "none -> its own loopback", n.Path(), local.Addr); from != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("own loopback: the server saw %s", from)
	}
	// ...the host's does not, though the host reaches it (the control).
	hostLo := serve(t, "", netip.MustParseAddr("127.0.0.1"))
	reach(t, "host -> host loopback (control)", "", hostLo.Addr)
	unreachable(t, "none -> host loopback", n.Path(), hostLo.Addr)
	// The namespace file is a mount of a network namespace.
	if left, _ := m.Leftovers(); !slices.Contains(left, "mount "+n.Path()) {
		t.Errorf("Leftovers while set up = %v, want the mount of %s", left, n.Path())
	}
	out := run(t, "nsenter", "--net="+n.Path(), "ip", "-o", "link")
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "lo:") {
		t.Errorf("nsenter --net=%s ip -o link:\n%s", n.Path(), out)
	}
	// none makes no bridge and no table.
	if err := m.Teardown(n); err != nil {
		t.Fatal(err)
	}
	assertClean(t, m)
}

func TestInternal(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	out := newOutside(t, m.prefix)
	a := setup(t, m, "sb-int-a", sandbox.NetworkInternal)
	b := setup(t, m, "sb-int-b", sandbox.NetworkInternal)
	for _, n := range []*Net{a, b} {
		if !m.internal.subnet.Contains(n.Addr()) || n.Addr() == n.Gateway() {
			t.Errorf("%s: address %s is not a session address of %s", n.ID(), n.Addr(), m.internal.subnet)
		}
	}
	if a.Addr() == b.Addr() {
		t.Fatalf("two sessions share the address %s", a.Addr())
	}
	// Only the subnet's route, no default route.
	routes := routesIn(t, a.Path())
	if len(routes) != 1 || routes[0].Dst == nil || routes[0].Dst.String() != m.internal.subnet.String() || routes[0].Gw != nil {
		t.Errorf("routes of an internal session = %v, want only %s on-link", routes, m.internal.subnet)
	}
	if got := linksIn(t, a.Path()); !slices.Equal(got, []string{"lo:up", "eth0:up"}) {
		t.Errorf("links of an internal session = %v", got)
	}
	// IPv4 only: no link-local IPv6 address on either end or the bridge to
	// reach or be reached by.
	if got := ipv6Addrs(t, a.Path(), "eth0"); len(got) != 0 {
		t.Errorf("IPv6 addresses on the session's eth0: %v", got)
	}
	if got := ipv6Addrs(t, a.Path(), "lo"); !slices.Equal(got, []string{"::1/128"}) {
		t.Errorf("IPv6 addresses on the session's lo: %v, want ::1", got)
	}
	if got := ipv6Addrs(t, "", m.internal.bridge); len(got) != 0 {
		t.Errorf("IPv6 addresses on the bridge: %v", got)
	}
	if got := ipv6Addrs(t, "", a.veth); len(got) != 0 {
		t.Errorf("IPv6 addresses on the session's host-side veth: %v", got)
	}

	// Internal sessions reach each other, both ways, with their own
	// addresses.
	srvA := serve(t, a.Path(), a.Addr())
	srvB := serve(t, b.Path(), b.Addr())
	if from := reach(t, "internal b -> internal a", b.Path(), srvA.Addr); from != b.Addr() {
		t.Errorf("a saw b's connection come from %s, want %s", from, b.Addr())
	}
	if from := reach(t, "internal a -> internal b", a.Path(), srvB.Addr); from != a.Addr() {
		t.Errorf("b saw a's connection come from %s, want %s", from, a.Addr())
	}

	// Nothing of the host: its loopback, the bridge address, another
	// address of the host (the outside link's host side); nor beyond.
	hostLo := serve(t, "", netip.MustParseAddr("127.0.0.1"))
	bridge := serve(t, "", a.Gateway())
	hostOther := serve(t, "", out.hostAddr)
	for _, s := range []*sessnettest.Server{hostLo, bridge, hostOther} {
		reach(t, "host -> its own listener (control)", "", s.Addr)
	}
	var wg sync.WaitGroup
	for what, to := range map[string]netip.AddrPort{
		"internal -> host loopback":        hostLo.Addr,
		"internal -> bridge address":       bridge.Addr,
		"internal -> another host address": hostOther.Addr,
		"internal -> outside host":         out.srv.Addr,
	} {
		wg.Go(func() { unreachable(t, what, a.Path(), to) })
	}
	wg.Wait()

	// A session that gives itself a default route via the bridge (one with
	// CAP_NET_ADMIN in its namespace could) still gets nowhere: the host
	// neither answers it nor forwards for it.
	rogue := setup(t, m, "sb-int-rogue", sandbox.NetworkInternal)
	addRoute(t, rogue.Path(), netip.MustParsePrefix("0.0.0.0/0"), rogue.Gateway())
	for what, to := range map[string]netip.AddrPort{
		"internal with a default route -> outside host":         out.srv.Addr,
		"internal with a default route -> another host address": hostOther.Addr,
	} {
		wg.Go(func() { unreachable(t, what, rogue.Path(), to) })
	}
	wg.Wait()
	// Not even one way: nothing it sends arrives outside, even where the
	// outside host could answer (it routes the internal subnet back to the
	// host), and nothing the outside host sends arrives in a session.
	addRoute(t, out.ns.FdPath(), m.internal.subnet, out.hostAddr)
	outSink := newUDPSink(t, out.ns.FdPath(), out.addr)
	arrives(t, "host -> outside UDP (control)", "", outSink)
	nothingArrives(t, "internal with a default route -> outside UDP", rogue.Path(), netip.Addr{}, outSink)
	intSink := newUDPSink(t, a.Path(), a.Addr())
	arrives(t, "internal -> internal UDP (control)", b.Path(), intSink)
	nothingArrives(t, "outside, routing to the internal subnet -> internal UDP", out.ns.FdPath(), netip.Addr{}, intSink)
}

func TestEgress(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	out := newOutside(t, m.prefix)
	e := setup(t, m, "sb-egr", sandbox.NetworkEgress)
	i := setup(t, m, "sb-int", sandbox.NetworkInternal)
	if !m.egress.subnet.Contains(e.Addr()) {
		t.Errorf("egress address %s is outside %s", e.Addr(), m.egress.subnet)
	}
	var hasDefault bool
	for _, r := range routesIn(t, e.Path()) {
		if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
			hasDefault = true
			if got, _ := netip.AddrFromSlice(r.Gw); got != e.Gateway() {
				t.Errorf("default route via %s, want %s", got, e.Gateway())
			}
		}
	}
	if !hasDefault {
		t.Error("an egress session has no default route")
	}
	fwd, err := readFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil || fwd != "1" {
		t.Errorf("net.ipv4.ip_forward = %q (%v) after an egress setup, want 1", fwd, err)
	}

	// Out, NATed: a public host beyond the host sees the host's address.
	// The outside host, on a network of the host's own, is fenced off.
	up := newUpstream(t, m.prefix, m.egress.subnet)
	if from := reach(t, "egress -> public", e.Path(), up.Hosts[sessnettest.Public].TCP.Addr); from != up.HostAddr {
		t.Errorf("the public host saw the connection come from %s, want the host's %s (masquerade)", from, up.HostAddr)
	}
	refusedFast(t, "egress -> outside, a host network", e.Path(), out.srv.Addr)

	hostLo := serve(t, "", netip.MustParseAddr("127.0.0.1"))
	gateway := serve(t, "", e.Gateway())
	intBridge := serve(t, "", i.Gateway())
	hostOther := serve(t, "", out.hostAddr)
	intSession := serve(t, i.Path(), i.Addr())
	egrSession := serve(t, e.Path(), e.Addr())
	for _, s := range []*sessnettest.Server{hostLo, gateway, intBridge, hostOther} {
		reach(t, "host -> its own listener (control)", "", s.Addr)
	}
	i2 := setup(t, m, "sb-int-2", sandbox.NetworkInternal)
	reach(t, "internal -> internal session (control)", i2.Path(), intSession.Addr)
	// Egress sessions share their bridge but do not reach each other: the
	// fences refuse their (private) subnet, and their ports are isolated.
	e2 := setup(t, m, "sb-egr-2", sandbox.NetworkEgress)
	unreachable(t, "egress -> egress session", e2.Path(), egrSession.Addr)
	for _, n := range []*Net{e, e2} {
		l, err := netlink.LinkByName(n.veth)
		if err != nil {
			t.Fatal(err)
		}
		pi, err := netlink.LinkGetProtinfo(l)
		if err != nil {
			t.Fatalf("bridge port flags of %s: %v", n.veth, err)
		}
		if !pi.Isolated {
			t.Errorf("the egress veth %s is not an isolated bridge port", n.veth)
		}
	}
	if l, err := netlink.LinkByName(i.veth); err != nil {
		t.Fatal(err)
	} else if pi, err := netlink.LinkGetProtinfo(l); err != nil || pi.Isolated {
		t.Errorf("the internal veth %s: isolated %v (%v), want not", i.veth, pi.Isolated, err)
	}
	var wg sync.WaitGroup
	for _, c := range []struct {
		what string
		from string
		to   netip.AddrPort
	}{
		{"egress -> host loopback", e.Path(), hostLo.Addr},
		{"egress -> its gateway (the egress bridge address)", e.Path(), gateway.Addr},
		{"egress -> the internal bridge address", e.Path(), intBridge.Addr},
		{"egress -> another host address", e.Path(), hostOther.Addr},
		{"egress -> an internal session", e.Path(), intSession.Addr},
		{"internal -> an egress session", i.Path(), egrSession.Addr},
		{"internal -> outside", i.Path(), out.srv.Addr},
	} {
		wg.Go(func() { unreachable(t, c.what, c.from, c.to) })
	}
	wg.Wait()

	// Nothing opens a connection into an egress session, not even an outside
	// host that routes the egress subnet to the host.
	addRoute(t, out.ns.FdPath(), m.egress.subnet, out.hostAddr)
	unreachable(t, "outside, routing to the egress subnet -> egress session", out.ns.FdPath(), egrSession.Addr)
	egrSink := newUDPSink(t, e.Path(), e.Addr())
	arrives(t, "host -> egress UDP (control)", "", egrSink)
	nothingArrives(t, "egress -> egress UDP", e2.Path(), netip.Addr{}, egrSink)
	nothingArrives(t, "outside, routing to the egress subnet -> egress UDP", out.ns.FdPath(), netip.Addr{}, egrSink)
	// ...nor into an internal one.
	addRoute(t, out.ns.FdPath(), m.internal.subnet, out.hostAddr)
	unreachable(t, "outside, routing to the internal subnet -> internal session", out.ns.FdPath(), intSession.Addr)

	// An egress session cannot send as someone else: a source outside its
	// subnet (here an internal session's address) is dropped, not forwarded
	// un-NATed.
	outSink := newUDPSink(t, sessnettest.Path(up.NS), up.Hosts[sessnettest.Public].Addr)
	arrives(t, "egress -> public UDP (control)", e.Path(), outSink)
	addAddr(t, e2.Path(), i.Addr())
	nothingArrives(t, "egress with a spoofed source -> outside UDP", e2.Path(), i.Addr(), outSink)
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}
