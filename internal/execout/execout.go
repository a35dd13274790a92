// Package execout holds an exec's output on the provider's side, shared by
// the providers: [Buffer] collects a non-interactive exec's output in
// memory up to a limit, and [Stream] queues an interactive exec's output
// for its handle's Next with a byte bound (back-pressure). Both are a
// [Sink]: the provider's readers write into it and its supervisor finishes
// it once the exec's end is decided.
package execout

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"

	"github.com/tai42/sandbox"
)

// Sink receives an exec's output from the provider's readers.
type Sink interface {
	// Write takes in one unit of output of stream 0 (stdout) or 1
	// (stderr); it copies b. False means the output limit is exceeded.
	Write(stream int, b []byte) bool
	// Stop makes Write return at once from now on (it still keeps the unit
	// it was given): the exec was killed.
	Stop()
	// Finish records the stream's end: exactly one of item and err. exit is
	// the command's real exit status when it could be read (also when err
	// is set), else nil.
	Finish(item sandbox.StreamItem, err error, exit *sandbox.StreamExit)
}

// Names maps a stream index to its contract name.
var Names = [2]sandbox.StreamName{sandbox.Stdout, sandbox.Stderr}

// Buffer holds a non-interactive exec's output in memory, each stream up to
// Limit bytes.
type Buffer struct {
	Limit int64

	mu   sync.Mutex
	bufs [2]bytes.Buffer
	item sandbox.StreamItem
	err  error
}

var _ Sink = (*Buffer)(nil)

func (s *Buffer) Write(i int, b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int64(s.bufs[i].Len()+len(b)) > s.Limit {
		return false
	}
	s.bufs[i].Write(b)
	return true
}

func (s *Buffer) Stop() {}

func (s *Buffer) Finish(item sandbox.StreamItem, err error, _ *sandbox.StreamExit) {
	s.mu.Lock()
	s.item, s.err = item, err
	s.mu.Unlock()
}

// Result is the exec's result once finished: the exit status and the
// output, or the error that ended it.
func (s *Buffer) Result() (sandbox.ExecResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return sandbox.ExecResult{}, s.err
	}
	exit, ok := s.item.(*sandbox.StreamExit)
	if !ok {
		return sandbox.ExecResult{}, errors.New("execout: the exec has not finished")
	}
	return sandbox.ExecResult{
		ExitCode: exit.ExitCode,
		Stdout:   s.bufs[0].String(),
		Stderr:   s.bufs[1].String(),
	}, nil
}

// Stream is an interactive exec's output queue: writers append chunks in
// the order they take them in, up to a byte bound (then they wait, which
// stops them reading: back-pressure), and Next pops them.
type Stream struct {
	mu       sync.Mutex
	space    *sync.Cond // writers wait here for room
	items    []sandbox.StreamItem
	queued   int
	max      int
	stopped  bool
	finished bool
	term     sandbox.StreamItem
	termErr  error
	exit     *sandbox.StreamExit // the real exit status, when read
	termSent bool
	killed   bool          // Kill returned: no timeout is raised from here on
	notify   chan struct{} // wakes Next; capacity 1
}

var _ Sink = (*Stream)(nil)

// NewStream returns a stream that queues up to limit bytes.
func NewStream(limit int) *Stream {
	s := &Stream{max: limit, notify: make(chan struct{}, 1)}
	s.space = sync.NewCond(&s.mu)
	return s
}

func (s *Stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Stream) Write(i int, b []byte) bool {
	c := &sandbox.StreamChunk{Stream: Names[i], Data: append([]byte(nil), b...)}
	s.mu.Lock()
	for s.queued >= s.max && !s.stopped {
		s.space.Wait()
	}
	s.items = append(s.items, c)
	s.queued += len(c.Data)
	s.mu.Unlock()
	s.wake()
	return true
}

func (s *Stream) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.space.Broadcast()
	s.mu.Unlock()
}

func (s *Stream) Finish(item sandbox.StreamItem, err error, exit *sandbox.StreamExit) {
	s.mu.Lock()
	s.finished, s.term, s.termErr, s.exit = true, item, err, exit
	s.clearTimeout()
	s.mu.Unlock()
	s.wake()
}

// NoTimeout records that Kill returned: a timeout not yet delivered gives
// way to the exec's exit status, as the contract requires of a kill.
func (s *Stream) NoTimeout() {
	s.mu.Lock()
	s.killed = true
	s.clearTimeout()
	s.mu.Unlock()
}

func (s *Stream) clearTimeout() {
	if s.killed && s.finished && !s.termSent && s.exit != nil && errors.Is(s.termErr, sandbox.ErrExecTimeout) {
		s.term, s.termErr = s.exit, nil
	}
}

// Next is the handle's Next: the next chunk, then the exit (or the error
// that ended the exec), then io.EOF. A done ctx returns a
// *sandbox.SandboxError that wraps ctx.Err() and leaves the stream where it
// was.
func (s *Stream) Next(ctx context.Context) (sandbox.StreamItem, error) {
	for {
		s.mu.Lock()
		if len(s.items) > 0 {
			it := s.items[0]
			s.items[0] = nil
			s.items = s.items[1:]
			s.queued -= len(it.(*sandbox.StreamChunk).Data)
			s.space.Broadcast()
			s.mu.Unlock()
			return it, nil
		}
		if s.finished {
			defer s.mu.Unlock()
			switch {
			case s.termErr != nil:
				s.termSent = true
				return nil, s.termErr
			case !s.termSent:
				s.termSent = true
				return s.term, nil
			}
			return nil, io.EOF
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return nil, sandbox.WrapError("output", "gave up waiting for the exec's output; the stream is where it was", ctx.Err())
		}
	}
}

// Done returns a stream already finished with a command that could not be
// started: its message on stderr, then its exit code (126 or 127).
func Done(limit int, code int, message string) *Stream {
	st := NewStream(limit)
	exit := &sandbox.StreamExit{ExitCode: code}
	st.Write(1, []byte(message))
	st.Finish(exit, nil, exit)
	return st
}
