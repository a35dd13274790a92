package container

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/internal/execout"
	"github.com/tai42/sandbox/kit"
)

// rproc is one exec running in the container, as the provider sees it: the
// agent's process, the sink its output goes to, the deadline, and why it
// was ended.
type rproc struct {
	r           *session
	ap          *agent.Proc
	sink        execout.Sink
	timeout     time.Duration
	timer       *time.Timer
	lens        [2]atomic.Int64
	oomAt       int64 // the cgroup's OOM kill count at the start
	interactive bool
	done        chan struct{} // closed once the end is handed to the sink

	mu     sync.Mutex
	reason execout.EndReason
}

func (p *rproc) exited() bool {
	select {
	case <-p.ap.Exited():
		return true
	default:
		return false
	}
}

// environ is the exec's environment: the session's base, then the spec's
// env overlaid by the exec's (merged by the kit). An exec with a user
// gets no HOME from the base, which is root's: the agent sets the user's
// own unless env sets one.
func (r *session) environ(env map[string]sandbox.Secret, user string) []string {
	out := make([]string, 0, len(r.env)+len(env))
	for k, v := range r.env {
		if _, ok := env[k]; !ok && (user == "" || k != "HOME") {
			out = append(out, k+"="+v)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v.Reveal())
	}
	return out
}

// start starts req through the agent, its output going to sk. A command
// that cannot be started is a result (exit 126 or 127), as the agent
// reports it.
func (r *session) start(ctx context.Context, op string, req kit.ExecRequest, interactive bool, sk execout.Sink) (*rproc, error) {
	if !r.execs.Admit() {
		return nil, r.gone()
	}
	defer r.execs.Done()
	p := &rproc{r: r, sink: sk, timeout: req.Timeout, interactive: interactive, done: make(chan struct{})}
	if r.spec.MemoryMB > 0 {
		// Only a session with a memory limit can have an exec killed by
		// it: the others skip the cgroup read on every exec.
		p.oomAt = r.p.cgroups.oomKills(cgroupsPath(r.id))
	}
	out := func(i int, b []byte) bool {
		p.lens[i].Add(int64(len(b)))
		if !sk.Write(i, b) {
			// The client kills the exec (stop flavour) itself on false;
			// this may run before Start has returned p.ap, so it cannot
			// ask whether the command exited (a limit counts after the
			// exit too).
			p.setReason(execout.EndLimit, false)
			sk.Stop()
			return false
		}
		return true
	}
	user := req.User
	if user == "" {
		user = r.user
	}
	spec := agent.ExecSpec{
		Op:          op,
		Argv:        req.Argv,
		Dir:         req.Cwd.Abs,
		DirOrig:     req.Cwd.Orig,
		Env:         r.environ(req.Env, user),
		User:        user,
		Stdin:       req.Stdin,
		Interactive: interactive,
		Grace:       r.p.opts.ExitGrace,
	}
	if req.Cwd.InWorkspace() {
		spec.DirRoot, spec.DirRel = workspaceDir, req.Cwd.Rel
	}
	ap, err := r.agent.Start(ctx, spec, out)
	if err != nil {
		if r.isClosed() {
			return nil, r.gone()
		}
		return nil, err
	}
	p.ap = ap
	r.execs.Add(p)
	p.timer = time.AfterFunc(req.Timeout, p.onTimeout)
	go p.supervise()
	return p, nil
}

// onTimeout kills the group. When the command exited in time but its
// output is still going (a process it left in its group may keep writing
// for ever), the timeout ends those processes; what is already in the
// pipes is still read, and the command's own exit status stands.
func (p *rproc) onTimeout() {
	p.mu.Lock()
	ended := p.reason != execout.EndNone
	p.reason = p.reason.Then(execout.EndTimeout, p.exited())
	p.mu.Unlock()
	if ended {
		return
	}
	// The agent drains what the killed group wrote, so the lengths count
	// every byte.
	_ = p.ap.Kill(true)
}

// release lets go of the exec's connections to the agent and of its place
// among the session's execs.
func (p *rproc) release() {
	p.ap.Close()
	p.r.execs.Remove(p)
}

// setReason records why the exec ends, exited telling whether the command
// had exited by then (see [execout.EndReason.Then]).
func (p *rproc) setReason(reason execout.EndReason, exited bool) {
	p.mu.Lock()
	p.reason = p.reason.Then(reason, exited)
	p.mu.Unlock()
}

// end kills the exec's process group and stops its output at once. The
// first reason decides how the stream ends (see [execout.EndReason.Then]).
func (p *rproc) end(reason execout.EndReason) {
	p.setReason(reason, p.exited())
	p.sink.Stop()
	_ = p.ap.Kill(false)
}

// supervise waits for the agent's end of the exec and hands the stream's
// end to the sink.
func (p *rproc) supervise() {
	<-p.ap.Done()
	p.timer.Stop()
	if !p.interactive {
		// Nothing more goes to the agent about a non-interactive exec.
		// An interactive one keeps its connection, and its place among
		// the session's execs, for a Kill after the exit (it ends what
		// the command left running) until Kill returns, the session is
		// destroyed, or its handle is dropped.
		p.release()
	}
	res := p.ap.Result()

	p.mu.Lock()
	reason := p.reason
	p.mu.Unlock()
	var exit *sandbox.StreamExit
	if res.Err == nil && res.StatusKnown {
		exit = &sandbox.StreamExit{ExitCode: res.ExitCode}
	}
	if reason == execout.EndTimeout && res.Err == nil && !res.KilledBeforeExit {
		reason = execout.EndNone // the command exited on its own before the kill reached it
	}
	if reason == execout.EndNone && res.Err != nil && p.r.isClosed() {
		reason = execout.EndDestroy
	}
	ended := execout.Ended{SessionID: p.r.id, Timeout: p.timeout, Limit: p.r.p.opts.MaxOutputBytes,
		Lens: [2]int64{p.lens[0].Load(), p.lens[1].Load()}, Held: res.Held}
	switch err := reason.Err(ended); {
	case err != nil:
		p.sink.Finish(nil, err, exit)
	case res.Err != nil:
		p.sink.Finish(nil, sandbox.WrapError("exec", "lost the session's agent before the exec ended", res.Err), nil)
	case !res.StatusKnown:
		p.sink.Finish(nil, sandbox.Errorf("exec", "cannot read the exec's exit status"), nil)
	default:
		if exit.ExitCode == 128+9 && p.r.spec.MemoryMB > 0 && p.r.p.cgroups.oomKills(cgroupsPath(p.r.id)) > p.oomAt {
			p.sink.Write(1, fmt.Appendf(nil, "\ntai42: killed by the session's memory limit (memory_mb=%d)\n", p.r.spec.MemoryMB))
		}
		p.sink.Finish(exit, nil, exit)
	}
	close(p.done)
}

// Exec runs req to completion, its output held in memory up to the limit.
func (r *session) Exec(ctx context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	sk := &execout.Buffer{Limit: r.p.opts.MaxOutputBytes}
	p, err := r.start(ctx, "exec", req, false, sk)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		p.end(execout.EndKill)
		<-p.done
		return sandbox.ExecResult{}, sandbox.WrapError("exec", "the call was cancelled and the exec killed", ctx.Err())
	}
	return sk.Result()
}

// handle is the container provider's sandbox.ExecHandle.
type handle struct {
	p       *rproc
	st      *execout.Stream
	stdinMu chan struct{} // a lock that a waiting writer can give up on
}

var (
	_ sandbox.ExecHandle  = (*handle)(nil)
	_ sandbox.ExitWatcher = (*handle)(nil)
)

func (r *session) ExecStart(ctx context.Context, req kit.ExecRequest) (sandbox.ExecHandle, error) {
	st := execout.NewStream(r.p.opts.StreamBuffer)
	p, err := r.start(ctx, "exec_start", req, true, st)
	if err != nil {
		return nil, err
	}
	h := &handle{p: p, st: st, stdinMu: make(chan struct{}, 1)}
	// A handle dropped by its caller lets go of the agent's connections;
	// the agent then kills the exec if it still runs.
	runtime.AddCleanup(h, (*rproc).release, p)
	return h, nil
}

// Exited implements sandbox.ExitWatcher: closed once the command has
// exited, its output read or not.
func (h *handle) Exited() <-chan struct{} { return h.p.ap.Exited() }

func (h *handle) Next(ctx context.Context) (sandbox.StreamItem, error) { return h.st.Next(ctx) }

func errExited(op string) error {
	return sandbox.Errorf(op, "the exec has exited; its stdin is closed")
}

// WriteStdin writes data whole to the exec's stdin, returning once the
// agent has put all of it into the pipe. Calls are serialised. A write
// cancelled by ctx midway has delivered a prefix; stdin is then closed, so
// no torn message is followed by another.
func (h *handle) WriteStdin(ctx context.Context, data []byte) error {
	if h.p.exited() {
		return errExited("write_stdin")
	}
	select {
	case h.stdinMu <- struct{}{}:
	case <-ctx.Done():
		return sandbox.WrapError("write_stdin", "gave up waiting for another write", ctx.Err())
	}
	defer func() { <-h.stdinMu }()
	n, err := h.p.ap.WriteStdin(ctx, data)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, agent.ErrStdinClosed):
		return sandbox.Errorf("write_stdin", "stdin was closed")
	case ctx.Err() != nil && n > 0:
		return sandbox.WrapError("write_stdin", fmt.Sprintf("cancelled after %d of %d bytes; stdin is now closed", n, len(data)), ctx.Err())
	case ctx.Err() != nil:
		return sandbox.WrapError("write_stdin", "cancelled before any byte was written", ctx.Err())
	case errors.Is(err, agent.ErrExited):
		return errExited("write_stdin")
	case h.p.r.isClosed():
		return h.p.r.gone()
	}
	return sandbox.WrapError("write_stdin", fmt.Sprintf("the exec's stdin refused the write after %d of %d bytes", n, len(data)), err)
}

// CloseStdin signals end-of-input; it is idempotent.
func (h *handle) CloseStdin(ctx context.Context) error {
	select {
	case h.stdinMu <- struct{}{}:
	case <-ctx.Done():
		return sandbox.WrapError("close_stdin", "gave up waiting for a write", ctx.Err())
	}
	defer func() { <-h.stdinMu }()
	if err := h.p.ap.CloseStdin(ctx); err != nil && !errors.Is(err, agent.ErrExited) && !errors.Is(err, agent.ErrStdinClosed) {
		if h.p.r.isClosed() {
			return nil
		}
		return sandbox.WrapError("close_stdin", "the agent did not take the close", err)
	}
	return nil
}

// killed is the end of a Kill: no timeout from here on, and the handle's
// connections to the agent are let go (a handle keeps resources only until
// Kill has returned).
func (h *handle) killed() {
	h.st.NoTimeout()
	h.p.release()
}

// Kill ends the exec's process group (after the command's exit: what it
// left running in it) and waits until the stream's end is decided, so that
// Next then ends promptly with the output taken in before the kill.
func (h *handle) Kill(ctx context.Context) error {
	h.p.end(execout.EndKill)
	select {
	case <-h.p.done:
		h.killed()
		return nil
	default:
	}
	select {
	case <-h.p.done:
		h.killed()
		return nil
	case <-ctx.Done():
		return sandbox.WrapError("kill", "the exec's process group was sent SIGKILL but its end has not been reported yet", ctx.Err())
	}
}
