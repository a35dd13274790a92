package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tai42/sandbox"
)

// ExecSpec is one exec for [Client.Start].
type ExecSpec struct {
	// Op names the operation in errors: "exec" or "exec_start".
	Op   string
	Argv []string
	// Dir is the working directory, absolute in the agent's filesystem.
	Dir string
	// DirOrig is the caller's cwd as given, for messages.
	DirOrig string
	// DirRoot, when set, is a directory Dir must stay inside (the
	// workspace), and DirRel is Dir relative to it: the agent checks the
	// cwd through os.Root there, so a symlink leading out of it is
	// refused.
	DirRoot, DirRel string
	// Env is the command's complete environment, "K=V". The values are
	// secrets: they are never logged nor put in an error.
	Env []string
	// User is the user the command runs as (sandbox.ValidUser's forms),
	// resolved by the agent in its own /etc/passwd and /etc/group; its
	// home becomes HOME when Env sets none. "" runs it as the agent's
	// own user.
	User string
	// Stdin is a non-interactive exec's whole input; nil (or empty): the
	// command reads /dev/null. Ignored when Interactive.
	Stdin []byte
	// Interactive: stdin is a pipe fed by WriteStdin, and the output comes
	// on a connection of its own.
	Interactive bool
	// Grace is how long output may go on after the command exited while a
	// process it left running holds the pipes: once the command was
	// reaped, a read of its output that waits longer than Grace ends the
	// output, and Result.Held says so. 0 means 200ms.
	Grace time.Duration
}

// Output takes one unit of output: stream 0 is stdout, 1 is stderr. It
// must copy b to keep it. It is called from one goroutine at a time, in
// the order the agent read the output, and may block: the client then
// stops reading, the agent stops reading the pipe, and the command blocks
// (back-pressure). Returning false means "over the limit": the client
// kills the exec (stop flavour) and hands it no more output.
type Output func(stream int, b []byte) bool

// Result is how an exec ended.
type Result struct {
	// ExitCode is the exit status, or 128+signal for a command killed by
	// one; -1 when the status is not known.
	ExitCode int
	// StatusKnown is false when the exit status could not be read (or the
	// connection was lost first).
	StatusKnown bool
	// KilledBeforeExit: a kill request reached the agent before the
	// command was reaped (a timeout that fired just as the command exited
	// reads false).
	KilledBeforeExit bool
	// Held: the output was cut at the grace deadline because a process the
	// command left running still held the pipes.
	Held bool
	// Err is set when the connection to the agent was lost (the container
	// was destroyed, or Close was called) before the end: a
	// *sandbox.SandboxError; the other fields then hold what arrived. nil
	// otherwise.
	Err error
}

// Errors of WriteStdin. Both are *sandbox.SandboxError with op
// "write_stdin".
var (
	// ErrStdinClosed: stdin was closed by CloseStdin, or by an earlier
	// write that was cancelled after some bytes went in.
	ErrStdinClosed error = sandbox.Errorf("write_stdin", "stdin was closed")
	// ErrExited: the command exited, or closed its stdin.
	ErrExited error = sandbox.Errorf("write_stdin", "the exec has exited; its stdin is closed")
)

// Proc is a started exec on the client's side.
//
// Concurrency: every method is safe to call from any goroutine. WriteStdin
// and CloseStdin are serialised among themselves; Kill and Close never wait
// for them.
type Proc struct {
	op          string
	interactive bool
	out         Output
	ctl, outc   *frameConn // nil for a command that could not be started

	exited     chan struct{}
	exitedOnce sync.Once
	done       chan struct{}
	ctlEnd     chan struct{} // the control reader returned
	acks       chan ackFrame // at most one write is outstanding
	stopOut    atomic.Bool   // out returned false: it gets no more output

	mu       sync.Mutex
	pending  int // readers still running
	exit     *exitFrame
	outEnded bool
	lost     error
	closed   bool
	res      Result

	stdinMu     chan struct{} // a lock a waiting writer can give up on
	stdinClosed bool          // under stdinMu
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Start starts spec's command in the agent and returns once it runs (the
// output connection of an interactive exec is attached by then). Output
// goes to out. A command that cannot be started (not found: 127, not
// executable: 126) is not an error: Start returns a Proc that is already
// done with that exit code, its message delivered to out as stderr.
//
// Errors are *sandbox.SandboxError with op spec.Op: the cwd does not exist
// or is not a directory, the user cannot be resolved or taken (a name
// with no passwd entry is a *sandbox.UserNotFoundError), the agent could
// not start the command or cannot be reached, the versions differ. ctx bounds the start only; to stop the
// exec later use Kill. The caller must Close the Proc once done with it.
func (c *Client) Start(ctx context.Context, spec ExecSpec, out Output) (*Proc, error) {
	op := spec.Op
	if op == "" {
		op = "exec"
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return nil, sandbox.Errorf(op, "no command given")
	}
	req := request{
		V: minVersion, Op: "exec",
		Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, DirOrig: spec.DirOrig, Root: spec.DirRoot, Rel: spec.DirRel,
		GraceNS: int64(spec.Grace), Interactive: spec.Interactive, User: spec.User,
	}
	if spec.User != "" {
		req.V = userVersion
	}
	if !spec.Interactive && len(spec.Stdin) > 0 {
		req.StdinLen = int64(len(spec.Stdin))
	}
	req.Argv = append([]string(nil), spec.Argv...) // encodeBytes rewrites in place
	req.Env = append([]string(nil), spec.Env...)
	req.encodeBytes()

	fc, err := c.connect(ctx, op)
	if err != nil {
		return nil, err
	}
	disarm := guard(ctx, fc.c)
	var rep startReply
	ef, err := startExchange(fc, &req, spec.Stdin, &rep)
	var outc *frameConn
	if err == nil && ef == nil && !rep.Failed && spec.Interactive {
		outc, ef, err = c.attach(ctx, op, rep.ID)
	}
	if fired := !disarm(); fired || err != nil || ef != nil || rep.Failed {
		fc.Close() // before the start reply's end, this kills the exec
		if outc != nil {
			outc.Close()
		}
		switch {
		case fired || (err != nil && ctx.Err() != nil):
			return nil, sandbox.WrapError(op, "the start was cancelled", ctx.Err())
		case err != nil:
			return nil, connError(ctx, op, "starting the command failed", err)
		case ef != nil && ef.Kind == kindVersion && spec.User != "":
			return nil, sandbox.Errorf(op, "user %q: this session's agent cannot run an exec as a user (%s): the session was started by an older tai42; run the exec as the session's default user, or in a new session", spec.User, ef.Message)
		case ef != nil:
			return nil, ef.toError(op)
		}
		// A command that could not be started: a result.
		p := &Proc{op: op, out: out, exited: closedChan, done: closedChan,
			res: Result{ExitCode: rep.ExitCode, StatusKnown: true}}
		if out != nil && len(rep.Message) > 0 {
			out(1, rep.Message)
		}
		return p, nil
	}

	p := &Proc{
		op: op, interactive: spec.Interactive, out: out, ctl: fc, outc: outc,
		exited:  make(chan struct{}),
		done:    make(chan struct{}),
		ctlEnd:  make(chan struct{}),
		acks:    make(chan ackFrame, 1),
		stdinMu: make(chan struct{}, 1),
		pending: 1,
	}
	if outc != nil {
		p.pending = 2
		go p.outLoop()
	}
	go p.ctlLoop()
	return p, nil
}

// startExchange sends an exec request (and its stdin) and reads the reply.
func startExchange(fc *frameConn, req *request, stdin []byte, rep *startReply) (*errorFrame, error) {
	if err := fc.writeJSON(frameRequest, req); err != nil {
		return nil, err
	}
	for i := 0; int64(i) < req.StdinLen; i += maxData {
		if err := fc.write(frameData, stdin[i:min(i+maxData, len(stdin))]); err != nil {
			// The agent may have refused the request; its answer says why.
			if ef, rerr := fc.readJSON(frameReply, rep); rerr == nil {
				return ef, nil
			}
			return nil, err
		}
	}
	return fc.readJSON(frameReply, rep)
}

// attach opens an interactive exec's output connection.
func (c *Client) attach(ctx context.Context, op string, id uint64) (*frameConn, *errorFrame, error) {
	oc, err := c.connect(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	defer guard(ctx, oc.c)() // attach's own ctx watch: Start's covers only fc
	if err := oc.writeJSON(frameRequest, request{V: minVersion, Op: "attach", ID: id}); err != nil {
		oc.Close()
		return nil, nil, err
	}
	ef, err := oc.readJSON(frameReply, nil)
	if err != nil || ef != nil {
		oc.Close()
		return nil, ef, err
	}
	return oc, nil, nil
}

// ctlLoop reads the control connection until the exit frame.
func (p *Proc) ctlLoop() {
	var buf []byte
	if !p.interactive {
		bp := frameBufs.Get().(*[]byte)
		defer frameBufs.Put(bp)
		buf = *bp
	}
	err := func() error {
		for {
			typ, payload, err := p.ctl.read(buf)
			if err != nil {
				return err
			}
			switch typ {
			case frameExited:
				p.markExited()
			case frameAck:
				var a ackFrame
				if err := json.Unmarshal(payload, &a); err != nil {
					return protoErrorf("an ack frame does not decode: %v", err)
				}
				select {
				case p.acks <- a:
				default:
					return protoErrorf("an ack frame with no stdin write outstanding")
				}
			case frameStdout, frameStderr:
				if p.interactive {
					return protoErrorf("output on the control connection of an interactive exec")
				}
				p.deliver(typ, payload)
			case frameExit:
				var ex exitFrame
				if err := json.Unmarshal(payload, &ex); err != nil {
					return protoErrorf("the exit frame does not decode: %v", err)
				}
				p.mu.Lock()
				p.exit = &ex
				if !p.interactive {
					p.outEnded = true
				}
				p.mu.Unlock()
				return nil
			case frameError:
				var ef errorFrame
				if err := json.Unmarshal(payload, &ef); err != nil {
					return protoErrorf("an error frame does not decode: %v", err)
				}
				return ef.toError(p.op)
			default:
				return protoErrorf("an unexpected frame of type %q on an exec's control connection", typ)
			}
		}
	}()
	close(p.ctlEnd)
	p.finish(err)
}

// outLoop reads an interactive exec's output connection until its end.
func (p *Proc) outLoop() {
	bp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bp)
	err := func() error {
		for {
			typ, payload, err := p.outc.read(*bp)
			if err != nil {
				return err
			}
			switch typ {
			case frameStdout, frameStderr:
				p.deliver(typ, payload)
			case frameEnd:
				p.mu.Lock()
				p.outEnded = true
				p.mu.Unlock()
				p.outc.Close()
				return nil
			default:
				return protoErrorf("an unexpected frame of type %q on an exec's output connection", typ)
			}
		}
	}()
	p.finish(err)
}

func (p *Proc) deliver(typ byte, b []byte) {
	if p.stopOut.Load() || p.out == nil {
		return
	}
	stream := 0
	if typ == frameStderr {
		stream = 1
	}
	if !p.out(stream, b) {
		p.stopOut.Store(true)
		_ = p.Kill(false)
	}
}

// finish records a reader's end; the last one decides the result.
func (p *Proc) finish(err error) {
	p.mu.Lock()
	if err != nil && p.lost == nil {
		p.lost = err
	}
	p.pending--
	last := p.pending == 0
	if last {
		r := Result{ExitCode: -1}
		if ex := p.exit; ex != nil {
			r = Result{ExitCode: ex.Code, StatusKnown: ex.Known, KilledBeforeExit: ex.Killed, Held: ex.Held}
		}
		if p.lost != nil || p.exit == nil || !p.outEnded {
			switch {
			case p.closed:
				r.Err = sandbox.Errorf(p.op, "the exec's connection to the agent was closed (Close) before the exec ended")
			case p.lost != nil:
				if _, ok := p.lost.(*sandbox.SandboxError); ok {
					r.Err = p.lost
				} else {
					r.Err = sandbox.WrapError(p.op, "lost the connection to the agent before the exec ended (was the sandbox destroyed?)", p.lost)
				}
			default:
				r.Err = sandbox.Errorf(p.op, "the agent ended the exec's connections before its end")
			}
		}
		p.res = r
	}
	p.mu.Unlock()
	if last {
		p.markExited()
		close(p.done)
	}
}

func (p *Proc) markExited() { p.exitedOnce.Do(func() { close(p.exited) }) }

// Exited is closed once the command has been reaped (the agent's exited
// notice), whether or not its output has been read; also once Done is.
// An interactive exec's notice comes on its control connection, apart from
// the output; a non-interactive exec's comes in order with its output, so
// it waits behind output the client has not taken yet.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Done is closed once the exit frame arrived (or the connection was lost)
// and every unit of output was handed to out.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Result is how the exec ended; valid once Done is closed.
func (p *Proc) Result() Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res
}

func (p *Proc) lockStdin(ctx context.Context, op string) error {
	select {
	case p.stdinMu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return sandbox.WrapError(op, "gave up waiting for another write", ctx.Err())
	}
}

func (p *Proc) unlockStdin() { <-p.stdinMu }

// WriteStdin writes data whole to an interactive exec's stdin and returns
// once all of it is in the pipe (the agent acked it); a full pipe blocks
// it. It returns the bytes written. Calls are serialised: a call waits for
// the one before (and can give up on ctx while it waits).
//
// Errors: ErrStdinClosed (closed by CloseStdin, or by an earlier cancelled
// write); ErrExited (the command exited or closed its stdin); ctx's error
// wrapped in a *sandbox.SandboxError when ctx ended the write: n > 0 then
// means a prefix went in and stdin is now closed (no torn message is
// followed by another), n == 0 that stdin is still open; a
// *sandbox.SandboxError when the exec is not interactive or the connection
// is lost.
func (p *Proc) WriteStdin(ctx context.Context, data []byte) (n int, err error) {
	const op = "write_stdin"
	if !p.interactive {
		if p.ctl == nil {
			return 0, ErrExited
		}
		return 0, sandbox.Errorf(op, "the exec is not interactive: its stdin was given whole at the start")
	}
	if isClosed(p.exited) {
		return 0, ErrExited
	}
	if err := p.lockStdin(ctx, op); err != nil {
		return 0, err
	}
	defer p.unlockStdin()
	if p.stdinClosed {
		return 0, ErrStdinClosed
	}
	for n < len(data) {
		if ctx.Err() != nil {
			return n, p.cancelled(ctx, n, len(data))
		}
		chunk := data[n:min(n+maxData, len(data))]
		if err := p.ctl.write(frameData, chunk); err != nil {
			return n, p.connLost(op, err)
		}
		a, err := p.awaitAck(ctx)
		if err != nil {
			return n, err
		}
		n += a.N
		switch a.Err {
		case "":
		case ackCancelled:
			return n, p.cancelled(ctx, n, len(data))
		case ackExited:
			return n, ErrExited
		case ackClosed:
			p.stdinClosed = true
			return n, ErrStdinClosed
		default:
			return n, sandbox.WrapError(op, fmt.Sprintf("the write into the exec's stdin failed after %d of %d bytes", n, len(data)), fmt.Errorf("%s", a.Msg))
		}
	}
	return n, nil
}

// awaitAck waits for the outstanding write's ack; once ctx is done it
// sends a cancel and goes on waiting (the agent answers at once).
func (p *Proc) awaitAck(ctx context.Context) (ackFrame, error) {
	ctxDone := ctx.Done()
	for {
		select {
		case a := <-p.acks:
			return a, nil
		case <-ctxDone:
			ctxDone = nil
			if err := p.ctl.write(frameCancel, nil); err != nil {
				return ackFrame{}, p.connLost("write_stdin", err)
			}
		case <-p.ctlEnd:
			select {
			case a := <-p.acks:
				return a, nil
			default:
			}
			p.mu.Lock()
			ended := p.exit != nil
			p.mu.Unlock()
			if ended {
				return ackFrame{Err: ackExited}, nil
			}
			return ackFrame{}, p.connLost("write_stdin", nil)
		}
	}
}

// cancelled ends a write that ctx stopped after n of total bytes; with
// n > 0 stdin is closed.
func (p *Proc) cancelled(ctx context.Context, n, total int) error {
	const op = "write_stdin"
	if n == 0 {
		return sandbox.WrapError(op, "cancelled before any byte was written", ctx.Err())
	}
	p.stdinClosed = true
	_ = p.ctl.write(frameCloseStdin, nil) // the agent closed it already if the last frame was cut
	return sandbox.WrapError(op, fmt.Sprintf("cancelled after %d of %d bytes; stdin is now closed", n, total), ctx.Err())
}

func (p *Proc) connLost(op string, err error) error {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return sandbox.Errorf(op, "the exec's connection to the agent was closed (Close)")
	}
	if err == nil {
		return sandbox.Errorf(op, "lost the connection to the agent")
	}
	return sandbox.WrapError(op, "lost the connection to the agent", err)
}

// CloseStdin closes an interactive exec's stdin: the command reads
// end-of-file once the data written before is read. It is idempotent, and
// does nothing for an exec that is not interactive. It waits for a
// WriteStdin in progress (giving up on ctx). Errors: *sandbox.SandboxError
// when ctx ends the wait or the connection is lost.
func (p *Proc) CloseStdin(ctx context.Context) error {
	const op = "close_stdin"
	if !p.interactive {
		return nil
	}
	if err := p.lockStdin(ctx, op); err != nil {
		return err
	}
	defer p.unlockStdin()
	if p.stdinClosed {
		return nil
	}
	p.stdinClosed = true
	if err := p.ctl.write(frameCloseStdin, nil); err != nil {
		if isClosed(p.done) {
			return nil // nothing left to close
		}
		return p.connLost(op, err)
	}
	return nil
}

// Kill sends SIGKILL to the exec's process group (after the command's
// exit: to what it left running in the group) and returns once the
// request is sent; it does not wait for Done. drain=false stops the
// output at once (a kill, a cancellation); drain=true goes on reading what
// the killed group wrote until end-of-file or the grace (a timeout, so the
// lengths count every byte). Errors: *sandbox.SandboxError when the
// request cannot be sent (the connection is lost or closed).
func (p *Proc) Kill(drain bool) error {
	if p.ctl == nil {
		return nil
	}
	var err error
	if drain {
		err = p.ctl.writeJSON(frameKill, killFrame{Drain: true})
	} else {
		err = p.ctl.write(frameKill, nil)
	}
	if err != nil {
		return p.connLost("kill", err)
	}
	return nil
}

// Close drops the exec's connections. Before the exec ended, the agent
// kills its process group (stop), and Done closes with Result.Err set once
// the readers return (an Output call in progress finishes first). After
// the end, processes the command left running keep running. Idempotent.
func (p *Proc) Close() {
	if p.ctl == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ctl.Close()
	if p.outc != nil {
		p.outc.Close()
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
