package execout

import (
	"time"

	"github.com/tai42/sandbox"
)

// EndReason is what ended an exec before its command exited on its own;
// a provider's supervisor turns it into the stream's end ([EndReason.Err]).
type EndReason int

const (
	EndNone    EndReason = iota
	EndKill              // the handle's Kill, or the caller's ctx
	EndTimeout           // timeout_seconds expired
	EndDestroy           // the session was destroyed
	EndLimit             // output over the in-memory limit
)

// Then is the reason once next has happened too, exited telling whether
// the command had already exited by then. The first reason decides, except
// that a kill or a timeout after the command's exit keeps its own exit
// status (what it left running is ended, the output not yet taken in may
// end with it). A destroy or an output limit cuts the output short even
// after the exit, so they always say so rather than hand back a truncated
// result.
func (r EndReason) Then(next EndReason, exited bool) EndReason {
	if r != EndNone || exited && (next == EndKill || next == EndTimeout) {
		return r
	}
	return next
}

// Ended is what an exec's end error reports besides its reason.
type Ended struct {
	SessionID string
	Timeout   time.Duration // the exec's timeout
	Limit     int64         // the output limit per stream
	Lens      [2]int64      // stdout and stderr bytes received
	// Held: a process the command started still held the output after
	// the kill, so the reading stopped at a deadline.
	Held bool
}

// Err is the error the stream ends with because of r, or nil for a
// stream that ends as its command did (EndNone, EndKill).
func (r EndReason) Err(e Ended) error {
	switch r {
	case EndTimeout:
		te := &sandbox.ExecTimeoutError{Timeout: e.Timeout, StdoutLen: e.Lens[0], StderrLen: e.Lens[1]}
		if e.Held {
			te.Note = "a process the command started still held the output after the kill; the lengths count the output received up to the stop"
		}
		return te
	case EndDestroy:
		return &sandbox.SessionNotFoundError{SessionID: e.SessionID, Detail: "the session was destroyed while the exec was running"}
	case EndLimit:
		return &sandbox.OutputLimitError{Limit: e.Limit, StdoutLen: e.Lens[0], StderrLen: e.Lens[1]}
	}
	return nil
}
