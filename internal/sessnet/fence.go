package sessnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The reasons an egress session's packet is refused, as Blocked counts them
// and Config.OnBlocked reports them.
const (
	// ReasonPrivate: 10/8, 172.16/12, 192.168/16, fc00::/7.
	ReasonPrivate = "private"
	// ReasonShared: the carrier-grade NAT range 100.64/10.
	ReasonShared = "shared"
	// ReasonLinkLocal: 169.254/16 (cloud metadata services), fe80::/10,
	// fd00:ec2::254.
	ReasonLinkLocal = "link_local"
	// ReasonLoopback: 127/8, ::1.
	ReasonLoopback = "loopback"
	// ReasonMulticast: 224/4, ff00::/8.
	ReasonMulticast = "multicast"
	// ReasonThisNetwork: 0/8, ::.
	ReasonThisNetwork = "this_network"
	// ReasonBroadcast: 255.255.255.255 and the rest of the reserved 240/4.
	ReasonBroadcast = "broadcast"
	// ReasonHostNetwork: an address or subnet of one of the host's own
	// interfaces, kept current as the host's addresses change.
	ReasonHostNetwork = "host_network"
	// ReasonOperatorDeny: in Fences.Deny.
	ReasonOperatorDeny = "operator_deny"
	// ReasonNotAllowedDomain: Fences.DomainFilter is on and the address is
	// not one AllowAddrs let through (or its time ran out).
	ReasonNotAllowedDomain = "not_allowed_domain"
)

// BlockReasons lists every reason Blocked reports, in the order the fences
// test them after Fences.Allow (ReasonOperatorDeny first).
func BlockReasons() []string {
	out := []string{ReasonOperatorDeny}
	for _, b := range builtinFences {
		out = append(out, b.reason)
	}
	return append(out, ReasonHostNetwork, ReasonNotAllowedDomain)
}

// RefusedPrefixes are the destinations no egress session reaches whatever
// the Fences (but Allow), besides the host's own networks.
func RefusedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, b := range builtinFences {
		out = append(out, b.prefixes...)
	}
	return out
}

// builtinFences are the destinations no egress session reaches, whatever
// the Fences (but Allow), tested in this order: link-local before private,
// so that fd00:ec2::254 (a metadata service) counts as link-local.
var builtinFences = []struct {
	reason   string
	prefixes []netip.Prefix
}{
	{ReasonLinkLocal, prefixes("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128")},
	{ReasonLoopback, prefixes("127.0.0.0/8", "::1/128")},
	{ReasonThisNetwork, prefixes("0.0.0.0/8", "::/128")},
	{ReasonPrivate, prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")},
	{ReasonShared, prefixes("100.64.0.0/10")},
	{ReasonMulticast, prefixes("224.0.0.0/4", "ff00::/8")},
	{ReasonBroadcast, prefixes("240.0.0.0/4")},
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Fences are what the operator adds to the egress tier's built-in fences.
// The fence of a packet from an egress session is decided in this order:
// a destination in Allow is accepted; one in Deny is refused
// (ReasonOperatorDeny); the built-in ranges and the host's networks are
// refused; with DomainFilter, an address AllowAddrs let through is
// accepted and every other refused (ReasonNotAllowedDomain); the rest is
// accepted. Allow opens nothing of the host itself: packets to the host's
// own addresses never pass the fences (the input hook drops them).
type Fences struct {
	// Allow are destinations accepted before every refusal (an exception,
	// say, for a package mirror on a private network).
	Allow []netip.Prefix
	// Deny are destinations refused, as ReasonOperatorDeny.
	Deny []netip.Prefix
	// DomainFilter, when on, refuses every destination (but Allow) that is
	// not in the sets AllowAddrs fills: the daemon's resolver adds the
	// addresses of the names a session may reach as it answers for them.
	// Connections already established stay up when their address times
	// out of the sets.
	DomainFilter bool
	// ResolverPort, when not 0, redirects UDP and TCP to port 53 of the
	// egress gateway (EgressGateway) from egress sessions to that port of
	// the gateway, where the daemon's resolver listens, and lets them reach
	// it; nothing else of the host becomes reachable.
	ResolverPort uint16
}

// ValidateFences checks f: every prefix valid, not an IPv4-mapped IPv6
// prefix (write it as IPv4), and without host bits set. The error names
// the field and the value.
func ValidateFences(f Fences) error {
	for _, l := range []struct {
		field string
		ps    []netip.Prefix
	}{{"Allow", f.Allow}, {"Deny", f.Deny}} {
		for i, p := range l.ps {
			switch {
			case !p.IsValid():
				return fmt.Errorf("sessnet: Fences.%s[%d] is not a valid prefix", l.field, i)
			case p.Addr().Is4In6():
				return fmt.Errorf("sessnet: Fences.%s[%d] %s is an IPv4-mapped IPv6 prefix: write it as IPv4", l.field, i, p)
			case p.Addr().Zone() != "":
				return fmt.Errorf("sessnet: Fences.%s[%d] %s has a zone, which a prefix of the fences cannot have", l.field, i, p)
			case p != p.Masked():
				return fmt.Errorf("sessnet: Fences.%s[%d] %s has host bits set (did you mean %s?)", l.field, i, p, p.Masked())
			}
		}
	}
	return nil
}

// Blocked is one refused attempt, as Config.OnBlocked reports it.
type Blocked struct {
	// Reason is one of the Reason constants.
	Reason string
	// Session is the id of the session the packet came from; "" when no
	// session of the Manager has its source address (any more).
	Session string
	// Src is the packet's source address (the session's own: the fences
	// see it before NAT).
	Src netip.Addr
	// Proto is "tcp", "udp", "icmp", "icmpv6", or the IP protocol number.
	Proto string
	// Dst is the destination; its port is 0 for a protocol without ports.
	Dst netip.AddrPort
}

// EgressGateway is the egress tier's gateway address (the first host
// address of its subnet), where sessions send DNS to the resolver. It is
// valid before the egress bridge exists, so the resolver can bind it
// early (with IP_FREEBIND).
func (m *Manager) EgressGateway() netip.Addr { return m.egress.leases.gateway }

// SetFences replaces the operator's fences with f, for the sessions that
// run now as for those to come, in one nftables transaction: a packet
// meets either the old fences or the new ones. The addresses AllowAddrs
// added stay in their sets (the table's reinstallation, after a crash or
// when someone removed it, empties them). It errs, changing nothing, when f
// is malformed (see ValidateFences), when the Manager is closed, or when
// the kernel refuses the rules. Safe for concurrent use.
func (m *Manager) SetFences(f Fences) error {
	if err := ValidateFences(f); err != nil {
		return err
	}
	f = cloneFences(f)
	m.mu.Lock()
	closed := m.released
	m.mu.Unlock()
	if closed {
		return ErrClosed
	}
	m.infraMu.Lock()
	defer m.infraMu.Unlock()
	if m.tableUp {
		if err := m.replaceRules(f); err != nil {
			return fmt.Errorf("sessnet: setting the fences: %w", err)
		}
	}
	m.fences = f
	return nil
}

func cloneFences(f Fences) Fences {
	f.Allow = slices.Clone(f.Allow)
	f.Deny = slices.Clone(f.Deny)
	return f
}

// maxAllowTTL bounds how long AllowAddrs lets an address through: a DNS
// TTL past it would outlast any sensible cache.
const maxAllowTTL = 24 * time.Hour

// AllowAddrs lets egress sessions reach addrs for ttl (rounded up to whole
// milliseconds, at most 24 hours) when Fences.DomainFilter is on: it adds
// them to the sets allow4 and allow6 of the table, and refreshes the
// timeout of an address already there to ttl from now. One netlink
// batch, on a socket of its own, so it is cheap enough for every DNS
// answer. IPv4-mapped IPv6 addresses count as IPv4. It errs when an
// address is invalid, ttl is not positive, there is no egress network yet
// (no table), or the kernel refuses. Safe for concurrent use.
func (m *Manager) AllowAddrs(addrs []netip.Addr, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("sessnet: AllowAddrs: the ttl %v is not positive", ttl)
	}
	ttl = min((ttl + time.Millisecond - 1).Truncate(time.Millisecond), maxAllowTTL)
	var v4, v6 [][]byte
	for _, a := range addrs {
		if !a.IsValid() {
			return errors.New("sessnet: AllowAddrs: an address is invalid (the zero netip.Addr)")
		}
		a = a.Unmap()
		if a.Is4() {
			v4 = append(v4, a.AsSlice())
		} else {
			v6 = append(v6, a.WithZone("").AsSlice())
		}
	}
	if len(v4)+len(v6) == 0 {
		return nil
	}
	m.fastMu.Lock()
	defer m.fastMu.Unlock()
	if m.setConn == nil {
		return ErrClosed
	}
	msgs := []netlink.Message{batchMsg(unix.NFNL_MSG_BATCH_BEGIN)}
	for _, l := range []struct {
		set   string
		addrs [][]byte
	}{{setAllow4, v4}, {setAllow6, v6}} {
		if len(l.addrs) == 0 {
			continue
		}
		msg, err := m.timedElements(l.set, l.addrs, ttl)
		if err != nil {
			return fmt.Errorf("sessnet: AllowAddrs: %w", err)
		}
		msgs = append(msgs, msg)
	}
	msgs = append(msgs, batchMsg(unix.NFNL_MSG_BATCH_END))
	if _, err := m.setConn.SendMessages(msgs); err != nil {
		return fmt.Errorf("sessnet: AllowAddrs: sending to nftables: %w", err)
	}
	for acks := len(msgs) - 2; acks > 0; {
		replies, err := m.setConn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("sessnet: AllowAddrs: there is no nftables table inet %s (no egress network is set up): %w", m.prefix, err)
			}
			return fmt.Errorf("sessnet: AllowAddrs: adding to the sets %s and %s: %w", setAllow4, setAllow6, err)
		}
		for _, r := range replies {
			if r.Header.Type == netlink.Error {
				acks--
			}
		}
	}
	return nil
}

// batchMsg begins or ends an nftables transaction.
func batchMsg(typ uint16) netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES},
	}
}

// timedElements is the message adding keys to the table's set with the
// timeout ttl, and their expiration set to ttl from now: the kernel
// refreshes the expiration of an element already there only when the
// message names it (google/nftables does not).
func (m *Manager) timedElements(set string, keys [][]byte, ttl time.Duration) (netlink.Message, error) {
	ms := uint64(ttl.Milliseconds())
	elems := netlink.NewAttributeEncoder()
	for _, k := range keys {
		elems.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, k)
				return nil
			})
			ae.Bytes(unix.NFTA_SET_ELEM_TIMEOUT, binary.BigEndian.AppendUint64(nil, ms))
			ae.Bytes(unix.NFTA_SET_ELEM_EXPIRATION, binary.BigEndian.AppendUint64(nil, ms))
			return nil
		})
	}
	list, err := elems.Encode()
	if err != nil {
		return netlink.Message{}, err
	}
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, m.prefix)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Bytes(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_LIST_ELEMENTS, list)
	attrs, err := ae.Encode()
	if err != nil {
		return netlink.Message{}, err
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM),
			Flags: netlink.Request | netlink.Acknowledge | netlink.Create,
		},
		Data: append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	}, nil
}

// Blocked returns how many packets the fences refused so far, per reason
// (every reason of BlockReasons, 0 included). The counts are exact (the
// log's rate limit does not touch them); they live in the nftables table,
// survive SetFences and an adoption after a crash, and start from 0 when
// the table is made anew (after Close, or when someone removed it). It errs
// when the Manager is closed or the kernel cannot be asked. Safe for
// concurrent use.
func (m *Manager) Blocked() (map[string]uint64, error) {
	out := make(map[string]uint64)
	for _, r := range BlockReasons() {
		out[r] = 0
	}
	m.fastMu.Lock()
	defer m.fastMu.Unlock()
	if m.fast == nil {
		return nil, ErrClosed
	}
	counts, err := readCounters(m.fast, m.nftTable())
	if err != nil {
		return nil, fmt.Errorf("sessnet: reading the fences' counters: %w", err)
	}
	for r, n := range counts {
		if _, ok := out[r]; ok {
			out[r] = n
		}
	}
	return out, nil
}

// readCounters reads the packet counts of the table's named counters; a
// table that does not exist has none.
func readCounters(c *nftables.Conn, table *nftables.Table) (map[string]uint64, error) {
	objs, err := c.GetNamedObjects(table)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, err
	}
	out := map[string]uint64{}
	for _, o := range objs {
		no, ok := o.(*nftables.NamedObj)
		if !ok || no.Type != nftables.ObjTypeCounter {
			continue
		}
		if ctr, ok := no.Obj.(*expr.Counter); ok {
			out[no.Name] = ctr.Packets
		}
	}
	return out, nil
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ from, to netip.Addr }

// mergeRanges turns ps (one family) into sorted, disjoint ranges, adjacent
// ones joined: an nftables interval set refuses overlapping elements.
func mergeRanges(ps []netip.Prefix) []addrRange {
	rs := make([]addrRange, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		rs = append(rs, addrRange{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.from.Compare(b.from) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last.to.Next(); !next.IsValid() || r.from.Compare(next) <= 0 {
				if r.to.Compare(last.to) > 0 {
					last.to = r.to
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// intervalElements are the elements of an nftables interval set holding
// ps: for each range its first address, and the address after its last
// flagged as an interval end (none for a range that runs to the family's
// last address).
func intervalElements(ps []netip.Prefix) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range mergeRanges(ps) {
		out = append(out, nftables.SetElement{Key: r.from.AsSlice()})
		if end := r.to.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// byFamily splits ps into its IPv4 and IPv6 prefixes.
func byFamily(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return v4, v6
}
