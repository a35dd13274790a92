package sessnet

import (
	"net/netip"
	"strings"
	"testing"
)

func TestLeases(t *testing.T) {
	l := newLeases(netip.MustParsePrefix("10.1.2.0/29")) // .0 network, .1 gateway, .2-.6, .7 broadcast
	if l.gateway != netip.MustParseAddr("10.1.2.1") {
		t.Errorf("gateway %s", l.gateway)
	}
	var got []string
	for range 5 {
		a, err := l.take()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a.String())
	}
	if want := "10.1.2.2 10.1.2.3 10.1.2.4 10.1.2.5 10.1.2.6"; strings.Join(got, " ") != want {
		t.Errorf("leased %v, want %s", got, want)
	}
	if _, err := l.take(); err == nil || !strings.Contains(err.Error(), "10.1.2.0/29") {
		t.Errorf("a full subnet leased: %v", err)
	}
	// Next-fit: a freed address comes back only after the search wraps.
	l.release(netip.MustParseAddr("10.1.2.4"))
	l.release(netip.MustParseAddr("10.1.2.3"))
	l.release(netip.MustParseAddr("10.1.2.3")) // twice: no effect
	if l.inUse() != 3 {
		t.Errorf("inUse = %d, want 3", l.inUse())
	}
	a, _ := l.take()
	b, _ := l.take()
	if a.String() != "10.1.2.3" || b.String() != "10.1.2.4" {
		t.Errorf("after wrapping leased %s, %s; want 10.1.2.3, 10.1.2.4", a, b)
	}
	l.release(netip.MustParseAddr("10.1.2.2"))
	l.release(netip.MustParseAddr("10.1.2.6"))
	if a, _ := l.take(); a.String() != "10.1.2.6" {
		t.Errorf("next-fit leased %s, want 10.1.2.6 (after the last one leased)", a)
	}

	big := newLeases(netip.MustParsePrefix("10.242.0.0/17"))
	if big.size != 32765 || big.last != netip.MustParseAddr("10.242.127.254") {
		t.Errorf("/17: size %d, last %s", big.size, big.last)
	}
	tiny := newLeases(netip.MustParsePrefix("10.0.0.4/30"))
	if a, err := tiny.take(); err != nil || a.String() != "10.0.0.6" {
		t.Errorf("/30 leased %s, %v; want 10.0.0.6", a, err)
	}
}

func TestOurs(t *testing.T) {
	m := &Manager{prefix: "t1", internal: &tierNet{bridge: "t1-int"}, egress: &tierNet{bridge: "t1-egr"}}
	for name, want := range map[string]bool{
		"t1-int": true, "t1-egr": true, "t1v0123abcd": true,
		"t1v0123abc": false, "t1v0123ABCD": false, "t1av0123abcd": false, "t1-intx": false,
		"t1a-int": false, "ot1": false, "eth0": false, "t1v0123abcde": false,
	} {
		if got := m.ours(name); got != want {
			t.Errorf("ours(%q) = %v, want %v", name, got, want)
		}
	}
}
