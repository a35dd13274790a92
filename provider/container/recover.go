package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/sessionlock"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/kit"
)

var (
	_ kit.Recoverer   = (*provider)(nil)
	_ kit.Recoverable = (*session)(nil)
)

// sessionHandle is what the ledger keeps of a session for its recovery, beside
// its id and spec: what the provider was when it made the session.
type sessionHandle struct {
	// V is the handle's format, handleVersion.
	V int `json:"v"`
	// Runtime is the OCI runtime that runs the container: "runc" or
	// "crun".
	Runtime string `json:"runtime"`
	// Remap says whether the session runs in a user namespace.
	Remap bool `json:"remap"`
	// Image is the content digest of the session's image; "" for the host
	// image.
	Image string `json:"image,omitempty"`
	// Disk is the name of the session's disk in the disks directory (its
	// image NAME.img, mounted at NAME); "" when it has none (no cap).
	Disk string `json:"disk,omitempty"`
	// WSImage says the session's persistent workspace is its key's image
	// (mounted under workspaces/+mnt/KEY), not a plain directory.
	WSImage bool `json:"ws_image,omitempty"`
}

const handleVersion = 1

// recoverPing bounds a recovered session's first ping of its agent.
const recoverPing = 5 * time.Second

// recoverWorkers is how many sessions Recover removes, or brings back, at
// once.
const recoverWorkers = 4

// Handle implements [kit.Recoverable]: a small JSON object naming the
// session's OCI runtime, whether it runs in a user namespace, its image's
// digest, its disk and whether its persistent workspace is an image, e.g.
// {"v":1,"runtime":"runc","remap":true,"disk":"d-0123456789abcdef"}. It holds no
// env value. Safe for concurrent use.
func (r *session) Handle() json.RawMessage {
	h := sessionHandle{V: handleVersion, Runtime: r.p.rt.name, Remap: r.p.userns != nil, Image: r.imageID, WSImage: r.wsDisk != nil}
	if r.disk != nil {
		h.Disk = r.disk.name()
	}
	b, err := json.Marshal(h)
	if err != nil {
		panic(fmt.Sprintf("container: encoding a session handle: %v", err)) // a struct of strings and a bool always encodes
	}
	return b
}

// holdOwner holds, for a recovered session whose PID 1 is pid, the host
// uid that owns its user namespace (see owners), so that no new session
// gets it while this one runs.
func (r *session) holdOwner(pid int) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return err
	}
	defer ns.Close()
	uid, err := nsOwner(ns)
	if err != nil {
		return err
	}
	if r.p.owners.hold(uid) {
		r.owner = uid
	}
	return nil
}

// parseHandle reads a session's handle, as Handle wrote it.
func parseHandle(raw json.RawMessage) (sessionHandle, error) {
	if len(raw) == 0 {
		return sessionHandle{}, errors.New("the ledger holds no handle of it, which every session the container provider made has")
	}
	var h sessionHandle
	if err := json.Unmarshal(raw, &h); err != nil {
		return sessionHandle{}, fmt.Errorf("its handle in the ledger does not decode: %w", err)
	}
	if h.V != handleVersion {
		return sessionHandle{}, fmt.Errorf("its handle is of format %d; this provider reads format %d", h.V, handleVersion)
	}
	if h.Runtime != "runc" && h.Runtime != "crun" {
		return sessionHandle{}, fmt.Errorf("its handle names the OCI runtime %q, neither runc nor crun", h.Runtime)
	}
	return h, nil
}

// mismatch says how the provider now differs from the one that made the
// session of h (its runtime, its user namespace mode); nil when it does
// not. Such a session cannot be brought back: its container, mounts and
// ids are of the other kind.
func (p *provider) mismatch(h sessionHandle) error {
	var diffs []string
	if h.Runtime != p.rt.name {
		diffs = append(diffs, fmt.Sprintf("its container runs on %s and the provider now runs %s", h.Runtime, p.rt.name))
	}
	if remap := p.userns != nil; h.Remap != remap {
		diffs = append(diffs, fmt.Sprintf("it runs %s and the provider's sessions now run %s", inUserNS(h.Remap), inUserNS(remap)))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("it was made by a provider configured otherwise: %s", strings.Join(diffs, "; "))
}

func inUserNS(remap bool) string {
	if remap {
		return "in a user namespace"
	}
	return "without a user namespace"
}

// Recover implements [kit.Recoverer]: it makes the provider's network
// manager (one it was given is used as it is), removes everything of an
// earlier run under the state directory that no session of keep owns, and
// brings back each session of keep. The kit calls it once, before any
// create; a second call errs.
//
// What it removes, per session bundle in the sessions directory that is
// not brought back: the container (its PID 1, through the bundle's pid file
// once checked to be that container's, then the runtime's delete, with the
// binary of the runtime whose state holds it, or, when that runtime is no
// longer installed, the state entry itself), the root overlay, the
// idmapped layers of its image and the sysfs (unmounted in this process's mount
// namespace and in the runtime's), the root's mount point under rootsDir,
// the cgroup, and the bundle with its ephemeral workspace. Then the
// runtimes' state entries no bundle names (their containers, likewise);
// the network manager sweeps what no kept session's network is. Cgroups
// and mount points of ids with no bundle here are never touched: the
// cgroup parent and rootsDir are shared with every provider on the host.
// Persistent workspaces are kept.
//
// A kept session comes back as its create left it, with its network
// adopted, its image held again, and a pidfd on its container's PID 1
// (checked to be in the session's cgroup and PID 1 of its pid namespace,
// so a reused pid is never taken for it). It is reported with Err, and
// removed like the others, when its handle is missing or of another
// runtime or user namespace mode (the error names both), when the provider
// was given a network manager (Options.Network: that manager cannot hand a
// network back), when its bundle, workspace, image, network or container is
// gone, or when its agent does not answer within 5 s. Each session brought
// back is logged: the execs that were running in it are gone (its agent
// ended each when its connection dropped); processes they left running
// (setsid, background jobs) go on until its destroy.
//
// Recover errs only when the sweep cannot run: the sessions directory
// cannot be read, or the network manager cannot be made (its error says
// why). A leftover it cannot remove is logged and left; the next start
// tries again.
func (p *provider) Recover(ctx context.Context, keep []kit.Kept) ([]kit.Recovered, error) {
	p.recoverMu.Lock()
	defer p.recoverMu.Unlock()
	if p.recovered {
		return nil, errors.New("container: Recover was called twice; the kit calls it once, before any create")
	}
	p.recovered = true

	entries, err := os.ReadDir(p.sessDir)
	if err != nil {
		return nil, fmt.Errorf("container: reading the sessions directory: %w", err)
	}
	bundles := make(map[string]bool, len(entries))
	for _, e := range entries {
		bundles[e.Name()] = true
	}
	// Runtime state entries are strays only when no bundle at all names
	// them, another live process's included.
	allBundles := maps.Clone(bundles)
	// A session whose lock another live process holds is that process's
	// (concurrent `tai42 run`s share a state directory): left alone. The
	// locks of the others are taken: held on for the sessions brought
	// back, released (their files removed) once the rest is removed.
	locked, err := p.locks.IDs()
	if err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	held := map[string]*sessionlock.Lock{}
	for _, id := range slices.Concat(slices.Collect(maps.Keys(bundles)), locked) {
		if _, ok := held[id]; ok || !validSessionID(id) {
			continue
		}
		l, err := p.locks.Hold(id)
		if err != nil {
			delete(bundles, id)
			continue
		}
		held[id] = l
	}
	defer func() {
		for _, l := range held {
			l.Release(false)
		}
	}()

	// Which kept sessions can be tried: the others are reported now and
	// their bundles swept.
	type attempt struct {
		k kit.Kept
		h sessionHandle
	}
	var (
		results  []kit.Recovered
		attempts []attempt
		trying   = map[string]bool{}
		seen     = map[string]bool{}
		tiers    = map[string]sandbox.Network{}
	)
	for _, k := range keep {
		if seen[k.ID] {
			continue // the kit never asks twice; answering twice would fail it
		}
		seen[k.ID] = true
		h, err := parseHandle(k.Handle)
		if err == nil {
			err = p.mismatch(h)
		}
		switch {
		case !validSessionID(k.ID):
			err = errors.New("its id cannot name a session of this provider")
		case err != nil:
		case !p.ownNet:
			err = errors.New("the provider was given a network manager (Options.Network), which cannot hand back a network made before")
		case held[k.ID] == nil && allBundles[k.ID]:
			err = errors.New("another live process runs it (its lock is held)")
		case !bundles[k.ID]:
			err = fmt.Errorf("its bundle %s is gone", filepath.Join(p.sessDir, k.ID))
		}
		if err != nil {
			results = append(results, kit.Recovered{ID: k.ID, Err: fmt.Errorf("container: session %s cannot be brought back: %w", k.ID, err)})
			continue
		}
		attempts = append(attempts, attempt{k: k, h: h})
		trying[k.ID] = true
		tiers[k.ID] = k.Spec.Network
	}

	if p.ownNet {
		// Refused attempts are read from the kernel only for a log that
		// shows them.
		var onBlocked func(sessnet.Blocked)
		if p.log.Enabled(ctx, slog.LevelDebug) {
			onBlocked = p.logBlocked
		}
		p.net, err = sessnet.New(sessnet.Config{
			Dir:            filepath.Join(p.root, "netns"),
			Prefix:         p.opts.NetPrefix,
			InternalSubnet: p.opts.InternalSubnet,
			EgressSubnet:   p.opts.EgressSubnet,
			Keep:           tiers,
			Fences:         p.fences(),
			OnBlocked:      onBlocked,
		})
		if err != nil {
			return nil, fmt.Errorf("container: network: %w", err)
		}
		if err := p.startEgress(p.net); err != nil {
			return nil, fmt.Errorf("container: %w", err)
		}
	}

	rts := &runtimes{p: p, others: map[string]*ociRuntime{}}
	defer rts.close()

	var left []string
	for id := range bundles {
		if !trying[id] {
			left = append(left, id)
		}
	}
	removed := make([]bool, len(left))
	parallel(len(left), func(i int) {
		id := left[i]
		if err := p.removeLeft(ctx, rts, id); err != nil {
			p.log.Warn("container: cannot remove all of a session an earlier run left; the next start tries again", "id", id, "err", err)
		} else {
			removed[i] = true
			p.log.Info("container: removed a session an earlier run left", "id", id)
		}
	})
	for i, id := range left {
		held[id].Release(removed[i])
		delete(held, id)
	}
	for id, l := range held {
		if !bundles[id] && !trying[id] {
			l.Release(true) // a lock file with nothing left of its session
			delete(held, id)
		}
	}
	for _, kind := range []string{"runc", "crun"} {
		p.removeStrayStates(ctx, rts, kind, allBundles)
	}

	// A put_file in flight when its container was killed left its
	// temporary file in a persistent workspace.
	if err := oscmd.RemoveTemps(ctx, p.perDir, putTempPrefix, nil); err != nil {
		p.log.Warn("container: cannot remove interrupted put_file temporaries from the persistent workspaces", "err", err)
	}

	keptDisks, keptKeys := map[string]bool{}, map[string]bool{}
	for _, a := range attempts {
		if a.h.Disk != "" {
			keptDisks[a.h.Disk] = true
		}
		if a.h.WSImage {
			keptKeys[a.k.Spec.WorkspaceKey] = true
		}
	}
	p.sweepDisks(keptDisks, keptKeys)

	mounted, err := p.runtimeMounts()
	if err != nil {
		// Taken for not mounted: the sessions then fail at their agent's
		// ping or at their destroy's unmount, which says so.
		p.log.Warn("container: cannot read the mount table where the runtime runs", "err", err)
	}
	back := make([]kit.Recovered, len(attempts))
	lockOf := make(map[string]*sessionlock.Lock, len(attempts))
	for _, a := range attempts {
		lockOf[a.k.ID] = held[a.k.ID]
		delete(held, a.k.ID) // recoverOne's now: the session's, or released by its cleanup
	}
	parallel(len(attempts), func(i int) {
		a := attempts[i]
		r, err := p.recoverOne(ctx, a.k, a.h, mounted, lockOf[a.k.ID])
		if err != nil {
			back[i] = kit.Recovered{ID: a.k.ID, Err: fmt.Errorf("container: session %s cannot be brought back, so it was removed: %w", a.k.ID, err)}
			return
		}
		back[i] = kit.Recovered{ID: a.k.ID, Res: r}
		p.log.Info("container: session brought back; the execs that were running in it when the previous process stopped are gone (its agent ended them), processes they left running go on",
			"id", a.k.ID)
	})
	if p.diskOn && p.opts.DiskPool > 0 {
		p.pool = newAhead("session disks", p.opts.DiskPool, p.makeEphemeralDisk, p.discardDisk, &p.creates, p.log)
	}
	if p.ownUserNS() {
		// Once the recovered sessions hold their owners.
		p.nsPool = newAhead("user namespaces", userNSAhead, p.makeSessionNS, p.discardSessionNS, &p.creates, p.log)
	}
	p.ready.Store(true)
	return append(results, back...), nil
}

// validSessionID reports whether id names one entry of a directory.
func validSessionID(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\x00")
}

// parallel runs fn(0..n-1), recoverWorkers at a time, and waits for all.
func parallel(n int, fn func(i int)) {
	sem := make(chan struct{}, recoverWorkers)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(i)
		})
	}
	wg.Wait()
}

// recoverOne brings back kept session k of handle h: a session as Create
// left it. mounted is the mount table where the runtime runs. On error
// everything of the session is removed (its persistent workspace kept).
func (p *provider) recoverOne(ctx context.Context, k kit.Kept, h sessionHandle, mounted map[string]bool, lock *sessionlock.Lock) (_ *session, err error) {
	r := &session{
		p: p, id: k.ID, spec: k.Spec, lock: lock,
		dir:    filepath.Join(p.sessDir, k.ID),
		initFD: -1,
	}
	defer func() {
		if err != nil {
			r.killInit()
			// What runs in its cgroup is its own, whatever its pid file says.
			_ = p.cgroups.killAll(cgroupsPath(k.ID))
			if cerr := r.cleanup(context.WithoutCancel(ctx)); cerr != nil {
				err = fmt.Errorf("%w; removing it failed too: %w", err, cerr)
			}
		}
	}()
	// Its disks are the session's from the start, whether or not they can
	// be brought back: a failure below has the cleanup unmount them where
	// they are still mounted (runc's, in this process's namespace), wait
	// for their loop devices to let go and remove the ephemeral image.
	// Recover's sweep kept them for this session.
	if h.Disk != "" {
		// Its lock is this process's now, as the session's is.
		l, err := p.locks.Hold(h.Disk)
		if err != nil {
			return nil, fmt.Errorf("its disk: %w", err)
		}
		r.disk = &disk{img: filepath.Join(p.diskDir, h.Disk+imageSuffix), mnt: filepath.Join(p.diskDir, h.Disk), owner: p.rootUID(), lock: l}
	}
	if h.WSImage {
		key := k.Spec.WorkspaceKey
		r.wsDisk = &disk{img: p.wsImage(key), mnt: filepath.Join(p.perDir, wsMountDir, key), owner: p.rootUID()}
	}
	if h.Remap {
		r.rootDir = filepath.Join(rootsDir, k.ID)
		r.rootfs = filepath.Join(r.rootDir, "rootfs")
	} else {
		r.rootfs = filepath.Join(r.dir, "rootfs")
	}
	r.keptTeardown(h, mounted)
	// Its network first: adopted, the cleanup tears it down.
	if r.net, err = p.net.Adopted(k.ID); err != nil {
		return nil, fmt.Errorf("its network: %w", err)
	}

	env := p.host.Env
	if k.Spec.Image != sandbox.HostImage {
		img, release, err := p.images.Acquire(k.Spec.Image)
		if err != nil {
			return nil, fmt.Errorf("its image %q: %w", k.Spec.Image, err)
		}
		r.release, r.imageID = release, img.ID
		if img.ID != h.Image {
			return nil, fmt.Errorf("its image %q is now %s, not %s, which its root was made of (it was imported again since)", k.Spec.Image, img.ID, h.Image)
		}
		env, r.user = img.Env, img.User
	}
	r.env = baseEnv(env)

	if r.dirFD, err = unix.Open(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("its bundle: %w", err)
	}
	pid, err := readPidFile(filepath.Join(r.dir, initPidFile))
	if err != nil {
		return nil, fmt.Errorf("its container is not running: %w", err)
	}
	fd, err := openInit(pid, k.ID)
	if err != nil {
		return nil, fmt.Errorf("its container is not running: %w", err)
	}
	r.initFD = fd
	if h.Remap {
		if err := r.holdOwner(pid); err != nil {
			return nil, fmt.Errorf("its user namespace: %w", err)
		}
	}
	// Its disks once its container is known to run: the container's
	// mounts are what holds them.
	if r.disk != nil {
		if err := p.reopenDisk(r.disk, mounted, false); err != nil {
			return nil, fmt.Errorf("its disk: %w", err)
		}
	}
	if r.wsDisk != nil {
		if err := p.reopenDisk(r.wsDisk, mounted, true); err != nil {
			return nil, fmt.Errorf("its persistent workspace's image: %w", err)
		}
	}
	switch {
	case r.wsDisk != nil:
		r.ws = r.wsDisk.path(diskWorkspace)
	case k.Spec.Durability == sandbox.Persistent:
		r.ws = filepath.Join(p.perDir, k.Spec.WorkspaceKey)
	case r.disk != nil:
		r.ws = r.disk.path(diskWorkspace)
	default:
		r.ws = filepath.Join(r.dir, "workspace")
	}
	if err := p.rt.do(func() error {
		if fi, err := os.Stat(r.ws); err != nil || !fi.IsDir() {
			return fmt.Errorf("its workspace %s is gone", r.ws)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	r.connectAgent()
	pctx, cancel := context.WithTimeout(ctx, recoverPing)
	defer cancel()
	if err := r.agent.Ping(pctx); err != nil {
		return nil, fmt.Errorf("its agent did not answer within %v: %w", recoverPing, err)
	}
	return r, nil
}

// runtimeMounts is the set of mount points where the runtime runs (its
// own mount namespace, or this process's).
func (p *provider) runtimeMounts() (map[string]bool, error) {
	var set map[string]bool
	err := p.rt.do(func() error {
		var err error
		set, err = mountPoints("/proc/thread-self/mountinfo")
		return err
	})
	return set, err
}

// isMounted reports whether path is a mount point of set, as is or with
// the symbolic links above it resolved (a mount table holds real paths).
func isMounted(set map[string]bool, path string) bool {
	if set[path] {
		return true
	}
	resolved, err := filepath.EvalSymlinks(path)
	return err == nil && set[resolved]
}

// mountPoints reads the mount points of a mountinfo file, as a set.
func mountPoints(mountinfo string) (map[string]bool, error) {
	all, err := oscmd.MountPoints(mountinfo)
	if err != nil {
		return nil, err
	}
	set := make(map[string]bool, len(all))
	for _, mp := range all {
		set[mp] = true
	}
	return set, nil
}

// removeLeft removes session id, whose bundle an earlier run left in the
// sessions directory: its container (PID 1 first, then the runtimes'
// state of it), its mounts wherever they are, its root's mount point, its
// cgroup and its bundle. Its network is the network manager's to sweep.
func (p *provider) removeLeft(ctx context.Context, rts *runtimes, id string) error {
	dir := filepath.Join(p.sessDir, id)
	if pid, err := readPidFile(filepath.Join(dir, initPidFile)); err == nil {
		if fd, err := openInit(pid, id); err == nil {
			killAndWait(fd)
			unix.Close(fd)
		}
	}
	var errs []error
	// Whatever still runs in the session's cgroup is the session's: its
	// pid file may be gone (a bundle half removed), or PID 1 a zombie
	// whose namespace's other processes live on.
	if err := p.cgroups.killAll(cgroupsPath(id)); err != nil {
		errs = append(errs, err)
	}
	for _, kind := range []string{"runc", "crun"} {
		if _, err := os.Lstat(filepath.Join(p.root, kind, id)); err == nil {
			if err := rts.remove(ctx, kind, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	unmounted := true
	for _, m := range append([]string{
		filepath.Join(dir, "rootfs"),
		filepath.Join(rootsDir, id, "rootfs"),
		filepath.Join(dir, "sys"),
	}, lowerMounts(dir)...) {
		if err := p.unmountEverywhere(m); err != nil {
			errs = append(errs, err)
			unmounted = false
		}
	}
	if unmounted {
		if err := removeRootMount(filepath.Join(rootsDir, id)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.cgroups.remove(cgroupsPath(id)); err != nil {
		errs = append(errs, err)
	}
	// Never remove through a root still mounted (see cleanup).
	if unmounted {
		if err := oscmd.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeStrayStates removes the containers of runtime kind's state entries
// that name no bundle of the sessions directory as it was (bundles): what
// a create or destroy interrupted between the bundle and the container
// left.
func (p *provider) removeStrayStates(ctx context.Context, rts *runtimes, kind string, bundles map[string]bool) {
	entries, err := os.ReadDir(filepath.Join(p.root, kind))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			p.log.Warn("container: cannot read a runtime's state directory", "runtime", kind, "err", err)
		}
		return
	}
	var stray []string
	for _, e := range entries {
		if e.IsDir() && !bundles[e.Name()] {
			stray = append(stray, e.Name())
		}
	}
	parallel(len(stray), func(i int) {
		id := stray[i]
		if err := rts.remove(ctx, kind, id); err != nil {
			p.log.Warn("container: cannot remove a container an earlier run left", "runtime", kind, "id", id, "err", err)
		} else {
			p.log.Info("container: removed a container an earlier run left without its bundle", "runtime", kind, "id", id)
		}
	})
}

// unmountEverywhere unmounts target in this process's mount namespace and
// in the runtime's own: a mount an earlier run made with the other
// runtime may be in either. Not mounted is not an error.
func (p *provider) unmountEverywhere(target string) error {
	if err := unmount(target); err != nil {
		return err
	}
	if p.rt.ns != nil {
		return p.rt.do(func() error { return unmount(target) })
	}
	return nil
}

// runtimes are the OCI runtimes Recover removes containers with: the
// provider's own, and the other one when an earlier run used it, made on
// demand and closed at the end. Safe for concurrent use.
type runtimes struct {
	p      *provider
	mu     sync.Mutex
	others map[string]*ociRuntime // by kind; nil: not installed
}

// get returns the runtime of kind, or nil (and why) when it cannot run
// here.
func (rs *runtimes) get(kind string) (*ociRuntime, error) {
	if kind == rs.p.rt.name {
		return rs.p.rt, nil
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rt, ok := rs.others[kind]; ok {
		if rt == nil {
			return nil, fmt.Errorf("%s cannot run here", kind)
		}
		return rt, nil
	}
	rt, err := newRuntime(kind, rs.p.root)
	rs.others[kind] = rt
	return rt, err
}

// remove removes container id from runtime kind's state: with that
// runtime's delete, or, when the runtime cannot run here (no longer
// installed), by killing the container's PID 1 (the state's pid, once
// checked to be that container's) and removing the state entry.
func (rs *runtimes) remove(ctx context.Context, kind, id string) error {
	rt, err := rs.get(kind)
	if err == nil {
		return rt.delete(ctx, id, filepath.Join(rs.p.sessDir, id))
	}
	if rerr := rs.p.removeByHand(kind, id); rerr != nil {
		return fmt.Errorf("%w (the runtime: %v)", rerr, err)
	}
	rs.p.log.Warn("container: removed a container's state by hand, its runtime being unavailable", "runtime", kind, "id", id, "reason", err.Error())
	return nil
}

// removeByHand removes container id from runtime kind's state without the
// runtime: it kills the container's PID 1 (the state's pid, once checked
// to be that container's) and removes the state entry. The container's
// cgroup is left to the caller.
func (p *provider) removeByHand(kind, id string) error {
	entry := filepath.Join(p.root, kind, id)
	if pid := statePID(entry); pid > 0 {
		if fd, err := openInit(pid, id); err == nil {
			killAndWait(fd)
			unix.Close(fd)
		}
	}
	if err := os.RemoveAll(entry); err != nil {
		return fmt.Errorf("%s's state of container %s: %w", kind, id, err)
	}
	return nil
}

func (rs *runtimes) close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, rt := range rs.others {
		if rt != nil {
			rt.close()
		}
	}
}

// statePID is the container's PID 1 as a runtime's state entry records it
// (runc: state.json's init_process_pid; crun: status's pid); 0 when it
// cannot be read.
func statePID(entry string) int {
	var st struct {
		InitPID int `json:"init_process_pid"`
		PID     int `json:"pid"`
	}
	for _, name := range []string{"state.json", "status"} {
		b, err := os.ReadFile(filepath.Join(entry, name))
		if err != nil || json.Unmarshal(b, &st) != nil {
			continue
		}
		if st.InitPID > 0 {
			return st.InitPID
		}
		if st.PID > 0 {
			return st.PID
		}
	}
	return 0
}

// readPidFile reads a pid file as the runtime wrote it.
func readPidFile(name string) (int, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, fmt.Errorf("its pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("its pid file %s holds %q, not a pid", name, b)
	}
	return pid, nil
}

// openInit returns a pidfd on process pid if it is the PID 1 of session
// id's container: PID 1 of its own pid namespace, in the session's cgroup.
// The checks are made through /proc after the pidfd is open and the
// process is seen alive after them, so they are of the process the pidfd
// holds: a pid reused by another process is never taken for it.
func openInit(pid int, id string) (int, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("its PID 1 (%d) has ended", pid)
	}
	if err := checkInit(pid, id); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.PidfdSendSignal(fd, 0, nil, 0); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("its PID 1 (%d) has ended", pid)
	}
	return fd, nil
}

// checkInit checks that pid is alive (not a zombie), PID 1 of a pid
// namespace, and in session id's cgroup.
func checkInit(pid int, id string) error {
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	status, err := os.ReadFile(filepath.Join(proc, "status"))
	if err != nil {
		return fmt.Errorf("its PID 1 (%d) has ended", pid)
	}
	nspid, state := "", ""
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				nspid = f[len(f)-1]
			}
		}
		if rest, ok := strings.CutPrefix(line, "State:"); ok {
			state = strings.TrimSpace(rest)
		}
	}
	if strings.HasPrefix(state, "Z") || strings.HasPrefix(state, "X") {
		return fmt.Errorf("its PID 1 (%d) has ended (%s)", pid, state)
	}
	if nspid != "1" {
		return fmt.Errorf("process %d, named by its pid file, is not its container's PID 1 (the pid was reused)", pid)
	}
	cg, err := os.ReadFile(filepath.Join(proc, "cgroup"))
	if err != nil {
		return fmt.Errorf("its PID 1 (%d) has ended", pid)
	}
	want := cgroupsPath(id)
	for line := range strings.Lines(string(cg)) {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) == 3 && parts[2] == want {
			return nil
		}
	}
	return fmt.Errorf("process %d, named by its pid file, is not in its cgroup %s (the pid was reused)", pid, want)
}

// reopenDisk gets back a kept session's disk d where the runtime runs: as
// it is when still mounted there (runc's: this process's namespace), or
// mounted again from the loop device that still has its image (crun's
// namespace died with the earlier run; the container's own mounts held
// the filesystem, and so the device). A disk on no loop device is gone.
func (p *provider) reopenDisk(d *disk, mounted map[string]bool, persistent bool) error {
	d.loop = loopOf(d.img)
	if d.loop == "" {
		return fmt.Errorf("its image %s is on no loop device (nothing holds it any more)", d.img)
	}
	if isMounted(mounted, d.mnt) {
		return nil
	}
	if err := os.Mkdir(d.mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// The same device: the filesystem already open on it, not a second one.
	return p.rt.do(func() error { return mountDisk(d.loop, d.mnt, persistent) })
}

// diskLocks sorts the ephemeral disks of the disks directory that no kept
// session owns (keep) by their locks: theirs, whose lock another live
// process holds (its sessions' disks and its pool's, which the sweep
// leaves), and the locks of the others, which an earlier run left, taken
// (ours) until the sweep has removed them.
func (p *provider) diskLocks(keep map[string]bool) (theirs map[string]bool, ours []*sessionlock.Lock) {
	theirs = map[string]bool{}
	entries, err := os.ReadDir(p.diskDir)
	if err != nil {
		return theirs, nil
	}
	seen := map[string]bool{}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), imageSuffix)
		if seen[name] || keep[name] || !validSessionID(name) {
			continue
		}
		seen[name] = true
		l, err := p.locks.Hold(name)
		switch {
		case errors.Is(err, sessionlock.ErrHeld):
			theirs[name] = true
		case err != nil:
			p.log.Warn("container: cannot take the lock of a session disk an earlier run left; removing it all the same", "disk", name, "err", err)
		default:
			ours = append(ours, l)
		}
	}
	return theirs, ours
}

// sweepDisks removes the disks an earlier run left that no kept session
// owns (keep: ephemeral disks by name; keepKeys: workspace images by key)
// and no other live process holds the lock of (see diskLocks):
// their mounts under the disks directory and the workspaces' mount
// directory, in this process's mount namespace and the runtime's; the
// loop devices whose backing file is under the provider's directory; the
// ephemeral images (the pool's among them) and mount points; and the
// images a workspace migration a crash interrupted left half made (see
// migrateMark: a mount point or image is a key's by its exact name, so a
// key ending in ".new" is never taken for one). Workspace images are
// kept. What it cannot remove is logged; the next start tries again.
func (p *provider) sweepDisks(keep, keepKeys map[string]bool) {
	theirs, ours := p.diskLocks(keep)
	defer func() {
		for _, l := range ours {
			l.Release(true)
		}
	}()
	wsMnt := filepath.Join(p.perDir, wsMountDir)
	kept := func(path string) bool {
		switch filepath.Dir(path) {
		case p.diskDir:
			name := strings.TrimSuffix(filepath.Base(path), imageSuffix)
			return keep[name] || theirs[name]
		case wsMnt:
			return keepKeys[filepath.Base(path)]
		case p.perDir:
			key, ok := strings.CutSuffix(filepath.Base(path), imageSuffix)
			return ok && keepKeys[key]
		}
		return false
	}
	strays := func(mountinfo string) []string {
		all, err := oscmd.MountPoints(mountinfo)
		if err != nil {
			p.log.Warn("container: cannot read a mount table to sweep the session disks", "err", err)
			return nil
		}
		var out []string
		for _, mp := range all {
			if (filepath.Dir(mp) == p.diskDir || filepath.Dir(mp) == wsMnt) && !kept(mp) {
				out = append(out, mp)
			}
		}
		return out
	}
	for _, mp := range strays("/proc/self/mountinfo") {
		if err := unmount(mp); err != nil {
			p.log.Warn("container: cannot unmount a session disk an earlier run left", "mount", mp, "err", err)
		}
	}
	if p.rt.ns != nil {
		_ = p.rt.do(func() error {
			for _, mp := range strays("/proc/thread-self/mountinfo") {
				if err := unmount(mp); err != nil {
					p.log.Warn("container: cannot unmount a session disk an earlier run left", "mount", mp, "err", err)
				}
			}
			return nil
		})
	}
	loops, err := loopsBacking(p.root)
	if err != nil {
		p.log.Warn("container: cannot list the loop devices to sweep the session disks", "err", err)
	}
	for dev, file := range loops {
		if kept(file) {
			continue
		}
		if err := detachLoop(dev); err != nil {
			p.log.Warn("container: cannot detach a loop device an earlier run left", "device", dev, "image", file, "err", err)
		} else {
			p.log.Info("container: detached a loop device an earlier run left", "device", dev, "image", file)
		}
	}
	remove := func(path string) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			p.log.Warn("container: cannot remove a session disk an earlier run left", "path", path, "err", err)
		}
	}
	if entries, err := os.ReadDir(p.diskDir); err == nil {
		for _, e := range entries {
			if path := filepath.Join(p.diskDir, e.Name()); !kept(path) {
				remove(path)
			}
		}
	}
	if entries, err := os.ReadDir(wsMnt); err == nil {
		for _, e := range entries {
			if path := filepath.Join(wsMnt, e.Name()); !kept(path) {
				remove(path)
			}
		}
	}
	if entries, err := os.ReadDir(p.perDir); err == nil {
		for _, e := range entries {
			name := e.Name()
			if e.Type().IsRegular() && (strings.HasSuffix(name, imageSuffix+migrateMark) || strings.HasSuffix(name, oldMigrateSuffix)) {
				remove(filepath.Join(p.perDir, name))
			}
		}
	}
}
