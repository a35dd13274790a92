package sessnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	sandbox "github.com/tai42/sandbox"
)

var tiers = []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress}

// infra is what Leftovers lists while bridges and table are up and no
// session is.
func infra(m *Manager) []string {
	return []string{"link " + m.internal.bridge, "link " + m.egress.bridge, "nft table inet " + m.prefix}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func leftovers(t testing.TB, m *Manager) []string {
	t.Helper()
	left, err := m.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	return sorted(left)
}

func TestTeardownAndCloseLeaveNothing(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	if left := leftovers(t, m); len(left) != 0 {
		t.Fatalf("a new Manager made something: %v", left)
	}
	var nets []*Net
	for _, tier := range tiers {
		n, err := m.Setup(context.Background(), "sb-"+string(tier), tier)
		if err != nil {
			t.Fatal(err)
		}
		nets = append(nets, n)
	}
	left := leftovers(t, m)
	for _, n := range nets {
		for _, want := range []string{"mount " + n.Path(), "netns file " + n.Path()} {
			if !slices.Contains(left, want) {
				t.Errorf("Leftovers = %v, lacks %q", left, want)
			}
		}
	}
	veths := 0
	for _, l := range left {
		if strings.HasPrefix(l, "link "+m.prefix+"v") {
			veths++
		}
	}
	if veths != 2 {
		t.Errorf("Leftovers = %v: want 2 veths (internal, egress)", left)
	}
	for _, n := range nets {
		if err := m.Teardown(n); err != nil {
			t.Fatal(err)
		}
		if err := m.Teardown(n); err != nil {
			t.Errorf("a second Teardown: %v", err)
		}
		if _, err := os.Stat(n.Path()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the namespace file %s is still there: %v", n.Path(), err)
		}
	}
	if left := leftovers(t, m); !slices.Equal(left, sorted(infra(m))) {
		t.Errorf("after the Teardowns Leftovers = %v, want only %v", left, infra(m))
	}
	if n := m.internal.leases.inUse() + m.egress.leases.inUse(); n != 0 {
		t.Errorf("%d addresses still leased", n)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, m)
	if err := m.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if _, err := m.Setup(context.Background(), "sb-late", sandbox.NetworkNone); !errors.Is(err, ErrClosed) {
		t.Errorf("Setup after Close = %v, want ErrClosed", err)
	}
}

func TestCloseTearsDownLiveNets(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	var nets []*Net
	for i := range 6 {
		n, err := m.Setup(context.Background(), fmt.Sprintf("sb-live-%d", i), tiers[i%3])
		if err != nil {
			t.Fatal(err)
		}
		nets = append(nets, n)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, m)
	for _, n := range nets {
		if err := m.Teardown(n); err != nil {
			t.Errorf("Teardown after Close: %v", err)
		}
	}
}

// TestCycles runs 100 Setup/Teardown cycles of mixed tiers: nothing piles
// up, not even a descriptor.
func TestCycles(t *testing.T) {
	requireRoot(t) // not parallel: counts the process's descriptors
	fds := openFDs(t)
	subnets := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 24, 2)
	cfg := Config{Dir: t.TempDir(), Prefix: testPrefix(), InternalSubnet: subnets[0], EgressSubnet: subnets[1]}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	seen := map[netip.Addr]bool{}
	for i := range 100 {
		tier := tiers[i%3]
		n, err := m.Setup(context.Background(), "sb-cycle", tier)
		if err != nil {
			t.Fatalf("cycle %d (%s): %v", i, tier, err)
		}
		if n.Addr().IsValid() {
			seen[n.Addr()] = true
		}
		if err := m.Teardown(n); err != nil {
			t.Fatalf("cycle %d (%s): Teardown: %v", i, tier, err)
		}
	}
	if left := leftovers(t, m); !slices.Equal(left, sorted(infra(m))) {
		t.Errorf("after 100 cycles Leftovers = %v, want only %v", left, infra(m))
	}
	if n := m.internal.leases.inUse() + m.egress.leases.inUse(); n != 0 {
		t.Errorf("%d addresses still leased", n)
	}
	if len(seen) < 10 {
		t.Errorf("only %d distinct addresses in 67 network setups: next-fit should rotate", len(seen))
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, m)
	if now := openFDs(t); now != fds {
		t.Errorf("%d descriptors open before, %d after", fds, now)
	}
}

// TestSweepAfterCrash drops a Manager without Close, as a crash would, and
// checks that New with the same Dir and Prefix removes everything.
func TestSweepAfterCrash(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	subnets := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 24, 2)
	cfg := Config{Dir: t.TempDir(), Prefix: testPrefix(), InternalSubnet: subnets[0], EgressSubnet: subnets[1]}
	crashed, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { crashed.Close() }) // only matters when the test fails early
	for i := range 6 {
		if _, err := crashed.Setup(context.Background(), fmt.Sprintf("sb-crash-%d", i), tiers[i%3]); err != nil {
			t.Fatal(err)
		}
	}
	crashed.release() // the process "dies": its descriptors close, the rest stays
	left := leftovers(t, crashed)
	if len(left) != 3+6+6+4 { // infra, 6 mounts, 6 files, 4 veths
		t.Fatalf("after the crash Leftovers = %v (%d entries), want 19", left, len(left))
	}

	m := newManagerWith(t, cfg)
	assertClean(t, m)
	// The same ids are free again and everything works.
	for i := range 6 {
		setup(t, m, fmt.Sprintf("sb-crash-%d", i), tiers[i%3])
	}
	// Sweeping when nothing is left is fine too.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := New(cfg)
	if err != nil {
		t.Fatalf("New over a clean slate: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, m)
}

func TestSetupFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	subnets := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 24, 1)
	egress := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 30, 1)[0]
	m := newManagerWith(t, Config{Dir: t.TempDir(), Prefix: testPrefix(), InternalSubnet: subnets[0], EgressSubnet: egress})
	ctx := context.Background()

	// A /30 holds the gateway and one session.
	first := setup(t, m, "sb-first", sandbox.NetworkEgress)
	before := leftovers(t, m)
	_, err := m.Setup(ctx, "sb-second", sandbox.NetworkEgress)
	if err == nil || !strings.Contains(err.Error(), "no free address") {
		t.Fatalf("Setup in a full subnet = %v, want a no-free-address error", err)
	}
	t.Logf("full subnet: %v", err)
	if after := leftovers(t, m); !slices.Equal(after, before) {
		t.Errorf("a failed Setup left something: before %v, after %v", before, after)
	}
	if _, err := os.Stat(m.dir + "/sb-second"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed session's namespace file: %v", err)
	}

	// The same id twice.
	if _, err := m.Setup(ctx, "sb-first", sandbox.NetworkNone); err == nil || !strings.Contains(err.Error(), "already has a network") {
		t.Errorf("Setup of a live id = %v", err)
	}
	if after := leftovers(t, m); !slices.Equal(after, before) {
		t.Errorf("a refused duplicate changed something: before %v, after %v", before, after)
	}

	// A done context.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Setup(cctx, "sb-cancelled", sandbox.NetworkInternal); !errors.Is(err, context.Canceled) {
		t.Errorf("Setup with a cancelled context = %v", err)
	}

	// Bad ids and tiers.
	for _, id := range []string{"", ".", "..", "a/b", "../x", "a b", strings.Repeat("x", 129), "a\x00b"} {
		if _, err := m.Setup(ctx, id, sandbox.NetworkNone); err == nil {
			t.Errorf("Setup(%q) succeeded", id)
		}
	}
	if _, err := m.Setup(ctx, "sb-wide", sandbox.Network("wide")); err == nil {
		t.Error("Setup with tier wide succeeded")
	}
	if after := leftovers(t, m); !slices.Equal(after, before) {
		t.Errorf("refused Setups changed something: before %v, after %v", before, after)
	}

	// Once the address is free again, it is leased again.
	if err := m.Teardown(first); err != nil {
		t.Fatal(err)
	}
	second := setup(t, m, "sb-second", sandbox.NetworkEgress)
	if second.Addr() != first.Addr() {
		t.Errorf("the /30's one session address: %s then %s", first.Addr(), second.Addr())
	}
}

// TestSubnetCollision gives a Manager a subnet the host already routes: the
// Setup fails naming the collision and changes nothing.
func TestSubnetCollision(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	prefix := testPrefix()
	out := newOutside(t, prefix)
	taken := netip.PrefixFrom(out.hostAddr, 24).Masked()
	egress := freePrefixes(t, netip.MustParsePrefix("10.224.0.0/11"), 24, 1)[0]
	m := newManagerWith(t, Config{Dir: t.TempDir(), Prefix: prefix, InternalSubnet: taken, EgressSubnet: egress})
	_, err := m.Setup(context.Background(), "sb-collide", sandbox.NetworkInternal)
	if err == nil || !strings.Contains(err.Error(), "overlaps the host's route") || !strings.Contains(err.Error(), out.hostLink) {
		t.Fatalf("Setup on a routed subnet = %v, want an overlap error naming %s", err, out.hostLink)
	}
	t.Logf("collision: %v", err)
	if left := leftovers(t, m); len(left) != 0 {
		t.Errorf("a refused Setup left %v", left)
	}
	// The other tier is unaffected.
	setup(t, m, "sb-fine", sandbox.NetworkEgress)
}

func TestConcurrentSetups(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	const n = 20
	nets := make([]*Net, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			nets[i], errs[i] = m.Setup(context.Background(), fmt.Sprintf("sb-conc-%02d", i), tiers[i%3])
		})
	}
	wg.Wait()
	addrs := map[netip.Addr]string{}
	var ints []*Net
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Setup %d: %v", i, err)
		}
		nt := nets[i]
		if nt.Tier() != tiers[i%3] {
			t.Errorf("Setup %d: tier %s, want %s", i, nt.Tier(), tiers[i%3])
		}
		if a := nt.Addr(); a.IsValid() {
			if other, dup := addrs[a]; dup {
				t.Errorf("%s and %s share %s", other, nt.ID(), a)
			}
			addrs[a] = nt.ID()
		}
		if nt.Tier() == sandbox.NetworkInternal {
			ints = append(ints, nt)
		}
	}
	if len(addrs) != 13 {
		t.Errorf("%d addresses for 13 networked sessions", len(addrs))
	}
	// Two of them talk.
	srv := serve(t, ints[0].Path(), ints[0].Addr())
	if from := reach(t, "internal -> internal", ints[len(ints)-1].Path(), srv.Addr); from != ints[len(ints)-1].Addr() {
		t.Errorf("the server saw %s", from)
	}
	for i := range n {
		wg.Go(func() { errs[i] = m.Teardown(nets[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Teardown %d: %v", i, err)
		}
	}
	if left := leftovers(t, m); !slices.Equal(left, sorted(infra(m))) {
		t.Errorf("after the Teardowns Leftovers = %v", left)
	}
}

// TestCloseDuringSetups closes while Setups run: each Setup either succeeds
// (and Close tears it down) or fails with ErrClosed; nothing is left.
func TestCloseDuringSetups(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = m.Setup(context.Background(), fmt.Sprintf("sb-race-%02d", i), tiers[i%3])
		})
	}
	var cerr error
	wg.Go(func() { <-start; cerr = m.Close() })
	close(start)
	wg.Wait()
	if cerr != nil {
		t.Fatalf("Close: %v", cerr)
	}
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Setup %d: %v", i, err)
		}
	}
	assertClean(t, m)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := netip.MustParsePrefix
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{}, "Dir is empty"},
		{"long prefix", Config{Dir: dir, Prefix: "abcdefg"}, "prefix"},
		{"upper-case prefix", Config{Dir: dir, Prefix: "Tai"}, "prefix"},
		{"prefix with a dash", Config{Dir: dir, Prefix: "t-a"}, "prefix"},
		{"prefix starting with a digit", Config{Dir: dir, Prefix: "1ab"}, "prefix"},
		{"IPv6 subnet", Config{Dir: dir, InternalSubnet: p("fd00::/64")}, "not IPv4"},
		{"tiny subnet", Config{Dir: dir, EgressSubnet: p("10.9.9.0/31")}, "between /8 and /30"},
		{"host bits", Config{Dir: dir, InternalSubnet: p("10.9.9.1/24")}, "host bits"},
		{"loopback", Config{Dir: dir, InternalSubnet: p("127.1.0.0/16")}, "reserved"},
		{"overlap", Config{Dir: dir, InternalSubnet: p("10.9.0.0/16"), EgressSubnet: p("10.9.4.0/24")}, "overlap"},
		{"overlap with a default", Config{Dir: dir, InternalSubnet: p("10.242.128.0/24")}, "overlap"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error about %q", c.name, err, c.want)
		}
	}
	f := dir + "/file"
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: f, Prefix: testPrefix()}); err == nil {
		t.Error("New with a file as Dir succeeded")
	}
}

// TestSweepLeavesForeignFiles: New removes namespace files only, never
// what else someone put in Dir.
func TestSweepLeavesForeignFiles(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/notes", []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir+"/sub", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/stale", nil, 0o444); err != nil { // an unmounted namespace file
		t.Fatal(err)
	}
	m, err := New(Config{Dir: dir, Prefix: testPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, keep := range []string{"notes", "sub"} {
		if _, err := os.Stat(dir + "/" + keep); err != nil {
			t.Errorf("the sweep removed %s: %v", keep, err)
		}
	}
	if _, err := os.Stat(dir + "/stale"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale namespace file survived the sweep: %v", err)
	}
}

// TestSelfHeal removes the table and a bridge behind the Manager's back
// (as nft flush ruleset or an admin would): the next Setup puts them back,
// with their fences, and succeeds.
func TestSelfHeal(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	a := setup(t, m, "sb-heal-a", sandbox.NetworkInternal)

	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(m.nftTable())
	if err := c.Flush(); err != nil {
		t.Fatalf("deleting the table behind the Manager's back: %v", err)
	}
	b := setup(t, m, "sb-heal-b", sandbox.NetworkInternal)
	if left := leftovers(t, m); !slices.Contains(left, "nft table inet "+m.prefix) {
		t.Fatalf("the table was not put back: %v", left)
	}
	bridge := serve(t, "", a.Gateway())
	reach(t, "host -> bridge address (control)", "", bridge.Addr)
	unreachable(t, "internal -> bridge address, after the table came back", b.Path(), bridge.Addr)

	if err := netlink.LinkDel(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.internal.bridge}}); err != nil {
		t.Fatalf("deleting the bridge behind the Manager's back: %v", err)
	}
	d := setup(t, m, "sb-heal-d", sandbox.NetworkInternal)
	e := setup(t, m, "sb-heal-e", sandbox.NetworkInternal)
	srv := serve(t, d.Path(), d.Addr())
	reach(t, "internal -> internal, on the remade bridge", e.Path(), srv.Addr)
}

// TestTableNameTaken: a table of the Manager's name made by someone else
// after New is not appended to; the Setup fails saying so.
func TestTableNameTaken(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.AddTable(m.nftTable())
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	_, err = m.Setup(context.Background(), "sb-taken", sandbox.NetworkInternal)
	if err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("Setup with the table name taken = %v", err)
	}
	t.Logf("table name taken: %v", err)
	if left := leftovers(t, m); !slices.Equal(left, []string{"nft table inet " + m.prefix}) {
		t.Errorf("Leftovers = %v, want only the foreign table", left)
	}
	if tb, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet); err == nil {
		for _, ch := range tb {
			if ch.Table.Name == m.prefix {
				t.Errorf("a chain %s was added to the foreign table", ch.Name)
			}
		}
	}
	// Close removes it as its own (same name): nothing stays behind.
}
