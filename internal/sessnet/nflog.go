package sessnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ErrNoNFLOG is wrapped by New's error when Config.OnBlocked is set but the
// kernel's NFLOG (nfnetlink_log) cannot be used: a daemon can then run
// without the hook, the counters of Blocked still work.
var ErrNoNFLOG = errors.New("sessnet: the kernel's NFLOG (nfnetlink_log) is not usable, so blocked attempts cannot be reported (Blocked still counts them)")

// nfnetlink_log's protocol (linux/netfilter/nfnetlink_log.h), which
// x/sys/unix does not define.
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd     = 1
	nfulaCfgMode    = 2
	nfulaCfgQthresh = 5

	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2

	nfulaPayload = 9
	nfulaPrefix  = 10
)

// NFLOG groups the Manager draws from: away from the low numbers other
// software (ulogd) uses by default.
const (
	logGroupBase  = 0x1000
	logGroupSpan  = 0x10000 - logGroupBase
	logGroupTries = 64
)

// nflog is the Manager's NFLOG socket, bound to a group of its own, and
// the goroutine that reads it.
type nflog struct {
	conn  *netlink.Conn
	group uint16
	wg    sync.WaitGroup
}

// openNFLOG binds an NFLOG group in the host's namespace: the first free
// one from a hash of the prefix on, so that two Managers (two prefixes) do
// not share one, and a collision of hashes does not either.
func (m *Manager) openNFLOG() (*nflog, error) {
	var l *nflog
	err := m.inHost(func() error {
		conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return fmt.Errorf("opening an nfnetlink socket: %w", err)
		}
		h := fnv.New32a()
		h.Write([]byte(m.prefix))
		start := h.Sum32() % logGroupSpan
		for i := range uint32(logGroupTries) {
			group := uint16(logGroupBase + (start+i)%logGroupSpan)
			err = nflogConfig(conn, group, []byte{nfulnlCfgCmdBind}, nfulaCfgCmd)
			if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EPERM) {
				continue // another socket has that group
			}
			if err != nil {
				break
			}
			mode := binary.BigEndian.AppendUint32(nil, logSnaplen)
			mode = append(mode, nfulnlCopyPacket, 0)
			if err = nflogConfig(conn, group, mode, nfulaCfgMode); err != nil {
				break
			}
			// Each packet at once, not batched until a timeout.
			if err = nflogConfig(conn, group, binary.BigEndian.AppendUint32(nil, 1), nfulaCfgQthresh); err != nil {
				break
			}
			l = &nflog{conn: conn, group: group}
			return nil
		}
		conn.Close()
		if err == nil {
			err = fmt.Errorf("the %d NFLOG groups tried from %d on are all taken", logGroupTries, logGroupBase+start)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoNFLOG, err)
	}
	return l, nil
}

// nflogConfig sends one configuration attribute for group and waits for
// the kernel's answer.
func nflogConfig(conn *netlink.Conn, group uint16, data []byte, attr uint16) error {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(attr, data)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(group >> 8), byte(group)}
	_, err = conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: append(hdr, attrs...),
	})
	return err
}

// run reads the logged packets until the socket is closed and reports each
// to m.onBlocked, on this one goroutine.
func (l *nflog) run(m *Manager) {
	l.wg.Go(func() {
		for {
			msgs, err := l.conn.Receive()
			if err != nil {
				if errors.Is(err, unix.ENOBUFS) {
					continue // the hook fell behind: those reports are lost, the counters are not
				}
				return // closed
			}
			for _, msg := range msgs {
				if b, ok := m.parseNFLOG(msg); ok {
					m.onBlocked(b)
				}
			}
		}
	})
}

// close closes the socket (which unbinds the group) and waits for the
// reading goroutine.
func (l *nflog) close() {
	if l == nil {
		return
	}
	l.conn.Close()
	l.wg.Wait()
}

// parseNFLOG makes a Blocked of one logged packet of this Manager's.
func (m *Manager) parseNFLOG(msg netlink.Message) (Blocked, bool) {
	if msg.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) || len(msg.Data) < 4 {
		return Blocked{}, false
	}
	ad, err := netlink.NewAttributeDecoder(msg.Data[4:])
	if err != nil {
		return Blocked{}, false
	}
	var prefix string
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			prefix = strings.TrimRight(string(ad.Bytes()), "\x00")
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	reason, ok := strings.CutPrefix(prefix, m.logPrefix(""))
	if ad.Err() != nil || !ok || reason == "" {
		return Blocked{}, false
	}
	b, ok := parsePacket(payload)
	if !ok {
		return Blocked{}, false
	}
	b.Reason = reason
	b.Session = m.sessionOf(b.Src)
	return b, true
}

// parsePacket reads the addresses, protocol and destination port of an
// IPv4 or IPv6 packet's headers.
func parsePacket(p []byte) (Blocked, bool) {
	var b Blocked
	var proto byte
	var l4 []byte
	var dst netip.Addr
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		ihl := int(p[0]&0x0f) * 4
		proto = p[9]
		b.Src = netip.AddrFrom4([4]byte(p[12:16]))
		dst = netip.AddrFrom4([4]byte(p[16:20]))
		if ihl >= 20 && len(p) >= ihl {
			l4 = p[ihl:]
		}
	case len(p) >= 40 && p[0]>>4 == 6:
		proto = p[6]
		b.Src = netip.AddrFrom16([16]byte(p[8:24]))
		dst = netip.AddrFrom16([16]byte(p[24:40]))
		l4 = p[40:]
	default:
		return b, false
	}
	var port uint16
	switch proto {
	case unix.IPPROTO_TCP:
		b.Proto = "tcp"
	case unix.IPPROTO_UDP:
		b.Proto = "udp"
	case unix.IPPROTO_ICMP:
		b.Proto = "icmp"
	case unix.IPPROTO_ICMPV6:
		b.Proto = "icmpv6"
	default:
		b.Proto = strconv.Itoa(int(proto))
	}
	if (proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP || proto == unix.IPPROTO_SCTP) && len(l4) >= 4 {
		port = binary.BigEndian.Uint16(l4[2:4])
	}
	b.Dst = netip.AddrPortFrom(dst, port)
	return b, true
}

// sessionOf is the id of the egress session with address a, or "".
func (m *Manager) sessionOf(a netip.Addr) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, n := range m.nets {
		if n.tier == m.egress && n.addr == a {
			return id
		}
	}
	return ""
}
