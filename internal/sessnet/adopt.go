package sessnet

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tai42/sandbox/internal/netns"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	sandbox "github.com/tai42/sandbox"
)

// adoption is what New made of one kept session: its Net, or why it could
// not adopt it. handed is set once Adopted has returned the Net.
type adoption struct {
	n      *Net
	err    error
	handed bool
}

// Adopted returns the Net of a kept session, as New found it on the
// machine: its namespace file, its veth, its address (leased again) and its
// tier. It errs, saying why, when New could not adopt it (no namespace file,
// a tier other than the one kept, a veth or address missing); New then
// removed what was left of it. Calling it for an id not in Config.Keep errs.
// Safe for concurrent use; a Net is handed out once (a second call errs).
//
// An adopted Net is the Manager's like one Setup made: Teardown removes it,
// Close tears it down (also when Adopted was never called for it; Adopted
// errs from then on), and Setup refuses its id while it is up.
func (m *Manager) Adopted(id string) (*Net, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.adopted[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("sessnet: session %s was not in Config.Keep: there is no network to adopt", clip(id))
	case a.err != nil:
		return nil, a.err
	case a.handed:
		return nil, fmt.Errorf("sessnet: the network of session %s was already handed out by Adopted", id)
	case m.nets[id] != a.n:
		return nil, fmt.Errorf("sessnet: the network of session %s was adopted but has been torn down since (by Close)", id)
	}
	a.handed = true
	m.adopted[id] = a
	return a.n, nil
}

// adoptFailed is the error Adopted returns for a kept session New could not
// adopt.
func adoptFailed(id string, tier sandbox.Network, err error) error {
	return fmt.Errorf("sessnet: cannot adopt the network of session %s, kept as tier %q (what was left of it is removed): %w", clip(id), clip(string(tier)), err)
}

// findKept inspects the network of each kept session before the sweep and
// returns what it made of each: an adopted Net (its address leased again)
// or why not. Only New calls it, before the Manager is shared.
func (m *Manager) findKept(keep map[string]sandbox.Network) map[string]adoption {
	out := make(map[string]adoption, len(keep))
	// In a fixed order, so that two kept sessions claiming one address
	// (which only a tampered machine shows) fail the same one every time.
	for _, id := range slices.Sorted(maps.Keys(keep)) {
		tier := keep[id]
		n, err := m.findNet(id, tier)
		if err != nil {
			out[id] = adoption{err: adoptFailed(id, tier, err)}
			continue
		}
		out[id] = adoption{n: n}
	}
	return out
}

// findNet finds what is left of session id's network of tier: its
// namespace file <Dir>/<id>, still a mount of a network namespace; for
// internal and egress its eth0, with an address in the tier's subnet, whose
// peer is a veth of this Manager in the host's namespace; for none nothing
// but loopback. It leases the address found.
func (m *Manager) findNet(id string, tier sandbox.Network) (*Net, error) {
	if err := validID(id); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "sessnet: "))
	}
	var t *tierNet
	switch tier {
	case sandbox.NetworkNone:
	case sandbox.NetworkInternal:
		t = m.internal
	case sandbox.NetworkEgress:
		t = m.egress
	default:
		return nil, fmt.Errorf("network tier %q is not one of none, internal, egress", clip(string(tier)))
	}
	n := &Net{m: m, id: id, tier: t, path: filepath.Join(m.dir, id)}
	ns, err := openNetnsFile(n.path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	links, err := listLinks(ns.Netlink())
	if err != nil {
		return nil, fmt.Errorf("listing the links in its namespace: %w", err)
	}
	var eth0 netlink.Link
	var others []string
	for _, l := range links {
		switch name := l.Attrs().Name; {
		case name == "lo":
		case name == "eth0":
			eth0 = l
		default:
			others = append(others, name)
		}
	}
	if len(others) > 0 {
		return nil, fmt.Errorf("its namespace holds links this package never makes: %v", others)
	}
	var found *tierNet
	var addr netip.Addr
	if eth0 != nil {
		addrs, err := ns.Netlink().AddrList(eth0, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("listing the addresses of eth0 in its namespace: %w", err)
		}
		found, addr = m.sessionAddr(addrs)
	}
	switch {
	case t == nil && eth0 == nil:
		n.mounted = true
		return n, nil
	case t == nil && found != nil:
		return nil, fmt.Errorf("it was set up for tier %s (eth0 has the address %s), not none", found.kind, addr)
	case t == nil:
		return nil, errors.New("its namespace has an eth0, which tier none never has")
	case eth0 == nil:
		return nil, errors.New("its namespace has no eth0: its veth is gone (or it was set up for tier none)")
	case found == nil:
		return nil, fmt.Errorf("eth0 in its namespace has no address in the internal subnet %s nor the egress subnet %s",
			m.internal.subnet, m.egress.subnet)
	case found != t:
		return nil, fmt.Errorf("it was set up for tier %s (eth0 has the address %s), not %s", found.kind, addr, t.kind)
	}
	veth, err := m.hostPeer(ns, eth0)
	if err != nil {
		return nil, err
	}
	if err := t.leases.claim(addr); err != nil {
		return nil, fmt.Errorf("its address %s: %w", addr, err)
	}
	n.addr, n.leased, n.veth, n.mounted = addr, true, veth, true
	return n, nil
}

// sessionAddr finds, among eth0's addresses, the one Setup gave it: an
// address of the internal or egress subnet with that subnet's length. It
// returns nil when there is none.
func (m *Manager) sessionAddr(addrs []netlink.Addr) (*tierNet, netip.Addr) {
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		bits, _ := a.Mask.Size()
		for _, t := range []*tierNet{m.internal, m.egress} {
			if t.subnet.Contains(ip) && bits == t.subnet.Bits() {
				return t, ip
			}
		}
	}
	return nil, netip.Addr{}
}

// hostPeer returns the name of the host-side veth whose peer is eth0 in ns:
// eth0's IFLA_LINK is its index in the host's namespace, and that link must
// be a veth named like this Manager's whose own peer is eth0, in ns.
func (m *Manager) hostPeer(ns *netns.NS, eth0 netlink.Link) (string, error) {
	idx := eth0.Attrs().ParentIndex
	if idx == 0 || eth0.Type() != "veth" {
		return "", fmt.Errorf("eth0 in its namespace is a %s with no peer: not a veth this package made", eth0.Type())
	}
	hl, err := m.host.LinkByIndex(idx)
	if err != nil {
		if isGone(err) {
			return "", fmt.Errorf("its host-side veth (ifindex %d) is gone", idx)
		}
		return "", fmt.Errorf("looking up its host-side veth (ifindex %d): %w", idx, err)
	}
	name := hl.Attrs().Name
	if hl.Type() != "veth" || !m.ours(name) || name == m.internal.bridge || name == m.egress.bridge {
		return "", fmt.Errorf("eth0's peer on the host is %s (a %s), not a veth named with the prefix %s", name, hl.Type(), m.prefix)
	}
	nsid, err := m.host.GetNetNsIdByFd(int(ns.File().Fd()))
	if err != nil {
		return "", fmt.Errorf("looking up the id the host gives its namespace: %w", err)
	}
	if hl.Attrs().ParentIndex != eth0.Attrs().Index || hl.Attrs().NetNsID != nsid {
		return "", fmt.Errorf("eth0's peer on the host, %s, has its own peer in another namespace", name)
	}
	return name, nil
}

// openNetnsFile opens the network namespace bind-mounted at path, with a
// rtnetlink socket inside it. It errs, saying so, when the file is missing,
// is not mounted (its namespace ended), or holds another kind of namespace.
func openNetnsFile(path string) (*netns.NS, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("its namespace file %s is missing", path)
		}
		return nil, fmt.Errorf("opening its namespace file: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("statfs of its namespace file %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("its namespace file %s is not mounted: the namespace ended", path)
	}
	ns, err := netns.Open(f)
	switch {
	case errors.Is(err, unix.EINVAL):
		return nil, fmt.Errorf("its namespace file %s holds a namespace that is not a network namespace", path)
	case err != nil:
		return nil, fmt.Errorf("its namespace file %s: %w", path, err)
	}
	return ns, nil
}

// keptNames lists what the sweep must leave of the adopted Nets: their
// namespace files and veths, and the bridges of their tiers.
func keptNames(adopted map[string]adoption) (files, links map[string]bool) {
	files, links = map[string]bool{}, map[string]bool{}
	for _, a := range adopted {
		if a.n == nil {
			continue
		}
		files[a.n.path] = true
		if a.n.tier != nil {
			links[a.n.veth] = true
			links[a.n.tier.bridge] = true
		}
	}
	return files, links
}

// restoreInfra, after the sweep, makes the shared infrastructure the
// adopted Nets need what a fresh Manager's would be: the nftables table
// (re)installed with the current rules and fences in one atomic batch (its
// counters carried over; the sets AllowAddrs filled start empty, and the
// resolver fills them again as the sessions resolve names again), then each
// used tier's bridge (kept when it is still there and a bridge, made
// again when not) with every adopted veth of the tier a port of it and up.
// An adopted Net whose veth cannot be put back on its bridge is torn down
// and its adoption fails; a table or bridge that cannot be made fails New.
// Only New calls it, before the Manager is shared.
func (m *Manager) restoreInfra(adopted map[string]adoption) error {
	used := map[*tierNet][]string{}
	for _, id := range slices.Sorted(maps.Keys(adopted)) {
		if n := adopted[id].n; n != nil && n.tier != nil {
			used[n.tier] = append(used[n.tier], id)
		}
	}
	if len(used) == 0 {
		return nil
	}
	m.infraMu.Lock()
	defer m.infraMu.Unlock()
	exists, err := m.hasTable()
	if err != nil {
		return err
	}
	if err := m.installTable(exists); err != nil {
		return err
	}
	m.tableUp = true
	for _, t := range []*tierNet{m.internal, m.egress} {
		ids := used[t]
		if len(ids) == 0 {
			continue
		}
		idx, err := m.adoptBridge(t)
		if err != nil {
			return err
		}
		t.bridgeIndex = idx
		for _, id := range ids {
			n := adopted[id].n
			if err := m.attachVeth(n.veth, idx, t == m.egress); err != nil {
				err = adoptFailed(id, t.kind, err)
				if terr := m.teardown(n); terr != nil {
					return fmt.Errorf("%w; removing it also failed: %w", err, terr)
				}
				adopted[id] = adoption{err: err}
			}
		}
	}
	return nil
}

// adoptBridge returns the index of t's bridge, kept as it is when it is a
// bridge with the tier's gateway address (brought up if down), else made
// anew (a link of its name that is not a bridge is removed first).
func (m *Manager) adoptBridge(t *tierNet) (int, error) {
	l, err := m.host.LinkByName(t.bridge)
	switch {
	case err != nil && !isGone(err):
		return 0, fmt.Errorf("looking up the bridge %s: %w", t.bridge, err)
	case err == nil && l.Type() == "bridge":
		addrs, err := m.host.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return 0, fmt.Errorf("listing the addresses of the bridge %s: %w", t.bridge, err)
		}
		gw := t.leases.gateway
		hasGW := slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
			ip, ok := netip.AddrFromSlice(a.IP)
			bits, _ := a.Mask.Size()
			return ok && ip.Unmap() == gw && bits == t.subnet.Bits()
		})
		if hasGW {
			if l.Attrs().Flags&net.FlagUp == 0 {
				if err := m.host.LinkSetUp(l); err != nil {
					return 0, fmt.Errorf("bringing the bridge %s up: %w", t.bridge, err)
				}
			}
			return l.Attrs().Index, nil
		}
		// Made for other subnets (the Config changed): make it anew.
		if err := m.delLink(t.bridge); err != nil {
			return 0, err
		}
	case err == nil:
		if err := m.delLink(t.bridge); err != nil {
			return 0, err
		}
	}
	if err := m.checkSubnetFree(t); err != nil {
		return 0, err
	}
	return m.addBridge(t)
}

// attachVeth makes the host veth name a port of the bridge at index (an
// isolated one when isolated), up.
func (m *Manager) attachVeth(name string, bridge int, isolated bool) error {
	l, err := m.host.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up its veth %s: %w", name, err)
	}
	if l.Attrs().MasterIndex != bridge {
		if err := m.host.LinkSetMasterByIndex(l, bridge); err != nil {
			return fmt.Errorf("making its veth %s a port of its tier's bridge again: %w", name, err)
		}
	}
	if isolated {
		// Every time: a port made anew, or by an earlier version, is not.
		if err := m.host.LinkSetIsolated(l, true); err != nil {
			return fmt.Errorf("isolating its veth %s on its tier's bridge: %w", name, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := m.host.LinkSetUp(l); err != nil {
			return fmt.Errorf("bringing its veth %s up: %w", name, err)
		}
	}
	return nil
}
