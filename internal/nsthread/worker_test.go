package nsthread

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func mountinfoHas(t *testing.T, path, dir string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), " "+dir+" ")
}

// TestMountNSWorker: a mount made on a NewMountNS worker is seen there
// and never in the host's namespace, the worker's thread is never the
// main thread, and a mount hidden at the start is gone in it.
func TestMountNSWorker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace needs root")
	}
	hidden := t.TempDir()
	if err := unix.Mount("tmpfs", hidden, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Unmount(hidden, unix.MNT_DETACH) }()
	w, err := NewMountNS(hidden)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dir := t.TempDir()
	err = w.Do(func() error {
		if unix.Gettid() == unix.Getpid() {
			return errors.New("the worker runs on the main thread")
		}
		if mountinfoHas(t, "/proc/thread-self/mountinfo", hidden) {
			return errors.New("the hidden mount shows in the worker's namespace")
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
			return err
		}
		if !mountinfoHas(t, "/proc/thread-self/mountinfo", dir) {
			return errors.New("the worker's own mount does not show in its namespace")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if mountinfoHas(t, "/proc/self/mountinfo", dir) {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		t.Error("the worker's mount reached the host's namespace")
	}
}

// TestJoinMountNS: a worker joins the namespace it is given; a path that
// is no namespace is its error, naming the path.
func TestJoinMountNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("entering a mount namespace needs root")
	}
	w, err := JoinMountNS("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := w.Do(func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("Do = %v, ran %v", err, ran)
	}
	w.Close()
	missing := t.TempDir() + "/none"
	if _, err := JoinMountNS(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("JoinMountNS(%s) = %v; want an error naming it", missing, err)
	}
}

// TestWorkerSetupError: a setup's error is NewWorker's, and no worker.
func TestWorkerSetupError(t *testing.T) {
	fail := errors.New("no namespace today")
	if w, err := NewWorker(func() error { return fail }); w != nil || !errors.Is(err, fail) {
		t.Errorf("NewWorker = %v, %v; want nil and the setup's error", w, err)
	}
}
