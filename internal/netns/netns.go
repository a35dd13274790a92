// Package netns makes anonymous network namespaces held by a descriptor,
// and keeps a few made ahead: the one copy of what the network manager
// (internal/sessnet) and the host runner's network "none" each need. A
// namespace here is only a descriptor: when the process dies the kernel
// reclaims it, so nothing here can leave anything behind.
//
// Every switch of a thread's namespace runs through [nsthread.Locked],
// which never lets a thread that could not return run anything else.
package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Options say what a new namespace gets beyond its loopback, which is
// always up.
type Options struct {
	// Netlink opens a rtnetlink socket inside the namespace ([NS.Netlink]),
	// so that configuring it needs no thread switch.
	Netlink bool
	// NoIPv6 turns IPv6 off for any device added later, so that a veth
	// given to the namespace carries IPv4 only and has no link-local
	// address. Loopback, there from the start, keeps ::1.
	NoIPv6 bool
}

// NS is a network namespace held open by a descriptor, with a rtnetlink
// socket inside it when it was asked for.
type NS struct {
	f *os.File
	h *netlink.Handle
}

// New makes a network namespace on a locked thread: unshare, open the new
// namespace, configure it as o says, and return the thread to the
// namespace it started in. A thread that cannot return is never reused.
func New(o Options) (*NS, error) {
	var ns *NS
	err := nsthread.Locked(func() (bool, error) {
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return false, fmt.Errorf("opening the thread's network namespace: %w", err)
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		n, cerr := configureCurrent(o)
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			n.Close()
			return true, fmt.Errorf("restoring the thread's network namespace: %w", err)
		}
		if cerr != nil {
			n.Close()
			return false, cerr
		}
		ns = n
		return false, nil
	})
	return ns, err
}

// configureCurrent sets up the namespace the calling (locked) thread has
// just unshared into. On error it returns what it opened so far, for the
// caller to close after restoring the thread.
func configureCurrent(o Options) (*NS, error) {
	n := &NS{}
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return n, fmt.Errorf("opening the new network namespace: %w", err)
	}
	n.f = f
	if err := loopbackUp(); err != nil {
		return n, err
	}
	if o.NoIPv6 {
		// /proc/sys/net resolves to the namespace of the thread that opens it.
		err = os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) { // no IPv6 in this kernel: nothing to turn off
			return n, fmt.Errorf("turning IPv6 off for new devices in the session's namespace: %w", err)
		}
	}
	if o.Netlink {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return n, fmt.Errorf("opening a rtnetlink socket in the session's namespace: %w", err)
		}
		n.h = h
	}
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

// Open takes f, a network namespace opened elsewhere (a bind-mounted
// namespace file), and opens a rtnetlink socket inside it. f is the NS's
// from then on, closed with it, or on error. An f that holds another
// kind of namespace is an error matching [unix.EINVAL].
func Open(f *os.File) (*NS, error) {
	ns := &NS{f: f}
	err := nsthread.InNetNS(f, func() error {
		var err error
		if ns.h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("opening a rtnetlink socket in the namespace: %w", err)
		}
		return nil
	})
	if err != nil {
		ns.Close()
		return nil, err
	}
	return ns, nil
}

// File is the descriptor holding the namespace, for setns or
// netlink.NsFd; it stays the NS's.
func (n *NS) File() *os.File { return n.f }

// Netlink is the rtnetlink socket inside the namespace, nil unless it was
// asked for ([Options.Netlink], [Open]).
func (n *NS) Netlink() *netlink.Handle { return n.h }

// FdPath names the namespace through this process's descriptor table, for
// bind-mounting it.
func (n *NS) FdPath() string {
	return "/proc/self/fd/" + strconv.Itoa(int(n.f.Fd()))
}

// Enter moves the calling thread, which must be locked to its goroutine,
// into the namespace. The caller owns returning it (or tainting it).
func (n *NS) Enter() error {
	if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering the session's network namespace: %w", err)
	}
	return nil
}

// Run calls start with the calling thread inside the namespace, so that a
// process it forks is born there, then returns the thread to home.
func (n *NS) Run(home *os.File, start func() error) error {
	return nsthread.Locked(func() (bool, error) {
		if err := n.Enter(); err != nil {
			return false, err
		}
		serr := start()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			return true, fmt.Errorf("restoring the thread's network namespace: %w", err)
		}
		return false, serr
	})
}

// Close releases the descriptors; the kernel destroys the namespace (and
// any device still in it) once nothing else holds it. Idempotent, and a
// nil NS is closed already.
func (n *NS) Close() {
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
