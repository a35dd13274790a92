package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// Timing and sizes of the interactive exec.
const (
	// killTimeout bounds one Kill; drainTimeout the output read after a
	// kill; closeTimeout the last frame and close handshake to a client
	// that does not read.
	killTimeout  = 10 * time.Second
	drainTimeout = 10 * time.Second
	closeTimeout = 5 * time.Second
	// safetyMargin: the provider's own timeout is requested*2 + this, a
	// safety net behind the server's deadline.
	safetyMargin = 30 * time.Second
	// stdinQueueBytes and stdinQueueFrames bound the stdin a client may send
	// ahead of its acks: at most this much stdin data, and this many stdin
	// and close_stdin frames, received and not yet acked. A frame past
	// either is a protocol violation, so the reader never waits for room:
	// a kill frame is read at once whatever stdin is queued.
	stdinQueueBytes  = 2 * api.MaxStdinFrame
	stdinQueueFrames = 1024
	// killQueueFrames bounds the kill frames a client may send ahead of
	// their acks. One kill at a time is in flight, the frames received
	// meanwhile wait for it (a kill is idempotent) and are acked once it
	// returned; a frame past the bound is a protocol violation, so that
	// neither goroutines nor waiting ids grow with a flood of kills.
	killQueueFrames = 1024
	// maxOutFrame is the most output data one binary frame carries.
	maxOutFrame = api.MaxStdinFrame
)

// streamTiming is the liveness timing of interactive execs; a Server holds
// its own copy (tests shorten it).
type streamTiming struct {
	// ping: the client is pinged this often; no pong within pong counts as
	// gone (see execStream.backPressured for the exception).
	ping, pong time.Duration
	// start: the start frame must arrive this soon after the upgrade.
	start time.Duration
	// paused bounds how long a client that does not read (the output sent
	// to it unread, in front of the ping and the last frame) keeps its
	// connection once its exec is being killed or has ended, when the
	// exec's deadline no longer bounds the wait. A client whose connection
	// closes is seen at once by the reader; this bound is for a peer that
	// keeps its connection open but reads nothing, or vanished without a
	// trace: it cannot pin the stream's goroutines for longer.
	paused time.Duration
}

var defaultTiming = streamTiming{ping: 15 * time.Second, pong: 15 * time.Second, start: 30 * time.Second, paused: 10 * time.Minute}

// execStream serves the interactive exec (GET /v1/sessions/{id}/exec/stream,
// protocol in package api's doc). The WebSocket is accepted only after the
// handshake, its subprotocol and the session were checked, so those failures
// are plain JSON errors; the handler then runs the stream to its end.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request) {
	if err := checkUpgrade(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := s.sb.GetSession(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{api.ExecSubprotocol},
		// Cross-site WebSocket hijacking needs credentials a browser adds
		// on its own; this API has none (the bearer token is a header a
		// browser's WebSocket cannot set), so an Origin check would add no
		// protection, only refuse some clients in plain text.
		InsecureSkipVerify: true,
	})
	rs := stateOf(r)
	if err != nil { // Accept has answered; the checks above make this rare
		rs.errKind = api.KindBadRequest
		return
	}
	rs.ws = true
	newExecStream(s, conn, sess, rs).run()
}

// checkUpgrade refuses, before any upgrade, a request that is not a
// WebSocket handshake for the exec subprotocol.
func checkUpgrade(r *http.Request) error {
	bad := func(format string, args ...any) error { return api.Transportf(api.KindBadRequest, format, args...) }
	switch {
	case !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", "websocket"):
		return bad("this route is the interactive exec over WebSocket: send a WebSocket handshake (Connection: Upgrade, Upgrade: websocket) with subprotocol %s", api.ExecSubprotocol)
	case !r.ProtoAtLeast(1, 1):
		return bad("a WebSocket handshake needs HTTP/1.1, not %s", clipText(r.Proto))
	case !headerHasToken(r.Header, "Sec-WebSocket-Protocol", api.ExecSubprotocol):
		return bad("the WebSocket subprotocol %s is required (Sec-WebSocket-Protocol)", api.ExecSubprotocol)
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return bad("WebSocket version 13 is required (Sec-WebSocket-Version)")
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return bad("exactly one Sec-WebSocket-Key header is required")
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
		return bad("Sec-WebSocket-Key must be 16 bytes in base64")
	}
	return nil
}

// headerHasToken reports whether a comma-separated header holds token
// (case-insensitively).
func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// abortKind says why a stream stopped before its exec's natural end.
type abortKind int

const (
	abortNone      abortKind = iota
	abortGone                // the client closed the connection or vanished
	abortViolation           // the client broke the protocol
	abortShutdown            // the daemon stopped before the exec started
	abortInternal            // a goroutine of the stream panicked
)

// terminal is how the exec's output stream ended: its exit, or an error.
type terminal struct {
	exit *sandbox.StreamExit
	err  error
}

// stdinOp is one stdin frame or close_stdin, queued for the stdin worker.
type stdinOp struct {
	id    uint64
	data  []byte
	close bool
}

// execStream is one interactive exec over one WebSocket.
//
// Goroutines: run (the handler's own: starts the exec, pumps its output,
// ends the stream), the reader (every client frame), the stdin worker
// (WriteStdin and CloseStdin in order), control (the start timeout, the
// exec's deadline, the shutdown), the pinger, and the killer (one at a
// time, while kill frames wait for their ack). run waits for all of them
// before it returns.
type execStream struct {
	s    *Server
	conn *websocket.Conn
	sess sandbox.Session
	rs   *reqState

	// ctx lives as long as the stream; cancelled when it aborts or ends,
	// it stops the goroutines and a Next, WriteStdin or CloseStdin in
	// progress.
	ctx    context.Context
	cancel context.CancelFunc
	// ioCtx bounds the connection's reads and writes: coder/websocket
	// closes a connection whose I/O context ends, so cancelling it drops
	// the connection.
	ioCtx  context.Context
	dropIO context.CancelFunc

	startCh     chan api.ExecRequest // the start frame, from the reader
	startedCh   chan struct{}        // closed by run once ExecStart returned; h is set before
	startedOnce sync.Once
	h           sandbox.ExecHandle
	requested   time.Duration
	began       time.Time
	queue       *stdinQueue
	outBuf      []byte // the pump's frame buffer

	wg    sync.WaitGroup // reader, control, pinger, stdin worker
	kills sync.WaitGroup // the killer, while it runs
	// stdinCtx (a child of ctx) bounds the stdin worker; end stops it and
	// waits for it (stdinWG) before the last frame, so that the ack of an
	// op applied before the end comes before it.
	stdinCtx  context.Context
	stopStdin context.CancelFunc
	stdinWG   sync.WaitGroup
	// discarded is closed once the reader has stopped reading: end waits for
	// it before the close handshake after an oversized frame, whose rest
	// the reader discards (bounded by the violation's drop timer).
	discarded chan struct{}
	t0        time.Time // the stream's creation, the origin of endingAt

	mu           sync.Mutex
	ended        bool // the stream's end is decided: no new kill goroutine, no abort
	abort        abortKind
	abortMsg     string
	deadline     *time.Timer // the requested timeout; nil before the start
	deadlineHit  bool        // the server killed the exec at its deadline
	clientKilled bool        // a kill frame came first: the deadline no longer applies
	shutdownHit  bool        // the server killed the exec at shutdown
	killIDs      []uint64    // kill frames received, not yet taken by the killer
	killUnacked  int         // kill frames received and not yet acked
	killing      bool        // the killer runs: a new kill frame waits for it
	killOK       bool        // a kill frame's Kill returned nil: the exec is killed
	dropTimers   []*time.Timer
	closeStatus  websocket.StatusCode // a violation's close status

	wmu       sync.Mutex // serialises frames so that the final one is last
	finalSent bool

	gotStart atomic.Bool
	// endingAt is 1 + the time from t0 at which the exec began to be killed
	// or ended (0 before): from then on, a paused client is waited for at
	// most timing.paused (see pauseLeft).
	endingAt    atomic.Int64
	writing     atomic.Bool  // a frame write is in progress
	bytesAtPong atomic.Int64 // bytesOut when the last pong's ping was sent
	// unackedBytes and unackedFrames count the stdin (data; stdin and
	// close_stdin frames) received and not yet acked. The reader adds, the
	// stdin worker subtracts before it sends the ack.
	unackedBytes  atomic.Int64
	unackedFrames atomic.Int64
	bytesIn       atomic.Int64
	bytesOut      atomic.Int64
	outLen        atomic.Int64
	errLen        atomic.Int64
}

func newExecStream(s *Server, conn *websocket.Conn, sess sandbox.Session, rs *reqState) *execStream {
	st := &execStream{
		s: s, conn: conn, sess: sess, rs: rs,
		startCh:   make(chan api.ExecRequest),
		startedCh: make(chan struct{}),
		queue:     &stdinQueue{ready: make(chan struct{}, 1)},
		discarded: make(chan struct{}),
		t0:        time.Now(),
	}
	st.ctx, st.cancel = context.WithCancel(context.Background())
	st.stdinCtx, st.stopStdin = context.WithCancel(st.ctx)
	st.ioCtx, st.dropIO = context.WithCancel(context.Background())
	return st
}

// run serves the stream to its end and returns once every goroutine of the
// stream has returned. A panic in a provider call it makes (ExecStart,
// Next) ends the stream with an internal error; it is logged with the
// route.
func (st *execStream) run() {
	defer func() {
		if p := recover(); p != nil {
			st.logPanic("run", p)
			st.abortWith(abortInternal, "")
			st.closeStarted()
			st.end(terminal{}, st.h != nil)
		}
	}()
	// The reader enforces api.MaxClientFrame itself (it never holds more
	// than one byte over it), so that an oversized frame gets an error frame
	// before the close: coder/websocket's own limit sends its close at once,
	// after which no frame can be written, and would fire again while the
	// reader discards the rest of the frame.
	st.conn.SetReadLimit(-1)
	st.goSafe("reader", st.readLoop)
	st.goSafe("control", st.control)
	st.goSafe("pinger", st.pinger)

	var req api.ExecRequest
	select {
	case req = <-st.startCh:
	case <-st.ctx.Done():
		st.closeStarted()
		st.end(terminal{}, false)
		return
	}
	st.requested = api.Seconds(req.TimeoutSeconds)
	h, err := st.sess.ExecStart(st.ctx, req.Argv, sandbox.StartOptions{
		Cwd:     req.Cwd,
		Env:     sandbox.SecretEnv(req.Env),
		Timeout: safetyTimeout(st.requested),
		User:    req.User,
	})
	if err != nil {
		st.closeStarted()
		st.end(terminal{err: err}, false)
		return
	}
	st.h = h
	st.began = time.Now()
	st.s.met.execsStarted.WithLabelValues(modeStream).Inc()
	st.mu.Lock()
	st.deadline = time.NewTimer(st.requested)
	st.mu.Unlock()
	_ = st.sendJSON(api.Frame{Type: api.FrameStarted}, false) // a dead connection shows in the reader and the pump
	// The client reads "started" before anything else it may leave unread:
	// from here on, frames sent and unanswered pings mean a paused reader.
	st.bytesAtPong.Store(st.bytesOut.Load())
	st.closeStarted()
	st.stdinWG.Add(1)
	st.goSafe("stdin", func() {
		defer st.stdinWG.Done()
		st.stdinWorker()
	})

	term, aborted := st.pump()
	if aborted {
		st.killExec()
		if term = st.drain(); errors.Is(term.err, context.DeadlineExceeded) {
			st.s.log.Warn("interactive exec: the output did not end within the drain timeout after the kill",
				"request_id", st.rs.id, "session_id", st.rs.sessionID, "drain_timeout", drainTimeout.String())
		}
	}
	st.end(term, true)
}

// closeStarted tells the reader that ExecStart returned (once).
func (st *execStream) closeStarted() {
	st.startedOnce.Do(func() { close(st.startedCh) })
}

// safetyTimeout is the provider's timeout behind the server's own deadline.
func safetyTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return d // the sandbox refuses it with its own error
	}
	if d > (math.MaxInt64-safetyMargin)/2 {
		return math.MaxInt64
	}
	return 2*d + safetyMargin
}

// pump forwards the exec's output until its end. aborted means the stream
// was aborted (ctx) before the end: the caller kills and drains. Once it
// has the terminal item the end is decided: a deadline that fires now
// changes nothing.
func (st *execStream) pump() (_ terminal, aborted bool) {
	for {
		item, err := st.h.Next(st.ctx)
		if err != nil {
			if st.ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
				return terminal{}, true
			}
			st.markEnded()
			return terminal{err: err}, false
		}
		switch it := item.(type) {
		case *sandbox.StreamChunk:
			st.count(it)
			if err := st.sendChunk(it); err != nil {
				st.abortWith(abortGone, "")
				return terminal{}, true
			}
		case *sandbox.StreamExit:
			st.markEnded()
			return terminal{exit: it}, false
		default:
			st.markEnded()
			return terminal{err: fmt.Errorf("server: the provider's stream yielded %T, neither a chunk nor the exit", item)}, false
		}
	}
}

func (st *execStream) markEnded() {
	st.mu.Lock()
	st.ended = true
	st.mu.Unlock()
	st.markEnding()
}

// markEnding records that the exec is being killed or has ended (once):
// the exec's deadline no longer bounds how long a paused client is waited
// for, timing.paused from now does.
func (st *execStream) markEnding() {
	st.endingAt.CompareAndSwap(0, int64(time.Since(st.t0))+1)
}

// pauseLeft is how much longer a client that does not read is waited for:
// unbounded here before the exec is being killed or has ended (its deadline
// bounds it), then what remains of timing.paused.
func (st *execStream) pauseLeft() time.Duration {
	at := st.endingAt.Load()
	if at == 0 {
		return math.MaxInt64
	}
	return time.Duration(at-1) + st.s.timing.paused - time.Since(st.t0)
}

// drain reads the stream to its end after a kill, so that the provider
// frees everything; the output is counted, not sent.
func (st *execStream) drain() terminal {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	for {
		item, err := st.h.Next(ctx)
		if err != nil {
			return terminal{err: err}
		}
		switch it := item.(type) {
		case *sandbox.StreamChunk:
			st.count(it)
		case *sandbox.StreamExit:
			return terminal{exit: it}
		default:
			return terminal{err: fmt.Errorf("server: the provider's stream yielded %T, neither a chunk nor the exit", item)}
		}
	}
}

func (st *execStream) count(c *sandbox.StreamChunk) {
	if c.Stream == sandbox.Stderr {
		st.errLen.Add(int64(len(c.Data)))
		st.s.met.streamed(dirStderr, len(c.Data))
	} else {
		st.outLen.Add(int64(len(c.Data)))
		st.s.met.streamed(dirStdout, len(c.Data))
	}
}

// abortWith records the first abort and stops the stream's work; a client
// that is gone loses its connection at once, any other abort bounds the
// last frame by closeTimeout. It reports whether this call aborted.
func (st *execStream) abortWith(kind abortKind, msg string) bool {
	return st.abortStatus(kind, msg, websocket.StatusPolicyViolation)
}

// abortStatus is abortWith with the close status of a violation.
func (st *execStream) abortStatus(kind abortKind, msg string, status websocket.StatusCode) bool {
	st.mu.Lock()
	if st.ended || st.abort != abortNone {
		st.mu.Unlock()
		return false
	}
	st.abort, st.abortMsg, st.closeStatus = kind, msg, status
	st.mu.Unlock()
	st.markEnding()
	st.cancel()
	if kind == abortGone {
		st.dropIO()
	} else {
		st.addDropTimer(closeTimeout) // a pump blocked on a client that does not read
	}
	return true
}

func (st *execStream) addDropTimer(d time.Duration) {
	t := time.AfterFunc(d, st.dropIO)
	st.mu.Lock()
	st.dropTimers = append(st.dropTimers, t)
	st.mu.Unlock()
}

// gone ends the stream for a client whose connection failed (the reader's
// error). When the stream's end is already decided, or another abort came
// first, the connection is dropped all the same: a last frame blocked on a
// client whose connection is closed gives up at once. (After the last
// frame and the close frame only the close handshake, which does not use
// ioCtx, is left to cut.)
func (st *execStream) gone() {
	if !st.abortWith(abortGone, "") {
		st.dropIO()
	}
}

// violate ends the stream for a protocol violation: error frame
// bad_request, exec killed, close 1008. kill is true only where st.h may
// be read (the reader after the start).
func (st *execStream) violate(msg string, kill bool) {
	st.violateWith(websocket.StatusPolicyViolation, msg, kill)
}

// violateWith is violate with the close status; it reports whether this
// call aborted the stream.
func (st *execStream) violateWith(status websocket.StatusCode, msg string, kill bool) bool {
	if !st.abortStatus(abortViolation, msg, status) {
		return false
	}
	if kill {
		st.killExec()
	}
	return true
}

// killExec kills the exec, bounded by killTimeout; a failure, or a panic
// of the provider's Kill, is logged.
func (st *execStream) killExec() {
	defer func() {
		if p := recover(); p != nil {
			st.logPanic("kill", p)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	if err := st.h.Kill(ctx); err != nil {
		st.s.log.Warn("interactive exec: kill failed", "request_id", st.rs.id, "session_id", st.rs.sessionID, "err", err)
	}
}

// goSafe runs f in a goroutine of the stream; a panic aborts the stream
// (internal) instead of crashing the daemon, and is logged with the route.
func (st *execStream) goSafe(name string, f func()) {
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		defer st.recoverPanic(name)
		f()
	}()
}

func (st *execStream) recoverPanic(name string) {
	if p := recover(); p != nil {
		st.logPanic(name, p)
		st.abortWith(abortInternal, "")
	}
}

// logPanic logs a panic with the route and the stack, never its value
// (which may quote request data).
func (st *execStream) logPanic(where string, p any) {
	st.s.log.Error("panic serving an interactive exec", "request_id", st.rs.id, "route", st.rs.route,
		"goroutine", where, "panic_type", fmt.Sprintf("%T", p), "stack", string(debug.Stack()))
}
