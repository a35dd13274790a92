package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// stream is an interactive exec's output queue: readers append chunks in
// the order they take them in, up to a byte bound (then they wait, which
// stops them reading: back-pressure), and Next pops them.
type stream struct {
	mu       sync.Mutex
	space    *sync.Cond // readers wait here for room
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

func newStream(max int) *stream {
	s := &stream{max: max, notify: make(chan struct{}, 1)}
	s.space = sync.NewCond(&s.mu)
	return s
}

func (s *stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *stream) write(i int, b []byte) bool {
	c := &sandbox.StreamChunk{Stream: streamNames[i], Data: append([]byte(nil), b...)}
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

func (s *stream) stop() {
	s.mu.Lock()
	s.stopped = true
	s.space.Broadcast()
	s.mu.Unlock()
}

func (s *stream) finish(item sandbox.StreamItem, err error, exit *sandbox.StreamExit) {
	s.mu.Lock()
	s.finished, s.term, s.termErr, s.exit = true, item, err, exit
	s.clearTimeout()
	s.mu.Unlock()
	s.wake()
}

// noTimeout records that Kill returned: a timeout not yet delivered gives
// way to the exec's exit status, as the contract requires of a kill.
func (s *stream) noTimeout() {
	s.mu.Lock()
	s.killed = true
	s.clearTimeout()
	s.mu.Unlock()
}

func (s *stream) clearTimeout() {
	if s.killed && s.finished && !s.termSent && s.exit != nil && errors.Is(s.termErr, sandbox.ErrExecTimeout) {
		s.term, s.termErr = s.exit, nil
	}
}

func (s *stream) next(ctx context.Context) (sandbox.StreamItem, error) {
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
			return nil, ctx.Err()
		}
	}
}

// handle is the host runner's sandbox.ExecHandle.
type handle struct {
	p  *proc // nil for a command that could not be started
	st *stream

	stdinMu     chan struct{} // a lock that a waiting writer can give up on
	stdinClosed bool
}

var (
	_ sandbox.ExecHandle  = (*handle)(nil)
	_ sandbox.ExitWatcher = (*handle)(nil)
)

// closedCh is the Exited of a command that could not be started.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Exited implements sandbox.ExitWatcher: closed once the command has
// exited (been reaped), its output read or not.
func (h *handle) Exited() <-chan struct{} {
	if h.p == nil {
		return closedCh
	}
	return h.p.exitedCh
}

func (r *resources) ExecStart(_ context.Context, req kit.ExecRequest) (sandbox.ExecHandle, error) {
	st := newStream(r.p.opts.StreamBuffer)
	s, err := r.start("exec_start", req, true, st)
	if err != nil {
		return nil, err
	}
	h := &handle{p: s.p, st: st, stdinMu: make(chan struct{}, 1)}
	if s.p == nil {
		exit := &sandbox.StreamExit{ExitCode: s.exitCode}
		st.write(1, []byte(s.message))
		st.finish(exit, nil, exit)
	}
	return h, nil
}

func (h *handle) Next(ctx context.Context) (sandbox.StreamItem, error) { return h.st.next(ctx) }

func (h *handle) lockStdin(ctx context.Context) error {
	select {
	case h.stdinMu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return sandbox.WrapError("write_stdin", "gave up waiting for another write", ctx.Err())
	}
}

func (h *handle) unlockStdin() { <-h.stdinMu }

func errExited(op string) error {
	return sandbox.Errorf(op, "the exec has exited; its stdin is closed")
}

// WriteStdin writes data whole to the exec's stdin pipe, blocking while the
// pipe is full. Calls are serialised. A write cancelled by ctx midway has
// delivered a prefix; stdin is then closed, so no torn message is followed
// by another.
func (h *handle) WriteStdin(ctx context.Context, data []byte) error {
	if h.p == nil || h.p.exited.Load() {
		return errExited("write_stdin")
	}
	if err := h.lockStdin(ctx); err != nil {
		return err
	}
	defer h.unlockStdin()
	if h.stdinClosed {
		return sandbox.Errorf("write_stdin", "stdin was closed")
	}
	stop := context.AfterFunc(ctx, func() { _ = h.p.stdin.SetWriteDeadline(time.Unix(1, 0)) })
	n, err := h.p.stdin.Write(data)
	if !stop() {
		_ = h.p.stdin.SetWriteDeadline(time.Time{})
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded):
		if n > 0 {
			h.stdinClosed = true
			h.p.stdin.Close()
			return sandbox.WrapError("write_stdin", fmt.Sprintf("cancelled after %d of %d bytes; stdin is now closed", n, len(data)), ctx.Err())
		}
		return sandbox.WrapError("write_stdin", "cancelled before any byte was written", ctx.Err())
	case h.p.exited.Load() || errors.Is(err, os.ErrClosed):
		return errExited("write_stdin")
	}
	return sandbox.WrapError("write_stdin", fmt.Sprintf("the exec's stdin refused the write after %d of %d bytes (it closed its stdin)", n, len(data)), err)
}

// CloseStdin signals end-of-input; it is idempotent.
func (h *handle) CloseStdin(ctx context.Context) error {
	if h.p == nil {
		return nil
	}
	if err := h.lockStdin(ctx); err != nil {
		return err
	}
	defer h.unlockStdin()
	if !h.stdinClosed {
		h.stdinClosed = true
		h.p.stdin.Close()
	}
	return nil
}

// Kill ends the exec's process group (after the command's exit: what it
// left running in it) and waits until the stream's end is decided, so that
// Next then ends promptly with the output taken in before the kill.
func (h *handle) Kill(ctx context.Context) error {
	if h.p == nil {
		return nil
	}
	h.p.end(endKill)
	select {
	case <-h.p.done:
		h.st.noTimeout()
		return nil
	default:
	}
	select {
	case <-h.p.done:
		h.st.noTimeout()
		return nil
	case <-ctx.Done():
		return sandbox.WrapError("kill", "the exec's process group was sent SIGKILL but has not been reaped yet", ctx.Err())
	}
}
