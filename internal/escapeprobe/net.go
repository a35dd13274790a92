//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The network subcommands. Each that sends something reports how long
// the attempt took, measured here (took=DURATION in detail), so that a
// refusal's speed is not blurred by the exec around the probe.

// took is d as detail reports it.
func took(d time.Duration) string { return "took=" + d.String() }

func dial(addr string) result {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	d := time.Since(start)
	if err != nil {
		return single(err, took(d))
	}
	detail := fmt.Sprintf("%s -> %s %s", c.LocalAddr(), c.RemoteAddr(), took(d))
	c.Close()
	return single(nil, detail)
}

// udpEcho sends a datagram to addr on a connected socket and waits for it
// to come back (an echo server): ok when it does; ECONNREFUSED or
// EHOSTUNREACH when an ICMP error came instead, timeout on silence.
func udpEcho(addr string) result {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return single(err, "")
	}
	defer c.Close()
	token := fmt.Sprintf("escapeprobe-%d", time.Now().UnixNano())
	start := time.Now()
	if _, err := c.Write([]byte(token)); err != nil {
		return single(err, took(time.Since(start)))
	}
	_ = c.SetReadDeadline(time.Now().Add(dialTimeout))
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return single(err, took(time.Since(start)))
		}
		if string(buf[:n]) == token {
			return single(nil, fmt.Sprintf("echoed by %s %s", c.RemoteAddr(), took(time.Since(start))))
		}
	}
}

// ping sends an ICMP echo request to the IPv4 ADDR on an ICMP datagram
// socket (what ping(8) uses without CAP_NET_RAW; the namespace's
// net.ipv4.ping_group_range decides who may open one) and waits for the
// reply.
func ping(addr string) result {
	dst, err := netip.ParseAddr(addr)
	if err != nil || !dst.Is4() {
		usage(fmt.Sprintf("bad IPv4 ADDR %q", addr))
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return single(err, "socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)")
	}
	defer unix.Close(fd)
	req := []byte{8, 0, 0, 0, 0, 0, 0, 1, 't', 'a', 'i', '4', '2'} // the kernel sets the id and checksum
	start := time.Now()
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
		return single(err, took(time.Since(start)))
	}
	tv := unix.NsecToTimeval(dialTimeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 512)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return result{Err: "timeout", Detail: took(time.Since(start))}
		case err != nil:
			return single(err, took(time.Since(start)))
		case n >= 8 && buf[0] == 0:
			return single(nil, "echo reply "+took(time.Since(start)))
		}
	}
}

// dnsQuery asks SERVER (host:port; the first nameserver of
// /etc/resolv.conf, port 53, when absent) for NAME's A records over UDP:
// ok when the answer is NOERROR with at least one address. detail:
// rcode=NAME addrs=A,B took=DURATION. ARG is NAME or NAME@SERVER, and
// NAME@SERVER*N (or NAME*N) asks N times in a row, detail then listing
// each query's took= (the rest from the last).
func dnsQuery(arg string) result {
	times := 1
	if i := strings.LastIndexByte(arg, '*'); i >= 0 {
		n, err := strconv.Atoi(arg[i+1:])
		if err != nil || n < 1 {
			usage(fmt.Sprintf("bad repetition in %q", arg))
		}
		times, arg = n, arg[:i]
	}
	name, server, _ := strings.Cut(arg, "@")
	if server == "" {
		cfg, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return single(err, "reading /etc/resolv.conf")
		}
		if len(cfg.Servers) == 0 {
			return result{Err: "no nameserver in /etc/resolv.conf"}
		}
		server = net.JoinHostPort(cfg.Servers[0], cfg.Port)
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: dialTimeout}
	var tooks []string
	var r *dns.Msg
	var err error
	for range times {
		start := time.Now()
		r, _, err = c.Exchange(q, server)
		tooks = append(tooks, took(time.Since(start)))
		if err != nil {
			return single(err, strings.Join(tooks, " "))
		}
	}
	var addrs []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			addrs = append(addrs, a.A.String())
		}
	}
	detail := fmt.Sprintf("rcode=%s addrs=%s %s", dns.RcodeToString[r.Rcode], strings.Join(addrs, ","), strings.Join(tooks, " "))
	switch {
	case r.Rcode != dns.RcodeSuccess:
		return result{Err: "rcode " + dns.RcodeToString[r.Rcode], Detail: detail}
	case len(addrs) == 0:
		return result{Err: "no address in the answer", Detail: detail}
	}
	return single(nil, detail)
}

// resolve looks NAME up with Go's resolver (pure Go in this static
// binary: /etc/resolv.conf, /etc/hosts): detail lists the addresses.
func resolve(name string) result {
	ctx, cancel := context.WithTimeout(context.Background(), 2*dialTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", name)
	if err != nil {
		return single(err, "")
	}
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return single(nil, strings.Join(s, ","))
}

// download connects to ADDR and reads until EOF, discarding: detail
// bytes=N took=DURATION (from before the connect to the last byte).
func download(addr string) result {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return single(err, took(time.Since(start)))
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	n, err := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
	return single(err, fmt.Sprintf("bytes=%d %s", n, took(time.Since(start))))
}

// nftables asks the kernel's nftables, over a NETLINK_NETFILTER socket
// (which needs CAP_NET_ADMIN over the network namespace), for its tables,
// then to delete the inet table TABLE. Items: list=OK|ERRNO (detail adds
// tables=NAMES when the list came back) and delete=OK|ERRNO. A delete
// that succeeds removes the table of the probe's own namespace, never the
// host's.
func nftables(table string) result {
	var a attempts
	names, err := nftListTables()
	a.add("list", err)
	err = nftDeleteTable(table)
	a.add("delete", err)
	r := a.result()
	if names != nil {
		r.Detail += " tables=" + strings.Join(names, ",")
	}
	return r
}

const nfgenLen = 4 // struct nfgenmsg

// nfMsg is one netlink message of the nftables subsystem.
func nfMsg(typ, flags uint16, seq uint32, family byte, resID uint16, attrs []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+nfgenLen, unix.NLMSG_HDRLEN+nfgenLen+len(attrs))
	b = append(b, attrs...)
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], flags)
	binary.NativeEndian.PutUint32(b[8:12], seq)
	b[16] = family
	b[17] = unix.NFNETLINK_V0
	binary.BigEndian.PutUint16(b[18:20], resID)
	return b
}

// nlAttr is a netlink attribute holding a NUL-terminated string.
func nlAttr(typ uint16, s string) []byte {
	l := unix.SizeofRtAttr + len(s) + 1
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:2], uint16(l))
	binary.NativeEndian.PutUint16(b[2:4], typ)
	copy(b[4:], s)
	return b
}

func nfSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, err
	}
	tv := unix.NsecToTimeval(dialTimeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// nfExchange sends req and reads the replies until the dump's end or the
// acknowledgement of seq: it returns the data messages, or the errno an
// error message carried.
func nfExchange(fd int, req []byte, seq uint32) ([]nlMessage, error) {
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out []nlMessage
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return out, err
		}
		msgs, err := parseNetlink(buf[:n])
		if err != nil {
			return out, err
		}
		for _, m := range msgs {
			switch m.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return out, errors.New("a short netlink error message")
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					return out, unix.Errno(-code)
				}
				if m.Seq == seq {
					return out, nil
				}
			default:
				out = append(out, m)
			}
		}
	}
}

// nlMessage is one parsed netlink message.
type nlMessage struct {
	Type uint16
	Seq  uint32
	Data []byte
}

func parseNetlink(b []byte) ([]nlMessage, error) {
	var out []nlMessage
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return out, errors.New("a malformed netlink message")
		}
		out = append(out, nlMessage{
			Type: binary.NativeEndian.Uint16(b[4:6]),
			Seq:  binary.NativeEndian.Uint32(b[8:12]),
			Data: b[unix.NLMSG_HDRLEN:l],
		})
		b = b[min((l+3)&^3, len(b)):]
	}
	return out, nil
}

func nftListTables() ([]string, error) {
	fd, err := nfSocket()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	req := nfMsg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETTABLE, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, 1, unix.AF_UNSPEC, 0, nil)
	msgs, err := nfExchange(fd, req, 1)
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, m := range msgs {
		if len(m.Data) < nfgenLen {
			continue
		}
		attrs := m.Data[nfgenLen:]
		for len(attrs) >= unix.SizeofRtAttr {
			l := int(binary.NativeEndian.Uint16(attrs[0:2]))
			typ := binary.NativeEndian.Uint16(attrs[2:4]) &^ unix.NLA_F_NESTED
			if l < unix.SizeofRtAttr || l > len(attrs) {
				break
			}
			if typ == unix.NFTA_TABLE_NAME {
				names = append(names, strings.TrimRight(string(attrs[4:l]), "\x00"))
			}
			attrs = attrs[min((l+3)&^3, len(attrs)):]
		}
	}
	return names, nil
}

// nftDeleteTable deletes the inet table name, in a batch (as nftables
// takes every change).
func nftDeleteTable(name string) error {
	fd, err := nfSocket()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var req []byte
	req = append(req, nfMsg(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, 1, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)...)
	req = append(req, nfMsg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_DELTABLE, unix.NLM_F_REQUEST|unix.NLM_F_ACK, 2, unix.NFPROTO_INET, 0,
		nlAttr(unix.NFTA_TABLE_NAME, name))...)
	req = append(req, nfMsg(unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, 3, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)...)
	_, err = nfExchange(fd, req, 2)
	return err
}

// routing tries to change the namespace's routing as a session bypassing
// its gateway would: add a route (192.0.2.0/24, TEST-NET-1, on eth0), an
// address (192.0.2.1/32 on eth0) and a policy rule (from 192.0.2.0/24 to
// table 100), and bring eth0 down and up. Each change that succeeds is
// undone.
func routing(string) result {
	var a attempts
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		a.add("eth0", err)
		return a.result()
	}
	testNet := &net.IPNet{IP: net.IPv4(192, 0, 2, 0).To4(), Mask: net.CIDRMask(24, 32)}
	route := &netlink.Route{Dst: testNet, LinkIndex: eth0.Attrs().Index}
	err = netlink.RouteAdd(route)
	if err == nil {
		_ = netlink.RouteDel(route)
	}
	a.add("route-add", err)
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(192, 0, 2, 1).To4(), Mask: net.CIDRMask(32, 32)}}
	err = netlink.AddrAdd(eth0, addr)
	if err == nil {
		_ = netlink.AddrDel(eth0, addr)
	}
	a.add("addr-add", err)
	rule := netlink.NewRule()
	rule.Src = testNet
	rule.Table = 100
	err = netlink.RuleAdd(rule)
	if err == nil {
		_ = netlink.RuleDel(rule)
	}
	a.add("rule-add", err)
	// Setting the link up again, as it is: what a session needs to
	// re-address it.
	a.add("link-set-up", netlink.LinkSetUp(eth0))
	return a.result()
}

// spoof tries to send UDP to DST (host:port) from SRC (an address not the
// session's), arg SRC>DST: bound with IP_FREEBIND (needs no privilege),
// and with IP_TRANSPARENT (needs CAP_NET_ADMIN or CAP_NET_RAW). Items:
// freebind-send, transparent; ok when any send went out of the socket.
func spoof(arg string) result {
	s, d, ok := strings.Cut(arg, ">")
	src, err1 := netip.ParseAddr(s)
	dst, err2 := netip.ParseAddrPort(d)
	if !ok || err1 != nil || err2 != nil || !src.Is4() || !dst.Addr().Is4() {
		usage(fmt.Sprintf("bad SRC>DST %q", arg))
	}
	var a attempts
	send := func(opt int) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_IP, opt, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: src.As4()}); err != nil {
			return err
		}
		return unix.Sendto(fd, []byte("escapeprobe-spoof"), 0, &unix.SockaddrInet4{Addr: dst.Addr().As4(), Port: int(dst.Port())})
	}
	a.add("freebind-send", send(unix.IP_FREEBIND))
	a.add("transparent", send(unix.IP_TRANSPARENT))
	return a.result()
}
