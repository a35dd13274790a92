// Package sessnettest is what tests of session networks share, as
// httptest is for HTTP: free address ranges picked once per process,
// network namespaces of the test's own, TCP and UDP test servers, and an
// [Upstream] standing for the internet beyond the host (a router with test
// hosts behind it on public-looking, private, shared and link-local
// addresses), which only the test's own egress subnets are routed to.
//
// Everything a helper makes is removed at the end of the test that made
// it (t.Cleanup), whether it passed or not. No helper sends anything
// beyond this machine: the test hosts live in namespaces the helpers make,
// and the host reaches them only through policy-routing rules from the
// egress subnets the test names, to a routing table of the test's own;
// the host's main table gains nothing but the prefix route of the veth to
// the router (a free /24 of 198.18.0.0/15, the benchmarking range).
//
// The helpers need root (network namespaces, links, rules); they fail the
// test (t.Fatal) when the machine refuses. They are safe for parallel
// tests.
package sessnettest

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// claimMu guards claimed: the ranges tests of this process picked, so
// that parallel tests never pick the same one.
var (
	claimMu sync.Mutex
	claimed []netip.Prefix
)

// Reserve marks ps as taken for FreePrefixes in this process: ranges a
// test uses without having picked them here (a network manager's fixed
// subnets, say), which no route covers yet.
func Reserve(ps ...netip.Prefix) {
	claimMu.Lock()
	defer claimMu.Unlock()
	claimed = append(claimed, ps...)
}

// FreePrefixes picks n distinct /bits prefixes inside within (IPv4) that
// overlap no route of the host (in any table) and none picked or
// reserved before in this process.
func FreePrefixes(t testing.TB, within netip.Prefix, bits, n int) []netip.Prefix {
	t.Helper()
	claimMu.Lock()
	defer claimMu.Unlock()
	routes, err := nsthread.RetryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		t.Fatalf("listing the host's routes: %v", err)
	}
	taken := slices.Clone(claimed)
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		if ip, ok := netip.AddrFromSlice(r.Dst.IP); ok && ones > 0 {
			taken = append(taken, netip.PrefixFrom(ip.Unmap(), ones))
		}
	}
	var out []netip.Prefix
	base := within.Masked().Addr().As4()
	bv := binary.BigEndian.Uint32(base[:])
	count := 1 << (bits - within.Bits())
	for tries := 0; len(out) < n && tries < 1000; tries++ {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], bv+uint32(rand.IntN(count))<<(32-bits))
		p := netip.PrefixFrom(netip.AddrFrom4(a), bits)
		if !slices.ContainsFunc(taken, p.Overlaps) && !slices.ContainsFunc(out, p.Overlaps) {
			out = append(out, p)
		}
	}
	if len(out) < n {
		t.Fatalf("no %d free /%d ranges in %s", n, bits, within)
	}
	claimed = append(claimed, out...)
	return out
}

// NewNetNS makes an anonymous network namespace with loopback up, held by
// the returned file, which is closed at the end of t (the kernel then
// destroys the namespace and the devices in it).
func NewNetNS(t testing.TB) *os.File {
	t.Helper()
	var ns *os.File
	err := nsthread.Locked(func() (bool, error) {
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return false, err
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("unshare: %w", err)
		}
		ns, err = os.Open("/proc/thread-self/ns/net")
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			return true, fmt.Errorf("returning the thread to its namespace: %w", serr)
		}
		return false, err
	})
	if err != nil {
		if ns != nil {
			ns.Close()
		}
		t.Fatalf("making a network namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	h := Handle(t, ns)
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("bringing loopback up in a new network namespace: %v", err)
	}
	return ns
}

// Handle opens a rtnetlink handle whose socket lives in the namespace ns,
// closed at the end of t.
func Handle(t testing.TB, ns *os.File) *netlink.Handle {
	t.Helper()
	var h *netlink.Handle
	err := nsthread.InNetNS(ns, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		t.Fatalf("rtnetlink in a network namespace: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

// Path names ns through this process's descriptor table, for helpers
// that take a namespace's path.
func Path(ns *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(ns.Fd())) }

// IPNet is p as the netlink package takes it.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Server is a TCP server that answers each connection with a line naming
// the address it saw the connection come from, then closes it, and
// records those addresses.
type Server struct {
	Addr netip.AddrPort

	ln net.Listener
	wg sync.WaitGroup
	mu sync.Mutex
	// from are the sources of the connections accepted so far.
	from []netip.Addr
}

// Serve serves ln until the end of t.
func Serve(t testing.TB, ln net.Listener) *Server {
	s := &Server{ln: ln, Addr: netip.MustParseAddrPort(ln.Addr().String())}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			from := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
			s.mu.Lock()
			s.from = append(s.from, from)
			s.mu.Unlock()
			s.wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprintf(c, "%s\n", from)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

// Accepted returns the sources of the connections accepted so far.
func (s *Server) Accepted() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.from)
}

// WaitAccepted waits up to d for at least n connections and returns the
// sources of all accepted so far.
func (s *Server) WaitAccepted(n int, d time.Duration) []netip.Addr {
	deadline := time.Now().Add(d)
	for {
		got := s.Accepted()
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Forget drops the sources recorded so far (after a control connection).
func (s *Server) Forget() {
	s.mu.Lock()
	s.from = nil
	s.mu.Unlock()
}

// Echo sends every datagram pc gets back to its sender, until the end of
// t; it returns pc's address.
func Echo(t testing.TB, pc net.PacketConn) netip.AddrPort {
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	})
	t.Cleanup(func() {
		pc.Close()
		wg.Wait()
	})
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// Dial connects to to from this process's network namespace and returns
// the source address a Server there saw.
func Dial(to netip.AddrPort, timeout time.Duration) (netip.Addr, error) {
	c, err := net.DialTimeout("tcp4", to.String(), timeout)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.Addr{}, fmt.Errorf("connected, but reading the answer: %w", err)
	}
	return netip.ParseAddr(strings.TrimSpace(line))
}
