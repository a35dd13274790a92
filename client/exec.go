package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// ExecStart starts argv as an interactive exec over a WebSocket
// (GET /v1/sessions/{id}/exec/stream): it dials, sends the start frame and
// waits for the daemon's "started", or returns the error the daemon
// answered instead (an unknown session, a bad argv, cwd or timeout). When
// ctx ends before the exec has started, the connection is dropped, which
// ends any exec the daemon started. ctx bounds the start only, never the
// handle's life.
func (s *session) ExecStart(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
	const op = "exec_start"
	c := s.c
	if c.urlErr != nil {
		return nil, c.urlErr
	}
	if err := ctx.Err(); err != nil {
		return nil, ctxErr(op, err)
	}
	start, err := json.Marshal(api.ExecRequest{Type: api.FrameStart, Argv: argv, Cwd: opts.Cwd, Env: reveal(opts.Env), TimeoutSeconds: api.SecondsOf(opts.Timeout), User: opts.User})
	if err != nil {
		return nil, sandbox.WrapError(op, "cannot encode the start frame", err)
	}
	hdr := http.Header{}
	c.authorize(hdr)
	conn, resp, err := websocket.Dial(ctx, c.endpoint(sessionPath(s.id, "exec/stream"), nil), &websocket.DialOptions{
		HTTPClient:   c.hc,
		HTTPHeader:   hdr,
		Subprotocols: []string{api.ExecSubprotocol},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			// An answer that refused the upgrade: its error body (Dial keeps
			// its first KiB, enough for an API error).
			return nil, c.responseErr(ctx, op, resp.Status, resp.Body)
		}
		if resp != nil {
			return nil, sandbox.WrapError(op, "the daemon at "+c.display+" answered the exec stream with a broken WebSocket handshake", noEOF(err))
		}
		return nil, c.transportErr(ctx, op, err)
	}
	if conn.Subprotocol() != api.ExecSubprotocol {
		_ = conn.CloseNow()
		return nil, sandbox.Errorf(op, "the daemon at %s did not agree to the exec stream's subprotocol %s", c.display, api.ExecSubprotocol)
	}
	conn.SetReadLimit(maxFrame)

	// Until "started", ctx bounds the reads and writes: its end closes the
	// connection, and the daemon then kills what it started.
	fail := func(err error) (sandbox.ExecHandle, error) {
		_ = conn.CloseNow()
		if cerr := ctx.Err(); cerr != nil {
			return nil, ctxErr(op, cerr)
		}
		return nil, err
	}
	if err := conn.Write(ctx, websocket.MessageText, start); err != nil {
		return fail(sandbox.WrapError(op, "the exec stream to the daemon at "+c.display+" broke before the exec started", noEOF(err)))
	}
	typ, b, err := conn.Read(ctx)
	if err != nil {
		return fail(sandbox.WrapError(op, "the exec stream from the daemon at "+c.display+" broke before the exec started", noEOF(err)))
	}
	var f api.Frame
	if typ != websocket.MessageText || json.Unmarshal(b, &f) != nil {
		return fail(sandbox.Errorf(op, "the daemon at %s answered the start frame with a malformed frame", c.display))
	}
	switch f.Type {
	case api.FrameStarted:
	case api.FrameError:
		conn.Close(websocket.StatusNormalClosure, "")
		if f.Error == nil {
			return nil, sandbox.Errorf(op, "the daemon at %s refused the exec without saying why", c.display)
		}
		return nil, f.Error.Err()
	default:
		return fail(sandbox.Errorf(op, "the daemon at %s answered the start frame with a %q frame; want \"started\" or \"error\"", c.display, clip(f.Type)))
	}

	h := &handle{
		c: c, sid: s.id, conn: conn,
		pending: make(map[uint64]pendingReq),
		space:   make(chan struct{}, 1),
		notify:  make(chan struct{}, 1),
		done:    make(chan struct{}),
		stdinMu: make(chan struct{}, 1),
		nextID:  1,
	}
	c.register(s.id, h)
	go h.read()
	return h, nil
}

// handle is the client side of one interactive exec: a WebSocket, the
// goroutine that reads it, and the output queue between that goroutine and
// Next.
//
// The reader goroutine (read) is the only reader of the connection. Output
// chunks and the stream's last frame (exit or error) go to the queue,
// bounded at StreamBuffer bytes: at the bound the reader stops reading until
// Next makes room, which back-pressures the daemon. Acks complete their
// pending request at once, by id. An ack comes behind the output the daemon
// sent before it, so a request waiting for one moves the bound (see full):
// while a stdin or close_stdin ack is awaited it is raised to ackBound, and
// once a kill is on its way, or the session is gone, it is lifted. A reader
// blocked at the bound for a while checks whether the session still exists
// (watchSession), so that a session destroyed elsewhere frees the handle
// too. When the last frame has arrived, or the connection is lost, the
// reader closes the connection and ends; the queue stays for Next. Writers
// (stdin, close_stdin, kill) send their frames from short-lived goroutines,
// which the connection's close ends.
type handle struct {
	c    *Client
	sid  string
	conn *websocket.Conn

	mu        sync.Mutex
	items     []*sandbox.StreamChunk
	queued    int                   // bytes in items
	pending   map[uint64]pendingReq // by frame id; nil once the reader has finished
	stdinAcks int                   // stdin and close_stdin requests in pending: the bound is raised
	nextID    uint64                // the next frame id; ids start at 1 (the daemon refuses 0)
	ended     bool                  // the reader has finished; term is set
	term      terminal              // how the stream ended
	termSent  bool                  // Next has returned the StreamExit
	sticky    error                 // the error Next returned for the end, returned again
	kills     int                   // kill requests on their way: the bound is lifted
	killOK    bool                  // a kill was acked: the bound stays lifted
	killed    bool                  // Kill has returned: no timeout is reported from now on
	gone      bool                  // the session was destroyed: the bound is lifted
	kill      *killCall             // the current kill request, if any

	space  chan struct{} // wakes the reader waiting for room; capacity 1
	notify chan struct{} // wakes Next; capacity 1
	done   chan struct{} // closed when the reader has finished

	stdinMu     chan struct{}   // a lock a waiting writer can give up on
	stdinClosed bool            // guarded by stdinMu
	unacked     chan *api.Error // guarded by stdinMu: the ack a cancelled call left
}

var _ sandbox.ExecHandle = (*handle)(nil)

// terminal is how a stream ended: an exit frame, an error frame, or the
// connection lost (or broken by a malformed frame) before either.
type terminal struct {
	exit    *int
	apiErr  *api.Error
	errExit *int // exit_code of an error frame
	lost    error
}

// pendingReq is a frame waiting for its ack.
type pendingReq struct {
	ack  chan *api.Error // buffered: the reader never blocks on it
	kill bool
}

// killCall is one kill request; every Kill waiting on it shares its
// outcome.
type killCall struct {
	done chan struct{}
	err  error // set before done is closed
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// read is the reader goroutine.
func (h *handle) read() {
	term := h.readFrames()
	if term.lost != nil {
		_ = h.conn.CloseNow()
	} else {
		// The daemon closes after its last frame: answer its close.
		h.conn.Close(websocket.StatusNormalClosure, "")
	}
	h.mu.Lock()
	h.ended, h.term = true, term
	h.pending, h.stdinAcks = nil, 0 // waiters see done
	h.mu.Unlock()
	close(h.done)
	wake(h.notify)
	h.c.unregister(h.sid, h)
}

// readFrames reads until the stream's last frame, or the connection's
// failure, and returns how the stream ended.
func (h *handle) readFrames() terminal {
	for {
		typ, b, err := h.conn.Read(context.Background())
		if err != nil {
			return terminal{lost: h.lostErr(err)}
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 || (b[0] != api.TagStdout && b[0] != api.TagStderr) {
				return terminal{lost: h.malformed("a binary frame that is neither stdout nor stderr")}
			}
			if len(b) > 1 {
				name := sandbox.Stdout
				if b[0] == api.TagStderr {
					name = sandbox.Stderr
				}
				h.push(&sandbox.StreamChunk{Stream: name, Data: b[1:]})
			}
			continue
		}
		var f api.Frame
		if err := json.Unmarshal(b, &f); err != nil {
			return terminal{lost: h.malformed("a text frame that is not JSON")}
		}
		switch f.Type {
		case api.FrameAck:
			h.ack(f.ID, f.Error)
		case api.FrameExit:
			if f.ExitCode == nil {
				return terminal{lost: h.malformed("an exit frame without exit_code")}
			}
			return terminal{exit: f.ExitCode}
		case api.FrameError:
			e := f.Error
			if e == nil {
				e = &api.Error{Kind: api.KindSandbox, Op: "exec_start", Message: "the daemon ended the stream with an error it did not describe"}
			}
			return terminal{apiErr: e, errExit: f.ExitCode}
		default:
			return terminal{lost: h.malformed(fmt.Sprintf("a %q frame", clip(f.Type)))}
		}
	}
}

func (h *handle) lostErr(err error) error {
	msg := "the exec stream from the daemon at " + h.c.display + " was lost before the exec's end; its outcome is unknown (a daemon that restarts ends the execs that were running)"
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		msg += fmt.Sprintf(" (the daemon closed it with status %d", int(ce.Code))
		if ce.Reason != "" {
			msg += ": " + clip(ce.Reason)
		}
		return sandbox.Errorf("exec_start", "%s)", msg)
	}
	return sandbox.WrapError("exec_start", msg, noEOF(err))
}

func (h *handle) malformed(what string) error {
	return sandbox.Errorf("exec_start", "the daemon at %s sent %s; the exec stream was dropped", h.c.display, what)
}

// full reports whether the output queue has reached its bound. h.mu is
// held.
//
// The bound is StreamBuffer, but the daemon sends each ack behind the
// output it sent before, so a request waiting for its ack moves it:
//
//   - Once a kill is on its way (or was acked), or the session is gone, it
//     is lifted: the exec is ending, so what is left to read is finite, and
//     the kill's ack, or the stream's end, always arrives.
//   - While a stdin or close_stdin ack is awaited it is raised to ackBound.
//     Either the exec takes its stdin in, and the ack comes soon, or it has
//     exited, and the ack comes behind a finite rest of output, which the
//     reader takes in: WriteStdin then fails promptly, as the contract
//     wants, with nobody calling Next. ackBound leaves room for the most
//     output the daemon can have ahead of an ack (see ackBound). A bound
//     lifted altogether would let an exec that does not read its stdin
//     (so that the ack never comes) while its output flows fill the
//     client's memory; ackBound keeps it bounded.
func (h *handle) full() bool {
	switch {
	case h.kills > 0 || h.killOK || h.gone:
		return false
	case h.stdinAcks > 0:
		return h.queued >= ackBound
	default:
		return h.queued >= StreamBuffer
	}
}

// push queues a chunk, first waiting while the queue is full.
func (h *handle) push(c *sandbox.StreamChunk) {
	h.mu.Lock()
	if h.full() {
		h.mu.Unlock()
		h.waitRoom()
		h.mu.Lock()
	}
	h.items = append(h.items, c)
	h.queued += len(c.Data)
	h.mu.Unlock()
	wake(h.notify)
}

// waitRoom waits until the queue is no longer full. Once it has waited
// c.goneAfter, it watches the session until then: a session destroyed
// elsewhere (another client, a TTL reap) lifts the bound, as one destroyed
// through this client does, so that the reader reads the stream's end and
// frees the handle while nobody reads. The watch ends with the wait.
func (h *handle) waitRoom() {
	t := time.NewTimer(h.c.goneAfter)
	defer t.Stop()
	var stopWatch func()
	defer func() {
		if stopWatch != nil {
			stopWatch()
		}
	}()
	for {
		h.mu.Lock()
		full := h.full()
		h.mu.Unlock()
		if !full {
			return
		}
		select {
		case <-h.space:
		case <-t.C:
			stopWatch = h.watchSession()
		}
	}
}

// watchSession asks the daemon every c.goneEvery whether the session still
// exists, each time bounded by c.goneTimeout, until the returned stop is
// called, which waits for the watcher goroutine to end. When the session is
// gone (*sandbox.SessionNotFoundError: destroyed, or expired) it destroys
// it, which tears down at once an expired session the daemon has not
// reaped yet (and is a no-op on one destroyed), so that its exec's output
// is finite, and lifts the bound.
func (h *handle) watchSession() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if h.sessionGone(ctx) {
				dctx, dcancel := context.WithTimeout(ctx, h.c.goneTimeout)
				_ = h.c.DestroySession(dctx, h.sid) // best effort: lifting the bound is what frees the handle
				dcancel()
				h.unbound()
				return
			}
			t.Reset(h.c.goneEvery)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// sessionGone reports whether the daemon says the handle's session does not
// exist; any other answer, or none, is not taken for gone.
func (h *handle) sessionGone(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, h.c.goneTimeout)
	defer cancel()
	_, err := h.c.GetSession(ctx, h.sid)
	var nf *sandbox.SessionNotFoundError
	return errors.As(err, &nf)
}

// unbound lifts the queue's bound for good: the session was destroyed.
func (h *handle) unbound() {
	h.mu.Lock()
	h.gone = true
	h.mu.Unlock()
	wake(h.space)
}

// ack completes the request id with the daemon's answer (nil: success).
func (h *handle) ack(id uint64, e *api.Error) {
	h.mu.Lock()
	r, ok := h.take(id)
	h.mu.Unlock()
	if ok {
		r.ack <- e // buffered: never blocks the reader
	}
}

// take removes the request id from pending, if it is there. h.mu is held.
func (h *handle) take(id uint64) (pendingReq, bool) {
	r, ok := h.pending[id]
	if ok {
		delete(h.pending, id)
		if !r.kill {
			h.stdinAcks--
		}
	}
	return r, ok
}

// register reserves a request id (ids start at 1) and the channel its ack
// arrives on, for a stdin or close_stdin frame (kill false) or a kill
// frame; ok is false once the stream has ended. While the ack is awaited
// the output queue's bound is moved (see full), and the reader is woken to
// read on.
func (h *handle) register(kill bool) (id uint64, ack chan *api.Error, ok bool) {
	h.mu.Lock()
	id, ack, ok = h.registerLocked(kill)
	h.mu.Unlock()
	if ok {
		wake(h.space)
	}
	return id, ack, ok
}

// registerLocked is register with h.mu held; the caller wakes the reader.
func (h *handle) registerLocked(kill bool) (id uint64, ack chan *api.Error, ok bool) {
	if h.ended {
		return 0, nil, false
	}
	id = h.nextID
	h.nextID++
	ack = make(chan *api.Error, 1)
	h.pending[id] = pendingReq{ack: ack, kill: kill}
	if !kill {
		h.stdinAcks++
	}
	return id, ack, true
}

// reserveID reserves a request id whose ack nobody waits for (the reader
// ignores an ack it has no request for).
func (h *handle) reserveID() (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return 0, false
	}
	id := h.nextID
	h.nextID++
	return id, true
}

// forget gives up on the ack of request id.
func (h *handle) forget(id uint64) {
	h.mu.Lock()
	h.take(id)
	h.mu.Unlock()
}

// send writes one frame from its own goroutine and reports the outcome on
// the returned channel. The write is not bound by any caller's context (a
// context's end would close the connection); it ends when the frame is
// written or the connection closes.
func (h *handle) send(typ websocket.MessageType, b []byte) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- h.conn.Write(context.Background(), typ, b) }()
	return ch
}

func controlFrame(typ string, id uint64) []byte {
	b, _ := json.Marshal(api.Frame{Type: typ, ID: id}) // cannot fail
	return b
}

// Next returns the next item of the stream: *sandbox.StreamChunk items in
// the order the exec wrote them, then exactly one *sandbox.StreamExit,
// then io.EOF. A stream that ends with an error (a timeout, a destroyed
// session, a failure the daemon reported, the connection lost before the
// end) returns that error, and returns it again on every later call.
//
// An *sandbox.ExecTimeoutError is returned only if Kill has not returned
// before Next reached the end: once Kill has returned, a timeout the daemon
// reported with the exec's exit status gives that *sandbox.StreamExit, and
// one without it a *sandbox.SandboxError saying the status could not be
// read.
//
// A done ctx returns a *sandbox.SandboxError that matches ctx.Err() with
// errors.Is, and leaves the stream where it was. Next is
// for one reader at a time; it is safe concurrently with every other method.
func (h *handle) Next(ctx context.Context) (sandbox.StreamItem, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, ctxErr("output", err)
		}
		h.mu.Lock()
		if len(h.items) > 0 {
			c := h.items[0]
			h.items[0] = nil
			h.items = h.items[1:]
			h.queued -= len(c.Data)
			h.mu.Unlock()
			wake(h.space)
			return c, nil
		}
		if h.ended {
			item, err := h.end()
			h.mu.Unlock()
			return item, err
		}
		h.mu.Unlock()
		select {
		case <-h.notify:
		case <-ctx.Done():
			return nil, ctxErr("output", ctx.Err())
		}
	}
}

// end returns the stream's end, once decided. h.mu is held.
func (h *handle) end() (sandbox.StreamItem, error) {
	switch {
	case h.sticky != nil:
		return nil, h.sticky
	case h.termSent:
		return nil, io.EOF
	case h.term.exit != nil:
		h.termSent = true
		return &sandbox.StreamExit{ExitCode: *h.term.exit}, nil
	case h.term.apiErr != nil:
		e := h.term.apiErr
		if e.Kind == api.KindExecTimeout && h.killed {
			// Kill returned before this timeout was delivered: the
			// stream reports the exec's exit status instead.
			if h.term.errExit != nil {
				h.termSent = true
				return &sandbox.StreamExit{ExitCode: *h.term.errExit}, nil
			}
			h.sticky = sandbox.Errorf("exec_start", "the exec was killed, but its exit status could not be read because the provider's timeout fired first")
			return nil, h.sticky
		}
		h.sticky = e.Err()
		return nil, h.sticky
	default:
		h.sticky = h.term.lost
		return nil, h.sticky
	}
}

func (h *handle) isEnded() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

func errEnded(op string) error {
	return sandbox.Errorf(op, "the exec has ended; its stdin is closed")
}

func (h *handle) lockStdin(ctx context.Context, op string) error {
	select {
	case h.stdinMu <- struct{}{}:
		return nil
	case <-h.done:
		return errEnded(op)
	case <-ctx.Done():
		return sandbox.WrapError(op, "gave up waiting for another stdin call to finish", ctx.Err())
	}
}

func (h *handle) unlockStdin() { <-h.stdinMu }

// WriteStdin delivers data to the exec's stdin, intact and in order: it is
// sent in frames of at most api.MaxStdinFrame bytes, all of one call
// contiguous (calls are serialised), each acknowledged by the daemon before
// the next is sent. A failure the daemon reports (the exec closed its
// stdin) is returned as the contract's error; once the exec has ended it is
// a *sandbox.SandboxError.
//
// When ctx ends first, WriteStdin returns a *sandbox.SandboxError that
// matches ctx.Err() with errors.Is; the frames already sent may still be
// delivered. If that leaves the call's data cut in two (frames sent, frames
// not), stdin is then closed, so that no later write follows a torn one.
//
// Safe concurrently with Next, Kill and other WriteStdin calls.
func (h *handle) WriteStdin(ctx context.Context, data []byte) error {
	const op = "write_stdin"
	if h.isEnded() {
		return errEnded(op)
	}
	if err := h.lockStdin(ctx, op); err != nil {
		return err
	}
	locked := true
	defer func() {
		if locked {
			h.unlockStdin()
		}
	}()
	if h.stdinClosed {
		return sandbox.Errorf(op, "stdin is closed")
	}
	if err := h.settle(ctx, op); err != nil {
		return err
	}
	// cancelled gives up on the call while a frame may be on its way: the
	// stdin lock is held until that frame is written (so that nothing
	// overtakes it), its ack is left for the next call to wait for, and
	// stdin is closed when the call's data is torn.
	cancelled := func(wrote <-chan error, ack chan *api.Error, sent, end int) error {
		torn := end < len(data)
		if torn {
			h.stdinClosed = true
		}
		h.unacked = ack
		locked = false
		go func() {
			if wrote != nil {
				<-wrote
			}
			if torn {
				// Nobody waits for this close's ack; stdinClosed already
				// refuses every later write.
				if id, ok := h.reserveID(); ok {
					<-h.send(websocket.MessageText, controlFrame(api.FrameCloseStdin, id))
				}
			}
			h.unlockStdin()
		}()
		msg := fmt.Sprintf("cancelled after sending %d of %d bytes, which may still be delivered", sent, len(data))
		if torn {
			msg += "; stdin is now closed, so that nothing follows the torn write"
		}
		return sandbox.WrapError(op, msg, ctx.Err())
	}
	for off := 0; off < len(data); {
		end := min(off+api.MaxStdinFrame, len(data))
		id, ack, ok := h.register(false)
		if !ok {
			return errEnded(op)
		}
		wrote := h.send(websocket.MessageBinary, api.StdinFrame(id, data[off:end]))
		select {
		case err := <-wrote:
			if err != nil {
				h.forget(id)
				// A failed write means the connection is going: its end
				// (the exec's, or the connection lost) follows.
				select {
				case <-h.done:
					return errEnded(op)
				case <-ctx.Done():
					return cancelled(nil, nil, off, off)
				}
			}
		case <-h.done:
			return errEnded(op)
		case <-ctx.Done():
			return cancelled(wrote, ack, end, end)
		}
		select {
		case e := <-ack:
			if e != nil {
				return e.Err()
			}
		case <-h.done:
			return errEnded(op)
		case <-ctx.Done():
			return cancelled(nil, ack, end, end)
		}
		off = end
	}
	return nil
}

// settle waits for the ack of a frame that a cancelled call left
// unacknowledged, so that at most one stdin frame is ever on its way: the
// daemon's stdin queue then never fills, and it reads a kill frame at once
// even while the exec does not read its stdin. The caller holds the stdin
// lock.
func (h *handle) settle(ctx context.Context, op string) error {
	if h.unacked == nil {
		return nil
	}
	select {
	case <-h.unacked: // its outcome was reported: the call was cancelled
	case <-h.done:
	case <-ctx.Done():
		return sandbox.WrapError(op, "cancelled while the daemon had not yet acknowledged an earlier cancelled write; nothing was sent", ctx.Err())
	}
	h.unacked = nil
	return nil
}

// CloseStdin signals end-of-input and waits for the daemon's ack. It is
// idempotent, and nil once the exec has ended. A failure the daemon reports
// is returned as the contract's error; a done ctx returns a
// *sandbox.SandboxError matching ctx.Err() (the close may still happen).
// Safe concurrently with every other method.
func (h *handle) CloseStdin(ctx context.Context) error {
	const op = "close_stdin"
	if h.isEnded() {
		return nil
	}
	if err := h.lockStdin(ctx, op); err != nil {
		if h.isEnded() {
			return nil
		}
		return err
	}
	if h.stdinClosed {
		h.unlockStdin()
		return nil
	}
	if err := h.settle(ctx, op); err != nil {
		h.unlockStdin()
		return err
	}
	id, ack, ok := h.register(false)
	if !ok {
		h.unlockStdin()
		return nil
	}
	h.stdinClosed = true
	wrote := h.send(websocket.MessageText, controlFrame(api.FrameCloseStdin, id))
	select {
	case <-wrote:
		h.unlockStdin()
	case <-ctx.Done():
		go func() { <-wrote; h.unlockStdin() }()
		return sandbox.WrapError(op, "cancelled before the daemon acknowledged the close", ctx.Err())
	}
	select {
	case e := <-ack:
		if e != nil {
			return e.Err()
		}
		return nil
	case <-h.done:
		return nil
	case <-ctx.Done():
		h.forget(id)
		return sandbox.WrapError(op, "cancelled before the daemon acknowledged the close", ctx.Err())
	}
}

// Kill terminates the exec: it sends a kill frame and waits for the
// daemon's ack (the exec is killed) or the stream's end. Concurrent and
// repeated calls share one request; a request the daemon failed is retried
// by the next call. Once the exec has ended Kill returns nil. A failure the
// daemon reports is returned as the contract's error; a done ctx returns a
// *sandbox.SandboxError matching ctx.Err() (the kill is on its way).
//
// Once Kill has returned, Next reports no timeout it had not already
// returned: the output received is still yielded in order, then the exec's
// StreamExit (see Next). The handle's connection and goroutine are freed
// as soon as the stream's last frame has arrived, whether or not Next
// reads it. Safe from any goroutine, at any time.
func (h *handle) Kill(ctx context.Context) error {
	h.mu.Lock()
	if h.ended || h.killOK {
		h.killed = true
		h.mu.Unlock()
		return nil
	}
	k := h.kill
	if k == nil || k.err != nil {
		k = &killCall{done: make(chan struct{})}
		h.kill = k
		h.kills++
		id, ack, _ := h.registerLocked(true) // the stream has not ended
		go h.runKill(k, id, ack)
	}
	h.mu.Unlock()
	wake(h.space) // the bound is lifted: the reader reads on to the ack

	var err error
	select {
	case <-k.done:
		err = k.err
	case <-h.done:
	case <-ctx.Done():
		err = sandbox.WrapError("kill", "cancelled before the daemon acknowledged the kill", ctx.Err())
	}
	h.mu.Lock()
	h.killed = true
	h.mu.Unlock()
	return err
}

// runKill sends one kill request and records its outcome.
func (h *handle) runKill(k *killCall, id uint64, ack chan *api.Error) {
	var err error
	select {
	case werr := <-h.send(websocket.MessageText, controlFrame(api.FrameKill, id)):
		if werr != nil {
			<-h.done // a failed write means the connection is going
			break
		}
		select {
		case e := <-ack:
			if e != nil {
				err = e.Err()
			}
		case <-h.done:
		}
	case <-h.done:
	}
	h.mu.Lock()
	if h.ended {
		err = nil // the stream ended: the exec is over
	}
	h.take(id)
	h.kills--
	if err == nil {
		h.killOK = true
	}
	k.err = err
	h.mu.Unlock()
	close(k.done)
	wake(h.space)
}

// clip shortens a value from the daemon for an error text.
func clip(s string) string {
	const n = 200
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
