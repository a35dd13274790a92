package server

import (
	"errors"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// end decides and sends the stream's last frame, closes the connection and
// waits for the stream's goroutines. ran says the exec was started.
func (st *execStream) end(term terminal, ran bool) {
	st.markEnding()
	// Whatever blocks below on a client that does not read is cut by
	// dropping the connection: a client whose connection closed at once
	// (the reader sees it), one that broke the protocol or at shutdown by
	// their own timers (closeTimeout), and one merely paused, its output
	// unread in front of the last frame, once timing.paused has passed
	// since its exec began to be killed or ended (at least killTimeout +
	// 2*closeTimeout from now, for the kill and the close below). A peer
	// that vanished without a trace holds the stream no longer than that.
	st.addDropTimer(max(killTimeout+2*closeTimeout, st.pauseLeft()))
	st.mu.Lock()
	st.ended = true
	abort, msg, status := st.abort, st.abortMsg, st.closeStatus
	deadlineHit, shutdownHit := st.deadlineHit, st.shutdownHit
	if st.deadline != nil {
		st.deadline.Stop()
	}
	st.mu.Unlock()

	if ran {
		st.kills.Wait()
		st.killExec() // done with the handle: the provider frees it, and what the command left running ends
		// The stdin op in progress ends (the exec is dead, and stdinCtx is
		// cancelled); when it was applied, its ack goes before the last
		// frame. No op is applied after.
		st.stopStdin()
		st.stdinWG.Wait()
		st.s.met.execDuration.WithLabelValues(modeStream).Observe(time.Since(st.began).Seconds())
	}
	frame, code, reason, send := st.lastFrame(term, ran, abort, msg, status, deadlineHit, shutdownHit)
	if send {
		if err := st.sendJSON(frame, true); err == nil {
			if abort == abortViolation && status == websocket.StatusMessageTooBig {
				<-st.discarded // the reader reads the oversized frame to its end (bounded by a drop timer)
			}
			_ = st.conn.Close(code, reason)
		}
	}
	st.cancel()
	_ = st.conn.CloseNow()
	st.wg.Wait()
	st.mu.Lock()
	for _, t := range st.dropTimers {
		t.Stop()
	}
	st.mu.Unlock()
	st.dropIO()

	st.rs.wsIn, st.rs.wsOut = st.bytesIn.Load(), st.bytesOut.Load()
	st.rs.streamEnd = st.logEnd(frame, ran, abort, send)
}

// lastFrame is the stream's final frame and close status. send is false
// when the client is gone.
func (st *execStream) lastFrame(term terminal, ran bool, abort abortKind, msg string, violation websocket.StatusCode, deadlineHit, shutdownHit bool) (api.Frame, websocket.StatusCode, string, bool) {
	errFrame := func(err error, exit *sandbox.StreamExit) api.Frame {
		e := api.ErrorFrom(err)
		f := api.Frame{Type: api.FrameError, Error: &e}
		if exit != nil {
			code := exit.ExitCode
			f.ExitCode = &code
		}
		return f
	}
	switch abort {
	case abortGone:
		return api.Frame{}, 0, "", false
	case abortViolation:
		return errFrame(api.Transportf(api.KindBadRequest, "%s", msg), nil), violation, closeReason(msg), true
	case abortShutdown:
		return errFrame(errStreamShutdown, term.exit), websocket.StatusGoingAway, "the daemon is shutting down", true
	case abortInternal:
		return errFrame(api.Transportf(api.KindInternal, "internal error serving the exec (request %s); the daemon's log has the details", st.rs.id), term.exit),
			websocket.StatusInternalError, "internal error", true
	}
	status, reason := websocket.StatusNormalClosure, ""
	if shutdownHit {
		status, reason = websocket.StatusGoingAway, "the daemon is shutting down"
	}
	switch {
	case term.exit != nil && deadlineHit:
		// The server's deadline killed the exec: the timeout, with the
		// exit status a client whose own kill returned first reports.
		return errFrame(&sandbox.ExecTimeoutError{Timeout: st.requested, StdoutLen: st.outLen.Load(), StderrLen: st.errLen.Load()}, term.exit), status, reason, true
	case term.exit != nil && shutdownHit:
		return errFrame(errStreamShutdown, term.exit), status, reason, true
	case term.exit != nil:
		code := term.exit.ExitCode
		return api.Frame{Type: api.FrameExit, ExitCode: &code}, status, reason, true
	case term.err == nil: // a failure before the start (ran is false)
		return errFrame(api.Transportf(api.KindInternal, "the exec ended without a status"), nil), status, reason, true
	}
	err := term.err
	var to *sandbox.ExecTimeoutError
	if ran && errors.As(err, &to) {
		// The provider's safety net fired: report the timeout the client asked for.
		c := *to
		c.Timeout = st.requested
		err = &c
	}
	return errFrame(err, nil), status, reason, true
}

var errStreamShutdown = api.Transportf(api.KindShuttingDown, "the daemon is shutting down: the exec was killed")

// logEnd describes the stream's end for the request's log line.
func (st *execStream) logEnd(f api.Frame, ran bool, abort abortKind, sent bool) []any {
	out := []any{}
	switch {
	case abort == abortGone:
		out = append(out, "exec_end", "client_gone")
	case f.Type == api.FrameExit:
		out = append(out, "exec_end", "exit")
	case sent && f.Error != nil:
		out = append(out, "exec_end", "error", "exec_error_kind", string(f.Error.Kind))
	}
	if f.ExitCode != nil {
		out = append(out, "exit_code", *f.ExitCode)
	}
	if !ran {
		out = append(out, "exec_started", false)
	}
	return out
}

// closeReason clips a message to what a close frame carries (123 bytes),
// on a rune boundary.
func closeReason(msg string) string {
	const n = 123
	if len(msg) <= n {
		return msg
	}
	msg = msg[:n]
	for !utf8.ValidString(msg) {
		msg = msg[:len(msg)-1]
	}
	return msg
}
