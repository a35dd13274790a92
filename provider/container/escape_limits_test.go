package container_test

import (
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
// inotify instances until the kernel refuses holds no more than its
// share, and host root still gets one meanwhile. (A session's inotify
// instances are charged to host root too, its user namespace's owner, up
// to fs.inotify.max_user_instances, 128 by default: one session took them
// all.) The bound is per uid of the session (see limitsHook): root in a
// session that becomes other uids gets it for each, no more.
func TestEscapeInotifyInstances(t *testing.T) {
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		if !container.RemapsUsers(p.sb) {
			t.Skip("without a user namespace root in a session is host root: its inotify instances are host root's, with no bound of the session's own (the docs say so)")
		}
		if p.rt == "crun" {
			t.Skip("crun 1.8.1 fails the hook that writes a session's limits: its sessions have no bound of their own (see sessionUserLimits)")
		}
		bound := container.SessionLimit(p.sb, "max_inotify_instances")
		if bound <= 0 {
			t.Fatalf("the provider sets no limit on a session's inotify instances")
		}
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
		installProbe(t, sess)
		mustSh(t, sess, `mkdir -p /workspace/inotify && chmod 777 /workspace/inotify`)
		done := make(chan probeResult, 1)
		go func() { done <- probeAsync(sess, "inotify", "1:/workspace/inotify") }()
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
		// While the session holds all it can: host root's own.
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			t.Errorf("host root's inotify_init1 while the session holds its instances (%s): %v", held, err)
		} else {
			unix.Close(fd)
		}
		release()
		r := <-done
		total, _ := strconv.Atoi(r.items()["total"])
		t.Logf("the session held %s (bound %d): %+v", held, bound, r)
		if !r.OK || total == 0 {
			t.Fatalf("control: the session opened no inotify instance: %+v", r)
		}
		if int64(total) > bound {
			t.Errorf("the session held %d inotify instances (%s), past its bound %d", total, held, bound)
		}
		if !strings.Contains(r.Detail, "err=EMFILE") {
			t.Errorf("the session's last inotify_init1 failed otherwise than for the bound: %+v", r)
		}

		// As root and three other uids: the bound of each, no more.
		mustSh(t, sess, `rm -f /workspace/inotify/held && touch /workspace/inotify/release`)
		r = probe(t, sess, "inotify", "4:/workspace/inotify")
		total, _ = strconv.Atoi(r.items()["total"])
		t.Logf("as 4 uids, the session held %s", r.Detail)
		if int64(total) > 4*bound {
			t.Errorf("as 4 uids, the session held %d inotify instances (%s), past 4 times its bound %d", total, r.Detail, bound)
		}
	})
}

// TestEscapeUserLimits: a remapped session's user namespace has the
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
			t.Skip("crun 1.8.1 fails the hook that writes a session's limits: its sessions have no bound of their own (see sessionUserLimits)")
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
