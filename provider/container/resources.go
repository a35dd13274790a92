package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/internal/agentexec"
	"github.com/tai42/sandbox/internal/sessionlock"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/kit"
)

// session is one container session: its bundle directory (config, root
// overlay, agent socket, runtime log, and the ephemeral workspace), its
// network, its container, and the execs it started.
type session struct {
	p    *provider
	id   string
	spec sandbox.SessionSpec
	dir  string
	ws   string
	env  map[string]string // the exec base environment
	user string            // the user of an exec that names none: its image's User; "": root

	disk   *disk // the session's disk; nil: no cap
	wsDisk *disk // its persistent workspace's image, mounted; nil: none (or a plain directory)

	rootfs  string // the root overlay's mount point
	rootDir string // when remapped, rootfs's own directory under rootsDir
	owner   int    // when remapped, the host uid that owns its user namespace (see owners); 0: none

	release func() // the image's hold, or nil
	imageID string // the image's content digest; "" for the host image
	net     *sessnet.Net
	dirFD   int // an O_PATH handle on dir, for a short socket path
	initFD  int // a pidfd on the container's PID 1, or -1
	agent   *agent.Client
	lock    *sessionlock.Lock // held while this process runs the session

	// teardown is the undos of what Create (or recoverOne) made, the last
	// made on top; cleanup unwinds it. stuck says that one of them could
	// not unmount something: the disks under it and the bundle stay.
	teardown undo.Stack
	stuck    bool
	ending   []*agentexec.Proc // the execs Destroy ended, for removeContainer to wait for

	// ex runs the session's execs and file operations through the agent;
	// set with agent (see connectAgent).
	ex *agentexec.Session

	mu   sync.Mutex
	puts map[string]int // persistent workspace: directories with a put_file in flight, or failed
}

var (
	_ kit.Resources    = (*session)(nil)
	_ kit.FileStreamer = (*session)(nil)
)

func (r *session) WorkspacePath() string { return workspaceDir }

func (r *session) gone() error { return r.ex.Gone() }

// sockPath is the agent's socket as this process reaches it: through the
// directory handle, since a state directory's path may be longer than a
// socket address may be.
func (r *session) sockPath() string {
	return "/proc/self/fd/" + strconv.Itoa(r.dirFD) + "/agent.sock"
}

func (r *session) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", r.sockPath())
}

// isClosed reports whether Destroy has begun.
func (r *session) isClosed() bool { return r.ex.Closed() }

// Destroy ends every exec, then the container (every process in it), and
// removes the session's network, root overlay (and its idmapped image
// and sysfs), cgroup and bundle; an ephemeral workspace goes with the bundle, a
// persistent one is kept.
func (r *session) Destroy(ctx context.Context) error {
	procs, first := r.ex.Close() // ends every exec
	if !first {
		return nil
	}
	// Killing the container's PID 1 ends every process in its pid
	// namespace; the agent's connections end, so do the execs. Deleting a
	// stopped container is then quick (runc's own kill of a running one
	// waits about 100 ms). The deletion is the top of the teardown, and
	// waits for the execs ended above (see removeContainer).
	r.killInit()
	r.ending = procs
	return r.cleanup(ctx)
}

// waitEnded waits for the execs Destroy ended, whose agent connections end
// with the container, and lets go of them.
func (r *session) waitEnded() error {
	procs := r.ending
	r.ending = nil
	return agentexec.WaitEnded(procs, 10*time.Second)
}

// putTempPrefix starts the names of the agent's put_file temporaries.
const putTempPrefix = ".tai42-put-"

// removePutTemps removes, once the container is gone, the temporary files
// of the put_file calls that were in flight in a persistent workspace: the
// agent, killed with the container, could not. Only the directories of
// those puts are looked in.
func (r *session) removePutTemps() {
	r.mu.Lock()
	dirs := slices.Collect(maps.Keys(r.puts))
	r.puts = nil
	r.mu.Unlock()
	if len(dirs) == 0 {
		return
	}
	// Opened where the runtime runs: a workspace image is mounted there.
	var root *os.Root
	if r.p.rt.do(func() (err error) { root, err = os.OpenRoot(r.ws); return err }) != nil {
		return
	}
	defer root.Close()
	for _, dir := range dirs {
		d, err := root.Open(dir)
		if err != nil {
			continue
		}
		entries, _ := d.ReadDir(-1)
		d.Close()
		for _, e := range entries {
			if e.Type().IsRegular() && strings.HasPrefix(e.Name(), putTempPrefix) {
				_ = root.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
}

// killInit sends SIGKILL to the container's PID 1 through its pidfd and
// waits up to 2 s for it to end.
func (r *session) killInit() {
	if r.initFD >= 0 {
		killAndWait(r.initFD)
	}
}

// killAndWait sends SIGKILL to the process of pidfd fd and waits up to 2 s
// for it to end.
func killAndWait(fd int) {
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return // gone already
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		n, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds())+1)
		if n > 0 || (err != nil && err != unix.EINTR) {
			return
		}
	}
}

// cleanup removes what Create (or recoverOne) made, last first: it unwinds
// the session's teardown; it is also the rollback of a failed create.
func (r *session) cleanup(ctx context.Context) error {
	err := r.teardown.Unwind(ctx)
	// Last: while it is held no other process sweeps the session; its file
	// stays when something is left, so that the next start retries.
	r.lock.Release(err == nil)
	r.lock = nil
	return err
}

// removeRootMount removes a remapped session's directory under rootsDir
// and the (unmounted, so empty) mount point in it; missing is not an
// error. It never removes anything else.
func removeRootMount(dir string) error {
	for _, d := range []string{filepath.Join(dir, "rootfs"), dir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the session's root mount point: %w", err)
		}
	}
	return nil
}

// PutFile writes data through the agent, which writes a temp file beside
// the target and renames it into place: a reader sees the old content or
// the new, never a mix. Missing parents are created; `..` and symlinks
// cannot lead out of the workspace.
func (r *session) PutFile(ctx context.Context, p kit.Path, data []byte) error {
	return r.PutFileFrom(ctx, p, bytes.NewReader(data))
}

func (r *session) PutFileFrom(ctx context.Context, p kit.Path, src io.Reader) (err error) {
	if r.isClosed() {
		return r.gone()
	}
	ref := r.ex.FileRef(p)
	// A persistent workspace outlives a crash of the machine: the agent
	// flushes the file and its directory before it answers.
	ref.Sync = r.spec.Durability == sandbox.Persistent && p.InWorkspace()
	if ref.Sync {
		// A destroy while it is in flight removes its temporary file: the
		// put is admitted as an exec start is, so Destroy, once it has
		// closed the gate, finds every put that passed it in r.puts.
		dir := filepath.Dir(p.Rel)
		if !r.ex.Admit() {
			return r.gone()
		}
		r.mu.Lock()
		if r.puts == nil {
			r.puts = map[string]int{}
		}
		r.puts[dir]++
		r.mu.Unlock()
		r.ex.Done()
		defer func() {
			// A put that failed keeps its directory in r.puts: the failure
			// may be the destroy's kill of the agent, which then could not
			// remove its temporary file, and the put can return before
			// Destroy looks (it did, in CI).
			if err != nil {
				return
			}
			r.mu.Lock()
			if r.puts != nil {
				if r.puts[dir]--; r.puts[dir] <= 0 {
					delete(r.puts, dir)
				}
			}
			r.mu.Unlock()
		}()
	}
	return r.ex.PutFileFrom(ctx, ref, src)
}

func (r *session) GetFile(ctx context.Context, p kit.Path) ([]byte, error) {
	return r.ex.GetFile(ctx, p)
}

func (r *session) OpenFile(ctx context.Context, p kit.Path) (io.ReadCloser, int64, error) {
	return r.ex.OpenFile(ctx, p)
}
