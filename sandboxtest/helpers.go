package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

const (
	// clauseTimeout bounds every clause: its calls share this deadline.
	clauseTimeout = 40 * time.Second
	// execTimeout is the Timeout of an ordinary exec.
	execTimeout = 20 * time.Second
	// prompt is how soon something the contract says ends "promptly" must
	// end (an exec of a destroyed session, a stream after Kill).
	prompt = 5 * time.Second
	// killPrompt is how soon a stream must end once Kill has returned.
	killPrompt = 2 * time.Second
)

// callContext bounds the calls of a helper that makes no create, as a
// clause's are bounded.
func callContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), clauseTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testContext returns the clause's context: canceled when the clause ends,
// with a deadline so that no call can outlive it by more than hangGrace.
// The deadline is clauseTimeout, plus Options.CreateTimeout for a provider
// whose creates may take that long: a clause's creates are within it.
func (s *suite) testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), clauseTimeout+s.opts.CreateTimeout)
	t.Cleanup(cancel)
	return ctx
}

// cleanupContext bounds a teardown call run from t.Cleanup, when the clause's
// own context is already canceled.
func cleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// newSandbox returns a fresh sandbox from the factory, every call of which is
// guarded against hanging and panicking.
func (s *suite) newSandbox(t *testing.T, cfg Config) sandbox.Sandbox {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = clauseLog(t).logger
	}
	sb := s.factory(t, cfg)
	if sb == nil {
		t.Fatal("the Factory returned a nil Sandbox")
	}
	return &guardedSandbox{g: guard{t}, sb: sb}
}

// logBuffer holds every line the sandboxes of one clause logged.
type logBuffer struct {
	logger *slog.Logger
	mu     sync.Mutex
	buf    bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything logged so far.
func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var clauseLogs sync.Map // *testing.T -> *logBuffer

// clauseLog is the log of t's clause, into which every sandbox the clause
// makes logs, at every level.
func clauseLog(t *testing.T) *logBuffer {
	if b, ok := clauseLogs.Load(t); ok {
		return b.(*logBuffer)
	}
	b := &logBuffer{}
	b.logger = slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if prev, loaded := clauseLogs.LoadOrStore(t, b); loaded {
		return prev.(*logBuffer)
	}
	t.Cleanup(func() { clauseLogs.Delete(t) })
	return b
}

// spec returns the suite's default spec (an ephemeral session of the
// provider's image, on its tightest honoured network), changed by mutate.
func (s *suite) spec(mutate func(*sandbox.SessionSpec)) sandbox.SessionSpec {
	sp := sandbox.SessionSpec{
		Image:      s.opts.Image,
		Durability: sandbox.Ephemeral,
		Network:    slices.MinFunc(s.opts.Networks, func(a, b sandbox.Network) int { return openness(a) - openness(b) }),
		TTLSeconds: 600,
		Labels:     map[string]string{"suite": "sandboxtest"},
	}
	if mutate != nil {
		mutate(&sp)
	}
	return sp
}

// newSession creates a session of the default spec changed by mutate, and
// destroys it at cleanup.
func (s *suite) newSession(t *testing.T, sb sandbox.Sandbox, mutate func(*sandbox.SessionSpec)) sandbox.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), clauseTimeout+s.opts.CreateTimeout)
	defer cancel()
	sess, err := sb.CreateSession(ctx, s.spec(mutate))
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	id := sess.ID()
	if id == "" {
		t.Fatal("CreateSession returned a session with an empty ID")
	}
	destroyAtCleanup(t, sb, id)
	return sess
}

// destroyAtCleanup destroys the session id when the clause ends.
func destroyAtCleanup(t *testing.T, sb sandbox.Sandbox, id string) {
	t.Cleanup(func() {
		ctx, cancel := cleanupContext()
		defer cancel()
		if err := sb.DestroySession(ctx, id); err != nil {
			t.Errorf("DestroySession(%q) at cleanup: %v; DestroySession is idempotent and tears a session down", id, err)
		}
	})
}

// fresh returns a fresh sandbox with the permissive policy and one session in
// it.
func (s *suite) fresh(t *testing.T, mutate func(*sandbox.SessionSpec)) (sandbox.Sandbox, sandbox.Session) {
	t.Helper()
	sb := s.newSandbox(t, Config{Policy: permissive})
	return sb, s.newSession(t, sb, mutate)
}

// hostFS reports whether sessions share the host's filesystem, so that the
// suite can check from the host what a session did.
func (s *suite) hostFS() bool { return s.opts.AbsoluteOutsideWorkspaceRefused }

func (s *suite) needHostFS(t *testing.T) {
	t.Helper()
	if !s.hostFS() {
		t.Skip("Options.AbsoluteOutsideWorkspaceRefused is false: sessions do not share the host's filesystem")
	}
}

// run runs argv to completion (Timeout execTimeout unless opts sets one) and
// fails the clause if Exec returns an error.
func run(t *testing.T, ctx context.Context, sess sandbox.Session, opts sandbox.ExecOptions, argv ...string) sandbox.ExecResult {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = execTimeout
	}
	res, err := sess.Exec(ctx, argv, opts)
	if err != nil {
		t.Fatalf("Exec(%q): %v", argv, err)
	}
	return res
}

// shArgv is the argv of `sh -c script sh args...`.
func shArgv(script string, args ...string) []string {
	return append([]string{"sh", "-c", script, "sh"}, args...)
}

// mustSh runs a shell script the suite needs to succeed and returns its
// stdout.
func mustSh(t *testing.T, ctx context.Context, sess sandbox.Session, script string, args ...string) string {
	t.Helper()
	res := run(t, ctx, sess, sandbox.ExecOptions{}, shArgv(script, args...)...)
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit code %d, stderr %q; the suite needs this command to succeed", script, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// exists reports whether p (a path in the session's filesystem) exists there,
// as a symlink or otherwise.
func exists(t *testing.T, ctx context.Context, sess sandbox.Session, p string) bool {
	t.Helper()
	return run(t, ctx, sess, sandbox.ExecOptions{}, shArgv(`[ -e "$1" ] || [ -L "$1" ]`, p)...).ExitCode == 0
}

func mustPut(t *testing.T, ctx context.Context, sess sandbox.Session, path string, data []byte) {
	t.Helper()
	if err := sess.PutFile(ctx, path, data); err != nil {
		t.Fatalf("PutFile(%q): %v", path, err)
	}
}

// kinds are the sentinels of the error family's own kinds.
var kinds = []error{
	sandbox.ErrExecTimeout, sandbox.ErrFileNotFound, sandbox.ErrSessionNotFound,
	sandbox.ErrSpecRejected, sandbox.ErrUnavailable, sandbox.ErrOutputLimit,
	sandbox.ErrWorkspaceNotFound, sandbox.ErrUserNotFound,
}

// wantKind fails unless err is of the sandbox family (errors.Is ErrSandbox,
// errors.As *SandboxError) and, when kind is not ErrSandbox, of that kind.
func wantKind(t *testing.T, err, kind error, what string) bool {
	t.Helper()
	if err == nil {
		t.Errorf("%s: got no error; want one matching %v", what, kind)
		return false
	}
	var se *sandbox.SandboxError
	switch {
	case !errors.Is(err, kind):
		t.Errorf("%s: got %T %q; want an error matching %v (errors.Is)", what, err, err, kind)
	case !errors.Is(err, sandbox.ErrSandbox):
		t.Errorf("%s: got %T %q, which does not match sandbox.ErrSandbox; every contract error belongs to the family", what, err, err)
	case !errors.As(err, &se):
		t.Errorf("%s: got %T %q, which does not convert to *sandbox.SandboxError with errors.As", what, err, err)
	default:
		return true
	}
	return false
}

// wantPlain fails unless err is a plain *SandboxError: of the family, of no
// more specific kind (in particular not a FileNotFoundError).
func wantPlain(t *testing.T, err error, what string) {
	t.Helper()
	if !wantKind(t, err, sandbox.ErrSandbox, what) {
		return
	}
	for _, k := range kinds {
		if errors.Is(err, k) {
			t.Errorf("%s: got %q, which matches %v; want a plain *sandbox.SandboxError carrying the real failure", what, err, k)
		}
	}
}

// wantPlainPath is wantPlain for a file operation on p: the message must
// also name p, so that a person can tell which path failed.
func wantPlainPath(t *testing.T, err error, p, what string) {
	t.Helper()
	wantPlain(t, err, what)
	wantNamesPath(t, err, p, what)
}

// wantNamesPath fails unless err's message names p, as given or quoted (a
// path holding a control character shows quoted). An empty path has
// nothing to name.
func wantNamesPath(t *testing.T, err error, p, what string) {
	t.Helper()
	if err == nil || p == "" {
		return
	}
	msg, q := err.Error(), strconv.Quote(p)
	if !strings.Contains(msg, p) && !strings.Contains(msg, q[1:len(q)-1]) {
		t.Errorf("%s: the message %q does not name the path %q; every file error names the path it was given", what, msg, p)
	}
}

// wantGone fails unless err is a *SessionNotFoundError for id.
func wantGone(t *testing.T, err error, id, what string) {
	t.Helper()
	if !wantKind(t, err, sandbox.ErrSessionNotFound, what) {
		return
	}
	var nf *sandbox.SessionNotFoundError
	if !errors.As(err, &nf) {
		t.Errorf("%s: %q does not convert to *sandbox.SessionNotFoundError", what, err)
	} else if nf.SessionID != id {
		t.Errorf("%s: SessionNotFoundError.SessionID = %q; want %q", what, nf.SessionID, id)
	}
}

// wantRejected fails unless err is a *SpecRejectedError for field with
// reason, whose message names the field.
func wantRejected(t *testing.T, err error, reason sandbox.RejectReason, field, what string) {
	t.Helper()
	if !wantKind(t, err, sandbox.ErrSpecRejected, what) {
		return
	}
	var re *sandbox.SpecRejectedError
	if !errors.As(err, &re) {
		t.Errorf("%s: %q does not convert to *sandbox.SpecRejectedError", what, err)
		return
	}
	if re.Reason != reason {
		t.Errorf("%s: Reason = %q; want %q (%s)", what, re.Reason, reason, err)
	}
	if field != "" && re.Field != field {
		t.Errorf("%s: Field = %q; want %q (%s)", what, re.Field, field, err)
	}
	if field != "" && !strings.Contains(err.Error(), field) {
		t.Errorf("%s: the message %q does not name the field %q", what, err, field)
	}
}

// noSecret fails if any printed form of v shows one of the secret values:
// env values never reach an error text, a log line or info.
func noSecret(t *testing.T, what string, v any, secrets ...string) {
	t.Helper()
	forms := []string{fmt.Sprint(v), fmt.Sprintf("%+v", v), fmt.Sprintf("%#v", v)}
	if err, ok := v.(error); ok && err != nil {
		forms = append(forms, err.Error())
		var se *sandbox.SandboxError
		if errors.As(err, &se) {
			forms = append(forms, se.Error())
		}
	}
	for _, f := range forms {
		for _, s := range secrets {
			if strings.Contains(f, s) {
				t.Errorf("%s shows an env value: %q; env values are secrets and never appear in errors, logs or info", what, f)
				return
			}
		}
	}
}

// secretValue returns a distinctive value to pass as a secret.
func secretValue(name string) string { return "tai42-secret-" + name + "-" + rand.Text()[:10] }

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// reader reads one exec handle's output stream and checks its shape: chunks
// on stdout or stderr, then exactly one StreamExit, then io.EOF; or an error
// that Next then keeps returning.
type reader struct {
	t              *testing.T
	h              sandbox.ExecHandle
	chunks         []sandbox.StreamChunk
	stdout, stderr []byte
	exit           *sandbox.StreamExit
	err            error // the error that ended the stream
	ended          bool
}

// start starts argv (Timeout execTimeout unless opts sets one) and kills the
// handle at cleanup, as a consumer done with a handle must.
func start(t *testing.T, ctx context.Context, sess sandbox.Session, opts sandbox.StartOptions, argv ...string) *reader {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = execTimeout
	}
	h, err := sess.ExecStart(ctx, argv, opts)
	if err != nil {
		t.Fatalf("ExecStart(%q): %v", argv, err)
	}
	t.Cleanup(func() {
		ctx, cancel := cleanupContext()
		defer cancel()
		_ = h.Kill(ctx)
	})
	return &reader{t: t, h: h}
}

// next reads one item. It reports false once the stream has ended, or if
// ctx ended first (then r.ended stays false).
func (r *reader) next(ctx context.Context) bool {
	t := r.t
	if r.ended {
		return false
	}
	item, err := r.h.Next(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		r.ended = true
		if errors.Is(err, io.EOF) {
			if r.exit == nil {
				t.Errorf("Next returned io.EOF before any StreamExit; the stream ends with exactly one StreamExit, then io.EOF")
			}
			return false
		}
		r.err = err
		if r.exit != nil {
			t.Errorf("Next returned %q after the StreamExit; want io.EOF", err)
		}
		return false
	}
	if r.exit != nil {
		t.Errorf("Next returned %#v after the StreamExit; the StreamExit is the last item, then io.EOF", item)
	}
	switch it := item.(type) {
	case *sandbox.StreamChunk:
		switch {
		case it == nil:
			t.Errorf("Next returned a nil *StreamChunk")
		case it.Stream == sandbox.Stdout:
			r.stdout = append(r.stdout, it.Data...)
		case it.Stream == sandbox.Stderr:
			r.stderr = append(r.stderr, it.Data...)
		default:
			t.Errorf("Next returned a chunk of stream %q; want stdout or stderr", it.Stream)
		}
		if it != nil {
			r.chunks = append(r.chunks, sandbox.StreamChunk{Stream: it.Stream, Data: bytes.Clone(it.Data)})
		}
	case *sandbox.StreamExit:
		if it == nil {
			t.Errorf("Next returned a nil *StreamExit")
		} else if r.exit == nil {
			r.exit = it
		}
	default:
		t.Errorf("Next returned %#v with a nil error; want a *StreamChunk or a *StreamExit", item)
	}
	return true
}

// drain reads the rest of the stream, which must end within d, then checks
// that Next keeps reporting the end (io.EOF, or the same error).
func (r *reader) drain(ctx context.Context, d time.Duration) {
	t := r.t
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for r.next(dctx) {
	}
	if !r.ended {
		t.Errorf("the output stream did not end within %v (stdout %d bytes, stderr %d bytes so far)", d, len(r.stdout), len(r.stderr))
		return
	}
	_, err := r.h.Next(dctx)
	switch {
	case r.err == nil && !errors.Is(err, io.EOF):
		t.Errorf("after io.EOF, Next returned %v; want io.EOF again", err)
	case r.err != nil && (err == nil || !sameKind(err, r.err)):
		t.Errorf("the stream ended with %q, then Next returned %v; once the stream has ended with an error, Next returns that error again", r.err, err)
	}
}

func sameKind(a, b error) bool {
	for _, k := range append(kinds, sandbox.ErrSandbox) {
		if errors.Is(a, k) != errors.Is(b, k) {
			return false
		}
	}
	return true
}

// wantExit fails unless the stream ended with a StreamExit of code.
func (r *reader) wantExit(code int, why string) {
	r.t.Helper()
	switch {
	case !r.ended: // drain has reported it
	case r.err != nil:
		r.t.Errorf("the stream ended with the error %q; want a StreamExit with exit code %d (%s)", r.err, code, why)
	case r.exit == nil:
		r.t.Errorf("the stream ended without a StreamExit; want one with exit code %d (%s)", code, why)
	case r.exit.ExitCode != code:
		r.t.Errorf("StreamExit.ExitCode = %d; want %d (%s)", r.exit.ExitCode, code, why)
	}
}

// merged joins consecutive chunks of the same stream: a provider may split
// or join a stream's output into chunks as it likes, but keeps the order.
func merged(chunks []sandbox.StreamChunk) []sandbox.StreamChunk {
	var out []sandbox.StreamChunk
	for _, c := range chunks {
		if n := len(out); n > 0 && out[n-1].Stream == c.Stream {
			out[n-1].Data = append(out[n-1].Data, c.Data...)
			continue
		}
		out = append(out, sandbox.StreamChunk{Stream: c.Stream, Data: bytes.Clone(c.Data)})
	}
	return out
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// eventually polls cond every 50ms until it holds or d has passed.
func eventually(ctx context.Context, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// waitExpired sleeps until every session has passed its expires_at.
func waitExpired(t *testing.T, ctx context.Context, sessions ...sandbox.Session) {
	t.Helper()
	var last time.Time
	for _, sess := range sessions {
		info, err := sess.Info(ctx)
		if errors.Is(err, sandbox.ErrSessionNotFound) {
			// Expired already, on a machine slow enough that the calls
			// before took its whole life: what this waits for.
			continue
		}
		if err != nil {
			t.Fatalf("Info of a live session: %v", err)
		}
		if info.ExpiresAt.After(last) {
			last = info.ExpiresAt
		}
	}
	sleepCtx(ctx, time.Until(last)+100*time.Millisecond)
}
