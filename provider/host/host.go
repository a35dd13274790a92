// Package host is the direct host runner: isolation "none". Each session is
// a workspace directory under a state directory; each exec is a process in
// its own process group, started in the workspace with a minimal clean
// environment plus the spec's and the exec's env.
//
// What it enforces, and what it rejects:
//   - image: "host" only (the host's own filesystem).
//   - network: "none" runs every exec of the session in one new network
//     namespace with only loopback (needs root: CAP_SYS_ADMIN); "egress" is
//     the host's own network; "internal" cannot be enforced and is rejected.
//     Egress is not fenced: a session with network "egress" reaches what
//     the host reaches, private networks and a cloud's metadata service
//     (169.254.169.254) included. The container provider fences egress;
//     the host runner is for trusted code.
//   - disk: not capped; a session may fill the state directory's
//     filesystem.
//   - cpu and memory_mb: a cgroup per session (v1 cpu+memory controllers, or
//     v2 cpu.max/memory.max with swap off) when the cgroup tree is writable;
//     else rejected, saying why.
//   - persistent workspaces: a directory per workspace_key that survives
//     destroy, reap and restarts; put_file there flushes the new file and
//     its directory to disk before it returns.
//
// Processes: a timeout, a kill or the session's destroy sends SIGKILL to the
// exec's whole process group. When a command exits on its own, processes it
// left running in its group go on (a background server keeps serving the
// session): the exec's output ends at the command's exit once its pipes
// reach end-of-file, or after the exit grace (default 200ms) while a left
// process still holds them without writing. A left process that keeps
// writing into them is killed at the exec's timeout; the command's own
// exit status stands. Kill on a handle whose command has exited ends
// those left processes, and destroying the session ends every process group
// it started and, where the runner can track processes (below), every
// process the session started, one that left its group (setsid) included.
//
// Tracking and recovery: where a cgroup v2 hierarchy is writable (root; on
// a hybrid cgroups v1 host the cgroup2 mount beside), every exec starts
// inside the session's tracking group (<cgroup2>/tai42-host/<id>, no
// controllers), so the kernel knows every process of the session. Each
// session also holds a lock file (<state>/host/locks/<id>.lock) while its
// process runs it. A runner starting on a state directory (kit.Recoverer)
// ends the processes of every session whose lock is free (its process was
// killed), removes those sessions but the ones its ledger keeps, and makes
// the kept ones again around their workspaces: execs that were running are
// gone. Without a writable cgroup v2 hierarchy (a tai42-host group made by
// another user, e.g. by an earlier run as root, is not writable), a killed runner's
// processes cannot be found and are left running (the log says so).
// Sessions of another live process on the same state directory are left
// alone.
//
// Users: an exec runs as the runner's own user, or as the user it names
// (sandbox.ExecOptions.User), resolved in the host's /etc/passwd and
// /etc/group (a session shares the host's filesystem); a name they lack is
// a *sandbox.UserNotFoundError. Only a runner that runs as root can run an
// exec as another user (setgroups, setgid, setuid in the child), and not
// in a session with cpu or memory caps, whose cgroup join runs as root
// before the command; a runner of another user runs an exec as itself
// alone (the user that is its own uid and gid). What it cannot honour it
// refuses with a *sandbox.SandboxError, never running the exec as another
// user. The exec starts in its cwd, entered before it takes the user's
// ids, but the workspace and TMPDIR stay the runner's, mode 0700: what
// the user may read or write there is theirs to say. Its HOME is the
// user's home unless the spec's or the exec's env sets HOME.
//
// A command that cannot be found exits 127, one that cannot be executed 126,
// with the reason on stderr; a command killed by a signal reports 128+signal.
package host

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/netns"
	"github.com/tai42/sandbox/internal/sessionlock"
	"github.com/tai42/sandbox/internal/wsdir"
	"github.com/tai42/sandbox/kit"
)

// Name is the provider's registered name. Its one image is
// [sandbox.HostImage].
const Name = "host"

// Options configure the host runner: the kit's, passed on to it (a
// durable Ledger brings back, at New, the sessions a killed process left),
// and those every provider takes. StateDir holds the workspaces and the
// per-session temp directories.
type Options struct {
	kit.Options
	kit.ProviderOptions
}

// Register registers the host runner in reg (nil: the process-wide
// registry) under [Name], opened on its first Require with the options
// opts returns then: what they need opened (a durable ledger) is opened
// only for the provider asked for, and New owns it from there.
func Register(reg *sandbox.Registry, opts func() (Options, error)) error {
	return kit.Register(reg, Name, opts, New)
}

// New returns the host runner wrapped by the kit. It owns opts.Ledger, as
// kit.New does: when New fails, the ledger has been closed, once.
func New(opts Options) (*kit.Sandbox, error) {
	p, err := NewProvider(opts)
	return kit.Wrap(p, err, opts.Options)
}

type provider struct {
	opts   Options
	ephDir string // ephemeral workspaces
	// wsdir.Store is the persistent workspaces, one directory per key
	// under <state>/host/workspaces, and the runner's
	// kit.WorkspaceStore as it is: Workspaces and RemoveWorkspace.
	wsdir.Store
	tmpDir   string // per-session TMPDIR
	locks    *sessionlock.Dir
	netErr   error // why network "none" cannot be enforced, or nil
	cgroups  *cgroupRoot
	cgErr    error // why caps cannot be enforced, or nil
	track    *tracker
	trackErr error // why sessions' processes are not tracked, or nil
	hostNet  *os.File
	netPool  *netns.Pool
	devNull  *os.File // stdin of an exec given no input
	hostPath string   // PATH for execs

	faults func(id, step string) error // a test's failures of create steps; nil: none
}

// NewProvider returns the host runner's [kit.Provider] for opts, not yet
// wrapped by the kit: for a caller that composes it (a test wrapping it to
// inject faults) before [kit.New]. The kit closes it. The kit's options
// (opts.Options) are New's to pass on; of them the provider uses only the
// Logger.
func NewProvider(opts Options) (kit.Provider, error) {
	defaultSignalsForCommands()
	p, err := newProvider(opts)
	if err != nil {
		return nil, err // not a nil *provider in a non-nil interface
	}
	return p, nil
}

func newProvider(opts Options) (*provider, error) {
	if opts.StateDir == "" {
		return nil, errors.New("host: a state directory is required")
	}
	opts.ProviderOptions = opts.ProviderOptions.WithDefaults()
	root, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("host: state directory: %w", err)
	}
	root = filepath.Join(root, "host")
	p := &provider{
		opts:     opts,
		ephDir:   filepath.Join(root, "sessions"),
		Store:    wsdir.Store{Dir: filepath.Join(root, "workspaces")},
		tmpDir:   filepath.Join(root, "tmp"),
		hostPath: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	}
	for _, d := range []string{p.ephDir, p.Store.Dir, p.tmpDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("host: state directory: %w", err)
		}
	}
	if p.locks, err = sessionlock.Open(filepath.Join(root, "locks")); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	if p.devNull, err = os.Open(os.DevNull); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	p.hostNet, p.netErr = probeNetns()
	if p.netErr == nil {
		p.netPool = netns.NewPool(netnsPoolSize, netnsOptions)
	}
	p.cgroups, p.cgErr = findCgroups()
	p.track, p.trackErr = findTracker()
	return p, nil
}

// netnsPoolSize is how many network namespaces are kept made ahead.
const netnsPoolSize = 2

// Close releases what the provider holds itself: its namespace pool, its
// handle on the host's network namespace, /dev/null. The kit calls it after
// every session is destroyed.
func (p *provider) Close() error {
	if p.netPool != nil {
		p.netPool.Close()
	}
	if p.hostNet != nil {
		p.hostNet.Close()
	}
	return p.devNull.Close()
}

// log is the provider's logger, never nil.
func (p *provider) log() *slog.Logger {
	if p.opts.Logger != nil {
		return p.opts.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Abandon implements kit.Abandoner: the sessions' locks go (as with the
// process's death) and what Close releases is released; sessions are left
// running.
func (p *provider) Abandon() {
	p.locks.Abandon()
	_ = p.Close()
}

func (p *provider) Name() string                 { return Name }
func (p *provider) Isolation() sandbox.Isolation { return sandbox.IsolationNone }
func (p *provider) SharedFilesystem() bool       { return true }

var (
	_ kit.UserRunner     = (*provider)(nil)
	_ kit.WorkspaceStore = (*provider)(nil)
)

// RunsExecsAsUsers implements kit.UserRunner (see the package doc's
// Users).
func (p *provider) RunsExecsAsUsers() {}

func (p *provider) Check(spec sandbox.SessionSpec) error {
	no := func(field, format string, args ...any) error {
		return &sandbox.SpecRejectedError{Field: field, Reason: sandbox.ReasonUnenforceable, Message: fmt.Sprintf(format, args...)}
	}
	if spec.Image != sandbox.HostImage {
		return no("image", "the host runner honours only image %q, not %q", sandbox.HostImage, spec.Image)
	}
	switch spec.Network {
	case sandbox.NetworkNone:
		if p.netErr != nil {
			return no("network", "network \"none\" needs a new network namespace, which this host refuses: %v", p.netErr)
		}
	case sandbox.NetworkInternal:
		return no("network", "the host runner cannot confine a session to an internal network; use \"none\", \"egress\", or the container provider")
	}
	if (spec.CPU > 0 || spec.MemoryMB > 0) && p.cgErr != nil {
		field := "cpu"
		if spec.CPU == 0 {
			field = "memory_mb"
		}
		return no(field, "caps need a writable cgroup tree: %v", p.cgErr)
	}
	if spec.CPU > 0 && spec.CPU*float64(cfsPeriodUS) < minQuotaUS {
		return no("cpu", "cpu %g is below the smallest enforceable cap (%g)", spec.CPU, float64(minQuotaUS)/cfsPeriodUS)
	}
	return nil
}
