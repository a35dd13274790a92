package sessnet

import (
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/tai42/sandbox/internal/netns"
	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ensureTier makes sure the nftables table and t's bridge exist (and, for
// egress, that the host forwards), making what is missing, and returns the
// bridge's index. The table comes first, so that a bridge never exists
// without the rules that fence it, and forwarding last, once the rules are
// in place. A table or bridge removed behind the Manager's back is made
// again here, at the next internal or egress Setup. Safe for concurrent
// use; the work happens once, and is retried by the next Setup when it
// failed.
func (m *Manager) ensureTier(t *tierNet) (int, error) {
	m.infraMu.Lock()
	defer m.infraMu.Unlock()
	if t.bridgeIndex == 0 {
		// Before anything is made: a range the host already routes fails
		// the Setup with nothing changed.
		if err := m.checkSubnetFree(t); err != nil {
			return 0, err
		}
	}
	if m.tableUp {
		// Someone may have removed the table since (nft flush ruleset, a
		// firewall reload): put it back rather than leave bridges unfenced.
		ok, err := m.hasTable()
		if err != nil {
			return 0, err
		}
		m.tableUp = ok
	}
	if !m.tableUp {
		if err := m.addTable(); err != nil {
			return 0, err
		}
		m.tableUp = true
	}
	if t.bridgeIndex == 0 {
		idx, err := m.addBridge(t)
		if err != nil {
			return 0, err
		}
		t.bridgeIndex = idx
	}
	if t == m.egress {
		// Every time: someone may have turned it off since.
		if err := m.enableForwarding(); err != nil {
			return 0, err
		}
	}
	return t.bridgeIndex, nil
}

// addBridge makes t's bridge: a fixed MAC (so the gateway's address does not
// change as veths come and go), no IPv6, the tier's gateway address, up. On
// error nothing is left.
func (m *Manager) addBridge(t *tierNet) (idx int, err error) {
	la := netlink.NewLinkAttrs()
	la.Name = t.bridge
	la.HardwareAddr = localMAC()
	br := &netlink.Bridge{LinkAttrs: la}
	if err := m.host.LinkAdd(br); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return 0, fmt.Errorf("making the bridge %s: a link of that name exists already (is another Manager using the prefix %s?)", t.bridge, m.prefix)
		}
		return 0, fmt.Errorf("making the bridge %s: %w", t.bridge, err)
	}
	defer func() {
		if err != nil {
			if derr := m.delLink(t.bridge); derr != nil {
				err = fmt.Errorf("%w; removing it again also failed: %w", err, derr)
			}
		}
	}()
	if br.Index == 0 {
		return 0, fmt.Errorf("making the bridge %s: the kernel did not report its index", t.bridge)
	}
	if err := m.host.LinkSetIP6AddrGenMode(br, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return 0, fmt.Errorf("turning IPv6 address generation off on the bridge %s: %w", t.bridge, err)
	}
	gw := t.leases.gateway
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(t.subnet.Bits(), 32)}}
	if err := m.host.AddrAdd(br, addr); err != nil {
		return 0, fmt.Errorf("giving the bridge %s the address %s/%d: %w", t.bridge, gw, t.subnet.Bits(), err)
	}
	if err := m.host.LinkSetUp(br); err != nil {
		return 0, fmt.Errorf("bringing the bridge %s up: %w", t.bridge, err)
	}
	return br.Index, nil
}

// localMAC is a random unicast, locally administered MAC address.
func localMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	crand.Read(mac)
	mac[0] = mac[0]&^1 | 2
	return mac
}

// checkSubnetFree refuses t's subnet when the host already routes any part
// of it (a route in any table other than a default route, or an address of
// its own): two bridges claiming one range would misroute both.
func (m *Manager) checkSubnetFree(t *tierNet) error {
	routes, err := nsthread.RetryDump(func() ([]netlink.Route, error) {
		return m.host.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("listing the host's routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok || ones == 0 {
			continue // default route: everything overlaps it
		}
		dst := netip.PrefixFrom(ip.Unmap(), ones)
		if !dst.Overlaps(t.subnet) {
			continue
		}
		dev := fmt.Sprintf("ifindex %d", r.LinkIndex)
		if l, err := m.host.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		return fmt.Errorf("the %s subnet %s overlaps the host's route to %s (dev %s, table %d): choose a free range in Config",
			t.kind, t.subnet, dst, dev, r.Table)
	}
	return nil
}

// enableForwarding turns net.ipv4.ip_forward on in the host's namespace,
// a global setting of the host.
func (m *Manager) enableForwarding() error {
	const knob = "/proc/sys/net/ipv4/ip_forward"
	err := m.inHost(func() error {
		b, err := os.ReadFile(knob)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == "1" {
			return nil
		}
		return os.WriteFile(knob, []byte("1"), 0)
	})
	if err != nil {
		return fmt.Errorf("turning on net.ipv4.ip_forward: %w", err)
	}
	return nil
}

// addVeth connects n's namespace to its tier's bridge: a veth pair whose
// host side (<prefix>v<8 hex>) is a port of the bridge and whose other side
// is born inside the namespace as eth0, the session's address on eth0 (its
// prefix route is the only route, for internal), and for egress a default
// route via the bridge address. An egress veth is an isolated port of its
// bridge: it forwards to the bridge itself (the gateway), not to other
// isolated ports. The namespace side is configured through
// the namespace's own rtnetlink socket, without a thread switch. IPv6 stays
// off on both sides (no link-local address to reach or be reached by).
func (m *Manager) addVeth(n *Net, ns *netns.NS, bridgeIndex int) error {
	var veth *netlink.Veth
	for attempt := 0; ; attempt++ {
		la := netlink.NewLinkAttrs()
		la.Name = fmt.Sprintf("%sv%08x", m.prefix, rand.Uint32())
		la.Flags = net.FlagUp
		la.MasterIndex = bridgeIndex
		veth = &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns.File().Fd())}
		err := m.host.LinkAdd(veth)
		if errors.Is(err, unix.EEXIST) && attempt < 5 {
			continue // that name is taken: draw another
		}
		if err != nil && errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("making a veth: every name drawn was taken: %w", err)
		}
		// The link may exist even when a later step of LinkAdd failed.
		n.veth = la.Name
		if err != nil {
			return fmt.Errorf("making the veth %s: %w", la.Name, err)
		}
		break
	}
	if err := m.host.LinkSetIP6AddrGenMode(veth, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("turning IPv6 address generation off on %s: %w", n.veth, err)
	}
	if n.tier == m.egress {
		// Egress sessions never reach each other, even where br_netfilter
		// is off and the fences never see frames bridged between them.
		if err := m.host.LinkSetIsolated(veth, true); err != nil {
			return fmt.Errorf("isolating the bridge port %s: %w", n.veth, err)
		}
	}
	eth0, err := ns.Netlink().LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("finding eth0 in the session's namespace: %w", err)
	}
	bits := n.tier.subnet.Bits()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.addr.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
	if err := ns.Netlink().AddrAdd(eth0, addr); err != nil {
		return fmt.Errorf("giving eth0 the address %s/%d: %w", n.addr, bits, err)
	}
	if err := ns.Netlink().LinkSetUp(eth0); err != nil {
		return fmt.Errorf("bringing eth0 up: %w", err)
	}
	if n.tier == m.egress {
		gw := n.tier.leases.gateway
		route := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}
		if err := ns.Netlink().RouteAdd(route); err != nil {
			return fmt.Errorf("adding the default route via %s: %w", gw, err)
		}
	}
	return nil
}

// forgetBridgeIfGone reports whether t's bridge at index is gone (deleted
// behind the Manager's back) and, if so, makes the next ensureTier remake
// it, so that one lost bridge does not fail every later Setup of its tier.
func (m *Manager) forgetBridgeIfGone(t *tierNet, index int) bool {
	m.infraMu.Lock()
	defer m.infraMu.Unlock()
	if t.bridgeIndex != index {
		return true // already found gone and remade
	}
	l, err := m.host.LinkByIndex(index)
	if err != nil && isGone(err) || err == nil && l.Attrs().Name != t.bridge {
		t.bridgeIndex = 0
		return true
	}
	return false
}

// delLink deletes the host's link named name; a link that is not there is
// not an error.
func (m *Manager) delLink(name string) error {
	l, err := m.host.LinkByName(name)
	if err != nil {
		if isGone(err) {
			return nil
		}
		return fmt.Errorf("looking up the link %s: %w", name, err)
	}
	if err := m.host.LinkDel(l); err != nil && !isGone(err) {
		return fmt.Errorf("deleting the link %s: %w", name, err)
	}
	return nil
}

// removeInfra deletes the bridges, then, when both are gone, the table.
func (m *Manager) removeInfra() error {
	m.infraMu.Lock()
	defer m.infraMu.Unlock()
	var errs []error
	for _, t := range []*tierNet{m.internal, m.egress} {
		if err := m.delLink(t.bridge); err != nil {
			errs = append(errs, err)
			continue
		}
		t.bridgeIndex = 0
	}
	if len(errs) > 0 {
		// Keep the rules while a bridge still stands.
		return errors.Join(errs...)
	}
	if err := m.delTable(); err != nil {
		return err
	}
	m.tableUp = false
	return nil
}

// bindMount bind-mounts src onto the existing file dst.
func bindMount(src, dst string) error {
	return unix.Mount(src, dst, "", unix.MS_BIND, "")
}

// unmountRemove unmounts every mount stacked on path (lazily, so a holder
// elsewhere does not make it fail) and removes the file. A path that is
// not mounted, or not there, is fine.
func unmountRemove(path string) error {
	for range 16 {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if err == nil {
			continue
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not (or no longer) a mount point
		}
		return fmt.Errorf("unmounting the namespace file %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the namespace file: %w", err)
	}
	return nil
}

// listLinks dumps h's links, retrying interrupted dumps.
func listLinks(h *netlink.Handle) ([]netlink.Link, error) {
	return nsthread.RetryDump(h.LinkList)
}
