package sandboxtest

import (
	"context"
	"errors"
	"io"
	"runtime/debug"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// hangGrace is how long a call may outlive its context before the suite
// fails it as hung.
const hangGrace = 5 * time.Second

// errHung and errPanicked stand in for the result of a call that hung or
// panicked; the clause has already failed with the reason.
var (
	errHung     = errors.New("sandboxtest: the call did not return after its context ended")
	errPanicked = errors.New("sandboxtest: the call panicked")
)

// guard runs provider calls so that a call ignoring its context, or
// panicking, fails the test (t.Errorf, safe from any goroutine) instead of
// hanging or crashing the test binary.
type guard struct{ t *testing.T }

func call[T any](g guard, ctx context.Context, what string, f func() (T, error)) (T, error) {
	type result struct {
		v     T
		err   error
		panic any
		stack []byte
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.panic, r.stack = p, debug.Stack()
			}
			ch <- r
		}()
		r.v, r.err = f()
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		timer := time.NewTimer(hangGrace)
		defer timer.Stop()
		select {
		case r = <-ch:
		case <-timer.C:
			g.t.Errorf("%s did not return within %v after its context ended; every call must be bounded by its context", what, hangGrace)
			var zero T
			return zero, errHung
		}
	}
	if r.panic != nil {
		g.t.Errorf("%s panicked: %v\n%s", what, r.panic, r.stack)
		var zero T
		return zero, errPanicked
	}
	return r.v, r.err
}

func do(g guard, ctx context.Context, what string, f func() error) error {
	_, err := call(g, ctx, what, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

type guardedSandbox struct {
	g  guard
	sb sandbox.Sandbox
}

func (w *guardedSandbox) session(s sandbox.Session) sandbox.Session {
	if s == nil {
		return nil
	}
	gs := &guardedSession{g: w.g, s: s}
	if fs, ok := s.(sandbox.FileStreamer); ok {
		return &guardedStreamer{guardedSession: gs, fs: fs}
	}
	return gs
}

func (w *guardedSandbox) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	s, err := call(w.g, ctx, "CreateSession", func() (sandbox.Session, error) { return w.sb.CreateSession(ctx, spec) })
	return w.session(s), err
}

func (w *guardedSandbox) GetSession(ctx context.Context, id string) (sandbox.Session, error) {
	s, err := call(w.g, ctx, "GetSession", func() (sandbox.Session, error) { return w.sb.GetSession(ctx, id) })
	return w.session(s), err
}

func (w *guardedSandbox) ListSessions(ctx context.Context) ([]sandbox.SessionInfo, error) {
	return call(w.g, ctx, "ListSessions", func() ([]sandbox.SessionInfo, error) { return w.sb.ListSessions(ctx) })
}

func (w *guardedSandbox) DestroySession(ctx context.Context, id string) error {
	return do(w.g, ctx, "DestroySession", func() error { return w.sb.DestroySession(ctx, id) })
}

func (w *guardedSandbox) Reap(ctx context.Context) ([]string, error) {
	return call(w.g, ctx, "Reap", func() ([]string, error) { return w.sb.Reap(ctx) })
}

func (w *guardedSandbox) ExecDefaultTimeout() time.Duration { return w.sb.ExecDefaultTimeout() }
func (w *guardedSandbox) ReapInterval() time.Duration       { return w.sb.ReapInterval() }

type guardedSession struct {
	g guard
	s sandbox.Session
}

func (w *guardedSession) ID() string            { return w.s.ID() }
func (w *guardedSession) WorkspacePath() string { return w.s.WorkspacePath() }

func (w *guardedSession) Info(ctx context.Context) (sandbox.SessionInfo, error) {
	return call(w.g, ctx, "Info", func() (sandbox.SessionInfo, error) { return w.s.Info(ctx) })
}

func (w *guardedSession) Exec(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	return call(w.g, ctx, "Exec", func() (sandbox.ExecResult, error) { return w.s.Exec(ctx, argv, opts) })
}

func (w *guardedSession) ExecStart(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
	h, err := call(w.g, ctx, "ExecStart", func() (sandbox.ExecHandle, error) { return w.s.ExecStart(ctx, argv, opts) })
	if h == nil {
		return nil, err
	}
	gh := &guardedHandle{g: w.g, h: h}
	if ew, ok := h.(sandbox.ExitWatcher); ok {
		return &guardedWatcher{guardedHandle: gh, ew: ew}, err
	}
	return gh, err
}

func (w *guardedSession) PutFile(ctx context.Context, path string, data []byte) error {
	return do(w.g, ctx, "PutFile", func() error { return w.s.PutFile(ctx, path, data) })
}

func (w *guardedSession) GetFile(ctx context.Context, path string) ([]byte, error) {
	return call(w.g, ctx, "GetFile", func() ([]byte, error) { return w.s.GetFile(ctx, path) })
}

func (w *guardedSession) Touch(ctx context.Context) error {
	return do(w.g, ctx, "Touch", func() error { return w.s.Touch(ctx) })
}

func (w *guardedSession) Destroy(ctx context.Context) error {
	return do(w.g, ctx, "Destroy", func() error { return w.s.Destroy(ctx) })
}

type guardedHandle struct {
	g guard
	h sandbox.ExecHandle
}

func (w *guardedHandle) WriteStdin(ctx context.Context, data []byte) error {
	return do(w.g, ctx, "WriteStdin", func() error { return w.h.WriteStdin(ctx, data) })
}

func (w *guardedHandle) CloseStdin(ctx context.Context) error {
	return do(w.g, ctx, "CloseStdin", func() error { return w.h.CloseStdin(ctx) })
}

func (w *guardedHandle) Next(ctx context.Context) (sandbox.StreamItem, error) {
	return call(w.g, ctx, "Next", func() (sandbox.StreamItem, error) { return w.h.Next(ctx) })
}

func (w *guardedHandle) Kill(ctx context.Context) error {
	return do(w.g, ctx, "Kill", func() error { return w.h.Kill(ctx) })
}

// guardedStreamer is a guardedSession whose session also implements
// sandbox.FileStreamer.
type guardedStreamer struct {
	*guardedSession
	fs sandbox.FileStreamer
}

func (w *guardedStreamer) PutFileFrom(ctx context.Context, path string, r io.Reader) error {
	return do(w.g, ctx, "PutFileFrom", func() error { return w.fs.PutFileFrom(ctx, path, r) })
}

func (w *guardedStreamer) OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	type opened struct {
		rc   io.ReadCloser
		size int64
	}
	o, err := call(w.g, ctx, "OpenFile", func() (opened, error) {
		rc, size, err := w.fs.OpenFile(ctx, path)
		return opened{rc, size}, err
	})
	return o.rc, o.size, err
}

// guardedWatcher is a guardedHandle whose handle also implements
// sandbox.ExitWatcher.
type guardedWatcher struct {
	*guardedHandle
	ew sandbox.ExitWatcher
}

func (w *guardedWatcher) Exited() <-chan struct{} { return w.ew.Exited() }
