package sessionlock_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tai42/sandbox/internal/sessionlock"
)

// A child process (this test binary, TAI42_LOCK_HELPER=DIR) holds lock
// "sb-child" until it is killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("TAI42_LOCK_HELPER"); dir != "" {
		d, err := sessionlock.Open(dir)
		if err != nil {
			os.Exit(1)
		}
		if _, err := d.Hold("sb-child"); err != nil {
			os.Stdout.WriteString("ERROR " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("held\n")
		select {}
	}
	os.Exit(m.Run())
}

func TestHoldRelease(t *testing.T) {
	d, err := sessionlock.Open(filepath.Join(t.TempDir(), "locks"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := d.Hold("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Hold("sb-1"); !errors.Is(err, sessionlock.ErrHeld) {
		t.Fatalf("a second hold of a held lock: %v; want ErrHeld", err)
	}
	if ids, _ := d.IDs(); !slices.Equal(ids, []string{"sb-1"}) {
		t.Fatalf("IDs = %q", ids)
	}
	l.Release(false)
	l.Release(false) // twice is harmless
	l2, err := d.Hold("sb-1")
	if err != nil {
		t.Fatalf("hold after release: %v", err)
	}
	l2.Release(true)
	if ids, _ := d.IDs(); len(ids) != 0 {
		t.Fatalf("IDs after a release with remove = %q", ids)
	}
	for _, bad := range []string{"", "..", "a/b", "../x"} {
		if _, err := d.Hold(bad); err == nil {
			t.Errorf("Hold(%q) succeeded", bad)
		}
	}
}

// TestAbandon: the locks go as with the process's death; the files stay.
func TestAbandon(t *testing.T) {
	d, err := sessionlock.Open(filepath.Join(t.TempDir(), "locks"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := d.Hold("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	d.Abandon()
	l.Release(true) // after Abandon: nothing more
	if ids, _ := d.IDs(); !slices.Equal(ids, []string{"sb-1"}) {
		t.Fatalf("IDs after Abandon = %q; the file must stay", ids)
	}
	l2, err := d.Hold("sb-1")
	if err != nil {
		t.Fatalf("hold after Abandon: %v", err)
	}
	l2.Release(true)
}

// TestOtherProcess: a lock another live process holds is refused; once
// that process is killed, it can be taken.
func TestOtherProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TAI42_LOCK_HELPER="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("the helper said %q (%v)", line, err)
	}
	d, err := sessionlock.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Hold("sb-child"); !errors.Is(err, sessionlock.ErrHeld) {
		t.Fatalf("hold of a lock a live process holds: %v; want ErrHeld", err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	l, err := d.Hold("sb-child")
	if err != nil {
		t.Fatalf("hold after the holder was killed: %v", err)
	}
	l.Release(true)
}
