package buildtest

import (
	"context"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/flock"
)

// TestTai42Static builds the static tai42 and checks that it is one: no
// dynamic loader.
func TestTai42Static(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	out := filepath.Join(t.TempDir(), "tai42")
	if err := Tai42(context.Background(), out, false); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s has a dynamic loader: not a static build", out)
		}
	}
}

// TestTai42WaitsForTheLock: a build waits while another holds the lock,
// and gives up with its ctx's cause, the lock still held by the other.
func TestTai42WaitsForTheLock(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	held, err := flock.TryExclusive(LockPath())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cause := errors.New("the test gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(300*time.Millisecond, func() { cancel(cause) })
	out := filepath.Join(t.TempDir(), "tai42")
	start := time.Now()
	err = Tai42(ctx, out, false)
	if !errors.Is(err, cause) {
		t.Fatalf("Tai42 with the lock held elsewhere: %v; want the ctx's cause", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("Tai42 returned after %v, before its ctx ended: it did not wait for the lock", d)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Tai42 built %s without the lock (stat: %v)", out, err)
	}
	f, err := os.Open(LockPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := flock.Lock(f, unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("the lock after Tai42 gave up: %v; want it still held by its holder", err)
	}
}

// TestWithBuildGOGC: GOGC is added where env has none, without writing into
// the caller's slice; a GOGC of the caller's stays.
func TestWithBuildGOGC(t *testing.T) {
	env := make([]string, 1, 4)
	env[0] = "PATH=/bin"
	got := WithBuildGOGC(env)
	if len(got) != 2 || got[1] != "GOGC="+BuildGOGC {
		t.Errorf("WithBuildGOGC(%q) = %q; want GOGC=%s added", env, got, BuildGOGC)
	}
	if extra := env[:2]; extra[1] != "" {
		t.Errorf("WithBuildGOGC wrote %q into the caller's slice", extra[1])
	}
	own := []string{"GOGC=50", "PATH=/bin"}
	if got := WithBuildGOGC(own); len(got) != 2 || got[0] != "GOGC=50" {
		t.Errorf("WithBuildGOGC(%q) = %q; want it unchanged", own, got)
	}
}
