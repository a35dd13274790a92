package sessnet

import (
	"context"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	sandbox "github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
)

// crashConfig is a Config with a unique prefix, free subnets and a temporary
// Dir. Whatever a test leaves of it, even when it fails early, a fresh
// Manager sweeps at the end; the sweep must leave nothing.
func crashConfig(t *testing.T) Config {
	t.Helper()
	requireRoot(t)
	subnets := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 24, 2)
	cfg := Config{Dir: t.TempDir(), Prefix: testPrefix(), InternalSubnet: subnets[0], EgressSubnet: subnets[1]}
	t.Cleanup(func() { // registered first: runs after every other cleanup
		m, err := New(cfg)
		if err != nil {
			t.Errorf("the final sweep: %v", err)
			return
		}
		if err := m.Close(); err != nil {
			t.Errorf("the final sweep: Close: %v", err)
		}
		if left := leftovers(t, m); len(left) > 0 {
			t.Errorf("left after the final sweep: %v", left)
		}
	})
	return cfg
}

// crash makes the networks of sessions (id -> tier) with a Manager of cfg,
// then drops the Manager as a crash would: its sockets close, everything
// on the machine stays.
func crash(t *testing.T, cfg Config, sessions map[string]sandbox.Network) map[string]*Net {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nets := map[string]*Net{}
	for _, id := range slices.Sorted(maps.Keys(sessions)) {
		n, err := m.Setup(context.Background(), id, sessions[id])
		if err != nil {
			m.release()
			t.Fatal(err)
		}
		nets[id] = n
	}
	m.release()
	return nets
}

// nftList reads the table with nft, less what changes under it: the
// counters' values and the host's networks (tests running beside this one
// add and remove addresses of the host).
func nftList(t *testing.T, prefix string) string {
	t.Helper()
	return stripVolatile(run(t, "nft", "list", "table", "inet", prefix))
}

func linkExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := netlink.LinkByName(name)
	if err != nil && !isGone(err) {
		t.Fatalf("looking up %s: %v", name, err)
	}
	return err == nil
}

// TestAdoptAfterCrash: a new Manager keeps the networks of the kept
// sessions, hands them out as they were, sweeps the rest, and the adopted
// sessions' connectivity and fences are as before.
func TestAdoptAfterCrash(t *testing.T) {
	t.Parallel()
	cfg := crashConfig(t)
	out := newOutside(t, cfg.Prefix)
	old := crash(t, cfg, map[string]sandbox.Network{
		"sb-none": sandbox.NetworkNone, "sb-none-x": sandbox.NetworkNone,
		"sb-int-a": sandbox.NetworkInternal, "sb-int-b": sandbox.NetworkInternal, "sb-int-x": sandbox.NetworkInternal,
		"sb-egr": sandbox.NetworkEgress, "sb-egr-x": sandbox.NetworkEgress,
	})
	rules := nftList(t, cfg.Prefix)
	// A chain the current rules do not have (an older daemon's, say): the
	// adopting Manager replaces the table with exactly a fresh one.
	nc, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	nc.AddChain(&nftables.Chain{Name: "stale", Table: &nftables.Table{Name: cfg.Prefix, Family: nftables.TableFamilyINet}})
	if err := nc.Flush(); err != nil {
		t.Fatalf("adding a stale chain: %v", err)
	}
	if nftList(t, cfg.Prefix) == rules {
		t.Fatal("the stale chain does not show in nft list (control)")
	}
	// A server in a that lives through the restart, as a container's would.
	srvA := serve(t, old["sb-int-a"].Path(), old["sb-int-a"].Addr())

	cfg.Keep = map[string]sandbox.Network{
		"sb-none": sandbox.NetworkNone, "sb-int-a": sandbox.NetworkInternal,
		"sb-int-b": sandbox.NetworkInternal, "sb-egr": sandbox.NetworkEgress,
	}
	m := newManagerWith(t, cfg)

	adopted := map[string]*Net{}
	for id, tier := range cfg.Keep {
		n, err := m.Adopted(id)
		if err != nil {
			t.Fatalf("Adopted(%s): %v", id, err)
		}
		o := old[id]
		if n.ID() != id || n.Path() != o.Path() || n.Addr() != o.Addr() || n.Tier() != tier || n.veth != o.veth || n.Gateway() != o.Gateway() {
			t.Errorf("Adopted(%s) = {%s %s %s %s %s}, want {%s %s %s %s %s}", id,
				n.ID(), n.Path(), n.Addr(), n.Tier(), n.veth, id, o.Path(), o.Addr(), tier, o.veth)
		}
		adopted[id] = n
		if _, err := m.Adopted(id); err == nil || !strings.Contains(err.Error(), "already handed out") {
			t.Errorf("a second Adopted(%s) = %v, want an already-handed-out error", id, err)
		}
	}
	if _, err := m.Adopted("sb-int-x"); err == nil || !strings.Contains(err.Error(), "not in Config.Keep") {
		t.Errorf("Adopted of a session not kept = %v", err)
	}

	// The rest was swept.
	for _, id := range []string{"sb-none-x", "sb-int-x", "sb-egr-x"} {
		if _, err := os.Stat(old[id].Path()); !os.IsNotExist(err) {
			t.Errorf("the namespace file of %s, not kept, is still there: %v", id, err)
		}
		if v := old[id].veth; v != "" && linkExists(t, v) {
			t.Errorf("the veth %s of %s, not kept, is still there", v, id)
		}
	}
	want := infra(m)
	for _, n := range adopted {
		want = append(want, "mount "+n.Path(), "netns file "+n.Path())
		if n.veth != "" {
			want = append(want, "link "+n.veth)
		}
	}
	if left := leftovers(t, m); !slices.Equal(left, sorted(want)) {
		t.Errorf("after the adoption Leftovers = %v, want %v", left, sorted(want))
	}
	if got := nftList(t, cfg.Prefix); got != rules {
		t.Errorf("the table after the adoption reads\n%s\nbefore the crash it read\n%s", got, rules)
	}
	if got := linksIn(t, adopted["sb-none"].Path()); !slices.Equal(got, []string{"lo:up"}) {
		t.Errorf("links of the adopted none session = %v", got)
	}

	// Connectivity as before: internal reaches internal (the server from
	// before the crash), egress gets out, masqueraded; no tier reaches the
	// host.
	a, b, e := adopted["sb-int-a"], adopted["sb-int-b"], adopted["sb-egr"]
	if from := reach(t, "adopted internal b -> adopted internal a", b.Path(), srvA.Addr); from != b.Addr() {
		t.Errorf("a saw b come from %s, want %s", from, b.Addr())
	}
	up := newUpstream(t, cfg.Prefix, cfg.EgressSubnet)
	if from := reach(t, "adopted egress -> public", e.Path(), up.Hosts[sessnettest.Public].TCP.Addr); from != up.HostAddr {
		t.Errorf("the public host saw the egress session come from %s, want the host's %s", from, up.HostAddr)
	}
	refusedFast(t, "adopted egress -> outside, a host network", e.Path(), out.srv.Addr)
	hostLo := serve(t, "", netip.MustParseAddr("127.0.0.1"))
	intGW := serve(t, "", a.Gateway())
	egrGW := serve(t, "", e.Gateway())
	for _, s := range []*sessnettest.Server{hostLo, intGW, egrGW} {
		reach(t, "host -> its own listener (control)", "", s.Addr)
	}
	unreachable(t, "adopted internal -> host loopback", a.Path(), hostLo.Addr)
	unreachable(t, "adopted internal -> its bridge address", a.Path(), intGW.Addr)
	unreachable(t, "adopted internal -> outside", a.Path(), out.srv.Addr)
	unreachable(t, "adopted egress -> its gateway", e.Path(), egrGW.Addr)
	unreachable(t, "adopted egress -> an internal session", e.Path(), srvA.Addr)
	unreachable(t, "adopted none -> host loopback", adopted["sb-none"].Path(), hostLo.Addr)

	// New sessions get fresh addresses and join the same bridges; the
	// adopted ids are taken.
	for _, tier := range []sandbox.Network{sandbox.NetworkInternal, sandbox.NetworkEgress} {
		n := setup(t, m, "sb-new-"+string(tier), tier)
		for _, o := range adopted {
			if o.Addr() == n.Addr() {
				t.Errorf("a new %s session got %s, the address of the adopted %s", tier, n.Addr(), o.ID())
			}
		}
	}
	c := setup(t, m, "sb-int-c", sandbox.NetworkInternal)
	if from := reach(t, "new internal -> adopted internal", c.Path(), srvA.Addr); from != c.Addr() {
		t.Errorf("a saw c come from %s, want %s", from, c.Addr())
	}
	if _, err := m.Setup(context.Background(), "sb-int-a", sandbox.NetworkInternal); err == nil || !strings.Contains(err.Error(), "already has a network") {
		t.Errorf("Setup of an adopted id = %v", err)
	}

	// Teardown works on an adopted Net as on one Setup made.
	leased := m.internal.leases.inUse()
	if err := m.Teardown(b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Path()); !os.IsNotExist(err) {
		t.Errorf("the namespace file of the torn-down adopted b: %v", err)
	}
	if linkExists(t, old["sb-int-b"].veth) {
		t.Errorf("the veth %s of the torn-down adopted b is still there", old["sb-int-b"].veth)
	}
	if got := m.internal.leases.inUse(); got != leased-1 {
		t.Errorf("%d internal addresses leased after tearing down b, want %d", got, leased-1)
	}

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, m)
}

// TestAdoptFailures: a kept session whose network is not whole, or not of
// the kept tier, is not adopted; Adopted says why, naming it, and nothing
// of it is left.
func TestAdoptFailures(t *testing.T) {
	t.Parallel()
	cfg := crashConfig(t)
	old := crash(t, cfg, map[string]sandbox.Network{
		"sb-nofile":   sandbox.NetworkInternal,
		"sb-unmount":  sandbox.NetworkNone,
		"sb-wrong":    sandbox.NetworkInternal,
		"sb-none-int": sandbox.NetworkNone,
		"sb-int-none": sandbox.NetworkInternal,
		"sb-noveth":   sandbox.NetworkEgress,
	})
	// The namespace file of sb-nofile is gone (its veth stays); the one of
	// sb-unmount is there but no longer a mount; sb-noveth's host veth is
	// gone (which takes eth0 along).
	if err := unmountRemove(old["sb-nofile"].Path()); err != nil {
		t.Fatal(err)
	}
	if err := unmountRemove(old["sb-unmount"].Path()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old["sb-unmount"].Path(), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: old["sb-noveth"].veth}}); err != nil {
		t.Fatal(err)
	}

	cfg.Keep = map[string]sandbox.Network{
		"sb-nofile":   sandbox.NetworkInternal,
		"sb-unmount":  sandbox.NetworkNone,
		"sb-wrong":    sandbox.NetworkEgress,
		"sb-none-int": sandbox.NetworkInternal,
		"sb-int-none": sandbox.NetworkNone,
		"sb-noveth":   sandbox.NetworkEgress,
		"sb-never":    sandbox.NetworkNone,
		"../escape":   sandbox.NetworkNone,
		"sb-odd":      sandbox.Network("wide"),
	}
	m := newManagerWith(t, cfg)
	for id, why := range map[string]string{
		"sb-nofile":   "namespace file " + old["sb-nofile"].Path() + " is missing",
		"sb-unmount":  "is not mounted",
		"sb-wrong":    "set up for tier internal",
		"sb-none-int": "has no eth0",
		"sb-int-none": "set up for tier internal",
		"sb-noveth":   "has no eth0",
		"sb-never":    "is missing",
		"../escape":   "cannot name a namespace file",
		"sb-odd":      "not one of none, internal, egress",
	} {
		n, err := m.Adopted(id)
		if err == nil {
			t.Errorf("Adopted(%s) = %v, want an error", id, n)
			continue
		}
		t.Logf("Adopted(%s): %v", id, err)
		if !strings.Contains(err.Error(), id) || !strings.Contains(err.Error(), why) {
			t.Errorf("Adopted(%s) = %v, want an error naming it and saying %q", id, err, why)
		}
		if _, err2 := m.Adopted(id); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("a second Adopted(%s) = %v, want the same error", id, err2)
		}
	}
	// Nothing of them is left: no file, no veth, no bridge, no table, no
	// address leased.
	assertClean(t, m)
	if n := m.internal.leases.inUse() + m.egress.leases.inUse(); n != 0 {
		t.Errorf("%d addresses leased for networks that were not adopted", n)
	}
	// Their ids are free again.
	for id, tier := range map[string]sandbox.Network{"sb-wrong": sandbox.NetworkEgress, "sb-nofile": sandbox.NetworkInternal} {
		setup(t, m, id, tier)
	}
}

// TestAdoptRemakesInfra: the bridge and the table gone while the daemon was
// down (a reboot of the firewall, an admin) are made again for the adopted
// sessions, with their veths back on the bridge. A Manager closed without
// handing an adopted Net out tears it down too.
func TestAdoptRemakesInfra(t *testing.T) {
	t.Parallel()
	cfg := crashConfig(t)
	old := crash(t, cfg, map[string]sandbox.Network{
		"sb-a": sandbox.NetworkInternal, "sb-b": sandbox.NetworkInternal, "sb-c": sandbox.NetworkInternal,
	})
	rules := nftList(t, cfg.Prefix)
	bridge := cfg.Prefix + "-int"
	if err := netlink.LinkDel(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Name: cfg.Prefix, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg.Keep = map[string]sandbox.Network{"sb-a": sandbox.NetworkInternal, "sb-b": sandbox.NetworkInternal, "sb-c": sandbox.NetworkInternal}
	m := newManagerWith(t, cfg)
	a, err := m.Adopted("sb-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Adopted("sb-b")
	if err != nil {
		t.Fatal(err)
	}
	if got := nftList(t, cfg.Prefix); got != rules {
		t.Errorf("the remade table reads\n%s\nbefore it read\n%s", got, rules)
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatalf("the bridge was not made again: %v", err)
	}
	for _, n := range []*Net{a, b, old["sb-c"]} {
		v, err := netlink.LinkByName(n.veth)
		if err != nil {
			t.Fatalf("the veth %s of %s: %v", n.veth, n.ID(), err)
		}
		if v.Attrs().MasterIndex != br.Attrs().Index {
			t.Errorf("the veth %s of %s is not a port of the remade bridge", n.veth, n.ID())
		}
	}
	srv := serve(t, a.Path(), a.Addr())
	if from := reach(t, "adopted internal b -> adopted internal a, on the remade bridge", b.Path(), srv.Addr); from != b.Addr() {
		t.Errorf("a saw b come from %s", from)
	}
	gw := serve(t, "", a.Gateway())
	reach(t, "host -> bridge address (control)", "", gw.Addr)
	unreachable(t, "adopted internal -> the remade bridge's address", b.Path(), gw.Addr)

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, m)
	if _, err := m.Adopted("sb-c"); err == nil || !strings.Contains(err.Error(), "torn down") {
		t.Errorf("Adopted after Close = %v, want a torn-down error", err)
	}
}
