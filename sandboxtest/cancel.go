package sandboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func (s *suite) cancelClauses() []clause {
	return []clause{
		{"Exec", s.testCancelExec},
		{"Next", s.testCancelNext},
		{"WriteStdin", s.testCancelWriteStdin},
		{"Expired", s.testCancelExpired},
	}
}

// cancelAfter is how long a call runs before its context expires.
const cancelAfter = 500 * time.Millisecond

// wantCancelled fails unless err is the error of a call whose context
// expired: of the contract's family (a *SandboxError, no timeout of the
// exec's own) and matching context.DeadlineExceeded, so that a caller can
// tell either from it.
func wantCancelled(t *testing.T, err error, what string) {
	t.Helper()
	if !wantKind(t, err, sandbox.ErrSandbox, what+" (a call whose context expires fails with a *sandbox.SandboxError)") {
		return
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s: %T %q does not match context.DeadlineExceeded; the error of a call whose context expired wraps ctx.Err()", what, err, err)
	}
	if errors.Is(err, sandbox.ErrExecTimeout) {
		t.Errorf("%s: %q is an ExecTimeoutError; the caller's context expired, not the exec's timeout", what, err)
	}
}

// An Exec whose context expires mid-run is killed and returns an error of
// the family that wraps ctx.Err(), promptly; the session stays usable.
func (s *suite) testCancelExec(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	cctx, cancel := context.WithTimeout(ctx, cancelAfter)
	defer cancel()
	begin := time.Now()
	_, err := sess.Exec(cctx, []string{"sleep", "30"}, sandbox.ExecOptions{Timeout: execTimeout})
	if took := time.Since(begin); took > cancelAfter+prompt {
		t.Errorf("Exec(sleep 30) whose context expired after %v returned after %v; want it killed and returned promptly", cancelAfter, took)
	}
	wantCancelled(t, err, "Exec(sleep 30) whose context expired mid-run")
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, "echo", "ok"); res.Stdout != "ok\n" {
		t.Errorf("Exec(echo ok) after a cancelled Exec = %+v; the session stays usable", res)
	}
}

// A Next whose context expires while it waits returns an error of the
// family that wraps ctx.Err(), and leaves the stream where it was: the
// stream goes on to its end.
func (s *suite) testCancelNext(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, shArgv("printf early; sleep 30")...)
	for len(r.stdout) < len("early") && r.next(ctx) {
	}
	cctx, cancel := context.WithTimeout(ctx, cancelAfter)
	defer cancel()
	item, err := r.h.Next(cctx)
	if err == nil {
		t.Fatalf("Next while the exec sleeps returned %#v; want the expired context's error", item)
	}
	wantCancelled(t, err, "Next whose context expired while the exec produced nothing")
	if err := r.h.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	r.drain(ctx, killPrompt)
	r.wantExit(killExit, "a cancelled Next leaves the stream where it was; the kill then ends it")
	if string(r.stdout) != "early" {
		t.Errorf("the stream yielded stdout %q; want \"early\" only", r.stdout)
	}
}

// A WriteStdin blocked on an exec that does not read its stdin returns,
// once its context expires, an error of the family that wraps ctx.Err().
func (s *suite) testCancelWriteStdin(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, "sleep", "30")
	cctx, cancel := context.WithTimeout(ctx, cancelAfter)
	defer cancel()
	err := r.h.WriteStdin(cctx, make([]byte, 64<<20))
	wantCancelled(t, err, "WriteStdin of 64 MiB into an exec that does not read its stdin, whose context expired")
	if err := r.h.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	r.drain(ctx, killPrompt)
	r.wantExit(killExit, "the exec was killed")
}

// A call made with a context that has already expired either does its work
// (a quick call may not look at its context) or fails with an error of the
// family (wrapping ctx.Err() when the context stopped it; the exec may also
// have exited first), never with the bare context error.
func (s *suite) testCancelExpired(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustPut(t, ctx, sess, "f", []byte("x"))
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	maybe := func(err error, what string) {
		t.Helper()
		if err != nil {
			wantKind(t, err, sandbox.ErrSandbox, what+" with an expired context (nil, or a *sandbox.SandboxError)")
		}
	}
	maybe(sess.PutFile(expired, "g", []byte("y")), "PutFile")
	_, err := sess.GetFile(expired, "f")
	maybe(err, "GetFile")
	_, err = sess.Exec(expired, []string{"true"}, sandbox.ExecOptions{Timeout: execTimeout})
	maybe(err, "Exec")
	h, err := sess.ExecStart(expired, []string{"true"}, sandbox.StartOptions{Timeout: execTimeout})
	maybe(err, "ExecStart")
	if h != nil {
		_, err := h.Next(expired)
		maybe(err, "Next")
		maybe(h.WriteStdin(expired, []byte("x")), "WriteStdin")
		_ = h.Kill(ctx)
	}
}
