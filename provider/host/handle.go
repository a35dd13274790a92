package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/execout"
	"github.com/tai42/sandbox/kit"
)

// handle is the host runner's sandbox.ExecHandle.
type handle struct {
	p  *proc // nil for a command that could not be started
	st *execout.Stream

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

func (r *session) ExecStart(_ context.Context, req kit.ExecRequest) (sandbox.ExecHandle, error) {
	st := execout.NewStream(r.p.opts.StreamBuffer)
	s, err := r.start("exec_start", req, true, st)
	if err != nil {
		return nil, err
	}
	if s.p == nil {
		st = execout.Done(r.p.opts.StreamBuffer, s.exitCode, s.message)
	}
	return &handle{p: s.p, st: st, stdinMu: make(chan struct{}, 1)}, nil
}

func (h *handle) Next(ctx context.Context) (sandbox.StreamItem, error) { return h.st.Next(ctx) }

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
	h.p.end(execout.EndKill)
	select {
	case <-h.p.done:
		h.st.NoTimeout()
		return nil
	default:
	}
	select {
	case <-h.p.done:
		h.st.NoTimeout()
		return nil
	case <-ctx.Done():
		return sandbox.WrapError("kill", "the exec's process group was sent SIGKILL but has not been reaped yet", ctx.Err())
	}
}
