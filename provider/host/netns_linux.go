package host

import (
	"fmt"
	"os"
	"sync"

	"github.com/tai42/sandbox/internal/nsthread"

	"golang.org/x/sys/unix"
)

// netns is a network namespace held open by a file descriptor: no mount,
// nothing to clean up but the descriptor.
type netns struct {
	f *os.File
}

// probeNetns opens the host's network namespace and proves a new one can be
// made here; the error says why not.
//
// The host's namespace is read from a thread of our own, locked while it
// reads: /proc/self names the main thread, which may at that moment be
// running another sandbox's namespace setup, and recording that throwaway
// namespace as the host's would later send threads back into it.
func probeNetns() (*os.File, error) {
	var host *os.File
	err := nsthread.Locked(func() (bool, error) {
		var err error
		host, err = os.Open("/proc/thread-self/ns/net")
		return false, err
	})
	if err != nil {
		return nil, err
	}
	ns, err := newNetns()
	if err != nil {
		host.Close()
		return nil, err
	}
	ns.close()
	return host, nil
}

// newNetns makes a network namespace with loopback up.
func newNetns() (*netns, error) {
	var ns *netns
	err := nsthread.Locked(func() (bool, error) {
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return false, err
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		f, ferr := os.Open("/proc/thread-self/ns/net")
		if ferr == nil {
			ferr = loopbackUp()
		}
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			if f != nil {
				f.Close()
			}
			return true, fmt.Errorf("restoring the thread's network namespace: %w", err)
		}
		if ferr != nil {
			if f != nil {
				f.Close()
			}
			return false, ferr
		}
		ns = &netns{f: f}
		return false, nil
	})
	return ns, err
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
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// run calls start with the calling thread inside the namespace, so that a
// process it forks is born there, then returns the thread to host.
func (ns *netns) run(host *os.File, start func() error) error {
	return nsthread.Locked(func() (bool, error) {
		if err := ns.enter(); err != nil {
			return false, err
		}
		serr := start()
		if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); err != nil {
			return true, fmt.Errorf("restoring the thread's network namespace: %w", err)
		}
		return false, serr
	})
}

// enter moves the calling thread, which must be locked to its goroutine,
// into the namespace.
func (ns *netns) enter() error {
	if err := unix.Setns(int(ns.f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering the session's network namespace: %w", err)
	}
	return nil
}

func (ns *netns) close() {
	if ns != nil && ns.f != nil {
		ns.f.Close()
	}
}

// netnsPool keeps a few network namespaces made ahead, refilled by one
// background goroutine, so that creating a session with network "none" does
// not wait for the kernel to build one (most of a create's cost otherwise).
// The goroutine starts at the first take and stops at close.
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

func (p *netnsPool) close() {
	p.mu.Lock()
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
