// Package agentexec is a session's exec and file side over the agent
// protocol, shared by the providers whose sessions run the agent (the
// container provider, the kubernetes provider): timeouts, output limits,
// exit grace, kill, interactive handles and their execout sinks, the
// admission of execs against the session's destroy, put/get through the
// agent. A provider supplies how the agent is reached and what is its own
// (the base environment, an OOM kill count); the mechanisms are written
// once, here.
package agentexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/internal/execgate"
	"github.com/tai42/sandbox/internal/execout"
	"github.com/tai42/sandbox/kit"
)

// Config is what a provider gives a [Session].
type Config struct {
	// ID is the session's id, for errors.
	ID string
	// Spec is the session's spec (its memory cap, its durability).
	Spec sandbox.SessionSpec
	// Agent reaches the session's agent.
	Agent *agent.Client
	// Opts bound the execs' output (defaults applied by New).
	Opts kit.ProviderOptions
	// WorkspaceDir is the workspace's absolute path in the session.
	WorkspaceDir string
	// BaseEnv is the exec base environment (the image's); the spec's env
	// overlaid by the exec's comes on top.
	BaseEnv map[string]string
	// User is the user of an exec that names none; "": the agent's own.
	User string
	// OOMKills, when set, is how many processes the session's memory
	// limit has killed so far: read at an exec's start and after an exit
	// by SIGKILL in a session with memory_mb, to say that the limit killed
	// it. nil: no report.
	OOMKills func() int64
}

// Session runs one session's execs and file operations through its agent.
type Session struct {
	cfg Config

	// execs: running execs, and ended interactive ones whose handles are
	// held; closed once the session's destroy has begun.
	execs execgate.Gate[*Proc]
}

// New returns the session's exec side.
func New(cfg Config) *Session {
	cfg.Opts = cfg.Opts.WithDefaults()
	return &Session{cfg: cfg}
}

// SetSpec makes spec the session's own: a session made ahead for a pool
// is handed to a create with that create's spec (its memory cap). It must
// be called before any exec of the session.
func (s *Session) SetSpec(spec sandbox.SessionSpec) { s.cfg.Spec = spec }

// Agent is the session's agent client.
func (s *Session) Agent() *agent.Client { return s.cfg.Agent }

// Gone is the error of an operation on the session once it is destroyed.
func (s *Session) Gone() error {
	return &sandbox.SessionNotFoundError{SessionID: s.cfg.ID, Detail: "it was destroyed"}
}

// Closed reports whether Close has begun.
func (s *Session) Closed() bool { return s.execs.Closed() }

// Admit admits an operation that Close must find (a put whose temporary
// file the provider removes after the destroy): false once Close has begun.
// An admitted one calls Done once it is recorded where the destroy looks.
func (s *Session) Admit() bool { return s.execs.Admit() }

// Done ends what Admit admitted.
func (s *Session) Done() { s.execs.Done() }

// Close refuses every later exec and ends every running one (its stream
// ends with a *sandbox.SessionNotFoundError), returning them for the
// caller to wait on ([Proc.Wait]) once the session's processes are gone.
// first is false when Close ran already.
func (s *Session) Close() (procs []*Proc, first bool) {
	procs, first = s.execs.Close()
	for _, p := range procs {
		p.end(execout.EndDestroy)
	}
	return procs, first
}

// WaitEnded waits up to limit for each of procs to end, and lets go of
// them.
func WaitEnded(procs []*Proc, limit time.Duration) error {
	var errs []error
	deadline := time.Now().Add(limit)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(time.Until(deadline)):
			errs = append(errs, fmt.Errorf("an exec did not end within %s of the session's end", limit))
		}
		p.release()
	}
	return errors.Join(errs...)
}

// Proc is one exec running in the session, as the provider sees it: the
// agent's process, the sink its output goes to, the deadline, and why it
// was ended.
type Proc struct {
	s           *Session
	ap          *agent.Proc
	sink        execout.Sink
	timeout     time.Duration
	timer       *time.Timer
	lens        [2]atomic.Int64
	oomAt       int64 // the OOM kill count at the start
	interactive bool
	done        chan struct{} // closed once the end is handed to the sink

	mu     sync.Mutex
	reason execout.EndReason
}

// Done is closed once the exec's end is decided.
func (p *Proc) Done() <-chan struct{} { return p.done }

func (p *Proc) exited() bool {
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
func (s *Session) environ(env map[string]sandbox.Secret, user string) []string {
	out := make([]string, 0, len(s.cfg.BaseEnv)+len(env))
	for k, v := range s.cfg.BaseEnv {
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
func (s *Session) start(ctx context.Context, op string, req kit.ExecRequest, interactive bool, sk execout.Sink) (*Proc, error) {
	if !s.execs.Admit() {
		return nil, s.Gone()
	}
	defer s.execs.Done()
	p := &Proc{s: s, sink: sk, timeout: req.Timeout, interactive: interactive, done: make(chan struct{})}
	if s.cfg.Spec.MemoryMB > 0 && s.cfg.OOMKills != nil {
		// Only a session with a memory limit can have an exec killed by
		// it: the others skip the read on every exec.
		p.oomAt = s.cfg.OOMKills()
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
		user = s.cfg.User
	}
	spec := agent.ExecSpec{
		Op:          op,
		Argv:        req.Argv,
		Dir:         req.Cwd.Abs,
		DirOrig:     req.Cwd.Orig,
		Env:         s.environ(req.Env, user),
		User:        user,
		Stdin:       req.Stdin,
		Interactive: interactive,
		Grace:       s.cfg.Opts.ExitGrace,
	}
	if req.Cwd.InWorkspace() {
		spec.DirRoot, spec.DirRel = s.cfg.WorkspaceDir, req.Cwd.Rel
	}
	ap, err := s.cfg.Agent.Start(ctx, spec, out)
	if err != nil {
		if s.Closed() {
			return nil, s.Gone()
		}
		return nil, err
	}
	p.ap = ap
	s.execs.Add(p)
	p.timer = time.AfterFunc(req.Timeout, p.onTimeout)
	go p.supervise()
	return p, nil
}

// onTimeout kills the group. When the command exited in time but its
// output is still going (a process it left in its group may keep writing
// for ever), the timeout ends those processes; what is already in the
// pipes is still read, and the command's own exit status stands.
func (p *Proc) onTimeout() {
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
func (p *Proc) release() {
	p.ap.Close()
	p.s.execs.Remove(p)
}

// setReason records why the exec ends, exited telling whether the command
// had exited by then (see [execout.EndReason.Then]).
func (p *Proc) setReason(reason execout.EndReason, exited bool) {
	p.mu.Lock()
	p.reason = p.reason.Then(reason, exited)
	p.mu.Unlock()
}

// end kills the exec's process group and stops its output at once. The
// first reason decides how the stream ends (see [execout.EndReason.Then]).
func (p *Proc) end(reason execout.EndReason) {
	p.setReason(reason, p.exited())
	p.sink.Stop()
	_ = p.ap.Kill(false)
}

// supervise waits for the agent's end of the exec and hands the stream's
// end to the sink.
func (p *Proc) supervise() {
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
	if reason == execout.EndNone && res.Err != nil && p.s.Closed() {
		reason = execout.EndDestroy
	}
	s := p.s
	ended := execout.Ended{SessionID: s.cfg.ID, Timeout: p.timeout, Limit: s.cfg.Opts.MaxOutputBytes,
		Lens: [2]int64{p.lens[0].Load(), p.lens[1].Load()}, Held: res.Held}
	switch err := reason.Err(ended); {
	case err != nil:
		p.sink.Finish(nil, err, exit)
	case res.Err != nil:
		p.sink.Finish(nil, sandbox.WrapError("exec", "lost the session's agent before the exec ended", res.Err), nil)
	case !res.StatusKnown:
		p.sink.Finish(nil, sandbox.Errorf("exec", "cannot read the exec's exit status"), nil)
	default:
		if exit.ExitCode == 128+9 && s.cfg.Spec.MemoryMB > 0 && s.cfg.OOMKills != nil && s.cfg.OOMKills() > p.oomAt {
			p.sink.Write(1, fmt.Appendf(nil, "\ntai42: killed by the session's memory limit (memory_mb=%d)\n", s.cfg.Spec.MemoryMB))
		}
		p.sink.Finish(exit, nil, exit)
	}
	close(p.done)
}

// Exec runs req to completion, its output held in memory up to the limit.
func (s *Session) Exec(ctx context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	sk := &execout.Buffer{Limit: s.cfg.Opts.MaxOutputBytes}
	p, err := s.start(ctx, "exec", req, false, sk)
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

// handle is an interactive exec's sandbox.ExecHandle.
type handle struct {
	p       *Proc
	st      *execout.Stream
	stdinMu chan struct{} // a lock that a waiting writer can give up on
}

var (
	_ sandbox.ExecHandle  = (*handle)(nil)
	_ sandbox.ExitWatcher = (*handle)(nil)
)

// ExecStart starts req as an interactive exec.
func (s *Session) ExecStart(ctx context.Context, req kit.ExecRequest) (sandbox.ExecHandle, error) {
	st := execout.NewStream(s.cfg.Opts.StreamBuffer)
	p, err := s.start(ctx, "exec_start", req, true, st)
	if err != nil {
		return nil, err
	}
	h := &handle{p: p, st: st, stdinMu: make(chan struct{}, 1)}
	// A handle dropped by its caller lets go of the agent's connections;
	// the agent then kills the exec if it still runs.
	runtime.AddCleanup(h, (*Proc).release, p)
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
	case h.p.s.Closed():
		return h.p.s.Gone()
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
		if h.p.s.Closed() {
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

// FileRef is p as the agent takes it: relative to the workspace, or to the
// session's root for an absolute path outside it.
func (s *Session) FileRef(p kit.Path) agent.FileRef {
	if p.InWorkspace() {
		return agent.FileRef{Root: s.cfg.WorkspaceDir, Rel: p.Rel, Orig: p.Orig}
	}
	rel := strings.TrimPrefix(filepath.Clean(p.Abs), "/")
	if rel == "" {
		rel = "."
	}
	return agent.FileRef{Root: "/", Rel: rel, Orig: p.Orig}
}

// FileErr is err of a file operation, or the session's end when the
// operation failed because the session was destroyed under it.
func (s *Session) FileErr(err error) error {
	if err != nil && s.Closed() {
		var nf *sandbox.SessionNotFoundError
		if !errors.As(err, &nf) {
			return s.Gone()
		}
	}
	return err
}

// PutFileFrom writes src to ref through the agent, which writes a temp
// file beside the target and renames it into place: a reader sees the old
// content or the new, never a mix.
func (s *Session) PutFileFrom(ctx context.Context, ref agent.FileRef, src io.Reader) error {
	if s.Closed() {
		return s.Gone()
	}
	return s.FileErr(s.cfg.Agent.PutFile(ctx, ref, src))
}

// OpenFile opens p for reading through the agent.
func (s *Session) OpenFile(ctx context.Context, p kit.Path) (io.ReadCloser, int64, error) {
	if s.Closed() {
		return nil, 0, s.Gone()
	}
	rc, size, err := s.cfg.Agent.OpenFile(ctx, s.FileRef(p))
	return rc, size, s.FileErr(err)
}

// GetFile reads p whole through the agent.
func (s *Session) GetFile(ctx context.Context, p kit.Path) ([]byte, error) {
	rc, size, err := s.OpenFile(ctx, p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	// Read to the end with room for one read past the size, so a file that
	// grew is still read whole and the end is found without a copy.
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
	if _, err := buf.ReadFrom(rc); err != nil {
		return nil, s.FileErr(sandbox.WrapError("get_file", fmt.Sprintf("reading %q", p.Orig), err))
	}
	return buf.Bytes(), nil
}
