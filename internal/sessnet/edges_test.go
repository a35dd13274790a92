package sessnet

import (
	"net/netip"
	"testing"

	sandbox "github.com/tai42/sandbox"
)

// fenceEdge is an address at an edge of a built-in fenced range: its first
// or last address, or the one just outside. want is the reason the fences
// refuse it for, "" when they let it through. wire says it can be tried
// with a connection from a session: a unicast IPv4 address a session's
// packets leave it for (its own loopback keeps 127/8, and multicast and
// the limited broadcast carry no TCP).
type fenceEdge struct {
	addr string
	want string
	wire bool
}

// fenceEdges are written out by hand from the documented ranges (see the
// Reason constants), not computed from builtinFences: a range given with
// the wrong length (172.16/16 for 172.16/12) must fail here every run. A
// random address inside a range catches that only sometimes (1 run in 16
// for that one).
var fenceEdges = []fenceEdge{
	{"0.0.0.0", ReasonThisNetwork, false},
	{"0.255.255.255", ReasonThisNetwork, false},
	{"1.0.0.0", "", true},
	{"9.255.255.255", "", true},
	{"10.0.0.0", ReasonPrivate, true},
	{"10.255.255.255", ReasonPrivate, true},
	{"11.0.0.0", "", true},
	{"100.63.255.255", "", true},
	{"100.64.0.0", ReasonShared, true},
	{"100.127.255.255", ReasonShared, true},
	{"100.128.0.0", "", true},
	{"126.255.255.255", "", true},
	{"127.0.0.0", ReasonLoopback, false},
	{"127.255.255.255", ReasonLoopback, false},
	{"128.0.0.0", "", true},
	{"169.253.255.255", "", true},
	{"169.254.0.0", ReasonLinkLocal, true},
	{"169.254.255.255", ReasonLinkLocal, true},
	{"169.255.0.0", "", true},
	{"172.15.255.255", "", true},
	{"172.16.0.0", ReasonPrivate, true},
	{"172.31.255.255", ReasonPrivate, true},
	{"172.32.0.0", "", true},
	{"192.167.255.255", "", true},
	{"192.168.0.0", ReasonPrivate, true},
	{"192.168.255.255", ReasonPrivate, true},
	{"192.169.0.0", "", true},
	{"223.255.255.255", "", true},
	{"224.0.0.0", ReasonMulticast, false},
	{"239.255.255.255", ReasonMulticast, false},
	{"240.0.0.0", ReasonBroadcast, true},
	{"255.255.255.254", ReasonBroadcast, true},
	{"255.255.255.255", ReasonBroadcast, false},

	{"::", ReasonThisNetwork, false},
	{"::1", ReasonLoopback, false},
	{"::2", "", false},
	{"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "", false},
	{"fc00::", ReasonPrivate, false},
	{"fd00:ec2::253", ReasonPrivate, false},
	{"fd00:ec2::254", ReasonLinkLocal, false},
	{"fd00:ec2::255", ReasonPrivate, false},
	{"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ReasonPrivate, false},
	{"fe00::", "", false},
	{"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "", false},
	{"fe80::", ReasonLinkLocal, false},
	{"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ReasonLinkLocal, false},
	{"fec0::", "", false},
	{"feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "", false},
	{"ff00::", ReasonMulticast, false},
	{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ReasonMulticast, false},
}

// builtinReason is the reason the fence chain refuses a as one of the
// built-in ranges for: the first of builtinFences holding it, the order
// the chain tests them in (TestRuleset checks the chain is builtinFences,
// in order).
func builtinReason(a netip.Addr) string {
	for _, b := range builtinFences {
		for _, p := range b.prefixes {
			if p.Contains(a) {
				return b.reason
			}
		}
	}
	return ""
}

// TestBuiltinFenceEdges checks every built-in range at its edges: its
// first and last addresses refused, for its reason, and the addresses just
// outside let through (or refused for the neighbouring range's reason).
// It also checks the table covers every range's edges, so a range added
// later is tested too.
func TestBuiltinFenceEdges(t *testing.T) {
	listed := map[netip.Addr]bool{}
	for _, e := range fenceEdges {
		a := netip.MustParseAddr(e.addr)
		listed[a] = true
		if got := builtinReason(a); got != e.want {
			t.Errorf("%s is refused for %q, want %q", a, got, e.want)
		}
	}
	for _, p := range RefusedPrefixes() {
		first, last := p.Masked().Addr(), lastAddr(p)
		edges := []netip.Addr{first, last, first.Prev(), last.Next()}
		for _, a := range edges {
			if a.IsValid() && !listed[a] {
				t.Errorf("the edges of %s are not all tested: %s is missing from fenceEdges", p, a)
			}
		}
	}
}

// TestFencesEdgesOnTheWire tries every edge a session's packets can carry
// with a TCP connection from an egress session to a test host at that
// address behind the upstream's router: those inside a range are reset
// and counted for its reason, those just outside reached. No address is
// drawn at random: every run tries the same edges.
func TestFencesEdgesOnTheWire(t *testing.T) {
	t.Parallel()
	m, up, _ := newFenceManager(t, Fences{})
	e := setup(t, m, "sb-edges", sandbox.NetworkEgress)
	hostNets, _, err := m.hostNetworks()
	if err != nil {
		t.Fatal(err)
	}
	onHostNet := func(a netip.Addr) bool {
		for _, p := range hostNets {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	for _, edge := range fenceEdges {
		if !edge.wire {
			continue
		}
		a := netip.MustParseAddr(edge.addr)
		if edge.want == "" && onHostNet(a) {
			// The host's own networks are refused: this machine has
			// one here, so the edge cannot show a range too wide.
			t.Logf("%s is on one of this host's networks: not tried", a)
			continue
		}
		h := up.AddHost(t, a)
		if edge.want == "" {
			if from := reach(t, "egress -> "+a.String()+", just outside a fenced range", e.Path(), h.TCP.Addr); from.IsValid() && from != up.HostAddr {
				t.Errorf("%s saw the connection come from %s, want the host's %s", a, from, up.HostAddr)
			}
			continue
		}
		before := blocked(t, m)[edge.want]
		refusedFast(t, "egress -> "+a.String()+", an edge of a fenced range", e.Path(), h.TCP.Addr)
		if got := blocked(t, m)[edge.want]; got != before+1 {
			t.Errorf("after one refused SYN to %s the %s counter went from %d to %d, want +1 (counts: %v)", a, edge.want, before, got, blocked(t, m))
		}
	}
}
