package container

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/kit"
)

// UserNamespaceMode says whether sessions run in a user namespace; see
// [Options.UserNamespace].
type UserNamespaceMode string

const (
	// UserNamespaceAuto remaps where the host allows it and runs without
	// otherwise, saying why once in the log when the provider starts.
	UserNamespaceAuto UserNamespaceMode = "auto"
	// UserNamespaceOn remaps, or New fails saying why it cannot.
	UserNamespaceOn UserNamespaceMode = "on"
	// UserNamespaceOff never remaps: root in a session is root on the
	// host, held back by the hardening alone.
	UserNamespaceOff UserNamespaceMode = "off"
)

// The fixed mapping of a remapped session, the same for uids and gids:
// ids 0 to UserNamespaceSize-1 in the session are UserNamespaceBase to
// UserNamespaceBase+UserNamespaceSize-1 on the host. Every session shares
// the mapping; sessions never see each other's processes or files.
//
// On crun, each session's user namespace is owned by a host uid of its
// own, one of UserNamespaceOwners from UserNamespaceOwnerBase, which no
// process runs as: the kernel charges what a session makes (inotify
// instances, fanotify groups, namespaces, pending signals) to that uid,
// against the host's per-user limits, and never to host root (see
// ownUserNS for runc). No host account should own ids in either range:
// the provider refuses to remap when /etc/subuid or /etc/subgid hands out
// any of them.
const (
	UserNamespaceBase      = 1_000_000
	UserNamespaceSize      = 65536
	UserNamespaceOwnerBase = UserNamespaceBase + UserNamespaceSize
	UserNamespaceOwners    = 65536
)

// ownUserNS reports whether each remapped session gets a user namespace
// made beforehand, owned by a host uid of its own (see owners), that the
// runtime joins: on crun. runc 1.1 joins a given user namespace before
// every other namespace, and from it may not join the session's network
// namespace, which host root owns ("failed to setns into net namespace:
// Operation not permitted"): on runc the runtime makes the session's user
// namespace, owned by host root, and a hook bounds its counts per uid of
// the session (see limitsHook).
func (p *provider) ownUserNS() bool { return p.userns != nil && p.rt.name == "crun" }

// owners hands out the host uids that own sessions' user namespaces, one
// per session at a time, in turn (a uid just released is the last one
// taken again). Safe for concurrent use.
type owners struct {
	mu   sync.Mutex
	next int          // the offset the next take tries first
	used map[int]bool // host uids held
}

// take holds and returns a free owner uid.
func (o *owners) take() (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.used == nil {
		o.used = make(map[int]bool)
	}
	for range UserNamespaceOwners {
		uid := UserNamespaceOwnerBase + o.next
		o.next = (o.next + 1) % UserNamespaceOwners
		if !o.used[uid] {
			o.used[uid] = true
			return uid, nil
		}
	}
	return 0, fmt.Errorf("all %d owner uids of sessions' user namespaces are in use", UserNamespaceOwners)
}

// hold marks uid held (a recovered session's) and reports whether it did:
// a uid outside the range (root, for a session made before owners were)
// is not one to hold.
func (o *owners) hold(uid int) bool {
	if uid < UserNamespaceOwnerBase || uid >= UserNamespaceOwnerBase+UserNamespaceOwners {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.used == nil {
		o.used = make(map[int]bool)
	}
	o.used[uid] = true
	return true
}

// release frees uid for another session.
func (o *owners) release(uid int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.used, uid)
}

// sessionNS is a session's user namespace, and its owner.
type sessionNS struct {
	f     *os.File
	owner int
}

// userNSAhead is how many sessions' user namespaces are made ahead (see
// ahead): a namespace is a process started and killed, about a
// millisecond, which a create would otherwise add to its time (made beside
// its other steps, it slowed them by as much).
const userNSAhead = 2

// makeSessionNS makes a session's user namespace, owned by a host uid it
// takes (see owners).
func (p *provider) makeSessionNS() (sessionNS, error) {
	uid, err := p.owners.take()
	if err != nil {
		return sessionNS{}, err
	}
	f, err := newUserNS(userNSExe, uid)
	if err != nil {
		p.owners.release(uid)
		return sessionNS{}, err
	}
	return sessionNS{f: f, owner: uid}, nil
}

// discardSessionNS lets go of a session's user namespace no session took.
func (p *provider) discardSessionNS(ns sessionNS) {
	ns.f.Close()
	p.owners.release(ns.owner)
}

// userNSExe is what the process that makes a session's user namespace
// execs (and never runs, see newUserNS): a program its owner, an
// unprivileged uid, may exec wherever the state directory is.
const userNSExe = "/bin/sh"

// nsOwner returns the host uid that owns the user namespace ns.
func nsOwner(ns *os.File) (int, error) {
	uid, err := unix.IoctlGetUint32(int(ns.Fd()), unix.NS_GET_OWNER_UID)
	if err != nil {
		return 0, fmt.Errorf("the owner of a user namespace: %w", err)
	}
	return int(uid), nil
}

// rootsDir holds the mount points of remapped sessions' roots, one
// directory per session (mode 0700, owned by the session's root). The
// runtimes resolve the root's path from inside the user namespace, as the
// session's root, so every directory above it must be searchable by
// others; a state directory is often below one that is not (/root, a
// test's temporary directory).
const rootsDir = "/run/tai42/roots"

// RemapsUsers reports whether sb is a container provider whose sessions run
// in a user namespace (root in a session is host uid [UserNamespaceBase]);
// false for a provider that runs them without, and for any other sandbox.
// Safe for concurrent use.
func RemapsUsers(sb *kit.Sandbox) bool {
	p, ok := sb.Provider().(*provider)
	return ok && p.userns != nil
}

// setupUserNS decides, by mode, whether the provider's sessions run in a
// user namespace; on success p.userns is the namespace whose mapping the
// sessions' idmapped mounts take, or nil. Auto falls back to no user
// namespace, logging why; on fails instead.
func (p *provider) setupUserNS(mode UserNamespaceMode) error {
	switch mode {
	case UserNamespaceOff:
		p.log.Info("container: sessions run without a user namespace (user namespace mode off): root in a session is root on the host")
		return nil
	case "", UserNamespaceAuto, UserNamespaceOn:
	default:
		return fmt.Errorf("user namespace mode %q: want %q, %q or %q", mode, UserNamespaceAuto, UserNamespaceOn, UserNamespaceOff)
	}
	ns, err := p.openUserNS()
	if err != nil {
		if mode == UserNamespaceOn {
			return fmt.Errorf("user namespace mode on, but %w", err)
		}
		p.log.Warn("container: sessions run without a user namespace: root in a session is root on the host", "reason", err.Error())
		return nil
	}
	p.userns = ns
	if p.ownUserNS() {
		p.log.Info("container: sessions run in a user namespace, each owned by a host uid of its own", "uid_base", UserNamespaceBase, "size", UserNamespaceSize, "owner_base", UserNamespaceOwnerBase, "owners", UserNamespaceOwners)
		return nil
	}
	if p.userLimits, err = userLimits(); err != nil {
		p.userns = nil
		ns.Close()
		return fmt.Errorf("the sessions' limits: %w", err)
	}
	p.log.Info("container: sessions run in a user namespace", "uid_base", UserNamespaceBase, "size", UserNamespaceSize, "limits", strings.Join(p.userLimits, " "))
	return nil
}

// openUserNS checks that this host can run remapped sessions and returns a
// handle on a user namespace with their mapping. Its error says what is
// missing.
func (p *provider) openUserNS() (_ *os.File, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the provider does not run as root, which idmapped mounts need")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return nil, errors.New("user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)")
	}
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		if err := checkSubIDs(f); err != nil {
			return nil, err
		}
	}
	if err := searchable(filepath.Dir(filepath.Dir(rootsDir))); err != nil {
		return nil, err
	}
	for _, d := range []string{filepath.Dir(rootsDir), rootsDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("the sessions' root mount points: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("the sessions' root mount points: %w", err)
		}
	}
	ns, err := newUserNS(p.agent.binary, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ns.Close()
		}
	}()
	// An idmapped mount of the image store, and a whole root of the host
	// image as a session gets it: the kernel and the filesystems allow
	// them.
	fd, err := idmapTree(p.images.Dir(), ns)
	if err != nil {
		return nil, fmt.Errorf("the image store: %w", err)
	}
	unix.Close(fd)
	if err = p.probeRemappedRoot(ns); err != nil {
		return nil, err
	}
	if p.rt.name == "crun" {
		// A namespace as each session gets its own (see ownUserNS).
		owned, err := newUserNS(userNSExe, UserNamespaceOwnerBase)
		if err != nil {
			return nil, fmt.Errorf("a session's user namespace: %w", err)
		}
		owned.Close()
	}
	return ns, nil
}

// checkSubIDs refuses a subordinate id file (/etc/subuid, /etc/subgid) that
// hands out an id of the sessions' range; a missing file hands out none.
func checkSubIDs(file string) error {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(fields) != 3 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		start, err1 := strconv.ParseInt(fields[1], 10, 64)
		count, err2 := strconv.ParseInt(fields[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if end := int64(UserNamespaceOwnerBase + UserNamespaceOwners); start < end && UserNamespaceBase < start+count {
			return fmt.Errorf("%s gives %s ids %d-%d, which overlap the sessions' ranges %d-%d", file, fields[0], start, start+count-1, UserNamespaceBase, end-1)
		}
	}
	return sc.Err()
}

// searchable checks that others may search dir and every directory above
// it, as root in a session must to reach its root mount point.
func searchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("the sessions' root mount points: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by others (mode %v), so root in a session could not reach its root under %s", d, fi.Mode().Perm(), rootsDir)
		}
		if d == "/" {
			return nil
		}
	}
}

// newUserNS returns a handle on a new user namespace with the sessions'
// mapping, owned by host uid owner. A child process makes it: exe,
// started traced so that it stops at its exec, before it runs anything,
// and is killed there; the handle keeps the namespace after the child is
// gone.
//
// A namespace's owner is the effective uid of the thread that makes it,
// and the kernel charges what is made in the namespace (inotify
// instances, fanotify groups, namespaces, pending signals) to its owner
// as well, against the host's per-user limits. So the child is cloned by
// a thread of this process whose effective uid is owner for that moment
// only: a thread of its own, locked, that ends with its goroutine unless
// it is root again. (The Go runtime starts no thread from a locked one.)
// exe must be one that owner may run.
func newUserNS(exe string, owner int) (*os.File, error) {
	type result struct {
		ns  *os.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The tracer is this thread: it must not go before the child is
		// reaped, or the child would run on untraced.
		runtime.LockOSThread()
		ns, root, err := cloneUserNS(exe, owner)
		if root {
			runtime.UnlockOSThread()
		}
		done <- result{ns, err}
	}()
	r := <-done
	return r.ns, r.err
}

// cloneUserNS is newUserNS on a locked thread; root says whether the
// thread's effective uid is root again.
func cloneUserNS(exe string, owner int) (_ *os.File, root bool, _ error) {
	cmd := &exec.Cmd{
		Path: exe,
		Args: []string{"tai42-userns-holder"},
		Env:  []string{},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER,
			Ptrace:     true,
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	if err := setThreadEUID(owner); err != nil {
		return nil, false, fmt.Errorf("cannot become uid %d to make a user namespace it owns: %w", owner, err)
	}
	startErr := cmd.Start()
	if err := setThreadEUID(0); err != nil {
		if startErr == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return nil, false, fmt.Errorf("cannot become root again after making a user namespace: %w", err)
	}
	if startErr != nil {
		return nil, true, fmt.Errorf("cannot start a process in a new user namespace (%s as uid %d): %w", exe, owner, startErr)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	mapping := fmt.Sprintf("0 %d %d\n", UserNamespaceBase, UserNamespaceSize)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(mapping), 0); err != nil {
			return nil, true, fmt.Errorf("the new user namespace's %s: %w", f, err)
		}
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return nil, true, fmt.Errorf("the new user namespace: %w", err)
	}
	return ns, true, nil
}

// setThreadEUID sets the effective uid of the calling thread alone (its
// real and saved uids stay root, so that it may become root again).
func setThreadEUID(uid int) error {
	if unix.Geteuid() == uid {
		return nil
	}
	keep := ^uintptr(0) // -1: unchanged
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); errno != 0 {
		return errno
	}
	return nil
}

// idmapTree returns a detached, read-only copy of the mount of src whose
// files' owners are shifted by userns's mapping (host root shows as
// UserNamespaceBase): a file descriptor to attach with move_mount, or to
// close, which frees it.
func idmapTree(src string, userns *os.File) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", src, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY, Userns_fd: uint64(userns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("an idmapped mount of %s (mount_setattr): %w", src, err)
	}
	return fd, nil
}

// mountIDMapped mounts src at target read-only, its files' owners shifted
// by userns's mapping.
func mountIDMapped(src, target string, userns *os.File) error {
	fd, err := idmapTree(src, userns)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := attach(fd, target); err != nil {
		return fmt.Errorf("mount the idmapped %s: %w", src, err)
	}
	return nil
}

// attach mounts the detached mount fd at target.
func attach(fd int, target string) error {
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount on %s: %w", target, err)
	}
	return nil
}

// probeDir is where probeRemappedRoot mounts, under the provider's root.
const probeDir = "userns-probe"

// probeRemappedRoot mounts and unmounts, where the runtime runs, a root
// made as a remapped session's is: an overlay whose lower layer is the
// host image's skeleton idmapped through userns.
func (p *provider) probeRemappedRoot(userns *os.File) error {
	dir := filepath.Join(p.root, probeDir)
	p.removeProbe()
	defer p.removeProbe()
	for _, d := range []string{"", "lower", "upper", "work", "rootfs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	return p.rt.do(func() error {
		lower := filepath.Join(dir, "lower")
		if err := mountIDMapped(p.host.Rootfs, lower, userns); err != nil {
			return err
		}
		defer func() { _ = unmount(lower) }()
		rootfs := filepath.Join(dir, "rootfs")
		if err := mountOverlay([]string{lower}, filepath.Join(dir, "upper"), filepath.Join(dir, "work"), rootfs); err != nil {
			return fmt.Errorf("an overlay on an idmapped lower layer: %w", err)
		}
		return unmount(rootfs)
	})
}

// removeProbe removes what probeRemappedRoot made, or left when the
// process died in it.
func (p *provider) removeProbe() {
	dir := filepath.Join(p.root, probeDir)
	_ = p.rt.do(func() error {
		_ = unmount(filepath.Join(dir, "rootfs"))
		return unmount(filepath.Join(dir, "lower"))
	})
	_ = oscmd.RemoveAll(dir)
}

// shiftOwners makes root in the sessions own the persistent workspace ws
// once more after the provider's mode changed: a workspace whose top is
// owned by host root was made without remapping, one owned by
// UserNamespaceBase with. Every file whose uid (gid) is in the other mode's
// range is moved to the same place in the current one; a workspace that
// is already current, or whose top neither mode's root owns, is left
// alone. Chown clears set-user-ID and set-group-ID bits, which mean
// nothing on the nosuid workspace mount. The walk cannot leave ws.
func shiftOwners(ws string, remapped bool) error {
	from, to := 0, UserNamespaceBase
	if !remapped {
		from, to = to, from
	}
	fi, err := os.Lstat(ws)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != from {
		return nil
	}
	root, err := os.OpenRoot(ws)
	if err != nil {
		return err
	}
	defer root.Close()
	shift := func(id uint32) int {
		if int(id) >= from && int(id) < from+UserNamespaceSize {
			return int(id) - from + to
		}
		return -1
	}
	return fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		uid, gid := shift(st.Uid), shift(st.Gid)
		if uid < 0 && gid < 0 {
			return nil
		}
		if err := root.Lchown(path, uid, gid); err != nil {
			return fmt.Errorf("shifting the owner of %s: %w", path, err)
		}
		return nil
	})
}

// prepareNetns readies a remapped session's network namespace ns, on a
// thread that enters it, and returns a read-only sysfs of it, detached (a
// mount file descriptor to attach with move_mount, or to close). A user
// namespace may mount a sysfs only of a network namespace it owns, and
// the session's belongs to the host's user namespace (runc then fails;
// crun binds the host's whole /sys, cgroup trees included), so the
// provider mounts it for the session: the same /sys an unremapped session
// gets, its files the host root's, so nobody's in the session.
//
// It also lets every user of ns bind ports below 1024
// (net.ipv4.ip_unprivileged_port_start 0): a remapped session's
// CAP_NET_BIND_SERVICE is of its own user namespace, not of the one its
// network namespace belongs to. This gives back what the capability gives
// an unremapped session, as Docker does for every container.
func prepareNetns(ns *os.File) (sysfs int, err error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// A thread that cannot return to the host's namespace dies with
		// this goroutine, still locked.
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		defer host.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("entering the session's network namespace: %w", err)}
			return
		}
		fd, err := inSessionNetns()
		if unix.Setns(int(host.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}

// inSessionNetns is prepareNetns's work on the thread in the session's
// network namespace.
func inSessionNetns() (int, error) {
	// /proc/sys/net is the namespace of the thread that opens it.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0); err != nil {
		return -1, fmt.Errorf("letting the session bind ports below 1024: %w", err)
	}
	// A sysfs shows the network namespace of the thread that creates it.
	fsfd, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("the session's sysfs (fsopen): %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("the session's sysfs (fsconfig): %w", err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("the session's sysfs (fsmount): %w", err)
	}
	return fd, nil
}
