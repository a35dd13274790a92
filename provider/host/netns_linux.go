package host

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// netns is a network namespace held open by a file descriptor: no mount,
// nothing to clean up but the descriptor.
type netns struct {
	f *os.File
}

// probeNetns opens the host's network namespace and proves a new one can be
// made here; the error says why not.
func probeNetns() (*os.File, error) {
	host, err := os.Open("/proc/self/ns/net")
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

// onLockedThread runs fn on a fresh goroutine locked to its OS thread and
// returns its error. When fn reports that the thread's namespaces could not
// be restored (tainted), the goroutine exits still locked, so the runtime
// ends that thread instead of reusing it.
func onLockedThread(fn func() (tainted bool, err error)) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tainted, err := fn()
		errc <- err
		if !tainted {
			runtime.UnlockOSThread()
		}
	}()
	return <-errc
}

// newNetns makes a network namespace with loopback up.
func newNetns() (*netns, error) {
	var ns *netns
	err := onLockedThread(func() (bool, error) {
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
	return onLockedThread(func() (bool, error) {
		if err := unix.Setns(int(ns.f.Fd()), unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("entering the session's network namespace: %w", err)
		}
		serr := start()
		if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); err != nil {
			return true, fmt.Errorf("restoring the thread's network namespace: %w", err)
		}
		return false, serr
	})
}

func (ns *netns) close() {
	if ns != nil && ns.f != nil {
		ns.f.Close()
	}
}
