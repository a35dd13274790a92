package sessnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The Manager's one nftables table, family inet (so its drops cover IPv6
// too), named after the prefix. Every rule matches interfaces by name
// (iifname/oifname), never by index, so the rules hold whatever order the
// bridges are made or remade in, and none refers to another table: a drop
// or reject here is final whatever other tables (Docker's, a host
// firewall) accept.
//
//	table inet <prefix> {
//	  counter <reason> {}      # one per reason of BlockReasons: packets refused
//	  limit log { rate 20/second burst 40 packets }   # only with Config.OnBlocked
//	  set host4 { type ipv4_addr; flags interval; }   # the host's addresses and subnets,
//	  set host6 { type ipv6_addr; flags interval; }   #   kept current (see watchAddrs)
//	  set opallow4, opallow6 { flags interval; }      # Fences.Allow
//	  set opdeny4, opdeny6 { flags interval; }        # Fences.Deny
//	  set allow4 { type ipv4_addr; flags timeout; }   # AllowAddrs (Fences.DomainFilter)
//	  set allow6 { type ipv6_addr; flags timeout; }
//	  chain input {            # hook input, priority filter, policy accept
//	    iifname <egr-bridge> ip saddr <egress> ip daddr <gateway> udp dport <resolver> accept  # Fences.ResolverPort
//	    iifname <egr-bridge> ip saddr <egress> ip daddr <gateway> tcp dport <resolver> accept
//	    iifname <int-bridge> drop     # sessions never reach the host itself
//	    iifname <egr-bridge> drop
//	  }
//	  chain forward {          # hook forward, priority filter, policy accept
//	    iifname <int-bridge> oifname <int-bridge> accept   # internal <-> internal (bridged, br_netfilter)
//	    iifname <int-bridge> drop                          # internal: nothing beyond
//	    oifname <int-bridge> drop                          # nobody routes into internal
//	    iifname <egr-bridge> ip saddr <egress> jump fence  # egress out, through the fences
//	    iifname <egr-bridge> drop                          # spoofed source, IPv6
//	    oifname <egr-bridge> ct state established,related accept
//	    oifname <egr-bridge> drop                          # no new connections in
//	  }
//	  chain fence {            # what an egress session may reach
//	    ip daddr @opallow4 accept
//	    ip6 daddr @opallow6 accept
//	    ip daddr @opdeny4 goto refuse_operator_deny
//	    ip6 daddr @opdeny6 goto refuse_operator_deny
//	    ip daddr 169.254.0.0/16 goto refuse_link_local     # and so on for builtinFences,
//	    ...                                                #   IPv4 and IPv6
//	    ip daddr @host4 goto refuse_host_network
//	    ip6 daddr @host6 goto refuse_host_network
//	    ct state established,related accept                # these four with Fences.DomainFilter
//	    ip daddr @allow4 accept
//	    ip6 daddr @allow6 accept
//	    goto refuse_not_allowed_domain
//	    accept
//	  }
//	  chain refuse_<reason> {  # one per reason
//	    counter name <reason> limit name log log prefix "<prefix> blocked <reason>" group <N> snaplen 48
//	    meta l4proto tcp reject with tcp reset
//	    reject with icmpx admin-prohibited
//	  }
//	  chain prerouting {       # hook prerouting, priority dstnat, policy accept
//	    iifname <egr-bridge> ip saddr <egress> ip daddr <gateway> udp dport 53 dnat ip to <gateway>:<resolver>  # Fences.ResolverPort
//	    iifname <egr-bridge> ip saddr <egress> ip daddr <gateway> tcp dport 53 dnat ip to <gateway>:<resolver>
//	  }
//	  chain postrouting {      # hook postrouting, priority srcnat, policy accept
//	    ip saddr <egress> oifname != <egr-bridge> masquerade
//	  }
//	}
//
// Traffic from a session to any address of the host arrives on the input
// hook through the session's bridge, whichever address it targets (the
// bridge's, loopback's, another interface's), so the input drops keep the
// host's services out of reach; the egress gateway only forwards, and
// answers DNS when Fences.ResolverPort says where the resolver listens.
//
// Egress sessions reach the public internet only: the fence chain refuses
// every private, shared, link-local, loopback, multicast, "this network"
// and reserved destination and every network of the host's own interfaces
// (host4/host6, filled from the host's addresses at installation and
// replaced in one transaction whenever they change). A refusal is a TCP
// reset or an ICMP administratively-prohibited error, so that a refused
// connection fails at once; the refuse chains count it exactly and, when
// the Manager reports blocked attempts (Config.OnBlocked), log it to an
// NFLOG group of the Manager's own (headers only, rate-limited: a session
// cannot flood the daemon; the counters stay exact). Egress sessions do not
// reach each other: their subnet is private, and their ports on the bridge
// are isolated (so that holds without br_netfilter too).
//
// With br_netfilter on (net.bridge.bridge-nf-call-iptables=1, as here),
// frames bridged between two sessions of one bridge pass the forward hook
// too, with the bridge as both interfaces: hence the bridge-to-itself
// accept of the internal bridge. An accept, unlike a drop, is not final
// across tables: another table whose forward chain drops (Docker sets
// iptables' FORWARD policy to DROP) can still block internal traffic
// between sessions and egress forwarding; the fences (the drops and
// rejects) hold regardless.

// The table's sets.
const (
	setHost4    = "host4"
	setHost6    = "host6"
	setOpAllow4 = "opallow4"
	setOpAllow6 = "opallow6"
	setOpDeny4  = "opdeny4"
	setOpDeny6  = "opdeny6"
	setAllow4   = "allow4"
	setAllow6   = "allow6"
)

// logLimit is the name of the limit object the log rules share, and
// logRate, logBurst its rate (per second) and burst.
const (
	logLimit = "log"
	logRate  = 20
	logBurst = 40
)

// logSnaplen is how much of a refused packet the log copies to the
// Manager: the IPv4 header (up to 44 bytes of it) or the IPv6 header, and
// the ports after it; no payload to speak of.
const logSnaplen = 48

// dnsPort is the port sessions send DNS to.
const dnsPort = 53

func (m *Manager) nftTable() *nftables.Table {
	return &nftables.Table{Name: m.prefix, Family: nftables.TableFamilyINet}
}

// nftSet is the table's set of that name.
func (m *Manager) nftSet(name string) *nftables.Set {
	s := &nftables.Set{Table: m.nftTable(), Name: name, KeyType: nftables.TypeIPAddr}
	if name[len(name)-1] == '6' {
		s.KeyType = nftables.TypeIP6Addr
	}
	switch name {
	case setAllow4, setAllow6:
		s.HasTimeout = true
	default:
		s.Interval = true
	}
	return s
}

// nftChains are the table's chains, base chains with their hooks.
func (m *Manager) nftChains() []*nftables.Chain {
	table := m.nftTable()
	accept := nftables.ChainPolicyAccept
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return &nftables.Chain{Name: name, Table: table, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept}
	}
	chains := []*nftables.Chain{
		base("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter),
		base("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter),
		base("prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest),
		base("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource),
		{Name: "fence", Table: table},
	}
	for _, r := range BlockReasons() {
		chains = append(chains, &nftables.Chain{Name: refuseChain(r), Table: table})
	}
	return chains
}

func refuseChain(reason string) string { return "refuse_" + reason }

// logPrefix is the log prefix of a refusal for reason; parseLogPrefix
// reads it back.
func (m *Manager) logPrefix(reason string) string { return m.prefix + " blocked " + reason }

// addTable installs the whole table in one atomic batch: either all of it
// exists afterwards or none of it. The caller holds m.infraMu.
func (m *Manager) addTable() error { return m.installTable(false) }

// installTable installs the whole table, with the current fences and the
// host's current networks, in one atomic batch; with replace, the table of
// that name that exists is deleted in the same batch, so that the rules
// change from the old to the new set with no moment without either, and
// its counters carry over (the sets AllowAddrs filled start empty). The
// caller holds m.infraMu or is New.
func (m *Manager) installTable(replace bool) error {
	c := m.nft
	host4, host6, err := m.hostNetworks()
	if err != nil {
		return err
	}
	var carried map[string]uint64
	if replace {
		if carried, err = readCounters(c, m.nftTable()); err != nil {
			return fmt.Errorf("reading the counters of the nftables table inet %s: %w", m.prefix, err)
		}
		c.DelTable(m.nftTable())
	}
	// Exclusive: appending the rules to a table of that name that someone
	// else made would double or mix them.
	table := c.CreateTable(m.nftTable())
	for _, r := range BlockReasons() {
		c.AddObj(&nftables.NamedObj{Table: table, Name: r, Type: nftables.ObjTypeCounter,
			Obj: &expr.Counter{Packets: carried[r]}})
	}
	if m.onBlocked != nil {
		c.AddObj(&nftables.NamedObj{Table: table, Name: logLimit, Type: nftables.ObjTypeLimit,
			Obj: &expr.Limit{Type: expr.LimitTypePkts, Rate: logRate, Unit: expr.LimitTimeSecond, Burst: logBurst}})
	}
	for i, name := range []string{setHost4, setHost6, setOpAllow4, setOpAllow6, setOpDeny4, setOpDeny6, setAllow4, setAllow6} {
		var elems []nftables.SetElement
		switch name {
		case setHost4:
			elems = intervalElements(host4)
		case setHost6:
			elems = intervalElements(host6)
		}
		set := m.nftSet(name)
		// An id of our own (ids name sets within one transaction):
		// google/nftables draws them from a package variable unguarded
		// against two Managers installing tables at once.
		set.ID = uint32(i + 1)
		if err := c.AddSet(set, elems); err != nil {
			return fmt.Errorf("installing the nftables table inet %s: set %s: %w", m.prefix, name, err)
		}
	}
	for _, ch := range m.nftChains() {
		c.AddChain(ch)
	}
	if err := m.writeRules(c, m.fences); err != nil {
		return fmt.Errorf("installing the nftables table inet %s: %w", m.prefix, err)
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.EEXIST) && !replace {
			return fmt.Errorf("installing the nftables table inet %s: a table of that name exists already (is another Manager using the prefix %s?)", m.prefix, m.prefix)
		}
		return fmt.Errorf("installing the nftables table inet %s: %w", m.prefix, err)
	}
	return nil
}

// replaceRules rewrites every chain's rules and the operator's sets for f
// in one transaction, keeping the table, its counters and its other sets.
// The caller holds m.infraMu.
func (m *Manager) replaceRules(f Fences) error {
	c := m.nft
	for _, ch := range m.nftChains() {
		c.FlushChain(ch)
	}
	for _, name := range []string{setOpAllow4, setOpAllow6, setOpDeny4, setOpDeny6} {
		c.FlushSet(m.nftSet(name))
	}
	if err := m.writeRules(c, f); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("replacing the rules of the nftables table inet %s: %w", m.prefix, err)
	}
	return nil
}

// writeRules adds every chain's rules for f, and f's prefixes to the
// operator's sets, to c's batch; the chains and sets exist (or are made
// earlier in the batch) and hold nothing.
func (m *Manager) writeRules(c *nftables.Conn, f Fences) error {
	table := m.nftTable()
	chain := func(name string) *nftables.Chain { return &nftables.Chain{Name: name, Table: table} }
	input, forward, fence := chain("input"), chain("forward"), chain("fence")
	pre, post := chain("prerouting"), chain("postrouting")
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: all})
	}
	intBr, egrBr := m.internal.bridge, m.egress.bridge
	egrNet := m.egress.subnet
	gw := m.egress.leases.gateway

	allow4, allow6 := byFamily(f.Allow)
	deny4, deny6 := byFamily(f.Deny)
	for name, ps := range map[string][]netip.Prefix{setOpAllow4: allow4, setOpAllow6: allow6, setOpDeny4: deny4, setOpDeny6: deny6} {
		if len(ps) == 0 {
			continue
		}
		if err := c.SetAddElements(m.nftSet(name), intervalElements(ps)); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}

	if rp := f.ResolverPort; rp != 0 {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rule(input, iif(egrBr), ipSaddrIn(egrNet), daddrIn(netip.PrefixFrom(gw, 32)), dport(proto, rp), verdict(expr.VerdictAccept))
		}
	}
	rule(input, iif(intBr), verdict(expr.VerdictDrop))
	rule(input, iif(egrBr), verdict(expr.VerdictDrop))

	rule(forward, iif(intBr), oif(intBr), verdict(expr.VerdictAccept))
	rule(forward, iif(intBr), verdict(expr.VerdictDrop))
	rule(forward, oif(intBr), verdict(expr.VerdictDrop))
	rule(forward, iif(egrBr), ipSaddrIn(egrNet), jump(expr.VerdictJump, "fence"))
	rule(forward, iif(egrBr), verdict(expr.VerdictDrop))
	rule(forward, oif(egrBr), ctEstablishedOrRelated(), verdict(expr.VerdictAccept))
	rule(forward, oif(egrBr), verdict(expr.VerdictDrop))

	rule(fence, daddrInSet(false, setOpAllow4), verdict(expr.VerdictAccept))
	rule(fence, daddrInSet(true, setOpAllow6), verdict(expr.VerdictAccept))
	rule(fence, daddrInSet(false, setOpDeny4), jump(expr.VerdictGoto, refuseChain(ReasonOperatorDeny)))
	rule(fence, daddrInSet(true, setOpDeny6), jump(expr.VerdictGoto, refuseChain(ReasonOperatorDeny)))
	for _, b := range builtinFences {
		for _, p := range b.prefixes {
			rule(fence, daddrIn(p), jump(expr.VerdictGoto, refuseChain(b.reason)))
		}
	}
	rule(fence, daddrInSet(false, setHost4), jump(expr.VerdictGoto, refuseChain(ReasonHostNetwork)))
	rule(fence, daddrInSet(true, setHost6), jump(expr.VerdictGoto, refuseChain(ReasonHostNetwork)))
	if f.DomainFilter {
		// A connection made while its address was allowed outlives the
		// address's time in the set: a DNS TTL ending mid-download must
		// not cut it.
		rule(fence, ctEstablishedOrRelated(), verdict(expr.VerdictAccept))
		rule(fence, daddrInSet(false, setAllow4), verdict(expr.VerdictAccept))
		rule(fence, daddrInSet(true, setAllow6), verdict(expr.VerdictAccept))
		rule(fence, jump(expr.VerdictGoto, refuseChain(ReasonNotAllowedDomain)))
	}
	rule(fence, verdict(expr.VerdictAccept))

	for _, r := range BlockReasons() {
		ch := chain(refuseChain(r))
		count := []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: r}}
		if m.onBlocked != nil {
			count = append(count,
				&expr.Objref{Type: unix.NFT_OBJECT_LIMIT, Name: logLimit},
				&expr.Log{
					Key:     1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
					Group:   m.logGroup,
					Data:    []byte(m.logPrefix(r)),
					Snaplen: logSnaplen,
				})
		}
		rule(ch, count)
		rule(ch, l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
		rule(ch, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})
	}

	if rp := f.ResolverPort; rp != 0 {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rule(pre, iif(egrBr), ipSaddrIn(egrNet), daddrIn(netip.PrefixFrom(gw, 32)), dport(proto, dnsPort), dnatTo(netip.AddrPortFrom(gw, rp)))
		}
	}
	rule(post, ipSaddrIn(egrNet), oifNot(egrBr), []expr.Any{&expr.Masq{}})
	return nil
}

// delTable removes the table if it exists. The caller holds m.infraMu or is
// New (nothing runs concurrently yet).
func (m *Manager) delTable() error {
	ok, err := m.hasTable()
	if err != nil || !ok {
		return err
	}
	m.nft.DelTable(m.nftTable())
	if err := m.nft.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting the nftables table inet %s: %w", m.prefix, err)
	}
	return nil
}

// hasTable reports whether the table exists on the machine.
func (m *Manager) hasTable() (bool, error) {
	_, err := m.nft.ListTableOfFamily(m.prefix, nftables.TableFamilyINet)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("looking up the nftables table inet %s: %w", m.prefix, err)
}

// ifnameBytes is an interface name as nftables compares it: the name, NUL
// padded to IFNAMSIZ.
func ifnameBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func iif(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(name)},
	}
}

func oif(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(name)},
	}
}

func oifNot(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifnameBytes(name)},
	}
}

// ipSaddrIn matches IPv4 packets whose source lies in p.
func ipSaddrIn(p netip.Prefix) []expr.Any { return addrIn(p, false) }

// daddrIn matches packets of p's family whose destination lies in p.
func daddrIn(p netip.Prefix) []expr.Any { return addrIn(p, true) }

func addrIn(p netip.Prefix, dst bool) []expr.Any {
	size := p.Addr().BitLen() / 8
	mask := make([]byte, size)
	for i := range p.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	out := nfproto(p.Addr().Is6())
	out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: addrOffset(p.Addr().Is6(), dst), Len: uint32(size)})
	if p.Bits() < size*8 {
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(size), Mask: mask, Xor: make([]byte, size)})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()})
}

// addrOffset is where the source or destination address is in an IPv4 or
// IPv6 header.
func addrOffset(v6, dst bool) uint32 {
	switch {
	case v6 && dst:
		return 24
	case v6:
		return 8
	case dst:
		return 16
	}
	return 12
}

func nfproto(v6 bool) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if v6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// daddrInSet matches packets (IPv6 ones when v6, else IPv4) whose
// destination is in the table's set of that name.
func daddrInSet(v6 bool, set string) []expr.Any {
	size := uint32(4)
	if v6 {
		size = 16
	}
	out := nfproto(v6)
	return append(out,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: addrOffset(v6, true), Len: size},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	)
}

func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// dport matches packets of the transport protocol proto (TCP or UDP) to
// port.
func dport(proto byte, port uint16) []expr.Any {
	return append(l4proto(proto),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	)
}

// dnatTo rewrites an IPv4 packet's destination to to.
func dnatTo(to netip.AddrPort) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: to.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

func jump(kind expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: kind, Chain: chain}}
}

func ctEstablishedOrRelated() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}
