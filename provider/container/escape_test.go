package container_test

// The escape battery: each test attempts, from inside a session, something
// a session must not be able to do to its host or to another session, and
// FAILS if the attempt works. Each runs on both runtimes, with and without
// a user namespace, and (where the image matters) on both images. Each also runs a control showing that the
// same means succeed on what the session may touch, so that a refusal seen
// here is the sandbox's doing and not a broken probe.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// TestEscapeReadHostFiles: neither a process in the session nor GetFile
// reads a host file outside the image: canaries in the host's temporary
// directory, the provider's state directory, /root, /home and /var, the
// session's own bundle, the host's /etc/shadow.
func TestEscapeReadHostFiles(t *testing.T) {
	forEachSetup(t, func(t *testing.T, p *testProvider, image string) {
		canaries := []canary{
			newCanary(t, ""),
			newCanary(t, p.opts.StateDir),
			newCanary(t, p.root()),
			newCanary(t, "/root"),
			newCanary(t, "/var/tmp"),
		}
		if fi, err := os.Stat("/home"); err == nil && fi.IsDir() {
			canaries = append(canaries, newCanary(t, "/home"))
		}
		sess := p.session(t, spec(image, sandbox.NetworkNone))
		installProbe(t, sess)

		// Control: the probe and GetFile read what the session holds.
		control := "tai42-control-" + randomToken(8)
		if err := sess.PutFile(ctxFor(t), "control.txt", []byte(control)); err != nil {
			t.Fatal(err)
		}
		if r := probe(t, sess, "read", "/workspace/control.txt"); !r.OK || r.Detail != control {
			t.Fatalf("control: the probe read %+v from the session's own file, want %q", r, control)
		}

		for _, c := range canaries {
			if r := probe(t, sess, "read", c.path); r.OK || strings.Contains(r.Detail, c.secret) {
				t.Errorf("the session read the host file %s: %+v", c.path, r)
			}
			for _, path := range []string{c.path, c.dir + "/../" + filepath.Base(c.dir) + "/canary"} {
				b, err := sess.GetFile(ctxFor(t), path)
				if err == nil && strings.Contains(string(b), c.secret) {
					t.Errorf("GetFile(%q) returned the host canary's secret", path)
				}
				if err == nil {
					t.Logf("GetFile(%q) read a file of the session's own (%d bytes)", path, len(b))
				}
			}
		}

		// The provider's own files about the session, and other host data.
		// None of these paths exists in the session: any read or stat that
		// works went through to the host.
		bundle := p.bundle(sess.ID())
		if _, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil {
			t.Fatalf("the session's config on the host: %v", err)
		}
		for _, path := range []string{
			filepath.Join(bundle, "config.json"),
			bundle, // PID 1's output is a pipe now: the bundle holds no log
			p.opts.StateDir,
			containertest.Agent(t),
		} {
			if r := probe(t, sess, "read", path); r.OK {
				t.Errorf("the session read the provider's file %s: %.200q", path, r.Detail)
			}
			if r := probe(t, sess, "stat", path); r.OK {
				t.Errorf("the session sees the host path %s: %+v", path, r)
			}
			if b, err := sess.GetFile(ctxFor(t), path); err == nil {
				t.Errorf("GetFile(%q) read the provider's file: %.200q", path, b)
			}
		}
		if shadow, err := os.ReadFile("/etc/shadow"); err == nil && len(shadow) > 0 {
			if r := probe(t, sess, "read", "/etc/shadow"); r.OK && r.Detail == string(shadow[:min(len(shadow), 64<<10)]) {
				t.Error("the session read the host's /etc/shadow")
			}
			if b, err := sess.GetFile(ctxFor(t), "/etc/shadow"); err == nil && string(b) == string(shadow) {
				t.Error("GetFile(/etc/shadow) returned the host's /etc/shadow")
			}
		}
		// Nothing of the host's homes or data shows at all.
		out := mustSh(t, sess, `for d in /root /home /var /srv /opt /mnt; do [ -d $d ] && ls -A $d | sed "s|^|$d/|"; done; true`)
		for _, c := range canaries {
			if strings.Contains(out, filepath.Base(c.dir)) {
				t.Errorf("the session lists the host's %s: %q", c.dir, out)
			}
		}
	})
}

// TestEscapeWriteHost: writes to /usr/bin, /bin, /etc, the root, and the
// canary's directory are refused or land in the session's own root; the
// host is unchanged afterwards.
func TestEscapeWriteHost(t *testing.T) {
	forEachSetup(t, func(t *testing.T, p *testProvider, image string) {
		c := newCanary(t, "")
		sess := p.session(t, spec(image, sandbox.NetworkNone))
		installProbe(t, sess)
		// The canary's directory path exists in the session too (in its
		// private /tmp), so that a write there succeeds inside.
		mustSh(t, sess, `mkdir -p "$1"`, c.dir)

		name := "tai42-escape-" + randomToken(6)
		type target struct {
			path  string
			upper bool // when the write succeeds it lands in the overlay's upper layer
			isNew bool // the host has nothing at path
		}
		targets := []target{
			{"/usr/bin/" + name, true, true},
			{"/bin/" + name, true, true},
			{"/etc/" + name, true, true},
			{"/" + name, true, true},
			{filepath.Join(c.dir, name), false, true},
			{c.path, false, false},
		}
		for _, tg := range targets {
			r := probe(t, sess, "write", tg.path)
			if !r.OK {
				t.Logf("write %s refused: %s", tg.path, r.Err)
				continue
			}
			if got := probe(t, sess, "read", tg.path); !got.OK || got.Detail != "tai42-escapeprobe\n" {
				t.Errorf("write %s succeeded, but the session reads back %+v", tg.path, got)
			}
			if tg.upper {
				if _, err := os.Lstat(filepath.Join(p.upper(t, sess.ID()), tg.path)); err != nil {
					t.Errorf("write %s succeeded but did not land in the session's upper layer: %v", tg.path, err)
				}
			}
			t.Logf("write %s landed in the session's own root", tg.path)
		}
		for _, tg := range targets {
			if !tg.isNew {
				continue
			}
			if _, err := os.Lstat(tg.path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the session's write of %s appeared on the host (lstat: %v)", tg.path, err)
				os.Remove(tg.path)
			}
		}
		// The same through PutFile's absolute paths.
		for _, tg := range targets {
			data := []byte("put-" + randomToken(8))
			if err := sess.PutFile(ctxFor(t), tg.path, data); err != nil {
				t.Logf("PutFile(%s) refused: %v", tg.path, err)
				continue
			}
			if b, err := sess.GetFile(ctxFor(t), tg.path); err != nil || string(b) != string(data) {
				t.Errorf("PutFile(%s) succeeded, but GetFile reads back %q, %v", tg.path, b, err)
			}
			if tg.isNew {
				if _, err := os.Lstat(tg.path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("PutFile(%s) wrote to the host (lstat: %v)", tg.path, err)
					os.Remove(tg.path)
				}
			}
		}
		c.intact(t, "the session's writes")
		// Nor did anything land in what sessions share: the host image's
		// skeleton, the image store, the disks (anywhere but this
		// session's upper layer and the mount point of its root), as the
		// runtime sees them, the sessions' disks mounted.
		for _, dir := range []string{p.root(), p.opts.Images} {
			for _, f := range findNamed(t, p.view(dir), name, p.upper(t, sess.ID())) {
				t.Errorf("the session's write landed outside its own root, in %s", f)
			}
		}
	})
}

// findNamed lists the paths under dir whose name starts with name, not
// looking into skip nor into any directory named rootfs (a session root's
// mount point, which shows the session's own files).
func findNamed(t testing.TB, dir, name, skip string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.EACCES) {
				return nil
			}
			return err
		}
		if d.IsDir() && (path == skip || d.Name() == "rootfs") {
			return filepath.SkipDir
		}
		if strings.HasPrefix(d.Name(), name) || strings.HasPrefix(d.Name(), ".tai42-put-") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", dir, err)
	}
	return out
}

// TestEscapeHostProcesses: a session sees its own processes only: PID 1
// the agent, the probe, never the test process or a marked host process.
func TestEscapeHostProcesses(t *testing.T) {
	marker := "tai42-host-marker-" + randomToken(6)
	// The shell stays (sleep is not its last command), its command line
	// holding the marker.
	host := exec.Command("sh", "-c", "sleep 600; :", marker)
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = host.Process.Kill() // by its pid: the process this test started
		_ = host.Wait()
	})
	self, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	selfCmd := strings.TrimRight(strings.ReplaceAll(string(self), "\x00", " "), " ")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", host.Process.Pid))
		if strings.Contains(string(b), marker) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("control: the host process's command line %q does not show the marker", b)
		}
	}
	forEachSetup(t, func(t *testing.T, p *testProvider, image string) {
		sess := p.session(t, spec(image, sandbox.NetworkNone))
		installProbe(t, sess)
		r := probe(t, sess, "pids")
		if !r.OK {
			t.Fatalf("listing the processes: %+v", r)
		}
		lines := strings.Split(r.Detail, "\n")
		if len(lines) < 2 || !strings.HasPrefix(lines[0], "1 /.tai42/agent agent") {
			t.Errorf("processes seen: %q; want PID 1 the agent (/.tai42/agent agent ...)", lines)
		}
		sawProbe := false
		for _, l := range lines {
			switch {
			case strings.Contains(l, probePath+" pids"):
				sawProbe = true
			case strings.Contains(l, "/.tai42/agent"):
			default:
				t.Errorf("the session sees a process that is neither its agent nor the probe: %q", l)
			}
			if strings.Contains(l, marker) || strings.Contains(l, selfCmd) {
				t.Errorf("the session sees a host process: %q", l)
			}
		}
		if !sawProbe {
			t.Errorf("the probe does not see itself in %q", lines)
		}
		// Nor through a shell's view of /proc.
		out := mustSh(t, sess, `cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' '`)
		if strings.Contains(out, marker) || strings.Contains(out, selfCmd) {
			t.Errorf("the session's /proc shows a host process: %q", out)
		}
		// The host sees the session's processes in its cgroup, none of them
		// this process.
		for _, pid := range sessionPIDs(t, sess.ID()) {
			if pid == os.Getpid() || pid == host.Process.Pid {
				t.Errorf("host pid %d is in the session's cgroup", pid)
			}
		}
	})
}

// probeAsync runs the probe in sess from a goroutine other than the
// test's: failures come back in the result (Err "exec: ...").
func probeAsync(sess sandbox.Session, args ...string) probeResult {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	res, err := sess.Exec(ctx, append([]string{probePath}, args...), sandbox.ExecOptions{Timeout: execTimeout})
	if err != nil {
		return probeResult{Err: "exec: " + err.Error()}
	}
	var p probeResult
	if res.ExitCode != 0 {
		return probeResult{Err: fmt.Sprintf("exec: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)}
	}
	if err := jsonLine(res.Stdout, &p); err != nil {
		return probeResult{Err: "exec: " + err.Error()}
	}
	return p
}

// TestEscapeSyscalls: mount, ptrace of PID 1, unshare, raw sockets,
// setns, keyctl, bpf and the rest of the probe's privileged attempts are
// refused; /proc/sys is read-only; no new privileges, seccomp on.
func TestEscapeSyscalls(t *testing.T) {
	forEachSetup(t, func(t *testing.T, p *testProvider, image string) {
		sess := p.session(t, spec(image, sandbox.NetworkNone))
		installProbe(t, sess)
		// Controls: the probe reports success where there is one.
		for _, args := range [][]string{{"listen", "127.0.0.1:0"}, {"threads"}, {"write", "/tmp/escapeprobe"}} {
			if r := probe(t, sess, args...); !r.OK {
				t.Errorf("control: escapeprobe %q failed: %+v", args, r)
			}
		}
		refused := func(args ...string) probeResult {
			t.Helper()
			r := probe(t, sess, args...)
			if r.OK {
				t.Errorf("escapeprobe %q: an attempt succeeded: %+v", args, r)
			}
			for k, v := range r.items() {
				if v == "OK" {
					t.Errorf("escapeprobe %q: %s succeeded", args, k)
				}
			}
			return r
		}
		for _, args := range [][]string{
			{"mount"}, {"ptrace", "1"}, {"unshare"}, {"rawsock"}, {"setns"}, {"keyctl"}, {"bpf"},
			{"mknod"}, {"kmod"}, {"hostname"}, {"vsock"}, {"sysrq"},
		} {
			refused(args...)
		}
		if r := probe(t, sess, "chroot-escape"); r.OK || r.Err != "stayed inside" {
			t.Errorf("chroot escape: %+v", r)
		}
		if r := probe(t, sess, "cgroup-write"); r.OK {
			t.Errorf("the session can write its cgroups: %+v", r)
		}
		for _, path := range []string{"/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sys/net/ipv4/ip_forward"} {
			if r := refused("write", path); r.Err != "EROFS" && r.Err != "ENOENT" {
				t.Errorf("write %s: %+v, want EROFS (a read-only /proc/sys)", path, r)
			}
		}
		r := probe(t, sess, "read", "/proc/self/status")
		if !r.OK {
			t.Fatalf("reading /proc/self/status: %+v", r)
		}
		fields := map[string]string{}
		for line := range strings.Lines(r.Detail) {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
		if fields["NoNewPrivs"] != "1" {
			t.Errorf("NoNewPrivs = %q, want 1", fields["NoNewPrivs"])
		}
		if fields["Seccomp"] != "2" {
			t.Errorf("Seccomp = %q, want 2 (a filter)", fields["Seccomp"])
		}
		// A shell's children inherit it: no new privileges anywhere.
		if out := mustSh(t, sess, `grep NoNewPrivs /proc/self/status`); !strings.Contains(out, "1") {
			t.Errorf("a shell's child: %q, want NoNewPrivs 1", out)
		}
	})
}

// TestEscapeDisk: a session cannot reach the machinery of its disk cap.
// No loop device node is in its /dev (nor can it make one: the mknod probe
// of TestEscapeSyscalls makes a block device 7:0, a loop device's, and is
// refused; so are its mounts). The filesystem administration calls
// (FITRIM, EXT4_IOC_RESIZE_FS, quotactl, quotactl_fd) are refused on /,
// /tmp and /workspace, where the host gets past the permission checks of
// the same ioctls on the same filesystems (the control: EINVAL, for the
// probe asks for an empty trim and a shrink, which change nothing). The
// image files of its disk and of its persistent workspace are neither
// seen nor read, by a process or by GetFile. That a write past the cap
// fails with ENOSPC in /, /tmp and /workspace is TestDiskCapEphemeral's
// and TestDiskPersistent's. (Its session is persistent, which a pool never
// serves: it has no pool variant.)
func TestEscapeDisk(t *testing.T) {
	forEachRuntimeMode(t, func(t *testing.T, p *testProvider) {
		sp := spec(containertest.Busybox, sandbox.NetworkNone)
		sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "esc-"+randomToken(6)
		sess := p.session(t, sp)
		installProbe(t, sess)
		upper, ws, err := container.SessionDirs(p.sb, sess.ID())
		if err != nil {
			t.Fatal(err)
		}
		images := []string{filepath.Dir(upper) + ".img", filepath.Join(p.root(), "workspaces", sp.WorkspaceKey+".img")}
		for _, img := range images {
			if _, err := os.Stat(img); err != nil {
				t.Fatalf("control: the session's image %s on the host: %v", img, err)
			}
			for _, op := range []string{"stat", "read"} {
				if r := probe(t, sess, op, img); r.OK {
					t.Errorf("the session can %s its disk's image %s: %.200q", op, img, r.Detail)
				}
			}
			if b, err := sess.GetFile(ctxFor(t), img); err == nil {
				t.Errorf("GetFile(%q) read the session's disk image (%d bytes)", img, len(b))
			}
		}

		if r := probe(t, sess, "stat", "/dev/null"); !r.OK {
			t.Fatalf("control: stat /dev/null in the session: %+v", r)
		}
		for _, dev := range []string{"/dev/loop-control", "/dev/loop0"} {
			if r := probe(t, sess, "stat", dev); r.OK {
				t.Errorf("the session has the loop device node %s: %+v", dev, r)
			}
		}
		if out := mustSh(t, sess, `ls -A /dev /dev/* 2>/dev/null | grep -i loop; true`); out != "" {
			t.Errorf("loop device nodes in the session's /dev: %q", out)
		}
		if r := probe(t, sess, "read", "/proc/partitions"); r.OK && strings.Contains(r.Detail, "loop") {
			t.Logf("the session's /proc/partitions names the loop devices (names only: no node to open): %q", r.Detail)
		}

		// Control: the host, root of the machine, gets past the
		// permission checks on the session's own filesystems: FITRIM's
		// CAP_SYS_ADMIN, and EXT4_IOC_RESIZE_FS's CAP_SYS_RESOURCE where
		// this process has it (a container running the tests may not).
		controls := []string{"fitrim"}
		if hasCap(t, unix.CAP_SYS_RESOURCE) {
			controls = append(controls, "ext4-resize")
		} else {
			t.Log("this process lacks CAP_SYS_RESOURCE: no control of EXT4_IOC_RESIZE_FS on the host")
		}
		probeBin := escapeprobetest.Build(t)
		for _, dir := range []string{p.view(filepath.Dir(upper)), p.view(ws)} {
			out, err := exec.Command(probeBin, "fsadmin", dir).Output()
			if err != nil {
				t.Fatalf("control: escapeprobe fsadmin %s on the host: %v", dir, err)
			}
			var r probeResult
			if err := jsonLine(string(out), &r); err != nil {
				t.Fatal(err)
			}
			for _, call := range controls {
				if v := r.items()[call]; v == "EPERM" || v == "ENOTTY" || v == "" {
					t.Errorf("control: %s on the host on %s: %q (%+v); want it past the permission check", call, dir, v, r)
				}
			}
		}
		for _, path := range []string{"/", "/tmp", "/workspace"} {
			r := probe(t, sess, "fsadmin", path)
			if r.OK {
				t.Errorf("fsadmin %s in the session: a call succeeded: %+v", path, r)
			}
			items := r.items()
			for _, call := range []string{"fitrim", "ext4-resize", "quotactl-sync", "quotactl_fd-info"} {
				switch v := items[call]; {
				case v == "OK":
					t.Errorf("%s on %s in the session succeeded: %+v", call, path, r)
				case v == "":
					t.Errorf("%s on %s in the session: not tried: %+v", call, path, r)
				case path == "/workspace" && (call == "fitrim" || call == "ext4-resize") && v != "EPERM":
					// The bind of an ext4 directory: the ioctl reaches ext4,
					// which refuses for want of the capability.
					t.Errorf("%s on %s in the session: %s, want EPERM (%+v)", call, path, v, r)
				}
			}
			t.Logf("fsadmin %s in the session: %s", path, r.Detail)
		}
	})
}

// TestEscapeSymlinks: a symlink in the workspace that leads out of it is
// not followed by GetFile or PutFile, whether it points at a host path,
// at a path of the session's own root, or climbs with "..".
func TestEscapeSymlinks(t *testing.T) {
	forEachSetup(t, func(t *testing.T, p *testProvider, image string) {
		c := newCanary(t, "")
		sess := p.session(t, spec(image, sandbox.NetworkNone))
		// The canary's path exists in the session too, with other content:
		// whatever GetFile returns, it must not be the host's secret.
		mustSh(t, sess, `mkdir -p "$1" && echo session-copy > "$2"`, c.dir, c.path)
		mustSh(t, sess, `cd /workspace && ln -s "$1" link-canary && ln -s "$2" link-dir && ln -s /etc/passwd link-passwd && ln -s / root && ln -s ../../.. up && mkdir sub && ln -s ../../etc/passwd sub/up-passwd`, c.path, c.dir)
		passwd := mustSh(t, sess, `cat /etc/passwd`)
		ctx := ctxFor(t)
		fst, ok := sess.(sandbox.FileStreamer)
		if !ok {
			t.Fatalf("%T does not implement sandbox.FileStreamer", sess)
		}

		refusedGet := func(path string) {
			t.Helper()
			b, err := sess.GetFile(ctx, path)
			if err == nil {
				t.Errorf("GetFile(%q) followed a symlink out of the workspace: %q", path, b)
			} else if !errors.Is(err, sandbox.ErrSandbox) || errors.Is(err, sandbox.ErrFileNotFound) {
				t.Errorf("GetFile(%q): %v; want a plain sandbox error (refused: the link exists)", path, err)
			}
			if strings.Contains(string(b), c.secret) {
				t.Errorf("GetFile(%q) returned the host canary's secret", path)
			}
			if rc, _, err := fst.OpenFile(ctx, path); err == nil {
				rc.Close()
				t.Errorf("OpenFile(%q) followed a symlink out of the workspace", path)
			}
		}
		for _, path := range []string{"link-canary", "link-passwd", "root/etc/passwd", "up/etc/passwd", "sub/up-passwd", "link-dir/canary", "/workspace/link-canary"} {
			refusedGet(path)
		}

		// PutFile through a link never writes its target.
		for _, path := range []string{"link-canary", "link-passwd"} {
			data := "put-" + randomToken(8)
			err := sess.PutFile(ctx, path, []byte(data))
			got := mustSh(t, sess, `if [ -L "$1" ]; then echo "link $(readlink "$1")"; else echo "file $(cat "$1")"; fi`, "/workspace/"+path)
			switch {
			case err != nil:
				t.Logf("PutFile(%q) refused: %v (now %s)", path, err, strings.TrimSpace(got))
			case strings.TrimSpace(got) != "file "+data:
				t.Errorf("PutFile(%q) succeeded, but the workspace holds %q; want the link replaced by a file of the data", path, got)
			}
		}
		for _, path := range []string{"root/etc/tai42-escape", "up/tai42-escape", "link-dir/tai42-escape", "sub/up-passwd"} {
			if err := sess.PutFile(ctx, path, []byte("x")); err == nil && path != "sub/up-passwd" {
				t.Errorf("PutFile(%q) wrote through a symlinked directory out of the workspace", path)
			}
			if err := fst.PutFileFrom(ctx, path, strings.NewReader("y")); err == nil && path != "sub/up-passwd" {
				t.Errorf("PutFileFrom(%q) wrote through a symlinked directory out of the workspace", path)
			}
		}
		if got := mustSh(t, sess, `cat /etc/passwd`); got != passwd {
			t.Errorf("the session's /etc/passwd changed: %q, was %q", got, passwd)
		}
		if got := sh(t, sess, `ls /etc/tai42-escape /tai42-escape "$1/tai42-escape" 2>/dev/null`, c.dir); got.Stdout != "" {
			t.Errorf("a put through a symlinked directory landed in the session's root: %q", got.Stdout)
		}
		if got := mustSh(t, sess, `cat "$1"`, c.path); got != "session-copy\n" {
			t.Errorf("the session's own file at the canary's path changed: %q", got)
		}
		c.intact(t, "puts through symlinks")
	})
}

// TestEscapeWorkspaces: a session sees neither another session's
// workspace nor its files, by any path; nor does a persistent workspace
// show another key's. (The workspace is a bind mount whatever the image.)
func TestEscapeWorkspaces(t *testing.T) {
	forEachEscapeMode(t, func(t *testing.T, p *testProvider) {
		image := containertest.Busybox
		for _, durability := range []sandbox.Durability{sandbox.Ephemeral, sandbox.Persistent} {
			t.Run(string(durability), func(t *testing.T) {
				mk := func() sandbox.Session {
					sp := spec(image, sandbox.NetworkInternal)
					if durability == sandbox.Persistent {
						sp.Durability = sandbox.Persistent
						sp.WorkspaceKey = "k-" + randomToken(6)
					}
					return p.session(t, sp)
				}
				a, b := mk(), mk()
				secret := "tai42-ws-secret-" + randomToken(12)
				if err := a.PutFile(ctxFor(t), "secret.txt", []byte(secret)); err != nil {
					t.Fatal(err)
				}
				installProbe(t, b)
				if got, err := b.GetFile(ctxFor(t), "secret.txt"); !errors.Is(err, sandbox.ErrFileNotFound) {
					t.Errorf("GetFile(secret.txt) in the other session: %q, %v; want not found", got, err)
				}
				// A's workspace on the host, whichever durability: on its
				// disk, as the runtime sees the state directory.
				view := p.view("")
				wsHost := strings.TrimPrefix(findHostFile(t, view+p.opts.StateDir, "secret.txt", secret), view)
				if wsHost == "" {
					t.Fatalf("the first session's file is not under the state directory %s", p.opts.StateDir)
				}
				if want := strings.TrimPrefix(p.workspace(t, a.ID()), view) + "/secret.txt"; wsHost != want {
					t.Errorf("the first session's file is at %s, not in its workspace %s", wsHost, want)
				}
				for _, path := range []string{"/workspace/secret.txt", wsHost, filepath.Join(p.bundle(a.ID()), "agent.sock")} {
					if r := probe(t, b, "read", path); r.OK || strings.Contains(r.Detail, secret) {
						t.Errorf("the other session read %s: %+v", path, r)
					}
					if got, err := b.GetFile(ctxFor(t), path); err == nil && strings.Contains(string(got), secret) {
						t.Errorf("GetFile(%q) in the other session returned the first one's secret", path)
					}
				}
				if out := mustSh(t, b, `ls -A /workspace`); strings.TrimSpace(out) != "escapeprobe" {
					t.Errorf("the other session's workspace lists %q; want its own probe only", out)
				}
				if out := sh(t, b, `grep -rl "$1" /workspace /tmp /root /etc 2>/dev/null`, secret); out.Stdout != "" {
					t.Errorf("the other session finds the first one's secret in %q", out.Stdout)
				}
			})
		}
	})
}

// findHostFile finds, under dir on the host, the file named name holding
// content, and returns its path ("" if none).
func findHostFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	var found string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.EACCES) {
				return nil
			}
			return err
		}
		if d.Name() == "rootfs" && d.IsDir() {
			return filepath.SkipDir // a mount point of a session's root
		}
		if d.Name() == name && d.Type().IsRegular() {
			if b, err := os.ReadFile(path); err == nil && string(b) == content {
				found = path
				return filepath.SkipAll
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", dir, err)
	}
	return found
}

// hasCap reports whether this process has capability c in its effective
// set.
func hasCap(t testing.TB, c int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("CapEff in /proc/self/status: %q", v)
			}
			return n&(1<<c) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}
