// Package flock takes flock(2) locks on files, retrying a call a signal
// interrupted: the one copy of what the session locks, the image store and
// the CLI's state directory each need.
package flock

import (
	"context"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Lock takes the lock how asks for (unix.LOCK_SH or LOCK_EX, with
// LOCK_NB not to wait) on f, retrying on EINTR. A lock held elsewhere
// with LOCK_NB is unix.EWOULDBLOCK.
func Lock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

// TryExclusive opens (creating, mode 0600) the lock file path and takes
// an exclusive lock on it without waiting, held until the file is closed
// or the process ends. A lock held elsewhere is unix.EWOULDBLOCK, the file
// closed.
func TryExclusive(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := Lock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close() // the lock's error is the one to report
		return nil, err
	}
	return f, nil
}

// pollInterval is how often LockContext tries again.
const pollInterval = 100 * time.Millisecond

// LockContext takes the lock how asks for (unix.LOCK_SH or LOCK_EX) on f,
// waiting while it is held elsewhere until ctx is done: then it returns
// ctx's cause. flock(2) cannot be cancelled, so it tries without waiting
// (LOCK_NB), every pollInterval.
func LockContext(ctx context.Context, f *os.File, how int) error {
	for {
		err := Lock(f, how|unix.LOCK_NB)
		if err != unix.EWOULDBLOCK {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(pollInterval):
		}
	}
}
