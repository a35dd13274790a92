package flock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTryExclusive: the first holder gets the lock; a second open of the
// file is refused with EWOULDBLOCK while it is held, and gets it once the
// first closes. Shared locks go together, and exclude an exclusive one.
func TestTryExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	f, err := TryExclusive(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the lock file: %v, %v; want it made with mode 0600", fi, err)
	}
	if g, err := TryExclusive(path); !errors.Is(err, unix.EWOULDBLOCK) {
		if g != nil {
			g.Close()
		}
		t.Fatalf("a second TryExclusive while held = %v; want EWOULDBLOCK", err)
	}
	f.Close()
	g, err := TryExclusive(path)
	if err != nil {
		t.Fatalf("TryExclusive after the holder closed: %v", err)
	}
	g.Close()

	a, _ := os.Open(path)
	b, _ := os.Open(path)
	defer a.Close()
	defer b.Close()
	if err := Lock(a, unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	if err := Lock(b, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		t.Errorf("a second shared lock = %v; want it granted", err)
	}
	if _, err := TryExclusive(path); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("an exclusive lock under shared ones = %v; want EWOULDBLOCK", err)
	}
}

// TestLockContext: the lock held elsewhere is waited for, and taken once
// its holder lets go; a wait whose ctx ends returns the ctx's cause, the
// lock untaken.
func TestLockContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	held, err := TryExclusive(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	cause := errors.New("the test gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(2*pollInterval, func() { cancel(cause) })
	if err := LockContext(ctx, f, unix.LOCK_EX); !errors.Is(err, cause) {
		t.Fatalf("LockContext with the lock held elsewhere: %v; want the ctx's cause", err)
	}

	time.AfterFunc(2*pollInterval, func() { held.Close() })
	start := time.Now()
	if err := LockContext(context.Background(), f, unix.LOCK_EX); err != nil {
		t.Fatalf("LockContext after the holder let go: %v", err)
	}
	if d := time.Since(start); d < pollInterval {
		t.Fatalf("LockContext took the lock after %v, while it was still held", d)
	}
	other, err := TryExclusive(path)
	if err == nil {
		other.Close()
		t.Fatal("a second holder got the lock LockContext holds")
	}
}
