package sessnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostNetworks lists the host's own networks: every address of every
// interface of its namespace, with the subnet it is on (and a
// point-to-point address's peer network), split by family.
func (m *Manager) hostNetworks() (v4, v6 []netip.Prefix, err error) {
	addrs, err := nsthread.RetryDump(func() ([]netlink.Addr, error) { return m.host.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing the host's addresses: %w", err)
	}
	var all []netip.Prefix
	add := func(n *net.IPNet) {
		if n == nil {
			return
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			return
		}
		ip = ip.Unmap()
		bits, _ := n.Mask.Size()
		all = append(all, netip.PrefixFrom(ip, ip.BitLen()), netip.PrefixFrom(ip, bits).Masked())
	}
	for _, a := range addrs {
		add(a.IPNet)
		add(a.Peer)
	}
	v4, v6 = byFamily(all)
	return v4, v6, nil
}

// syncHostNets replaces the elements of the sets host4 and host6 with the
// host's current networks, in one transaction. Nothing to do while there
// is no table (its installation fills them).
func (m *Manager) syncHostNets() error {
	m.infraMu.Lock()
	defer m.infraMu.Unlock()
	if !m.tableUp {
		return nil
	}
	v4, v6, err := m.hostNetworks()
	if err != nil {
		return err
	}
	c := m.nft
	for name, ps := range map[string][]netip.Prefix{setHost4: v4, setHost6: v6} {
		s := m.nftSet(name)
		c.FlushSet(s)
		if len(ps) > 0 {
			if err := c.SetAddElements(s, intervalElements(ps)); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // removed behind our back: the next Setup reinstalls it, filled
		}
		return fmt.Errorf("updating the host's networks in the nftables table inet %s: %w", m.prefix, err)
	}
	return nil
}

// hostNetRetry is how soon a failed update of the host's networks, or a
// subscription to their changes that ended, is tried again.
const hostNetRetry = time.Second

// watchAddrs keeps the sets host4 and host6 current until stop is closed:
// it subscribes to the host's address changes and, after each burst of
// them, replaces the sets' elements. A subscription that ends (the
// kernel's queue overflowed) is made again, followed by a full update, so
// no change is missed for long. It closes done when it returns.
func (m *Manager) watchAddrs(sub *addrSub, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var retry <-chan time.Time
	for {
		var events <-chan netlink.AddrUpdate
		if sub != nil {
			events = sub.ch
		}
		select {
		case <-stop:
			sub.close()
			return
		case _, ok := <-events:
			if !ok {
				sub.close()
				sub = nil
				retry = time.After(hostNetRetry)
				continue
			}
			// One update for a burst of changes.
			for drained := false; !drained; {
				select {
				case _, ok := <-events:
					drained = !ok
				default:
					drained = true
				}
			}
		case <-retry:
			retry = nil
			if sub == nil {
				s, err := m.subscribeAddrs()
				if err != nil {
					retry = time.After(hostNetRetry)
					continue
				}
				sub = s
			}
		}
		if err := m.syncHostNets(); err != nil {
			retry = time.After(hostNetRetry)
		}
	}
}

// addrSub is a subscription to the host's address changes.
type addrSub struct {
	ch   chan netlink.AddrUpdate
	done chan struct{}
}

// subscribeAddrs subscribes to the address changes of the host's
// namespace.
func (m *Manager) subscribeAddrs() (*addrSub, error) {
	s := &addrSub{ch: make(chan netlink.AddrUpdate, 64), done: make(chan struct{})}
	err := m.inHost(func() error {
		return netlink.AddrSubscribeWithOptions(s.ch, s.done, netlink.AddrSubscribeOptions{ReceiveBufferSize: 1 << 20})
	})
	if err != nil {
		return nil, fmt.Errorf("subscribing to the host's address changes: %w", err)
	}
	return s, nil
}

// close ends the subscription and waits for its goroutine to finish.
func (s *addrSub) close() {
	if s == nil {
		return
	}
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	for range s.ch {
	}
}
