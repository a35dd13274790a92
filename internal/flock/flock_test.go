package flock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

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
