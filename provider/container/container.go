// Package container is the container provider: isolation "container". Each
// session is one OCI container, run by an OCI runtime binary (runc by
// default, crun when configured), whose PID 1 is the in-sandbox agent
// (`tai42 agent`, the same binary, bind-mounted read-only; when it is
// dynamically linked, with its loader and libraries, see
// Options.AgentBinary). The
// provider reaches the agent over a unix socket it made and handed to the
// container; each exec and each file transfer is one connection to it, not
// a runtime call.
//
// What a session gets:
//   - its own root: an overlay of its image (read-only) and an upper layer
//     of its own, removed at destroy. Image "host" is a read-only view of
//     the host's system directories (/usr, /bin, /sbin, /lib*, the parts of
//     /etc programs need) and nothing of its data: no home directories,
//     /root, /var, /tmp or the daemon's state. Other images are OCI images
//     of the local store, pulled from their registry (`tai42 image pull`,
//     or by the create itself, see Options.Pull) or imported (`tai42 image
//     import`). The overlay stacks the image's layers as they are stored,
//     each unpacked once and shared by every image that has it (a
//     whiteout a 0:0 character device, an opaque directory one with xattr
//     trusted.overlay.opaque=y): its lower layers are the image's, top
//     first, one fsconfig "lowerdir+" each, so that no number of layers
//     meets mount(2)'s page of options (a kernel without lowerdir+, before
//     Linux 6.8, gets them in one option string, which bounds them).
//   - of its image's config: Env, the base of every exec's environment
//     (with a PATH, HOME, TMPDIR and LANG where it sets none); User, the
//     user of an exec that names none (as `docker exec` does; an exec
//     naming a user runs as it, "root" or "0" included), and an image
//     whose User is no valid exec user (sandbox.ValidUser: a user:group by
//     names) is refused at create; not WorkingDir: an exec starts in the
//     workspace unless its cwd says otherwise, as the contract has it; not
//     Entrypoint nor Cmd: the agent is the container's PID 1, and the
//     session runs what its execs ask, nothing else.
//   - the workspace bind-mounted at /workspace (workspace_path says so), a
//     private /tmp.
//   - a disk cap (Options.DiskMB): the session's root upper layer, its
//     /tmp and its ephemeral workspace are on one ext4 filesystem of its
//     own, of that size, in a sparse image on a loop device; a write past
//     it fails with ENOSPC, and df shows the cap. A persistent workspace
//     is an image of its own, of the same size, kept with its key. With
//     the cap off (Options.DiskOff) they are directories of the state
//     directory and /tmp is a tmpfs, counted against memory_mb.
//   - new pid, ipc, uts, mount, cgroup and network namespaces. Network
//     "none" is loopback only; "internal" a bridge shared by this host's
//     internal sessions with no route out; "egress" adds NAT out through
//     the host. No tier reaches the host itself.
//   - caps as cgroup limits: cpu (CFS quota), memory_mb (with no swap) and
//     a pids limit always. An exec killed by the memory limit says so on
//     its stderr.
//   - hardening: no new privileges, a seccomp allowlist modelled on
//     Docker's default profile, a small capability set, masked and
//     read-only /proc paths (see internal/hardening).
//   - where the host allows it, a user namespace (Options.UserNamespace):
//     root in the session is host uid [UserNamespaceBase], which owns
//     nothing outside the session, so a process that escapes holds no
//     privilege on the host.
//
// Users: an exec runs as the session's root, or as the user it names
// (sandbox.ExecOptions.User), which the agent resolves in the session's own
// /etc/passwd and /etc/group (an image's, as the session may have changed
// them: a user added by an exec is known to the next). A name they lack is
// a *sandbox.UserNotFoundError; a uid or gid outside the session's user
// namespace (ids 0 to [UserNamespaceSize]-1 when remapped) is refused with
// a *sandbox.SandboxError naming it. The exec starts in its cwd even where
// its user may not enter it (the workspace is root's, mode 0700, as the
// provider made it): what the user may read or write there is the files'
// modes' to say, as in Docker; chown or chmod the workspace from an exec
// as root to share it. Its HOME is the user's home unless the spec's or
// the exec's env sets HOME (the image's HOME is root's).
//
// Processes: each exec is a process group inside the container; a kill, a
// timeout or the destroy sends it SIGKILL, and the destroy ends every
// process of the container. A process that leaves its group (setsid) lives
// until the session is destroyed.
//
// Recovery: a session's container, network and mounts outlive the process
// that made them, so a daemon killed with SIGKILL and started again on the
// same state directory (with a durable ledger, [Options.Ledger]) gets its
// live sessions back: same id, workspace and processes. At its start the
// kit hands the provider the sessions its ledger holds live
// ([kit.Recoverer]); the provider finds everything of its own under its
// state directory (session bundles, the runtimes' state, the network
// manager's namespaces, links and table), removes what no kept session
// owns, and brings each kept one back as its create left it, checking that
// its container's PID 1 still runs and its agent answers. A session made
// with another OCI runtime or user namespace mode than the provider now
// has (each session's ledger handle records both) is not brought back but
// removed. Execs that were running when the daemon died are gone: the
// agent ended each when its connection dropped. A process an exec left
// running (setsid, a background job) goes on until the session's destroy.
// A provider given a network manager ([Options.Network]) cannot get a
// kept session's network back, so it brings none back. A kept session holds
// its image again (an image pulled or imported again under its name since
// is another, and the session is removed instead); its root overlay and
// idmapped layers are left mounted as they are, and unmounted at its
// destroy, a session of an earlier version's single idmapped image
// included.
package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/egressdns"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/sessionlock"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/kit"
)

// Name is the provider's registered name. Its built-in image is
// [sandbox.HostImage].
const Name = "container"

// DefaultPidsLimit is the process cap of a session when [Options] sets
// none.
const DefaultPidsLimit = 1024

// PullPolicy says when a create pulls its image (see Options.Pull).
type PullPolicy string

const (
	// PullMissing pulls an image the store lacks (the default).
	PullMissing PullPolicy = "missing"
	// PullAlways pulls on every create: the registry is asked whether
	// the reference names another image now.
	PullAlways PullPolicy = "always"
	// PullNever never pulls: an image the store lacks is rejected.
	PullNever PullPolicy = "never"
)

// Options configure the container provider: the kit's, passed on to it,
// those every provider takes, and its own. StateDir holds the sessions'
// bundles and workspaces, the runtime's state and the image store
// (<StateDir>/images). The Ledger (see [kit.Options.Ledger]): nil means
// one in memory, and the provider then removes every session an earlier
// run left; a durable one lets New bring back the sessions it holds live.
type Options struct {
	kit.Options
	kit.ProviderOptions
	// Runtime is the OCI runtime: "runc" (the default) or "crun", by name
	// in PATH or by path.
	Runtime string
	// AgentBinary is the tai42 binary (or the agent's own, tai42-agent) to
	// run as each container's PID 1; "" means tai42-agent beside this
	// process's executable where it is installed (see [AgentAlone]), else
	// the executable itself. It may be static or
	// dynamically linked (cgo, the default where a C compiler is
	// installed): a dynamically linked one runs in a session through its
	// own dynamic loader and libraries, resolved at New and bound
	// read-only under /.tai42/lib, since an image may have no libc or
	// another one; the commands it starts use the image's. New fails when
	// it is not an ELF executable or a library it needs is not found.
	AgentBinary string
	// PidsLimit caps the processes of a session. 0 means
	// [DefaultPidsLimit].
	PidsLimit int64
	// NetPrefix names the provider's bridges, veths and nftables table;
	// "" means "tai42". Two providers on one host need different ones.
	NetPrefix string
	// InternalSubnet and EgressSubnet are the tiers' address ranges; zero
	// means sessnet's defaults.
	InternalSubnet, EgressSubnet netip.Prefix
	// EgressAllow and EgressDeny are the operator's fences on network
	// "egress", beside the ranges always refused (private, shared,
	// link-local, loopback, multicast, 0/8, broadcast, the host's own
	// networks): destinations reachable all the same, and destinations
	// refused besides. See sessnet.Fences.
	EgressAllow, EgressDeny []netip.Prefix
	// EgressAllowDomains is the domain allowlist ("name", or "*.name" for
	// the names below it): when set, egress sessions reach only the
	// addresses these names resolve to through their resolver (and
	// EgressAllow).
	EgressAllowDomains []string
	// EgressDNS are the upstreams of the resolver egress sessions use (the
	// provider runs it on the egress gateway; their /etc/resolv.conf names
	// it); nil means the nameservers of EgressResolvConf.
	EgressDNS []netip.AddrPort
	// EgressResolvConf is the file EgressDNS defaults from; "" means
	// /etc/resolv.conf.
	EgressResolvConf string
	// EgressAllowMinTTL and EgressAllowGrace shape how long an address an
	// allowed name resolved to stays reachable (EgressAllowDomains): the
	// answer's least TTL, at least EgressAllowMinTTL, plus
	// EgressAllowGrace. Zero means egressdns.DefaultMinTTL and
	// egressdns.DefaultGrace; shorter values are for tests, which would
	// otherwise wait out the defaults to see an address expire.
	EgressAllowMinTTL, EgressAllowGrace time.Duration
	// Images is the image store's directory; "" means <StateDir>/images.
	Images string
	// Pull says when a create pulls its image from its registry: "" or
	// PullMissing when the store lacks it, PullAlways on every create (a
	// registry round trip; layers held are not fetched again), PullNever
	// never (an image the store lacks is rejected). Creates of one image
	// at once share one pull. A pull that fails fails the create with a
	// *sandbox.SpecRejectedError of field "image" naming the reference
	// and what the registry answered. Each pull is one line of the log
	// (the reference, the digest, the bytes and layers fetched, the layers
	// held already, how long it took). Another value is an error of New.
	Pull PullPolicy
	// Registry is how pulls reach registries (mirrors, insecure hosts,
	// credentials, the stall timeout).
	Registry imagestore.RegistryOptions
	// MaxImageSize bounds the bytes one image's layers take in the store
	// (see imagestore.WithMaxImageSize); 0 means
	// imagestore.DefaultMaxImageSize.
	MaxImageSize int64
	// MaxImageInodes bounds the inodes one image's layers take in the
	// store; 0 means imagestore.DefaultMaxImageInodes.
	MaxImageInodes int64
	// Network, when set, is a network manager the provider uses instead
	// of making (and at Close tearing down) its own; NetPrefix and the
	// subnets are then unused. Providers in one process share one this
	// way, since each manager sweeps what its prefix names. Such a
	// provider brings back no session after a restart (see Recovery in
	// the package doc): only a manager the provider makes itself adopts
	// the networks of the sessions it keeps.
	Network *sessnet.Manager
	// UserNamespace says whether each session runs in a user namespace
	// of its own, with the fixed mapping of [UserNamespaceBase]: root in
	// a session is then an unprivileged host uid that owns nothing
	// outside the session, so a process that escapes the container holds
	// no privilege on the host. "" means [DefaultUserNamespace]; see
	// [UserNamespaceMode] for the values, [RemapsUsers] for the outcome.
	//
	// A remapped session's root is an overlay whose lower layers are its
	// image's, each idmapped (files of host root show as root in the
	// session; the image on disk is unchanged), its upper layer and
	// workspace owned by UserNamespaceBase on the host. The host image's read-only binds
	// (/usr, ...) are not idmapped: their files show as nobody, readable
	// and executable as before. /sys is the read-only sysfs of the
	// session's network namespace as without remapping, mounted by the
	// provider (a user namespace cannot mount it), its files nobody's.
	// Every user in the session may bind ports below 1024. Ids past
	// UserNamespaceSize-1 do not exist in a session (chown to one fails).
	// A persistent workspace made in the other mode has its files' owners
	// shifted once, at its next create (host root's files become
	// UserNamespaceBase's, uid 1000's UserNamespaceBase+1000's, and back).
	// Sessions share the mapping: a process that escaped one is the same
	// host uid as root in the others. On crun each session's user
	// namespace is owned by a host uid of its own (see
	// [UserNamespaceOwnerBase]), which the kernel charges for what the
	// session makes (inotify instances, namespaces...); on runc it is
	// host root's, and limits per uid of the session bound what it makes.
	//
	// Remapping needs root, user namespaces enabled, idmapped mounts on
	// the filesystem of the images and of the state directory, overlayfs
	// on an idmapped lower layer (Linux 5.19), no /etc/subuid or
	// /etc/subgid range over the sessions' ids or their namespaces'
	// owners' (ids 1,000,000 to 1,131,071), /bin/sh (on crun, the
	// program the process that makes a session's namespace stops at), and
	// the root mount points under /run/tai42/roots reachable by others.
	UserNamespace UserNamespaceMode
	// DiskMB caps what a session may write, in MiB: its root's upper
	// layer, its /tmp and (ephemeral sessions) its workspace share one
	// ext4 filesystem of that size, in a sparse image file on a loop
	// device (<StateDir>/container/disks/NAME.img), removed at destroy. A
	// write past it fails with ENOSPC ("No space left on device") in the
	// session, and `df` there shows the cap. A persistent workspace is an
	// image of its own of the same size (<StateDir>/container/workspaces/
	// KEY.img, with a journal, mounted with discard so that what a
	// session deletes frees the host's disk), made at the key's first
	// create and kept with the key: a later change of DiskMB leaves it at
	// its size. A key whose workspace is still a plain directory of an
	// earlier version is moved into a new image at its next create.
	// 0 means [DefaultDiskMB] (10 GiB); a negative value is an error of
	// New. Turning the cap off is DiskOff's, never a silent default.
	DiskMB int
	// DiskInodes is the inode count of each session's disk: the files a
	// session may have. 0 means one per 16 KiB of DiskMB (655,360 for
	// 10 GiB); a negative value is an error of New.
	DiskInodes int
	// DiskPool is how many empty ephemeral disks the provider keeps made
	// ahead and mounted, so that a create takes one (a create that finds
	// none makes its own: a copy of the provider's empty disk, attached,
	// mounted and given a UUID of its own, about 1.5 ms on an idle
	// machine). The pool is refilled in the background, at the lowest
	// CPU and I/O priority, once no create has run for 2 ms. 0 means
	// [DefaultDiskPool]; negative means none.
	DiskPool int
	// DiskReserveMB is the free space, in MiB, the state directory's
	// filesystem must keep: a create finding less is refused with a
	// *sandbox.SandboxError naming the free space and the reserve (the
	// sessions' disks are sparse: many together can still fill it). 0
	// means [DefaultDiskReserveMB]; negative means no check.
	DiskReserveMB int
	// DiskOff turns the disk cap off: a session's writes then go to the
	// state directory's filesystem, limited by nothing but its size; its
	// /tmp is a tmpfs, counted in memory_mb; new persistent workspaces are
	// plain directories (those that already have an image keep it).
	//
	// With the cap on, New checks that it can work (mkfs.ext4 of
	// e2fsprogs in PATH, /dev/loop-control, an ext4 mount of a loop
	// device) and fails otherwise, saying why and that DiskOff turns it
	// off.
	DiskOff bool
}

// DefaultUserNamespace is the user namespace mode of an Options that sets
// none.
const DefaultUserNamespace = UserNamespaceAuto

// Register registers the container provider in reg (nil: the process-wide
// registry) under [Name], opened on its first Require with the options
// opts returns then: what they need opened (a durable ledger) is opened
// only for the provider asked for, and New owns it from there.
func Register(reg *sandbox.Registry, opts func() (Options, error)) error {
	return kit.Register(reg, Name, opts, New)
}

// New returns the container provider wrapped by the kit. Before New
// returns, the kit has the provider recover what an earlier run on the
// same state directory left (see Recovery in the package doc): with no
// durable ledger, every session of that run is removed. New fails when
// that sweep cannot run (the state directory cannot be read, the network
// manager cannot be made); a session that cannot be brought back or
// removed is logged, not an error. New owns opts.Ledger, as kit.New does:
// when New fails, the ledger has been closed, once.
func New(opts Options) (*kit.Sandbox, error) {
	p, err := newProvider(opts)
	return kit.Wrap(p, err, opts.Options)
}

type provider struct {
	opts      Options
	log       *slog.Logger
	rt        *ociRuntime
	images    *imagestore.Store
	host      imagestore.HostImage
	net       *sessnet.Manager
	ownNet    bool      // net is the provider's own, closed with it
	agent     agentLoad // the agent binary on the host, and how it runs
	root      string    // the provider's directory in the state directory
	sessDir   string    // per-session bundles
	perDir    string    // persistent workspaces, one per key
	locks     *sessionlock.Dir
	cgroups   cgroupLayout
	userns    *os.File      // the sessions' user namespace; nil: none
	egress    *egress       // the egress sessions' resolver; nil: none; set under fenceMu
	diskOn    bool          // sessions get a disk of their own (the cap is on)
	disk      diskCfg       // their geometry
	diskDir   string        // their images and mount points
	template  *diskTemplate // what an ephemeral disk is a copy of
	diskUUIDs bool          // each gets a UUID of its own (see setDiskUUID)
	pool      *ahead[*disk] // ephemeral disks made ahead; nil: none
	seccomp   seccompCache
	closeOnce sync.Once

	owners  owners            // the owners of the sessions' user namespaces (crun)
	nsPool  *ahead[sessionNS] // their namespaces made ahead (see ownUserNS); nil: none
	creates creates           // the creates running, which the refills of pool and nsPool wait for

	// userLimits are, when remapped on runc, each session's user
	// namespace's limits (see limitsHook).
	userLimits []string

	fenceMu  sync.Mutex
	opFences operatorFences // guarded by fenceMu

	faults func(id, step string) error // a test's failures of create steps; nil: none

	pulls      pullGroup          // one pull per reference among the creates
	pullCtx    context.Context    // the creates' pulls run in it: they outlive the create that began one
	pullCancel context.CancelFunc // ends them, at Close

	recoverMu sync.Mutex
	recovered bool        // Recover has begun; guarded by recoverMu
	ready     atomic.Bool // Recover is done: net is set, creates may run
}

func newProvider(opts Options) (_ *provider, err error) {
	if opts.StateDir == "" {
		return nil, errors.New("container: a state directory is required")
	}
	opts.ProviderOptions = opts.ProviderOptions.WithDefaults()
	if opts.PidsLimit <= 0 {
		opts.PidsLimit = DefaultPidsLimit
	}
	if opts.NetPrefix == "" {
		opts.NetPrefix = "tai42"
	}
	if opts.UserNamespace == "" {
		opts.UserNamespace = DefaultUserNamespace
	}
	if opts.Pull, err = validPull(opts.Pull); err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	if err := sessnet.ValidateFences(sessnet.Fences{Allow: opts.EgressAllow, Deny: opts.EgressDeny}); err != nil {
		return nil, fmt.Errorf("container: egress fences: %w", err)
	}
	for _, d := range opts.EgressAllowDomains {
		if err := egressdns.ValidPattern(d); err != nil {
			return nil, fmt.Errorf("container: egress domain allowlist: %w", err)
		}
	}
	if opts.DiskMB < 0 || opts.DiskInodes < 0 {
		return nil, fmt.Errorf("container: the disk cap: DiskMB %d and DiskInodes %d must not be negative (0 means the default; DiskOff turns the cap off)", opts.DiskMB, opts.DiskInodes)
	}
	if opts.DiskMB == 0 {
		opts.DiskMB = DefaultDiskMB
	}
	if opts.DiskInodes == 0 {
		opts.DiskInodes = int(int64(opts.DiskMB) << 20 / diskBytesPerInode)
	}
	if opts.DiskPool == 0 {
		opts.DiskPool = DefaultDiskPool
	}
	if opts.DiskReserveMB == 0 {
		opts.DiskReserveMB = DefaultDiskReserveMB
	}
	state, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("container: state directory: %w", err)
	}
	root := filepath.Join(state, "container")
	p := &provider{
		opts:    opts,
		log:     opts.Logger,
		root:    root,
		sessDir: filepath.Join(root, "sessions"),
		perDir:  filepath.Join(root, "workspaces"),
		opFences: operatorFences{allow: slices.Clone(opts.EgressAllow), deny: slices.Clone(opts.EgressDeny),
			domains: slices.Clone(opts.EgressAllowDomains)},
		diskDir: filepath.Join(root, "disks"),
		diskOn:  !opts.DiskOff,
		disk:    diskCfg{mb: opts.DiskMB, inodes: opts.DiskInodes},
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.pullCtx, p.pullCancel = context.WithCancel(context.Background())
	for _, d := range []string{p.sessDir, p.perDir, p.diskDir, filepath.Join(p.perDir, wsMountDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("container: state directory: %w", err)
		}
	}
	if p.locks, err = sessionlock.Open(filepath.Join(root, "locks")); err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	if p.agent, err = agentBinary(opts.AgentBinary); err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	if p.cgroups, err = findCgroupLayout(); err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.rt, err = newRuntime(opts.Runtime, root); err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	images := opts.Images
	if images == "" {
		images = filepath.Join(state, "images")
	}
	if p.images, err = imagestore.Open(images, imagestore.WithMaxImageSize(opts.MaxImageSize), imagestore.WithMaxImageInodes(opts.MaxImageInodes)); err != nil {
		return nil, fmt.Errorf("container: image store: %w", err)
	}
	if p.host, err = imagestore.BuildHost(filepath.Join(root, "hostimage")); err != nil {
		return nil, fmt.Errorf("container: the host image: %w", err)
	}
	if err := p.setupUserNS(opts.UserNamespace); err != nil {
		return nil, fmt.Errorf("container: %w", err)
	}
	if p.diskOn {
		if err := p.checkDisks(); err != nil {
			return nil, fmt.Errorf("container: %w", err)
		}
	}
	// The provider's own network manager is made by Recover, which knows
	// the networks to keep; a shared one is used as it is.
	p.net, p.ownNet = opts.Network, opts.Network == nil
	return p, nil
}

// agentBinary is the agent to bind into containers, name or this
// process's executable, and how a session runs it (see agentLoad): static,
// as it is; dynamically linked, with its loader and libraries.
func agentBinary(name string) (agentLoad, error) {
	if name == "" {
		exe, err := os.Executable()
		if err != nil {
			return agentLoad{}, fmt.Errorf("the agent binary: %w", err)
		}
		name = defaultAgent(exe)
	}
	abs, err := filepath.Abs(name)
	if err != nil {
		return agentLoad{}, err
	}
	if _, err := os.Stat(abs); err != nil {
		return agentLoad{}, fmt.Errorf("the agent binary: %w", err)
	}
	a, err := loadAgent(abs)
	if err != nil {
		return agentLoad{}, fmt.Errorf("the agent binary %s: %w", abs, err)
	}
	return a, nil
}

// AgentAlone is the agent's own binary (cmd/tai42-agent), which the
// provider runs in place of tai42 itself when it is installed beside it: it
// starts in a couple of milliseconds rather than tai42's dozen (whose
// package initializers, the Kubernetes client's among them, run first), and
// its few pages are what an idle session holds of it.
const AgentAlone = "tai42-agent"

// defaultAgent is the agent binary of a provider whose AgentBinary is "",
// in the process whose executable is exe: AgentAlone beside exe, else exe.
func defaultAgent(exe string) string {
	alone := filepath.Join(filepath.Dir(exe), AgentAlone)
	if fi, err := os.Stat(alone); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return alone
	}
	return exe
}

// Close releases what the provider holds itself: the network's bridges and
// rules, the runtime's mount namespace. (The parent cgroup "tai42", shared
// with every other provider on the host, stays: removing it would race
// their creates.) The kit calls it after every session is destroyed.
func (p *provider) Close() error {
	var errs []error
	p.closeOnce.Do(func() {
		p.pullCancel()
		errs = append(errs, p.closeEgress())
		if p.pool != nil {
			p.pool.close()
		}
		if p.nsPool != nil {
			p.nsPool.close()
		}
		if p.net != nil && p.ownNet {
			errs = append(errs, p.net.Close())
		}
		if p.rt != nil {
			p.rt.close()
		}
		if p.userns != nil {
			p.userns.Close()
		}
	})
	return errors.Join(errs...)
}

// Abandon implements kit.Abandoner: it lets go of what the provider holds
// in this process, as the process's death would, and touches no session:
// the OCI runtime's mount namespace (crun's, on a host with hybrid cgroups:
// its thread ends, and with it the mounts made there), the user namespace
// handles (the sessions' made ahead too), the network manager's sockets and made-ahead namespaces (its
// networks stay), the disk pool's refill (its disks stay), and the
// sessions' locks.
func (p *provider) Abandon() {
	p.closeOnce.Do(func() {
		p.pullCancel()
		if p.pool != nil {
			p.pool.abandon()
		}
		if p.nsPool != nil {
			p.nsPool.close() // handles of this process's, which its death closes
		}
		if p.rt != nil {
			p.rt.close()
		}
		if p.userns != nil {
			p.userns.Close()
		}
		_ = p.closeEgress()
		if p.net != nil && p.ownNet {
			p.net.Abandon()
		}
		p.locks.Abandon()
	})
}

func (p *provider) Name() string                 { return Name }
func (p *provider) Isolation() sandbox.Isolation { return sandbox.IsolationContainer }
func (p *provider) SharedFilesystem() bool       { return false }

var _ kit.UserRunner = (*provider)(nil)

// RunsExecsAsUsers implements kit.UserRunner: the agent runs an exec as
// its user (see the package doc).
func (p *provider) RunsExecsAsUsers() {}

func (p *provider) Check(spec sandbox.SessionSpec) error {
	no := func(field, format string, args ...any) error {
		return &sandbox.SpecRejectedError{Field: field, Reason: sandbox.ReasonUnenforceable, Message: fmt.Sprintf(format, args...)}
	}
	if spec.Image != sandbox.HostImage {
		// An image the store lacks is the create's to pull, unless the
		// policy says never.
		if _, err := p.images.Get(spec.Image); err != nil && (p.opts.Pull == PullNever || !errors.Is(err, imagestore.ErrNotFound)) {
			if errors.Is(err, imagestore.ErrNotFound) {
				return no("image", "image %q is not in the local store (%s) and pulls are off (--pull %s): pull it (`tai42 image pull %s`), import it (`tai42 image import FILE --name %s`), or use %q", spec.Image, p.images.Dir(), PullNever, spec.Image, spec.Image, sandbox.HostImage)
			}
			return no("image", "image %q: %v", spec.Image, err)
		}
	}
	if spec.CPU > 0 && spec.CPU*cfsPeriodUS < 1000 {
		return no("cpu", "cpu %g is below the smallest enforceable cap (0.01)", spec.CPU)
	}
	return nil
}

// cgroupsPath is a session's cgroup, below the provider's shared parent.
func cgroupsPath(id string) string { return "/" + cgroupParent + "/" + id }

const cgroupParent = "tai42"

// pidfdOf opens a pidfd on the process whose pid file is name; -1 when it
// cannot (the destroy then leaves the whole kill to the runtime).
func pidfdOf(name string) int {
	b, err := os.ReadFile(name)
	if err != nil {
		return -1
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return -1
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1
	}
	return fd
}

// diskFull is err of a create, saying so when the session's disk filled up
// (blocks or inodes) before the session could start: its cap is below what
// a session needs to begin.
func (p *provider) diskFull(r *session, err error) error {
	if r.disk == nil {
		return err
	}
	var st unix.Statfs_t
	if p.rt.do(func() error { return unix.Statfs(r.disk.mnt, &st) }) != nil {
		return err
	}
	if st.Bavail > 0 && st.Ffree > 0 {
		return err
	}
	return fmt.Errorf("the session's disk cap (%d MiB, %d inodes; container.Options.DiskMB, DiskInodes) is full before the session could start: raise it: %w", p.disk.mb, p.disk.inodes, err)
}

// rootUID is the host uid (and gid) of root in a session.
func (p *provider) rootUID() int {
	if p.userns != nil {
		return UserNamespaceBase
	}
	return 0
}

func ifNotEmpty(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

// baseEnv is the environment every exec starts from: the image's, with a
// PATH, HOME, TMPDIR and LANG where the image sets none.
func baseEnv(image []string) map[string]string {
	env := map[string]string{
		"PATH":   "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":   "/root",
		"TMPDIR": "/tmp",
		"LANG":   "C.UTF-8",
	}
	for _, kv := range image {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	return env
}
