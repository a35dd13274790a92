package sessnet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"

	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nsID identifies a network namespace (the nsfs inode).
type nsID struct{ dev, ino uint64 }

func nsIDOf(f *os.File) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nsID{}, fmt.Errorf("stat of network namespace: %w", err)
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// threadNS reports the network namespace of the calling thread, which must
// be locked to its goroutine.
func threadNS() (nsID, error) {
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nsID{}, err
	}
	defer f.Close()
	return nsIDOf(f)
}

// netns is an anonymous network namespace held by a descriptor, with
// loopback up, IPv6 off for any device added later (so a session's veth
// carries IPv4 only and has no link-local address), and a rtnetlink handle
// whose socket lives inside it: configuring the namespace through h needs
// no thread switch.
type netns struct {
	f *os.File
	h *netlink.Handle
}

// newNetns makes a network namespace on a locked thread: unshare, open the
// new namespace, bring loopback up, open the rtnetlink socket in it, and
// return the thread to the namespace it started in. When that return fails
// the thread is never reused (see onLockedThread).
func newNetns() (*netns, error) {
	var ns *netns
	err := nsthread.Locked(func() (bool, error) {
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return false, fmt.Errorf("opening the thread's network namespace: %w", err)
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		n, cerr := configureCurrentNetns()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			n.close()
			return true, fmt.Errorf("restoring the thread's network namespace: %w", err)
		}
		if cerr != nil {
			n.close()
			return false, cerr
		}
		ns = n
		return false, nil
	})
	return ns, err
}

// configureCurrentNetns sets up the namespace the calling (locked) thread
// has just unshared into. On error it returns what it opened so far, for the
// caller to close after restoring the thread.
func configureCurrentNetns() (*netns, error) {
	n := &netns{}
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return n, fmt.Errorf("opening the new network namespace: %w", err)
	}
	n.f = f
	if err := loopbackUp(); err != nil {
		return n, err
	}
	// /proc/sys/net resolves to the namespace of the thread that opens it.
	err = os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0)
	if err != nil && !errors.Is(err, fs.ErrNotExist) { // no IPv6 in this kernel: nothing to turn off
		return n, fmt.Errorf("turning IPv6 off for new devices in the session's namespace: %w", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return n, fmt.Errorf("opening a rtnetlink socket in the session's namespace: %w", err)
	}
	n.h = h
	return n, nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing loopback up: %w", err)
	}
	return nil
}

// close releases the descriptors; the kernel destroys the namespace (and
// any device still in it) once nothing else holds it.
func (n *netns) close() {
	if n == nil {
		return
	}
	if n.h != nil {
		n.h.Close()
		n.h = nil
	}
	if n.f != nil {
		n.f.Close()
		n.f = nil
	}
}

// fdPath names the namespace through this process's descriptor table, for
// bind-mounting it.
func (n *netns) fdPath() string {
	return "/proc/self/fd/" + strconv.Itoa(int(n.f.Fd()))
}

// netnsPool keeps a few network namespaces made ahead, refilled by one
// background goroutine, so that Setup does not wait for the kernel to build
// one. The goroutine starts at the first take and stops at close. A pooled
// namespace is only a descriptor: if the process dies, the kernel reclaims
// it, so the pool never leaves anything behind.
type netnsPool struct {
	size   int
	start  sync.Once
	refill chan struct{}
	stop   chan struct{}
	done   chan struct{}

	mu     sync.Mutex
	ready  []*netns
	closed bool
}

func newNetnsPool(size int) *netnsPool {
	return &netnsPool{size: size, refill: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// take returns a namespace from the pool, or makes one when it is empty.
// Safe for concurrent use.
func (p *netnsPool) take() (*netns, error) {
	p.start.Do(func() { go p.fill() })
	p.mu.Lock()
	var ns *netns
	if n := len(p.ready); n > 0 {
		ns, p.ready = p.ready[n-1], p.ready[:n-1]
	}
	p.mu.Unlock()
	select {
	case p.refill <- struct{}{}:
	default:
	}
	if ns != nil {
		return ns, nil
	}
	return newNetns()
}

func (p *netnsPool) fill() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.refill:
		}
		for {
			p.mu.Lock()
			full := p.closed || len(p.ready) >= p.size
			p.mu.Unlock()
			if full {
				break
			}
			ns, err := newNetns()
			if err != nil {
				break // take makes its own and reports the error
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				ns.close()
				return
			}
			p.ready = append(p.ready, ns)
			p.mu.Unlock()
		}
	}
}

// close stops the refill goroutine and releases the namespaces made ahead.
// Idempotent.
func (p *netnsPool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	p.start.Do(func() { close(p.done) }) // never started: nothing to wait for
	close(p.stop)
	<-p.done
	for _, ns := range ready {
		ns.close()
	}
}
