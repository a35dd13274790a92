package container_test

// Tests of user namespace remapping (Options.UserNamespace): the mapping a
// session sees, who owns what it writes on the host, what its root can no
// longer do to host-owned files it can see, its own root still writable,
// the fallback and the mode switch of a persistent workspace, and that a
// remapped session leaves no mount behind.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/syncbuf"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// unsPolicy lets persistence through the kit.
var unsPolicy = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationContainer, Durable: true}

// unsTimeout bounds one provider call of these tests.
const unsTimeout = 60 * time.Second

// unsRuntimes and unsImages are what the tests run on.
var (
	unsRuntimes = []string{"runc", "crun"}
	unsImages   = []string{sandbox.HostImage, containertest.Busybox}
)

// unsBase is the host id of root in a remapped session.
const unsBase = container.UserNamespaceBase

// unsOptions are a provider's options on runtime rt in mode, with a fresh
// state directory.
func unsOptions(t testing.TB, rt string, mode container.UserNamespaceMode) container.Options {
	opts := containertest.Options(t, rt, unsPolicy)
	opts.ReapInterval = -1 // the tests destroy what they make
	opts.UserNamespace = mode
	return opts
}

// unsEachRuntime runs fn per installed runtime.
func unsEachRuntime(t *testing.T, fn func(t *testing.T, rt string)) {
	t.Helper()
	containertest.Require(t)
	for _, rt := range unsRuntimes {
		t.Run(rt, func(t *testing.T) {
			if !containertest.HasRuntime(rt) {
				t.Skipf("%s is not installed (apt-get install -y %s)", rt, rt)
			}
			fn(t, rt)
		})
	}
}

// unsRequireRemap skips t on a host whose kernel cannot remap at all:
// older than 5.19 (overlayfs on an idmapped lower layer) or with user
// namespaces disabled. Anywhere else a provider in mode on must start.
func unsRequireRemap(t testing.TB) {
	t.Helper()
	containertest.Require(t)
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var release []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		release = append(release, byte(c))
	}
	var major, minor int
	if _, err := fmt.Sscanf(string(release), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", release, err)
	}
	if major < 5 || major == 5 && minor < 19 {
		t.Skipf("kernel %s: overlayfs takes an idmapped lower layer from 5.19 on", release)
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are disabled here (/proc/sys/user/max_user_namespaces is 0)")
	}
}

// unsRemapped is a provider on rt that must remap.
func unsRemapped(t *testing.T, rt string) (*kit.Sandbox, container.Options) {
	t.Helper()
	unsRequireRemap(t)
	opts := unsOptions(t, rt, container.UserNamespaceOn)
	sb := containertest.New(t, opts)
	if !container.RemapsUsers(sb) {
		t.Fatal("a provider made with UserNamespace on does not remap")
	}
	return sb, opts
}

// unsCtx is a context for one call of t, cancelled at its end.
func unsCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), unsTimeout)
	t.Cleanup(cancel)
	return ctx
}

// unsSession creates a session, destroyed at the end of t.
func unsSession(t testing.TB, sb *kit.Sandbox, sp sandbox.SessionSpec) sandbox.Session {
	t.Helper()
	sess, err := sb.CreateSession(unsCtx(t), sp)
	if err != nil {
		t.Fatalf("CreateSession(image %s): %v", sp.Image, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), unsTimeout)
		defer cancel()
		if err := sess.Destroy(ctx); err != nil {
			t.Errorf("destroying session %s: %v", sess.ID(), err)
		}
	})
	return sess
}

// unsSpec is a session spec of image: ephemeral when key is "", else
// persistent on workspace key.
func unsSpec(image, key string) sandbox.SessionSpec {
	sp := sandbox.SessionSpec{Image: image, Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: 600}
	if key != "" {
		sp.Durability, sp.WorkspaceKey = sandbox.Persistent, key
	}
	return sp
}

// unsSh runs a shell script in sess and returns its result.
func unsSh(t testing.TB, sess sandbox.Session, script string) sandbox.ExecResult {
	t.Helper()
	res, err := sess.Exec(unsCtx(t), []string{"sh", "-c", script}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("sh -c %q: %v", script, err)
	}
	return res
}

// unsMustSh runs a script that must succeed and returns its stdout.
func unsMustSh(t testing.TB, sess sandbox.Session, script string) string {
	t.Helper()
	res := unsSh(t, sess, script)
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d, stdout %q, stderr %q", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// unsBundle is session id's bundle directory on the host.
func unsBundle(opts container.Options, id string) string {
	return filepath.Join(opts.StateDir, "container", "sessions", id)
}

// unsOwner is path's uid and gid on the host (not following a symlink).
func unsOwner(t testing.TB, path string) (uid, gid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

// unsWantOwner checks path's owner on the host.
func unsWantOwner(t testing.TB, path string, uid, gid int) {
	t.Helper()
	if u, g := unsOwner(t, path); u != uid || g != gid {
		t.Errorf("%s is owned by %d:%d on the host, want %d:%d", path, u, g, uid, gid)
	}
}

// TestUserNamespaceSession: in a remapped session, on runc and crun, in the
// host image and busybox, root is uid 0 whose ids map to UserNamespaceBase;
// what it writes in its workspace and its root is owned by
// UserNamespaceBase on the host; its root stays writable; the image's
// files are root's; the host image's binds show as nobody and still run
// (sh, coreutils, python3); /sys is the session's network namespace's;
// ports below 1024 bind.
func TestUserNamespaceSession(t *testing.T) {
	unsEachRuntime(t, func(t *testing.T, rt string) {
		sb, _ := unsRemapped(t, rt)
		for _, image := range unsImages {
			t.Run(strings.Split(image, ":")[0], func(t *testing.T) {
				sess := unsSession(t, sb, unsSpec(image, ""))
				want := fmt.Sprintf("0 %d %d", unsBase, container.UserNamespaceSize)
				for _, f := range []string{"/proc/self/uid_map", "/proc/self/gid_map"} {
					if got := strings.Join(strings.Fields(unsMustSh(t, sess, "cat "+f)), " "); got != want {
						t.Errorf("%s in the session is %q, want %q", f, got, want)
					}
				}
				if got := strings.TrimSpace(unsMustSh(t, sess, "id -u; id -g")); got != "0\n0" {
					t.Errorf("id -u, id -g in the session: %q, want 0 and 0", got)
				}

				// The workspace: by exec and by PutFile.
				unsMustSh(t, sess, "echo x > /workspace/by-exec && mkdir /workspace/dir && chown 1000:1001 /workspace/dir")
				if err := sess.PutFile(unsCtx(t), "by-put", []byte("y")); err != nil {
					t.Fatal(err)
				}
				upper, ws := sessionDirs(t, sb, sess.ID())
				unsWantOwner(t, ws, unsBase, unsBase)
				unsWantOwner(t, filepath.Join(ws, "by-exec"), unsBase, unsBase)
				unsWantOwner(t, filepath.Join(ws, "by-put"), unsBase, unsBase)
				unsWantOwner(t, filepath.Join(ws, "dir"), unsBase+1000, unsBase+1001)

				// Its own root: a new file in the image's /etc, a new
				// directory, both landing in the upper layer as
				// UserNamespaceBase's.
				unsMustSh(t, sess, "echo x > /etc/new-file && mkdir -p /opt/x && echo y > /opt/x/f")
				unsWantOwner(t, filepath.Join(upper, "etc", "new-file"), unsBase, unsBase)
				unsWantOwner(t, filepath.Join(upper, "opt", "x", "f"), unsBase, unsBase)
				// The image's files are root's in the session, and the
				// root directory too.
				if got := strings.Fields(unsMustSh(t, sess, "stat -c %u:%g / /etc /etc/passwd")); !slices.Equal(got, []string{"0:0", "0:0", "0:0"}) {
					t.Errorf("owners of /, /etc and /etc/passwd in the session: %q, want 0:0 each", got)
				}
				if image == sandbox.HostImage {
					// A bind of the host's /usr: host root's, unmapped.
					if got := strings.TrimSpace(unsMustSh(t, sess, "stat -c %u /usr/bin/env")); got != "65534" {
						t.Errorf("owner of /usr/bin/env in the session: %s, want 65534 (the host's root, unmapped)", got)
					}
					if got := strings.TrimSpace(unsMustSh(t, sess, "python3 -c 'import os; print(os.getuid())' && ls /usr/bin/env >/dev/null && echo ok")); got != "0\nok" {
						t.Errorf("python3 and ls in the session: %q", got)
					}
				}
				// /sys: the sysfs of the session's own network namespace
				// (loopback alone), host root's files, no cgroup trees,
				// the hardening's masked paths masked.
				if got := strings.Fields(unsMustSh(t, sess, "ls /sys/class/net; stat -c %u /sys/class/net/lo/operstate; ls -A /sys/fs/cgroup | wc -l; ls -A /sys/firmware | wc -l")); !slices.Equal(got, []string{"lo", "65534", "0", "0"}) {
					t.Errorf("/sys in the session: network devices, owner of a file, entries of /sys/fs/cgroup and of /sys/firmware: %q, want lo, 65534 (host root, unmapped), 0, 0", got)
				}
				if image == sandbox.HostImage {
					// A port below 1024 in the session's own network
					// namespace, as root in the session.
					unsMustSh(t, sess, `python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 80))'`)
				}
			})
		}
	})
}

// TestUserNamespaceHostFiles: root in a remapped session holds no
// privilege over host root's files it can see. The test puts files of host
// root into the session's workspace from the host: the session can read a
// world-readable one but cannot read a 0600 one, write a 0644 one, chown
// or chmod either, or delete a file of a host-root directory. Without
// remapping, root in the session can do all of it (the same checks with
// the provider in mode off), which shows the checks can fail.
func TestUserNamespaceHostFiles(t *testing.T) {
	unsEachRuntime(t, func(t *testing.T, rt string) {
		for _, mode := range []container.UserNamespaceMode{container.UserNamespaceOn, container.UserNamespaceOff} {
			t.Run(string(mode), func(t *testing.T) {
				if mode == container.UserNamespaceOn {
					unsRequireRemap(t)
				}
				opts := unsOptions(t, rt, mode)
				sb := containertest.New(t, opts)
				if got, want := container.RemapsUsers(sb), mode == container.UserNamespaceOn; got != want {
					t.Fatalf("RemapsUsers = %v, want %v", got, want)
				}
				sess := unsSession(t, sb, unsSpec(containertest.Busybox, ""))
				_, ws := sessionDirs(t, sb, sess.ID())
				secret := "tai42-secret-" + strconv.FormatInt(time.Now().UnixNano(), 36)
				for name, perm := range map[string]os.FileMode{"secret": 0o600, "public": 0o644} {
					if err := os.WriteFile(filepath.Join(ws, name), []byte(secret), perm); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Mkdir(filepath.Join(ws, "hostdir"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(ws, "hostdir", "keep"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				attempts := map[string]string{
					"read secret":  "cat /workspace/secret",
					"write public": "echo overwritten > /workspace/public",
					"chown public": "chown 0:0 /workspace/public",
					"chmod secret": "chmod 0644 /workspace/secret",
					"delete keep":  "rm /workspace/hostdir/keep",
				}
				names := make([]string, 0, len(attempts))
				for name := range attempts {
					names = append(names, name)
				}
				sort.Strings(names)
				if got := unsMustSh(t, sess, "cat /workspace/public"); got != secret {
					t.Errorf("reading a world-readable host file: %q, want its content", got)
				}
				for _, name := range names {
					res := unsSh(t, sess, attempts[name])
					switch {
					case mode == container.UserNamespaceOn && res.ExitCode == 0:
						t.Errorf("%s (%s): root in a remapped session did it on a host root's file (stdout %q)", name, attempts[name], res.Stdout)
					case mode == container.UserNamespaceOff && res.ExitCode != 0:
						t.Errorf("%s (%s): root in an unremapped session could not (exit %d, stderr %q): the check proves nothing", name, attempts[name], res.ExitCode, res.Stderr)
					}
				}
				if mode == container.UserNamespaceOn {
					if b, err := os.ReadFile(filepath.Join(ws, "public")); err != nil || string(b) != secret {
						t.Errorf("the host file the session tried to write holds %q (%v)", b, err)
					}
					if fi, err := os.Stat(filepath.Join(ws, "secret")); err != nil || fi.Mode().Perm() != 0o600 {
						t.Errorf("the host file the session tried to chmod: %v, %v", fi.Mode(), err)
					}
					if _, err := os.Stat(filepath.Join(ws, "hostdir", "keep")); err != nil {
						t.Errorf("the host file the session tried to delete: %v", err)
					}
				}
			})
		}
	})
}

// TestUserNamespaceModes: a provider in mode off does not remap (the
// session's uid_map is the identity, its files are host root's), an
// unknown mode is refused at New, and "" is the documented default.
func TestUserNamespaceModes(t *testing.T) {
	containertest.Require(t)
	opts := unsOptions(t, "runc", container.UserNamespaceOff)
	sb := containertest.New(t, opts)
	if container.RemapsUsers(sb) {
		t.Error("RemapsUsers of a provider in mode off is true")
	}
	sess := unsSession(t, sb, unsSpec(containertest.Busybox, ""))
	if got := strings.Join(strings.Fields(unsMustSh(t, sess, "cat /proc/self/uid_map")), " "); got != "0 0 4294967295" {
		t.Errorf("uid_map in an unremapped session: %q, want the identity", got)
	}
	unsMustSh(t, sess, "echo x > /workspace/f")
	_, ws := sessionDirs(t, sb, sess.ID())
	unsWantOwner(t, filepath.Join(ws, "f"), 0, 0)

	bad := unsOptions(t, "runc", "sometimes")
	if sb, err := container.New(bad); err == nil {
		sb.Close(context.Background())
		t.Error("New with UserNamespace \"sometimes\" succeeded")
	} else if !strings.Contains(err.Error(), "sometimes") {
		t.Errorf("New with UserNamespace \"sometimes\": %v, want an error naming the mode", err)
	}

	// "" is the default, auto: as an auto provider does on this host.
	if container.DefaultUserNamespace != container.UserNamespaceAuto {
		t.Errorf("DefaultUserNamespace is %q, want %q", container.DefaultUserNamespace, container.UserNamespaceAuto)
	}
	def := containertest.New(t, unsOptions(t, "runc", ""))
	auto := containertest.New(t, unsOptions(t, "runc", container.UserNamespaceAuto))
	if got, want := container.RemapsUsers(def), container.RemapsUsers(auto); got != want {
		t.Errorf("RemapsUsers of a provider with the default mode = %v, of one in mode auto %v", got, want)
	}
}

// TestUserNamespacePersistentSwitch: a persistent workspace made without
// remapping is shifted at its first remapped session (host root's files
// become UserNamespaceBase's, a file of uid 1000 UserNamespaceBase+1000's)
// and stays usable by root in the session, and shifted back when the
// provider runs without remapping again.
func TestUserNamespacePersistentSwitch(t *testing.T) {
	unsRequireRemap(t)
	unsEachRuntime(t, func(t *testing.T, rt string) {
		state := t.TempDir()
		const key = "switch"
		use := func(mode container.UserNamespaceMode, script string) {
			t.Helper()
			opts := unsOptions(t, rt, mode)
			opts.StateDir = state
			sb, err := container.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := sb.Close(context.Background()); err != nil {
					t.Errorf("closing the provider: %v", err)
				}
			}()
			sess, err := sb.CreateSession(unsCtx(t), unsSpec(containertest.Busybox, key))
			if err != nil {
				t.Fatal(err)
			}
			unsMustSh(t, sess, script)
		}
		// The workspace as the host has it, between the sessions.
		owners := func(fn func(ws string)) { t.Helper(); withWorkspace(t, state, key, fn) }

		use(container.UserNamespaceOff, "echo a > /workspace/a && mkdir /workspace/d && echo b > /workspace/d/b && chown -R 1000:1000 /workspace/d && ln -s /etc/passwd /workspace/link")
		owners(func(ws string) {
			unsWantOwner(t, ws, 0, 0)
			unsWantOwner(t, filepath.Join(ws, "a"), 0, 0)
			unsWantOwner(t, filepath.Join(ws, "d", "b"), 1000, 1000)
		})

		use(container.UserNamespaceOn, `test "$(stat -c %u:%g /workspace/a /workspace/d/b | tr '\n' ' ')" = "0:0 1000:1000 " && echo more >> /workspace/a && echo c > /workspace/c && rm /workspace/d/b`)
		owners(func(ws string) {
			unsWantOwner(t, ws, unsBase, unsBase)
			unsWantOwner(t, filepath.Join(ws, "a"), unsBase, unsBase)
			unsWantOwner(t, filepath.Join(ws, "c"), unsBase, unsBase)
			unsWantOwner(t, filepath.Join(ws, "d"), unsBase+1000, unsBase+1000)
			unsWantOwner(t, filepath.Join(ws, "link"), unsBase, unsBase)
		})
		unsWantOwner(t, "/etc/passwd", 0, 0) // the symlink's target is not followed

		use(container.UserNamespaceOff, `test "$(stat -c %u /workspace/a /workspace/c /workspace/d | tr '\n' ' ')" = "0 0 1000 " && cat /workspace/a`)
		owners(func(ws string) {
			unsWantOwner(t, ws, 0, 0)
			unsWantOwner(t, filepath.Join(ws, "c"), 0, 0)
			unsWantOwner(t, filepath.Join(ws, "d"), 1000, 1000)
		})
	})
}

// TestUserNamespaceNoLeaks: a remapped session's mounts (its root under
// /run/tai42/roots, its idmapped image and sysfs in the bundle) are gone
// after its destroy, in every mount namespace of this process (crun's own
// included), and so is its directory under /run/tai42/roots.
func TestUserNamespaceNoLeaks(t *testing.T) {
	unsEachRuntime(t, func(t *testing.T, rt string) {
		sb, opts := unsRemapped(t, rt)
		var ids []string
		for _, image := range unsImages {
			sess, err := sb.CreateSession(unsCtx(t), unsSpec(image, ""))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sess.ID())
			unsMustSh(t, sess, "echo x > /etc/f")
			if m := unsMountsUnder(t, "/run/tai42/roots/"+sess.ID()); len(m) == 0 {
				t.Errorf("session %s: no mount under /run/tai42/roots/%s while it is live: the check cannot see it", sess.ID(), sess.ID())
			}
			if err := sess.Destroy(unsCtx(t)); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range ids {
			for _, dir := range []string{"/run/tai42/roots/" + id, unsBundle(opts, id)} {
				if m := unsMountsUnder(t, dir); len(m) > 0 {
					t.Errorf("mounts left after the destroy of %s: %v", id, m)
				}
				if _, err := os.Lstat(dir); err == nil {
					t.Errorf("%s is left after the destroy of its session", dir)
				}
			}
		}
		// The pool's disks are the open provider's; after its Close
		// nothing is left.
		if m := notPool(unsMountsUnder(t, opts.StateDir), poolDisks(t, sb)); len(m) > 0 {
			t.Errorf("mounts left under the state directory: %v", m)
		}
		if err := sb.Close(unsCtx(t)); err != nil {
			t.Fatal(err)
		}
		if m := unsMountsUnder(t, opts.StateDir); len(m) > 0 {
			t.Errorf("mounts left under the state directory after Close: %v", m)
		}
		if l := loopsUnder(t, opts.StateDir); len(l) > 0 {
			t.Errorf("loop devices left after Close: %v", l)
		}
		if imgs, _ := filepath.Glob(filepath.Join(opts.StateDir, "container", "disks", "*")); len(imgs) > 0 {
			t.Errorf("disks left after Close: %v", imgs)
		}
	})
}

// TestUserNamespaceFallback: where the host refuses what remapping needs
// (here an image store on ramfs, which refuses idmapped mounts), mode auto
// runs without remapping and logs why once, and mode on fails New saying
// why; sessions of the auto provider work.
func TestUserNamespaceFallback(t *testing.T) {
	containertest.Require(t)
	images := t.TempDir()
	if err := syscall.Mount("ramfs", images, "ramfs", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting a ramfs for the image store: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(images, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the test's ramfs: %v", err)
		}
	})

	on := unsOptions(t, "runc", container.UserNamespaceOn)
	on.Images = images
	if sb, err := container.New(on); err == nil {
		sb.Close(context.Background())
		t.Fatal("New in mode on with an image store on ramfs succeeded")
	} else if !strings.Contains(err.Error(), "image store") {
		t.Errorf("New in mode on with an image store on ramfs: %v, want an error naming the image store", err)
	}

	auto := unsOptions(t, "runc", container.UserNamespaceAuto)
	auto.Images = images
	var logs syncBuffer
	auto.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	sb := containertest.New(t, auto)
	if container.RemapsUsers(sb) {
		t.Fatal("a provider in mode auto remaps with an image store that refuses idmapped mounts")
	}
	var why []string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "without a user namespace") {
			why = append(why, line)
		}
	}
	if len(why) != 1 || !strings.Contains(why[0], "level=WARN") || !strings.Contains(why[0], "image store") {
		t.Errorf("the auto provider's log says why it does not remap in %q, want one warning naming the image store; the log:\n%s", why, logs.String())
	}
	sess := unsSession(t, sb, unsSpec(sandbox.HostImage, ""))
	if got := strings.Join(strings.Fields(unsMustSh(t, sess, "cat /proc/self/uid_map")), " "); got != "0 0 4294967295" {
		t.Errorf("uid_map in a session of the fallen-back provider: %q, want the identity", got)
	}
}

// syncBuffer is a log or output sink safe to read while it is written.
type syncBuffer = syncbuf.Buffer

// TestUserNamespaceSweep: a provider started on the state directory of one
// that did not close (as after a crash) removes the remapped session it
// left: its root's mount and directory under /run/tai42/roots, its
// idmapped image, its bundle. On runc only, whose mounts are the host's:
// crun's are in the runtime's own mount namespace, which dies with the
// process that held it.
func TestUserNamespaceSweep(t *testing.T) {
	containertest.Require(t)
	first, opts := unsRemapped(t, "runc")
	sess, err := first.CreateSession(unsCtx(t), unsSpec(containertest.Busybox, ""))
	if err != nil {
		t.Fatal(err)
	}
	root := "/run/tai42/roots/" + sess.ID()
	if len(unsMountsUnder(t, root)) == 0 || len(unsMountsUnder(t, unsBundle(opts, sess.ID()))) == 0 {
		t.Fatalf("a live remapped session without its mounts (%s, %s): the test cannot see them", root, unsBundle(opts, sess.ID()))
	}
	// As the first process's death would: its locks go, so the second
	// takes its sessions for a dead process's.
	container.Crash(first)
	second := containertest.New(t, opts)
	if !container.RemapsUsers(second) {
		t.Fatal("the second provider does not remap")
	}
	for _, dir := range []string{root, unsBundle(opts, sess.ID())} {
		if m := unsMountsUnder(t, dir); len(m) > 0 {
			t.Errorf("mounts left by the first provider after the second's start: %v", m)
		}
		if _, err := os.Lstat(dir); err == nil {
			t.Errorf("%s is left after the second provider's start", dir)
		}
	}
}

// TestUserNamespaceKeyQuota: remapped sessions' session keyrings are not
// charged to UserNamespaceBase, a user every remapped session on the host
// shares, whose key quota (kernel.keys.maxkeys, 200 by default) would
// otherwise cap the host's remapped sessions (runc fails "unable to join
// session keyring: disk quota exceeded").
func TestUserNamespaceKeyQuota(t *testing.T) {
	unsEachRuntime(t, func(t *testing.T, rt string) {
		sb, _ := unsRemapped(t, rt)
		const n = 5
		before := unsKeys(t, unsBase)
		for range n {
			sess := unsSession(t, sb, unsSpec(containertest.Busybox, ""))
			unsMustSh(t, sess, "true")
		}
		// n live sessions; a concurrent process's sessions could only
		// add keys, not hide ours.
		if after := unsKeys(t, unsBase); after-before >= n {
			t.Errorf("uid %d holds %d keys with %d live remapped sessions, %d before them: each session's keyring counts against its quota", unsBase, after, n, before)
		}
	})
}

// unsKeys is how many keys uid owns (/proc/key-users), 0 for none.
func unsKeys(t testing.TB, uid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/key-users")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == strconv.Itoa(uid)+":" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("/proc/key-users: %q", line)
			}
			return n
		}
	}
	return 0
}

// TestUserNamespaceClose: the provider's handle on the sessions' user
// namespace is held while it is open and closed by its Close, and the
// child process that made the namespace is gone.
func TestUserNamespaceClose(t *testing.T) {
	unsRequireRemap(t)
	before := unsUserNSFDs(t)
	sb, _ := unsRemapped(t, "runc")
	if n := unsUserNSFDs(t); n != before+1 {
		t.Errorf("an open remapping provider holds %d user namespace descriptors more than before it, want 1", n-before)
	}
	sess := unsSession(t, sb, unsSpec(containertest.Busybox, ""))
	unsMustSh(t, sess, "true")
	if err := sb.Close(unsCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n := unsUserNSFDs(t); n != before {
		t.Errorf("after Close, this process holds %d user namespace descriptors, %d before the provider", n, before)
	}
	if kids := unsChildren(t); len(kids) > 0 {
		t.Errorf("child processes of this process after Close: %v", kids)
	}
}

// unsUserNSFDs counts this process's descriptors on user namespaces.
func unsUserNSFDs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, "user:[") {
			n++
		}
	}
	return n
}

// unsChildren lists the pids whose parent is this process.
func unsChildren(t testing.TB) []string {
	t.Helper()
	var kids []string
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "children"))
		if err == nil {
			kids = append(kids, strings.Fields(string(b))...)
		}
	}
	return kids
}

// unsMountsUnder lists the mount points at or under dir in the mount
// namespace of any thread of this process.
func unsMountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "mountinfo"))
		if err != nil {
			continue // the thread ended
		}
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			mp := oscmd.UnescapeMount(f[4])
			if (mp == dir || strings.HasPrefix(mp, dir+"/")) && !slices.Contains(out, mp) {
				out = append(out, mp)
			}
		}
	}
	return out
}

// BenchmarkUserNamespaceCreateExec measures a session's create to the end
// of its first exec (`true`), busybox, with and without remapping: each
// iteration makes one session on a provider in mode off and one on a
// provider in mode on, in alternating order so that a change in the
// machine's load falls on both; their medians are reported as off-ms and
// on-ms (ns/op is the pair's). The destroys are not timed.
func BenchmarkUserNamespaceCreateExec(b *testing.B) {
	unsRequireRemap(b)
	for _, rt := range unsRuntimes {
		b.Run(rt, func(b *testing.B) {
			if !containertest.HasRuntime(rt) {
				b.Skipf("%s is not installed", rt)
			}
			modes := []container.UserNamespaceMode{container.UserNamespaceOff, container.UserNamespaceOn}
			sbs := make(map[container.UserNamespaceMode]*kit.Sandbox)
			for _, mode := range modes {
				sbs[mode] = containertest.New(b, unsOptions(b, rt, mode))
			}
			times := make(map[container.UserNamespaceMode][]time.Duration)
			one := func(mode container.UserNamespaceMode) {
				start := time.Now()
				sess, err := sbs[mode].CreateSession(unsCtx(b), unsSpec(containertest.Busybox, ""))
				if err != nil {
					b.Fatal(err)
				}
				res, err := sess.Exec(unsCtx(b), []string{"true"}, sandbox.ExecOptions{Timeout: 30 * time.Second})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("true: %v, %+v", err, res)
				}
				times[mode] = append(times[mode], time.Since(start))
				b.StopTimer()
				if err := sess.Destroy(unsCtx(b)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			for i := 0; b.Loop(); i++ {
				one(modes[i%2])
				one(modes[(i+1)%2])
			}
			for _, mode := range modes {
				slices.Sort(times[mode])
				b.ReportMetric(float64(times[mode][len(times[mode])/2].Microseconds())/1000, string(mode)+"-ms")
			}
		})
	}
}
