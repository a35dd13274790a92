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
// here is final whatever other tables (Docker's, a host firewall) accept.
//
//	table inet <prefix> {
//	  chain input {            # hook input, priority filter, policy accept
//	    iifname <int-bridge> drop     # sessions never reach the host itself
//	    iifname <egr-bridge> drop
//	  }
//	  chain forward {          # hook forward, priority filter, policy accept
//	    iifname <int-bridge> oifname <int-bridge> accept   # internal <-> internal (bridged, br_netfilter)
//	    iifname <int-bridge> drop                          # internal: nothing beyond
//	    oifname <int-bridge> drop                          # nobody routes into internal
//	    iifname <egr-bridge> ip saddr <egress> accept      # egress out (and egress <-> egress, bridged)
//	    iifname <egr-bridge> drop                          # spoofed source, IPv6
//	    oifname <egr-bridge> ct state established,related accept
//	    oifname <egr-bridge> drop                          # no new connections in
//	  }
//	  chain postrouting {      # hook postrouting, priority srcnat, policy accept
//	    ip saddr <egress> oifname != <egr-bridge> masquerade
//	  }
//	}
//
// Traffic from a session to any address of the host arrives on the input
// hook through the session's bridge, whichever address it targets (the
// bridge's, loopback's, another interface's), so the input drops keep the
// host's services out of reach; the egress gateway only forwards.
//
// With br_netfilter on (net.bridge.bridge-nf-call-iptables=1, as here),
// frames bridged between two sessions of one bridge pass the forward hook
// too, with the bridge as both interfaces: hence the bridge-to-itself
// accepts. An accept, unlike a drop, is not final across tables: another
// table whose forward chain drops (Docker sets iptables' FORWARD policy to
// DROP) can still block internal traffic between sessions and egress
// forwarding; the fences (the drops) hold regardless.

func (m *Manager) nftTable() *nftables.Table {
	return &nftables.Table{Name: m.prefix, Family: nftables.TableFamilyINet}
}

// addTable installs the whole table in one atomic batch: either all of it
// exists afterwards or none of it. The caller holds m.infraMu.
func (m *Manager) addTable() error { return m.installTable(false) }

// installTable installs the whole table in one atomic batch; with replace,
// the table of that name that exists is deleted in the same batch, so that
// the rules change from the old to the new set with no moment without
// either. The caller holds m.infraMu or is New.
func (m *Manager) installTable(replace bool) error {
	c := m.nft
	if replace {
		c.DelTable(m.nftTable())
	}
	// Exclusive: appending the rules to a table of that name that someone
	// else made would double or mix them.
	table := c.CreateTable(m.nftTable())
	accept := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{
		Name: "input", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	forward := c.AddChain(&nftables.Chain{
		Name: "forward", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	post := c.AddChain(&nftables.Chain{
		Name: "postrouting", Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept,
	})
	intBr, egrBr := m.internal.bridge, m.egress.bridge
	egrNet := m.egress.subnet
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: all})
	}
	rule(input, iif(intBr), verdict(expr.VerdictDrop))
	rule(input, iif(egrBr), verdict(expr.VerdictDrop))

	rule(forward, iif(intBr), oif(intBr), verdict(expr.VerdictAccept))
	rule(forward, iif(intBr), verdict(expr.VerdictDrop))
	rule(forward, oif(intBr), verdict(expr.VerdictDrop))
	rule(forward, iif(egrBr), ipSaddrIn(egrNet), verdict(expr.VerdictAccept))
	rule(forward, iif(egrBr), verdict(expr.VerdictDrop))
	rule(forward, oif(egrBr), ctEstablishedOrRelated(), verdict(expr.VerdictAccept))
	rule(forward, oif(egrBr), verdict(expr.VerdictDrop))

	rule(post, ipSaddrIn(egrNet), oifNot(egrBr), []expr.Any{&expr.Masq{}})
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.EEXIST) && !replace {
			return fmt.Errorf("installing the nftables table inet %s: a table of that name exists already (is another Manager using the prefix %s?)", m.prefix, m.prefix)
		}
		return fmt.Errorf("installing the nftables table inet %s: %w", m.prefix, err)
	}
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
func ipSaddrIn(p netip.Prefix) []expr.Any {
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	network := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network[:]},
	}
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
