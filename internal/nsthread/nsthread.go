// Package nsthread runs code on an OS thread of its own, in another
// network namespace or working directory when asked, and never lets a
// thread left in the wrong namespace or directory run anything else: the
// one copy of what the network manager, the host runner and their tests
// each need.
package nsthread

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Locked runs fn on a fresh goroutine locked to its OS thread and returns
// its error. When fn reports the thread tainted (its namespaces could not
// be restored), the goroutine exits still locked, so the runtime ends that
// thread instead of reusing it: no other goroutine ever runs on a thread
// left inside a session's namespace.
func Locked(fn func() (tainted bool, err error)) error {
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

// InNetNS runs fn on a thread inside the network namespace ns, then
// returns the thread to its own namespace; sockets fn makes belong to ns
// for life. A thread that cannot return is never reused.
func InNetNS(ns *os.File, fn func() error) error {
	return Locked(func() (bool, error) {
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return false, err
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("entering the network namespace: %w", err)
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			return true, fmt.Errorf("returning the thread to its namespace: %w", err)
		}
		return false, ferr
	})
}

// InDir runs fn on an OS thread of its own whose working directory is
// dir, the thread's alone (its filesystem attributes unshared from the
// process, whose own working directory stays): a process fn forks starts
// in dir. The thread enters dir with this process's credentials, so a
// process that takes other ones before its exec (a user's, through
// SysProcAttr.Credential, which Go applies before any chdir of its own)
// starts in a dir its user could not enter, as runc starts a container's
// process. fn may change the thread further (enter a namespace): the
// thread is never reused. A dir that cannot be entered is an error
// wrapping the chdir's.
func InDir(dir string, fn func() error) error {
	return Locked(func() (bool, error) {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return false, fmt.Errorf("unshare the thread's working directory: %w", err)
		}
		if err := unix.Chdir(dir); err != nil {
			return true, &os.PathError{Op: "chdir", Path: dir, Err: err}
		}
		return true, fn()
	})
}

// dumpRetries bounds the retries of a netlink dump that the kernel reports
// interrupted (the table changed under it, as parallel sessions and tests
// make it do).
const dumpRetries = 10

// RetryDump runs a netlink dump until the kernel reports it consistent,
// at most dumpRetries times more.
func RetryDump[T any](dump func() ([]T, error)) ([]T, error) {
	for i := 0; ; i++ {
		out, err := dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == dumpRetries {
			return out, err
		}
	}
}
