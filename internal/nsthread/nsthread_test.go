package nsthread

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func netnsIno(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestInNetNS: fn runs inside the namespace it is given, and the thread
// comes back: what runs next on a locked thread is in the first namespace.
func TestInNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a network namespace needs root (CAP_SYS_ADMIN)")
	}
	host := netnsIno(t, "/proc/self/ns/net")
	var ns *os.File
	err := Locked(func() (bool, error) {
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return false, err
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return false, err
		}
		ns, err = os.Open("/proc/thread-self/ns/net")
		return unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) != nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino == host {
		t.Fatal("the new namespace is the host's")
	}
	var inside uint64
	if err := InNetNS(ns, func() error { inside = netnsIno(t, "/proc/thread-self/ns/net"); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != st.Ino {
		t.Errorf("fn ran in namespace %d, want %d", inside, st.Ino)
	}
	for range 20 {
		var after uint64
		_ = Locked(func() (bool, error) { after = netnsIno(t, "/proc/thread-self/ns/net"); return false, nil })
		if after != host {
			t.Fatalf("a thread after InNetNS is in namespace %d, want the host's %d", after, host)
		}
	}
	want := errors.New("fn's own")
	if err := InNetNS(ns, func() error { return want }); !errors.Is(err, want) {
		t.Errorf("InNetNS returned %v, want fn's error", err)
	}
}

// TestInDir: a process fn forks starts in dir, also as a user that may
// not enter dir; the process's own working directory never moves, and no
// later thread inherits dir.
func TestInDir(t *testing.T) {
	own, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pwd := func(cred *syscall.Credential) (string, error) {
		var out []byte
		err := InDir(dir, func() error {
			cmd := exec.Command("/bin/pwd")
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			var err error
			out, err = cmd.Output()
			return err
		})
		return strings.TrimSpace(string(out)), err
	}
	if got, err := pwd(nil); err != nil || got != dir {
		t.Errorf("pwd in InDir = %q, %v; want %q", got, err, dir)
	}
	if os.Geteuid() == 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		got, err := pwd(&syscall.Credential{Uid: 65534, Gid: 65534})
		if err != nil || got != dir {
			t.Errorf("pwd as uid 65534 in a directory of mode 0700 = %q, %v; want %q", got, err, dir)
		}
	}
	for range 20 {
		var cwd string
		_ = Locked(func() (bool, error) { cwd, err = os.Getwd(); return false, err })
		if cwd != own {
			t.Fatalf("a thread after InDir works in %q, want the process's %q", cwd, own)
		}
	}
	if now, _ := os.Getwd(); now != own {
		t.Errorf("the process's working directory moved to %q", now)
	}
	want := errors.New("fn's own")
	if err := InDir(dir, func() error { return want }); !errors.Is(err, want) {
		t.Errorf("InDir returned %v, want fn's error", err)
	}
	ran := false
	err = InDir(filepath.Join(dir, "missing"), func() error { ran = true; return nil })
	if !errors.Is(err, os.ErrNotExist) || ran {
		t.Errorf("InDir of a missing directory = %v (fn ran: %v); want ErrNotExist, fn not run", err, ran)
	}
}

// TestRetryDump: an interrupted dump is run again, a bounded number of
// times; any other outcome is returned as it is.
func TestRetryDump(t *testing.T) {
	calls := 0
	out, err := RetryDump(func() ([]int, error) {
		calls++
		if calls < 3 {
			return nil, netlink.ErrDumpInterrupted
		}
		return []int{7}, nil
	})
	if err != nil || len(out) != 1 || calls != 3 {
		t.Errorf("RetryDump: %v, %v after %d calls; want [7] after 3", out, err, calls)
	}
	calls = 0
	if _, err := RetryDump(func() ([]int, error) { calls++; return nil, netlink.ErrDumpInterrupted }); !errors.Is(err, netlink.ErrDumpInterrupted) || calls != dumpRetries+1 {
		t.Errorf("always interrupted: %v after %d calls, want the interruption after %d", err, calls, dumpRetries+1)
	}
	other := errors.New("other")
	calls = 0
	if _, err := RetryDump(func() ([]int, error) { calls++; return nil, other }); !errors.Is(err, other) || calls != 1 {
		t.Errorf("another error: %v after %d calls, want it at once", err, calls)
	}
}
