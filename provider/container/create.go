package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/kit"
)

// Create makes a session as the steps below, in order. Each step that
// makes something pushes its undo on the session's teardown stack: a step
// that fails has the steps before it undone, last first, and a session
// made keeps the stack for its Destroy, which unwinds it the same way.
func (p *provider) Create(ctx context.Context, req kit.CreateRequest) (_ kit.Resources, err error) {
	if !p.ready.Load() {
		return nil, errors.New("container: the provider has not recovered its state directory yet (the kit calls Recover before any create)")
	}
	// The refills of what is made ahead wait for the creates (their
	// rollbacks included).
	p.creates.begin()
	defer p.creates.end()
	c := p.newCreation(ctx, req)
	r := c.r
	// First: from here on no other process sweeps what this one makes.
	if r.lock, err = p.locks.Hold(req.ID); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if cerr := r.cleanup(context.WithoutCancel(ctx)); cerr != nil {
				p.log.Warn("container: cleanup after a failed create", "id", req.ID, "step", undo.FailedStep(err), "err", cerr)
			}
		}
	}()
	defer c.closeTemps() // before the rollback, as the create's own handles
	if err := r.teardown.Run(
		undo.Step{Name: "bundle", Do: c.bundle},
		undo.Step{Name: "reserve", Do: c.reserve},
		undo.Step{Name: "disk", Do: c.disk},
		undo.Step{Name: "workspace", Do: c.workspace},
		undo.Step{Name: "image", Do: c.image},
		undo.Step{Name: "layers", Do: c.layers},
		undo.Step{Name: "idmapped image", Do: c.idmappedImage},
		undo.Step{Name: "root mount point", Do: c.rootMountPoint},
		undo.Step{Name: "root", Do: c.root},
		undo.Step{Name: "network", Do: c.network},
		undo.Step{Name: "bundle handle", Do: c.bundleHandle},
		undo.Step{Name: "agent socket", Do: c.agentSocket},
		undo.Step{Name: "netns handle", Do: c.netnsHandle},
		undo.Step{Name: "sysfs", Do: c.sysfs},
		undo.Step{Name: "user namespace", Do: c.userNamespace},
		undo.Step{Name: "spec", Do: c.spec},
		undo.Step{Name: "log", Do: c.openLog},
		undo.Step{Name: "container", Do: c.container},
		undo.Step{Name: "agent", Do: c.agent},
		undo.Step{Name: "warm", Do: c.warm},
	); err != nil {
		return nil, err
	}
	return r, nil
}

// keptTeardown pushes the teardown of a kept session, recovered from the
// ledger's handle h, as its create pushed it (see Create; keep the two in
// step): whatever the earlier run's create made is taken to be there, its
// mounts as they are where the cleanup would unmount them (mounted: for
// crun in a mount namespace of its own, the earlier run's namespace died
// with it, and with it the mounts; the container's own mount namespace
// holds its root). The undos of handles recoverOne has yet to take (its
// network, image, bundle handle, PID 1's pidfd) do nothing until they are
// taken.
func (r *session) keptTeardown(h sessionHandle, mounted map[string]bool) {
	t := &r.teardown
	t.Push("bundle", r.removeBundle)
	if r.disk != nil {
		t.Push("disk", r.closeSessionDisk)
	}
	if r.wsDisk != nil {
		t.Push("workspace", r.closeWorkspaceDisk)
	}
	t.Push("image", r.releaseImage)
	if slices.ContainsFunc(lowerMounts(r.dir), func(m string) bool { return isMounted(mounted, m) }) {
		t.Push("idmapped image", r.unmountLowers)
	}
	if h.Remap {
		t.Push("root mount point", r.removeRootDir)
	}
	if isMounted(mounted, r.rootfs) {
		t.Push("root", r.unmountRoot)
	}
	t.Push("network", r.teardownNet)
	t.Push("bundle handle", r.closeBundleHandle)
	if isMounted(mounted, filepath.Join(r.dir, "sys")) {
		t.Push("sysfs", r.unmountSysfs)
	}
	if h.Remap {
		t.Push("user namespace", r.releaseOwner)
	}
	t.Push("container", r.removeContainer)
}

// creation is one Create under way: the session it makes, and what its
// steps hand on to the steps after them.
type creation struct {
	ctx context.Context
	p   *provider
	req kit.CreateRequest
	r   *session

	owner       int      // the host uid (and gid) of root in the session
	upper, work string   // the root overlay's upper and work directories
	lowers      []string // its lower layers, lowest first: the image's, or their idmapped views
	binds       []bind
	resolvConf  string
	sysfsDir    string    // where the session's sysfs is mounted; "": none
	listener    *os.File  // the agent's listening socket, handed to the container
	netns       *os.File  // the session's network namespace, joined by the runtime
	userns      *os.File  // when remapped on crun, the session's user namespace, joined by the runtime
	netnsSysfs  int       // a sysfs of that namespace, to attach; -1: none
	stdio       *stdioLog // the container's stdout and stderr

	seccompKey   [32]byte // the config's seccomp profile (crun)
	learnSeccomp bool     // keep the program crun compiles for it
}

func (p *provider) newCreation(ctx context.Context, req kit.CreateRequest) *creation {
	r := &session{
		p: p, id: req.ID, spec: req.Spec,
		dir:    filepath.Join(p.sessDir, req.ID),
		initFD: -1,
	}
	r.teardown.Fault = p.createFault(req.ID)
	return &creation{
		ctx: ctx, p: p, req: req, r: r,
		// Root in the session owns its workspace and its root's upper
		// layer: host uid UserNamespaceBase when remapped, host root
		// otherwise.
		owner:      p.rootUID(),
		upper:      filepath.Join(r.dir, diskUpper),
		work:       filepath.Join(r.dir, diskWork),
		netnsSysfs: -1,
	}
}

// createFault is the test's fault injection of session id's create steps
// (see export_test.go); nil in production.
func (p *provider) createFault(id string) func(step string) error {
	if p.faults == nil {
		return nil
	}
	return func(step string) error { return p.faults(id, step) }
}

// closeTemps closes what the create held for itself alone.
func (c *creation) closeTemps() {
	for _, f := range []*os.File{c.listener, c.netns, c.userns} {
		if f != nil {
			f.Close()
		}
	}
	if c.netnsSysfs >= 0 {
		unix.Close(c.netnsSysfs)
	}
}

// bundle makes the session's bundle directory: its config, root overlay,
// agent socket, and (ephemeral, uncapped) its workspace.
func (c *creation) bundle() (undo.Func, error) {
	if err := os.Mkdir(c.r.dir, 0o700); err != nil {
		return nil, err
	}
	return c.r.removeBundle, nil
}

// removeBundle is the undo of bundle; it never removes through a root
// still mounted: that would write into its upper layer, and could not
// finish.
func (r *session) removeBundle(context.Context) error {
	if r.stuck {
		return nil
	}
	return oscmd.RemoveAll(r.dir)
}

// reserve checks the reserve, whether or not the sessions' disks are
// capped: it keeps the state directory's filesystem (the ledger,
// persistent workspaces) from filling up.
func (c *creation) reserve() (undo.Func, error) {
	return nil, c.p.checkReserve()
}

// disk takes the session's disk, with the cap on: its root's upper layer,
// its /tmp and its ephemeral workspace are there.
func (c *creation) disk() (undo.Func, error) {
	if !c.p.diskOn {
		return nil, nil
	}
	r, p := c.r, c.p
	var err error
	if r.disk, err = p.sessionDisk(); err != nil {
		return nil, fmt.Errorf("the session's disk (cap %d MiB, %d inodes; tai42 serve --disk-mb, --disk-inodes): %w", p.disk.mb, p.disk.inodes, err)
	}
	c.upper, c.work = r.disk.path(diskUpper), r.disk.path(diskWork)
	return r.closeSessionDisk, nil
}

// closeSessionDisk is the undo of disk, once nothing of the session is
// mounted on it: the container's mounts are gone with it, the root overlay
// before.
func (r *session) closeSessionDisk(context.Context) error {
	if r.disk == nil || r.stuck {
		return nil
	}
	if err := r.p.closeDisk(r.disk, true); err != nil {
		r.stuck = true
		return err
	}
	r.disk = nil
	return nil
}

// workspace makes or opens the session's workspace: its key's (an image
// of its own, mounted, or a directory), its disk's, or a directory of its
// bundle.
func (c *creation) workspace() (undo.Func, error) {
	r := c.r
	switch {
	case c.req.Spec.Durability == sandbox.Persistent:
		var err error
		// openWorkspace holds the key's image in r.wsDisk as soon as it
		// is mounted: its undo goes with a failure after that, too.
		r.ws, err = c.p.openWorkspace(c.ctx, r, c.req.Spec.WorkspaceKey)
		return r.closeWorkspaceDisk, err
	case r.disk != nil:
		r.ws = r.disk.path(diskWorkspace)
	default:
		r.ws = filepath.Join(r.dir, "workspace")
		if err := os.Mkdir(r.ws, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chown(r.ws, c.owner, c.owner); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// closeWorkspaceDisk is the undo of a persistent workspace's image: it is
// unmounted and let go of, and kept.
func (r *session) closeWorkspaceDisk(context.Context) error {
	if r.wsDisk == nil || r.stuck {
		return nil
	}
	if err := r.p.closeDisk(r.wsDisk, false); err != nil {
		r.stuck = true
		return fmt.Errorf("the persistent workspace's image: %w", err)
	}
	r.wsDisk = nil
	return nil
}

// image holds the session's image (the store's, while the session runs)
// or takes the host image's binds.
func (c *creation) image() (undo.Func, error) {
	r, p := c.r, c.p
	if c.req.Spec.Image == sandbox.HostImage {
		for _, b := range p.host.Binds {
			c.binds = append(c.binds, bind{source: b.Source, dest: b.Dest})
		}
		c.lowers, r.env = []string{p.host.Rootfs}, baseEnv(p.host.Env)
		return nil, nil
	}
	img, release, err := p.acquireImage(c.ctx, c.req.Spec.Image)
	if err != nil {
		return nil, err
	}
	r.release, r.imageID, r.user = release, img.ID, img.User
	c.lowers, r.env = img.Layers, baseEnv(img.Env)
	return r.releaseImage, nil
}

// releaseImage is the undo of image.
func (r *session) releaseImage(context.Context) error {
	if r.release != nil {
		r.release()
		r.release = nil
	}
	return nil
}

// layers makes the root overlay's upper and work directories in the
// bundle, with the cap off (the disk has its own).
func (c *creation) layers() (undo.Func, error) {
	if c.r.disk != nil {
		return nil, nil
	}
	for _, d := range []string{c.upper, c.work} {
		// The upper layer's top is the session's "/": 0755, as a root is
		// (the bundle directory above it is 0700).
		mode := os.FileMode(0o755)
		if d == c.work {
			mode = 0o700
		}
		if err := os.Mkdir(d, mode); err != nil {
			return nil, err
		}
		if err := os.Chown(d, c.owner, c.owner); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// idmappedImage mounts, when remapped, each layer of the image idmapped
// (lower/0 the lowest), so that its root's files are root's in the
// session; they are the overlay's lower layers.
func (c *creation) idmappedImage() (undo.Func, error) {
	if c.p.userns == nil {
		return nil, nil
	}
	if err := os.Mkdir(filepath.Join(c.r.dir, lowerDir), 0o700); err != nil {
		return nil, err
	}
	mapped := make([]string, len(c.lowers))
	for i, l := range c.lowers {
		mapped[i] = layerMountPoint(c.r.dir, i)
		if err := os.Mkdir(mapped[i], 0o700); err != nil {
			return c.r.unmountLowers, err
		}
		if err := c.p.rt.do(func() error { return mountIDMapped(l, mapped[i], c.p.userns) }); err != nil {
			return c.r.unmountLowers, fmt.Errorf("the session's image, layer %d of %d: %w", i+1, len(c.lowers), err)
		}
	}
	c.lowers = mapped
	return c.r.unmountLowers, nil
}

// unmountLowers is the undo of idmappedImage: every idmapped layer,
// whether this process mounted it or an earlier one did (the one idmapped
// image of a session an earlier version made included).
func (r *session) unmountLowers(context.Context) error {
	err := r.p.rt.do(func() error {
		var errs []error
		for _, m := range lowerMounts(r.dir) {
			errs = append(errs, unmount(m))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		r.stuck = true
		return fmt.Errorf("unmount the idmapped layers of the session's image: %w", err)
	}
	return nil
}

// rootMountPoint makes, when remapped, the root's own directory under
// rootsDir, where the session's root can reach it; without remapping the
// root is mounted in the bundle.
func (c *creation) rootMountPoint() (undo.Func, error) {
	r := c.r
	if c.p.userns == nil {
		r.rootfs = filepath.Join(r.dir, "rootfs")
		return nil, nil
	}
	r.rootDir = filepath.Join(rootsDir, c.req.ID)
	if err := os.Mkdir(r.rootDir, 0o700); err != nil {
		return nil, fmt.Errorf("the session's root mount point: %w", err)
	}
	r.rootfs = filepath.Join(r.rootDir, "rootfs")
	return r.removeRootDir, os.Chown(r.rootDir, c.owner, c.owner)
}

// removeRootDir is the undo of rootMountPoint, once the root is unmounted.
func (r *session) removeRootDir(context.Context) error {
	if r.stuck {
		return nil
	}
	return removeRootMount(r.rootDir)
}

// root mounts the session's root: an overlay of its image (read-only) and
// its upper layer.
func (c *creation) root() (undo.Func, error) {
	r := c.r
	if err := os.Mkdir(r.rootfs, 0o700); err != nil {
		return nil, err
	}
	if err := c.p.rt.do(func() error { return mountOverlay(c.lowers, c.upper, c.work, r.rootfs) }); err != nil {
		return nil, c.p.diskFull(r, fmt.Errorf("the session's root overlay: %w", err))
	}
	return r.unmountRoot, nil
}

// unmountRoot is the undo of root.
func (r *session) unmountRoot(context.Context) error {
	if err := r.p.rt.do(func() error { return unmount(r.rootfs) }); err != nil {
		r.stuck = true
		return fmt.Errorf("unmount the session's root: %w", err)
	}
	if r.rootDir == "" {
		// Its mount point now, not with the bundle: removing it detaches
		// the copies of the root that mount namespaces made meanwhile
		// hold (see closeDisk), which would hold its disk.
		if err := os.Remove(r.rootfs); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.stuck = true
			return fmt.Errorf("the session's root mount point: %w", err)
		}
	}
	return nil
}

// network sets up the session's network namespace on its tier.
func (c *creation) network() (undo.Func, error) {
	r := c.r
	var err error
	if r.net, err = c.p.net.Setup(c.ctx, c.req.ID, c.req.Spec.Network); err != nil {
		return nil, fmt.Errorf("network %q: %w", c.req.Spec.Network, err)
	}
	if c.req.Spec.Network == sandbox.NetworkEgress {
		c.resolvConf = c.p.resolvConf()
	}
	return r.teardownNet, nil
}

// teardownNet is the undo of network (and of a recovered session's
// adopted one).
func (r *session) teardownNet(context.Context) error {
	if r.net == nil {
		return nil
	}
	return r.p.net.Teardown(r.net)
}

// bundleHandle opens the bundle as an O_PATH handle: the agent's socket is
// reached through it, since a state directory's path may be longer than a
// socket address may be.
func (c *creation) bundleHandle() (undo.Func, error) {
	var err error
	if c.r.dirFD, err = unix.Open(c.r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, err
	}
	return c.r.closeBundleHandle, nil
}

// closeBundleHandle is the undo of bundleHandle.
func (r *session) closeBundleHandle(context.Context) error {
	if r.dirFD > 0 {
		unix.Close(r.dirFD)
		r.dirFD = 0
	}
	return nil
}

// agentSocket listens on the agent's socket in the bundle, for the
// container to take (the create closes its own copy).
func (c *creation) agentSocket() (undo.Func, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.r.sockPath(), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("the agent's socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	c.listener, err = ln.File()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("the agent's socket: %w", err)
	}
	return nil, nil
}

// netnsHandle opens the session's network namespace: the runtime joins it
// through this handle, since crun runs in a mount namespace of its own,
// where the namespace's bind mount (made later, in ours) does not show.
func (c *creation) netnsHandle() (undo.Func, error) {
	var err error
	if c.netns, err = os.Open(c.r.net.Path()); err != nil {
		return nil, fmt.Errorf("the session's network namespace: %w", err)
	}
	return nil, nil
}

// sysfs mounts, when remapped, the read-only sysfs of the session's
// network namespace (a user namespace cannot mount it).
func (c *creation) sysfs() (undo.Func, error) {
	if c.p.userns == nil {
		return nil, nil
	}
	var err error
	if c.netnsSysfs, err = prepareNetns(c.netns); err != nil {
		c.netnsSysfs = -1
		return nil, err
	}
	dir := filepath.Join(c.r.dir, "sys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	if err := c.p.rt.do(func() error { return attach(c.netnsSysfs, dir) }); err != nil {
		return nil, fmt.Errorf("the session's sysfs: %w", err)
	}
	c.sysfsDir = dir
	return c.r.unmountSysfs, nil
}

// unmountSysfs is the undo of sysfs.
func (r *session) unmountSysfs(context.Context) error {
	if err := r.p.rt.do(func() error { return unmount(filepath.Join(r.dir, "sys")) }); err != nil {
		r.stuck = true
		return fmt.Errorf("unmount the session's sysfs: %w", err)
	}
	return nil
}

// userNamespace gives, when remapped on crun (see ownUserNS), the
// session its user namespace, owned by a host uid of its own (see owners),
// for the runtime to join: one made ahead, or one made now when none is
// ready. Its undo, once the container is gone, frees the owner.
func (c *creation) userNamespace() (undo.Func, error) {
	if !c.p.ownUserNS() {
		return nil, nil
	}
	var ns sessionNS
	ok := false
	if c.p.nsPool != nil {
		ns, ok = c.p.nsPool.take()
	}
	if !ok {
		var err error
		if ns, err = c.p.makeSessionNS(); err != nil {
			return nil, err
		}
	}
	c.userns, c.r.owner = ns.f, ns.owner
	return c.r.releaseOwner, nil
}

// releaseOwner is the undo of userNamespace.
func (r *session) releaseOwner(context.Context) error {
	if r.owner != 0 {
		r.p.owners.release(r.owner)
		r.owner = 0
	}
	return nil
}

// procPath is a path the runtime opens f by (through this process's file
// descriptors: a namespace's handle, which has no path of its own); "" for
// nil.
func procPath(f *os.File) string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
}

// spec writes the container's OCI config into the bundle; for crun, with
// the seccomp program it compiled for the profile before (seccompCache).
func (c *creation) spec() (undo.Func, error) {
	r, p := c.r, c.p
	s := buildSpec(specInput{
		remap:       p.userns != nil,
		userns:      procPath(c.userns),
		limits:      p.sessionUserLimits(),
		tmpfs:       r.disk == nil,
		sysfs:       c.sysfsDir,
		rootfs:      r.rootfs,
		workspace:   r.ws,
		agent:       p.agent,
		netns:       procPath(c.netns),
		binds:       c.binds,
		resolvConf:  c.resolvConf,
		hostname:    "tai42",
		cgroupsPath: cgroupsPath(c.req.ID),
		cpu:         c.req.Spec.CPU,
		memoryMB:    c.req.Spec.MemoryMB,
		pids:        p.opts.PidsLimit,
	})
	if p.rt.name == "crun" {
		var hit bool
		c.seccompKey, hit = p.seccomp.annotate(s)
		c.learnSeccomp = !hit && s.Linux.Seccomp != nil
	}
	return nil, writeSpec(r.dir, s)
}

// openLog makes the container's stdout and stderr, drained by this
// process (see stdioLog); its undo, once the container is gone, stops the
// drain.
func (c *creation) openLog() (undo.Func, error) {
	var err error
	if c.stdio, err = newStdioLog(); err != nil {
		return nil, err
	}
	l := c.stdio
	return func(context.Context) error { l.close(); return nil }, nil
}

// container runs the container, its PID 1 the agent. Its undo is pushed
// whether or not the run succeeded: a run that failed may have left the
// container in the runtime's state, and its cgroup.
func (c *creation) container() (undo.Func, error) {
	r, p := c.r, c.p
	if err := p.rt.run(c.ctx, c.req.ID, r.dir, c.stdio, c.listener, p.userns != nil); err != nil {
		return r.removeContainer, p.diskFull(r, err)
	}
	if c.learnSeccomp {
		if err := p.seccomp.learn(c.seccompKey, filepath.Join(p.rt.root, c.req.ID)); err != nil {
			p.log.Debug("container: crun's compiled seccomp program is not kept; the next create compiles it again", "err", err)
		}
	}
	r.initFD = pidfdOf(filepath.Join(r.dir, initPidFile))
	return r.removeContainer, nil
}

// removeContainer is the undo of container: the runtime's delete of the
// container, which ends every process in it and with them the execs (a
// Destroy has ended them and waits for them here, see Destroy); then the
// put_file temporaries the killed agent left, its PID 1's pidfd and its
// cgroup.
func (r *session) removeContainer(ctx context.Context) error {
	var errs []error
	if err := r.p.rt.delete(ctx, r.id, r.dir); err != nil {
		errs = append(errs, err)
	}
	if err := r.waitEnded(); err != nil {
		errs = append(errs, err)
	}
	r.removePutTemps()
	if r.initFD >= 0 {
		unix.Close(r.initFD)
		r.initFD = -1
	}
	if err := r.p.cgroups.remove(cgroupsPath(r.id)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// agent waits for the session's agent to answer.
func (c *creation) agent() (undo.Func, error) {
	r := c.r
	r.connectAgent()
	pctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if err := r.agent.Ping(pctx); err != nil {
		msg := c.stdio.text(2048)
		return nil, c.p.diskFull(r, fmt.Errorf("the session's agent did not answer: %w%s", err, ifNotEmpty("; its log: ", msg)))
	}
	c.stdio.settle()
	return nil, nil
}

// warm runs one command in a session made ahead for a pool (the agent
// binary's version, which every session has), best effort: a session's
// first exec costs about a millisecond more than the next ones (the
// agent's and the kernel's first process in it), which a pool's refill
// pays instead of the create that takes the session. It leaves nothing
// in the session but the process ids it used.
func (c *creation) warm() (undo.Func, error) {
	if !c.req.Ahead {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	res, err := c.r.ex.Exec(ctx, kit.ExecRequest{Argv: c.p.agent.run("version"),
		Cwd: kit.Path{Rel: ".", Abs: workspaceDir, Orig: "."}, Timeout: 10 * time.Second})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %.200s", res.ExitCode, res.Stderr)
	}
	if err != nil && c.ctx.Err() == nil {
		c.p.log.Debug("container: warming a session made ahead failed; it is handed out all the same", "id", c.req.ID, "err", err)
	}
	return nil, nil
}
