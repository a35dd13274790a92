package netns

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces are root's on this runner")
	}
}

// inode names a namespace file the way /proc's links do.
func inode(t *testing.T, f *os.File) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("net:[%d]", st.Ino)
}

// threadNS is the network namespace of the calling thread, as /proc names it.
func threadNS(t *testing.T) string {
	t.Helper()
	l, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A namespace is new, has loopback up, and gets the rtnetlink socket and
// IPv6 off for new devices only when asked.
func TestNewConfigures(t *testing.T) {
	needRoot(t)
	home, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{{}, {Netlink: true}, {NoIPv6: true}, {Netlink: true, NoIPv6: true}} {
		t.Run(fmt.Sprintf("%+v", o), func(t *testing.T) {
			ns, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			if got := inode(t, ns.File()); got == home {
				t.Fatalf("the namespace is the process's own (%s)", got)
			}
			if (ns.Netlink() != nil) != o.Netlink {
				t.Errorf("rtnetlink socket %v, asked %v", ns.Netlink() != nil, o.Netlink)
			}
			var loUp bool
			var v6off string
			err = nsthread.InNetNS(ns.File(), func() error {
				lo, err := netlink.LinkByName("lo")
				if err != nil {
					return err
				}
				loUp = lo.Attrs().Flags&unix.IFF_UP != 0
				b, err := os.ReadFile("/proc/sys/net/ipv6/conf/default/disable_ipv6")
				if errors.Is(err, os.ErrNotExist) {
					v6off = "no ipv6"
					return nil
				}
				v6off = strings.TrimSpace(string(b))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if !loUp {
				t.Error("loopback is down")
			}
			if o.NoIPv6 && v6off != "1" && v6off != "no ipv6" {
				t.Errorf("disable_ipv6 for new devices is %q, want 1", v6off)
			}
			if o.Netlink {
				lo, err := ns.Netlink().LinkByName("lo")
				if err != nil || lo.Attrs().Flags&unix.IFF_UP == 0 {
					t.Errorf("the namespace's own socket does not see its loopback up: %v %v", lo, err)
				}
			}
		})
	}
}

// Close releases every descriptor, twice is harmless, and a nil NS is
// closed already.
func TestCloseReleases(t *testing.T) {
	needRoot(t)
	before := openFDs(t)
	ns, err := New(Options{Netlink: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	ns.Close()
	(*NS)(nil).Close()
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after Close, %d before", after, before)
	}
}

// Run forks inside the namespace and leaves the thread at home.
func TestRunStartsInside(t *testing.T) {
	needRoot(t)
	ns, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	home, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	var inside string
	if err := ns.Run(home, func() error { inside = threadNS(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := inode(t, ns.File()); inside != want {
		t.Errorf("start ran in %s, not the namespace %s", inside, want)
	}
	want := errors.New("start failed")
	if err := ns.Run(home, func() error { return want }); !errors.Is(err, want) {
		t.Errorf("Run returned %v, not start's error", err)
	}
	// Every thread of the process is back home: none was left inside.
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/task/" + e.Name() + "/ns/net")
		if err == nil && l == inode(t, ns.File()) {
			t.Errorf("thread %s is still inside the namespace", e.Name())
		}
	}
}

// Open gives a namespace file its own rtnetlink socket; a file holding
// another kind of namespace is refused with EINVAL and closed.
func TestOpen(t *testing.T) {
	needRoot(t)
	made, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer made.Close()
	f, err := os.Open(made.FdPath())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	if inode(t, ns.File()) != inode(t, made.File()) {
		t.Error("Open holds another namespace than the one it was given")
	}
	if _, err := ns.Netlink().LinkByName("lo"); err != nil {
		t.Errorf("the socket Open made does not see the namespace's loopback: %v", err)
	}
	ns.Close()

	uts, err := os.Open("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(uts); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Open of a UTS namespace: %v, want EINVAL", err)
	}
	if err := uts.Close(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Open left the refused file open (Close: %v)", err)
	}
}

// The pool fills to its size after the first Take, Take still works after
// Close, and Close releases what was made ahead.
func TestPoolFillsAndReleases(t *testing.T) {
	needRoot(t)
	before := openFDs(t)
	p := NewPool(3, Options{Netlink: true})
	ns, err := p.Take()
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.ready)
		p.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool holds %d namespaces, not 3, after 10s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ns, err = p.Take()
	if err != nil || ns.Netlink() == nil {
		t.Fatalf("a pooled namespace is not made as the pool's options say: %v", err)
	}
	ns.Close()
	p.Close()
	ns, err = p.Take()
	if err != nil {
		t.Fatalf("Take after Close: %v", err)
	}
	ns.Close()
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after Close, %d before", after, before)
	}
}

// Closing the pool twice, before and after it started, is harmless. (The
// host runner's copy of the pool once panicked here, on close(p.stop).)
func TestPoolCloseTwice(t *testing.T) {
	needRoot(t)
	idle := NewPool(1, Options{})
	idle.Close()
	idle.Close()

	used := NewPool(1, Options{})
	ns, err := used.Take()
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	used.Close()
	used.Close()
}
