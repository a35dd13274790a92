package container_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// TestEscapeInotifyInstances: root in a remapped session that opens
// inotify instances as several uids, until the kernel refuses, holds no
// more than its bound, and meanwhile host root and another session still
// get one. (A session's inotify instances are charged to the owner of its
// user namespace too: when that was host root with no other bound, one
// session took all 128 of host root's, fs.inotify.max_user_instances, and
// host root's inotify_init failed until the session ended.)
//
// On crun each session's namespace is owned by a host uid of its own (see
// TestUserNSOwners): the session as a whole holds at most what one host
// user may, as ten uids (more than the eight that reach host root's count
// on runc). On runc the namespace is host root's and its own limits bound
// each uid of the session to an eighth of that: four uids hold no more
// than four eighths.
func TestEscapeInotifyInstances(t *testing.T) {
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		if !container.RemapsUsers(p.sb) {
			t.Skip("without a user namespace root in a session is host root: its inotify instances are host root's, with no bound of the session's own (the docs say so)")
		}
		hostLimit, ok := readInt("/proc/sys/user/max_inotify_instances")
		if !ok {
			t.Fatal("cannot read /proc/sys/user/max_inotify_instances")
		}
		users, bound := 10, hostLimit
		if p.rt == "runc" {
			perUID := container.SessionLimit(p.sb, "max_inotify_instances")
			if perUID <= 0 {
				t.Fatalf("the provider sets no limit on a runc session's inotify instances")
			}
			users, bound = 4, 4*perUID
		}
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		other := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		for _, s := range []sandbox.Session{sess, other} {
			installProbe(t, s)
			mustSh(t, s, `mkdir -p /workspace/inotify && chmod 777 /workspace/inotify`)
		}
		done := make(chan probeResult, 1)
		go func() { done <- probeAsync(sess, "inotify", fmt.Sprintf("%d:/workspace/inotify", users)) }()
		released := false
		release := func() {
			if !released {
				released = true
				_ = sess.PutFile(ctxFor(t), "inotify/release", nil)
			}
		}
		defer release()

		var held string
		for deadline := time.Now().Add(20 * time.Second); held == ""; time.Sleep(20 * time.Millisecond) {
			if b, err := sess.GetFile(ctxFor(t), "inotify/held"); err == nil {
				held = string(b)
			} else if time.Now().After(deadline) {
				release()
				t.Fatalf("the probe did not say what it holds: %v (probe: %+v)", err, <-done)
			}
		}
		// While the session holds all it can: host root's own, and the
		// other session's.
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			t.Errorf("host root's inotify_init1 while a session holds all it can (%s): %v", held, err)
		} else {
			unix.Close(fd)
		}
		mustSh(t, other, `touch /workspace/inotify/release`)
		if r := probe(t, other, "inotify", "1:/workspace/inotify"); !r.OK {
			t.Errorf("another session's inotify_init1 while a session holds all it can (%s): %+v", held, r)
		}
		release()
		r := <-done
		total, _ := strconv.Atoi(r.items()["total"])
		t.Logf("as %d uids, the session held %s (bound %d): %+v", users, held, bound, r)
		if !r.OK || total == 0 {
			t.Fatalf("control: the session opened no inotify instance: %+v", r)
		}
		if int64(total) > bound {
			t.Errorf("as %d uids, the session held %d inotify instances (%s), past its bound %d", users, total, held, bound)
		}
		if !strings.Contains(r.Detail, "err=EMFILE") {
			t.Errorf("the session's last inotify_init1 failed otherwise than for the bound: %+v", r)
		}
	})
}

// TestUserNSOwners: on crun each remapped session's user namespace is
// owned by a host uid of the owners' range, not root, and two sessions' by
// two uids, so that the kernel charges what each makes to a user of its
// own.
func TestUserNSOwners(t *testing.T) {
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		if !container.RemapsUsers(p.sb) {
			t.Skip("without a user namespace a session is in host root's own")
		}
		if p.rt == "runc" {
			t.Skip("runc makes a session's user namespace itself, as host root (see ownUserNS): TestEscapeUserLimits checks its bounds")
		}
		a := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		b := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		ua, ub := nsOwnerOf(t, bundlePID(t, p.opts, a.ID())), nsOwnerOf(t, bundlePID(t, p.opts, b.ID()))
		for _, u := range []int{ua, ub} {
			if u < container.UserNamespaceOwnerBase || u >= container.UserNamespaceOwnerBase+container.UserNamespaceOwners {
				t.Errorf("a session's user namespace is owned by host uid %d, outside the owners' range %d-%d", u, container.UserNamespaceOwnerBase, container.UserNamespaceOwnerBase+container.UserNamespaceOwners-1)
			}
		}
		if ua == ub {
			t.Errorf("two sessions' user namespaces are both owned by host uid %d", ua)
		}
		if got := strings.TrimSpace(mustSh(t, a, `id -u`)); got != "0" {
			t.Errorf("root in the session is uid %s", got)
		}
	})
}

// TestEscapeUserLimits: a remapped runc session's user namespace has the
// provider's limits on every per-user count charged to host root as well
// (inotify instances and watches, fanotify groups and marks, user and
// mount namespaces; a new namespace's are unlimited), and the session
// cannot raise them.
func TestEscapeUserLimits(t *testing.T) {
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		if !container.RemapsUsers(p.sb) {
			t.Skip("without a user namespace a session's counts are host root's own: nothing of the session's to bound")
		}
		if p.rt == "crun" {
			t.Skip("a crun session's user namespace is owned by a host uid of its own, whose host limits bound it (TestUserNSOwners)")
		}
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		for _, name := range []string{"max_inotify_instances", "max_inotify_watches", "max_fanotify_groups", "max_fanotify_marks", "max_user_namespaces", "max_mnt_namespaces"} {
			want := container.SessionLimit(p.sb, name)
			host, ok := readInt("/proc/sys/user/" + name)
			if !ok {
				t.Logf("this kernel has no %s", name)
				continue
			}
			if want <= 0 || want >= host {
				t.Errorf("the provider's limit on %s is %d; want one below the host's %d", name, want, host)
			}
			got := strings.TrimSpace(mustSh(t, sess, `cat /proc/sys/user/$1`, name))
			if got != strconv.FormatInt(want, 10) {
				t.Errorf("%s in the session is %s, want %d", name, got, want)
			}
			res := sh(t, sess, `echo 2147483647 > /proc/sys/user/$1`, name)
			if after := strings.TrimSpace(mustSh(t, sess, `cat /proc/sys/user/$1`, name)); res.ExitCode == 0 || after != got {
				t.Errorf("the session raised %s: exit %d, now %s", name, res.ExitCode, after)
			}
		}
	})
}
