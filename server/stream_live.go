package server

import (
	"context"
	"fmt"
	"time"

	"github.com/tai42/sandbox"
)

// control runs the start timeout, the exec's deadline and the shutdown.
func (st *execStream) control() {
	startTimer := time.NewTimer(st.s.timing.start)
	defer startTimer.Stop()
	started := st.startedCh
	hardStop := st.s.hardStop
	var deadline, shutdownDrop <-chan time.Time
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-startTimer.C:
			if !st.gotStart.Load() {
				st.violate(fmt.Sprintf("no start frame within %v of the upgrade", st.s.timing.start), false)
			}
		case <-started:
			started = nil
			startTimer.Stop()
			st.mu.Lock()
			if st.deadline != nil {
				deadline = st.deadline.C
			}
			st.mu.Unlock()
		case <-deadline:
			deadline = nil
			st.onDeadline()
		case <-hardStop:
			hardStop = nil
			if st.onShutdown(started == nil) {
				t := time.NewTimer(closeTimeout)
				defer t.Stop()
				shutdownDrop = t.C
			}
		case <-shutdownDrop:
			shutdownDrop = nil
			st.dropIO() // the client does not read the rest: drop it
		}
	}
}

// onDeadline kills the exec at the requested timeout unless a kill frame
// came first or the stream already ended, and unless the exec exited in
// time: the pump may not have read its exit yet, blocked sending output the
// client has not read, and that is no timeout (see exitedInTime).
func (st *execStream) onDeadline() {
	exited := st.exitedInTime()
	st.mu.Lock()
	if st.ended || st.clientKilled || st.abort != abortNone {
		st.mu.Unlock()
		return
	}
	if exited {
		st.mu.Unlock()
		// The stream ends with the exec's exit once the client has read
		// its output; from now on timing.paused bounds the wait for it.
		st.markEnding()
		return
	}
	st.deadlineHit = true
	st.mu.Unlock()
	st.markEnding()
	st.killExec()
}

// exitedInTime reports whether the exec's own command has exited, as told
// by a handle that implements sandbox.ExitWatcher. A provider whose handles
// do not cannot tell the server: at the deadline an exec whose exit the
// pump has not read yet is killed and reported as a timeout, even one that
// exited in time and whose output the client had not read yet.
func (st *execStream) exitedInTime() bool {
	w, ok := st.h.(sandbox.ExitWatcher)
	if !ok {
		return false
	}
	select {
	case <-w.Exited():
		return true
	default:
		return false
	}
}

// onShutdown kills the exec (or aborts a stream not started yet); it
// reports whether it killed an exec.
func (st *execStream) onShutdown(started bool) bool {
	if !started || st.h == nil {
		st.abortWith(abortShutdown, "")
		return false
	}
	st.mu.Lock()
	if st.ended || st.abort != abortNone {
		st.mu.Unlock()
		return false
	}
	if !st.deadlineHit {
		st.shutdownHit = true
	}
	st.mu.Unlock()
	st.markEnding()
	st.killExec()
	return true
}

// pinger pings the client every timing.ping.
func (st *execStream) pinger() {
	t := time.NewTicker(st.s.timing.ping)
	defer t.Stop()
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-t.C:
		}
		if st.backPressured() {
			continue
		}
		if !st.pingOnce() {
			return
		}
	}
}

// backPressured reports that the client is slow, not gone: we wait on its
// reading (a frame write in progress), or frames were sent since its last
// pong, which may sit unread in front of the ping (a client applying
// back-pressure reads nothing, so answers no ping, until its consumer
// catches up). A slow client is not judged by pongs: until its exec is
// being killed or has ended the exec's own deadline bounds the wait, from
// then on timing.paused does (a client paused across the deadline still
// gets its output and the last frame once it reads again). A client whose
// connection closes is seen by the reader at once.
func (st *execStream) backPressured() bool {
	unread := st.bytesOut.Load() != st.bytesAtPong.Load()
	return (st.writing.Load() || unread) && st.pauseLeft() > 0
}

// pingOnce sends one ping; no pong within timing.pong (unless the client
// is back-pressured) aborts the stream as gone. false ends the pinger.
func (st *execStream) pingOnce() bool {
	pctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	sent := st.bytesOut.Load()
	go func() { done <- st.conn.Ping(pctx) }()
	timer := time.NewTimer(st.s.timing.pong)
	defer timer.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				st.abortWith(abortGone, "")
				return false
			}
			// The pong came after every frame sent before the ping.
			st.bytesAtPong.Store(sent)
			return true
		case <-timer.C:
			if st.backPressured() {
				timer.Reset(st.s.timing.pong)
				continue
			}
			if st.abortWith(abortGone, "") {
				st.s.log.Info("interactive exec: no pong from the client; treating it as gone", "request_id", st.rs.id, "session_id", st.rs.sessionID)
			}
			cancel()
			<-done
			return false
		case <-st.ctx.Done():
			<-done // run closes the connection, which ends the ping
			return false
		}
	}
}
