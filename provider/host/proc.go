package host

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/execout"
	"github.com/tai42/sandbox/internal/nsthread"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/unixuser"
	"github.com/tai42/sandbox/kit"
	"golang.org/x/sys/unix"
)

// readBufs are the readers' buffers: pooled, since an exec of a short
// command would otherwise allocate (and zero) two of them for a few bytes.
// A sink copies what it keeps.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// proc is one running exec: a process group, its pipes, two readers and a
// supervisor that reaps it and decides how its output ends.
type proc struct {
	r       *session
	pid     int // also the process group id
	process *os.Process
	stdin   *os.File // the parent's write end; closed at finish
	outs    [2]*os.File
	sink    execout.Sink
	timeout time.Duration
	grace   time.Duration
	timer   *time.Timer

	readers   sync.WaitGroup
	exited    atomic.Bool
	exitedCh  chan struct{} // closed when exited is set
	done      chan struct{} // closed once the end is decided and handed to the sink
	closeOnce sync.Once
	lens      [2]atomic.Int64

	mu     sync.Mutex
	reason execout.EndReason
	held   bool // a reader stopped at the grace deadline: a left process held the pipe
}

// started is what start returns: a running proc, or the result of a
// command that could not be started (exit 126 or 127 with a message).
type started struct {
	p        *proc
	exitCode int
	message  string
}

// start launches req in the session, with a stdin pipe when stdinPipe (else
// /dev/null). Errors are *sandbox.SandboxError (or *SessionNotFoundError once
// the session is closed).
func (r *session) start(op string, req kit.ExecRequest, stdinPipe bool, sk execout.Sink) (started, error) {
	if !r.execs.Admit() {
		return started{}, r.gone()
	}
	defer r.execs.Done()
	fi, err := r.root.Stat(req.Cwd.Rel)
	switch {
	case err != nil && oscmd.Missing(err):
		return started{}, sandbox.Errorf(op, "cwd %q does not exist in the workspace", req.Cwd.Orig)
	case err != nil:
		return started{}, sandbox.WrapError(op, fmt.Sprintf("cwd %q", req.Cwd.Orig), oscmd.RootErr(err))
	case !fi.IsDir():
		return started{}, sandbox.Errorf(op, "cwd %q is not a directory", req.Cwd.Orig)
	}
	dir := filepath.Join(r.ws, req.Cwd.Rel)
	home, cred := r.ws, (*syscall.Credential)(nil)
	if req.User != "" {
		u, c, err := r.execUser(op, req.User)
		if err != nil {
			return started{}, err
		}
		home, cred = u.Home, c
	}
	env, pathEnv := r.environ(req.Env, home)
	path, code, msg := oscmd.LookPath(req.Argv[0], pathEnv, dir)
	if code != 0 {
		return started{exitCode: code, message: msg}, nil
	}
	argv := req.Argv
	if r.cg != nil {
		argv = cgroupTrampoline(r.cg.procsFiles(), path, argv)
		path = "/bin/sh"
	}

	// pipes: stdin r,w; stdout r,w; stderr r,w. Without input (a
	// non-interactive exec with no stdin) the command reads /dev/null.
	var pipes [6]*os.File
	closeAll := func() {
		for _, f := range pipes {
			if f != nil {
				f.Close()
			}
		}
	}
	first := 0
	if !stdinPipe {
		first = 2
	}
	for i := first; i < 6; i += 2 {
		if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
			closeAll()
			return started{}, sandbox.WrapError(op, "cannot create pipes", err)
		}
	}
	childStdin := pipes[0]
	if !stdinPipe {
		childStdin = r.p.devNull
	}
	for _, f := range []*os.File{pipes[2], pipes[4]} {
		growPipe(f)
	}
	attr := &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []*os.File{childStdin, pipes[3], pipes[5]},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	}
	r.grp.sysProcAttr(attr.Sys)
	var process *os.Process
	startFn := func() (err error) { process, err = os.StartProcess(path, argv, attr); return err }
	switch {
	case cred != nil:
		// The child enters its cwd before it takes the user's ids, as runc
		// does: Go's fork enters attr.Dir after them, where the user may
		// be refused (the workspace is the runner's, mode 0700).
		attr.Dir = ""
		err = nsthread.InDir(dir, func() error {
			if r.netns != nil {
				if err := r.netns.Enter(); err != nil {
					return err
				}
			}
			return startFn()
		})
	case r.netns != nil:
		err = r.netns.Run(r.p.hostNet, startFn)
	default:
		err = startFn()
	}
	for _, i := range []int{0, 3, 5} { // the child's ends
		if pipes[i] != nil {
			pipes[i].Close()
			pipes[i] = nil
		}
	}
	if err != nil {
		closeAll()
		if pe, ok := errors.AsType[*os.PathError](err); ok && pe.Op == "chdir" {
			return started{}, sandbox.WrapError(op, fmt.Sprintf("cwd %q", req.Cwd.Orig), pe.Err)
		}
		if code, msg := oscmd.StartFailure(req.Argv[0], err); code != 0 {
			return started{exitCode: code, message: msg}, nil
		}
		return started{}, sandbox.WrapError(op, "cannot start the command", err)
	}
	p := &proc{
		r: r, pid: process.Pid, process: process,
		stdin: pipes[1], outs: [2]*os.File{pipes[2], pipes[4]},
		sink: sk, timeout: req.Timeout, grace: r.p.opts.ExitGrace,
		done: make(chan struct{}), exitedCh: make(chan struct{}),
	}
	r.register(p)
	p.timer = time.AfterFunc(req.Timeout, p.onTimeout)
	p.readers.Add(2)
	go p.read(0)
	go p.read(1)
	go p.supervise()
	return started{p: p}, nil
}

// growPipe raises a pipe's buffer to 1 MiB where allowed: fewer wakeups
// for a command that writes a lot. Failure keeps the default.
func growPipe(f *os.File) {
	if sc, err := f.SyscallConn(); err == nil {
		_ = sc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
	}
}

// environ is the exec's environment: a minimal clean base (HOME home),
// then the spec's env overlaid by the exec's (already merged by the kit).
// It also returns the PATH that commands are looked up in.
func (r *session) environ(env map[string]sandbox.Secret, home string) ([]string, string) {
	base := map[string]string{
		"PATH":   r.p.hostPath,
		"HOME":   home,
		"TMPDIR": r.tmp,
		"LANG":   "C.UTF-8",
	}
	for k, v := range env {
		base[k] = v.Reveal()
	}
	out := make([]string, 0, len(base))
	for k, v := range base {
		out = append(out, k+"="+v)
	}
	return out, base["PATH"]
}

// execUser resolves an exec's user in the host's /etc/passwd and
// /etc/group (a session of the host runner shares the host's filesystem)
// and returns it with the credential to start the command with: nil when
// the command runs as the runner's own user. The runner honours a user
// only where it can: as root, any user, in a session without caps (whose
// cgroup join runs as root before the command); as another user, that
// user alone. Errors: *sandbox.UserNotFoundError for a name the host does
// not know, else a *sandbox.SandboxError saying why.
func (r *session) execUser(op, spec string) (unixuser.User, *syscall.Credential, error) {
	u, err := unixuser.Lookup("/", spec)
	if _, ok := errors.AsType[*sandbox.UserNotFoundError](err); ok {
		return u, nil, err
	}
	if err != nil {
		return u, nil, sandbox.WrapError(op, fmt.Sprintf("user %q", spec), err)
	}
	euid, egid := os.Geteuid(), os.Getegid()
	switch {
	case euid != 0 && (int(u.UID) != euid || int(u.GID) != egid):
		return u, nil, sandbox.Errorf(op, "user %q (uid %d, gid %d): the host runner runs as uid %d (gid %d) and cannot run an exec as another user; only a runner that runs as root can", spec, u.UID, u.GID, euid, egid)
	case euid != 0:
		return u, nil, nil // the runner's own user: its groups stay the runner's
	case r.cg != nil:
		return u, nil, sandbox.Errorf(op, "user %q: the host runner cannot run an exec as a user in a session with cpu or memory caps: the command joins the session's cgroups through a shell that runs as root before it", spec)
	}
	return u, u.Credential(), nil
}

// cgroupTrampoline returns argv for /bin/sh that moves itself into each of
// the session's cgroups and then becomes the command, so that the command
// and all it forks are inside the caps from their first instruction.
func cgroupTrampoline(procs []string, path string, argv []string) []string {
	const script = `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || { echo "tai42: cannot join the session cgroup" >&2; exit 126; }; shift; n=$((n-1)); done; exec "$@"`
	out := []string{"/bin/sh", "-c", script, "tai42-cgroup", strconv.Itoa(len(procs))}
	out = append(out, procs...)
	out = append(out, path)
	return append(out, argv[1:]...)
}

func (p *proc) killGroup() { _ = syscall.Kill(-p.pid, syscall.SIGKILL) }

func (p *proc) closePipes() {
	p.closeOnce.Do(func() {
		p.outs[0].Close()
		p.outs[1].Close()
	})
}

// read takes in one stream until end-of-file, until its pipes are closed
// (kill), or, once the command has exited, until the grace deadline passes
// with a left process still holding the pipe.
func (p *proc) read(i int) {
	defer p.readers.Done()
	f := p.outs[i]
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for {
		if p.exited.Load() {
			_ = f.SetReadDeadline(time.Now().Add(p.grace))
		}
		n, err := f.Read(buf)
		if n > 0 {
			p.lens[i].Add(int64(n))
			if !p.sink.Write(i, buf[:n]) {
				p.end(execout.EndLimit)
				return
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				p.mu.Lock()
				p.held = true
				p.mu.Unlock()
			}
			return
		}
	}
}

// onTimeout kills the group. When the command exited in time but its
// output is still going (a process it left in its group may keep writing
// for ever), the timeout ends those processes; what is already in the
// pipes is still read, and the command's own exit status stands.
func (p *proc) onTimeout() {
	p.mu.Lock()
	ended := p.reason != execout.EndNone
	p.reason = p.reason.Then(execout.EndTimeout, p.exited.Load())
	p.mu.Unlock()
	if ended {
		return
	}
	// The readers drain what the killed group wrote, so the lengths count
	// every byte; the grace bounds a process outside the group holding on.
	p.killGroup()
}

// end kills the exec's process group (and, after the command's exit, what
// it left running) and stops reading at once. The first reason decides how
// the stream ends (see [execout.EndReason.Then]).
func (p *proc) end(reason execout.EndReason) {
	p.mu.Lock()
	p.reason = p.reason.Then(reason, p.exited.Load())
	p.mu.Unlock()
	p.killGroup()
	p.sink.Stop()
	p.closePipes()
}

// supervise reaps the command, lets the readers finish, and hands the
// stream's end to the sink.
func (p *proc) supervise() {
	state, werr := p.process.Wait()
	p.exited.Store(true)
	close(p.exitedCh)
	deadline := time.Now().Add(p.grace)
	for _, f := range p.outs {
		_ = f.SetReadDeadline(deadline) // wakes a reader blocked on a held pipe
	}
	p.readers.Wait()
	p.timer.Stop()
	p.closePipes()
	p.stdin.Close()
	p.r.unregister(p)

	p.mu.Lock()
	reason, held := p.reason, p.held
	p.mu.Unlock()
	var exit *sandbox.StreamExit
	if werr == nil {
		exit = &sandbox.StreamExit{ExitCode: exitCode(state)}
	}
	ended := execout.Ended{SessionID: p.r.id, Timeout: p.timeout, Limit: p.r.p.opts.MaxOutputBytes,
		Lens: [2]int64{p.lens[0].Load(), p.lens[1].Load()}, Held: held}
	switch err := reason.Err(ended); {
	case err != nil:
		p.sink.Finish(nil, err, exit)
	case werr != nil:
		p.sink.Finish(nil, sandbox.WrapError("exec", "cannot read the exec's exit status", werr), nil)
	default:
		p.sink.Finish(exit, nil, exit)
	}
	close(p.done)
}

// exitCode is the exit status, or 128+signal for a command killed by one.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
