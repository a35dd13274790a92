package sessnet

import (
	"fmt"
	"net/netip"
)

// leases hands out the session addresses of one IPv4 subnet. The first host
// address is the bridge's (the gateway) and never leased; the network and
// broadcast addresses are never leased either. Allocation is next-fit, so a
// freed address is not handed out again until the others have been, which
// keeps stale neighbour entries in other sessions from pointing at a new
// owner. Not safe for concurrent use: the Manager guards it.
type leases struct {
	subnet  netip.Prefix
	gateway netip.Addr
	first   netip.Addr // lowest leasable
	last    netip.Addr // highest leasable
	next    netip.Addr // where the next search starts
	used    map[netip.Addr]struct{}
	size    int // number of leasable addresses
}

// newLeases prepares the leases of subnet, which must be a masked IPv4
// prefix of length 30 or less (validated by the caller).
func newLeases(subnet netip.Prefix) *leases {
	network := subnet.Addr()
	gateway := network.Next()
	bcast := lastAddr(subnet)
	l := &leases{
		subnet:  subnet,
		gateway: gateway,
		first:   gateway.Next(),
		last:    bcast.Prev(),
		used:    map[netip.Addr]struct{}{},
	}
	l.next = l.first
	l.size = 1<<(32-subnet.Bits()) - 3
	return l
}

// lastAddr is the highest address of a prefix (for IPv4, its broadcast).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// take leases a free address, or says the subnet is full.
func (l *leases) take() (netip.Addr, error) {
	if len(l.used) >= l.size {
		return netip.Addr{}, fmt.Errorf("no free address left in %s: all %d are leased to live sessions", l.subnet, l.size)
	}
	a := l.next
	for {
		if _, busy := l.used[a]; !busy {
			break
		}
		a = l.step(a)
	}
	l.used[a] = struct{}{}
	l.next = l.step(a)
	return a, nil
}

func (l *leases) step(a netip.Addr) netip.Addr {
	if a == l.last {
		return l.first
	}
	return a.Next()
}

// claim leases a, an address found in use (a network adopted from an
// earlier run). The next search starts after the highest address claimed.
// It errs when a is not leasable in the subnet or is leased already.
func (l *leases) claim(a netip.Addr) error {
	if !l.subnet.Contains(a) || a.Less(l.first) || l.last.Less(a) {
		return fmt.Errorf("%s is not an address %s leases (it is the network, gateway or broadcast address, or outside it)", a, l.subnet)
	}
	if _, busy := l.used[a]; busy {
		return fmt.Errorf("%s is leased already (to another kept session)", a)
	}
	l.used[a] = struct{}{}
	if !a.Less(l.next) {
		l.next = l.step(a)
	}
	return nil
}

// release returns a to the pool; releasing a free address does nothing.
func (l *leases) release(a netip.Addr) {
	delete(l.used, a)
}

// inUse is how many addresses are leased.
func (l *leases) inUse() int { return len(l.used) }
