package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// noToken fails if err shows the bearer token in any printed form.
func noToken(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, s := range []string{err.Error(), fmt.Sprintf("%v", err), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
		if strings.Contains(s, testToken) {
			t.Errorf("%s: the error shows the token: %s", what, s)
		}
	}
}

// inFamily fails unless err belongs to the sandbox family.
func inFamily(t *testing.T, what string, err error) {
	t.Helper()
	var se *sandbox.SandboxError
	if !errors.Is(err, sandbox.ErrSandbox) || !errors.As(err, &se) {
		t.Errorf("%s: %T %v is not of the sandbox family", what, err, err)
	}
	noToken(t, what, err)
}

// Every error kind the daemon answers comes back as the contract's own
// type, every field intact.
func TestErrorKinds(t *testing.T) {
	var answerP atomic.Pointer[api.Error]
	setAnswer := func(e api.Error) { answerP.Store(&e) }
	mux := sessionMux()
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/sessions/s1" && r.Method == http.MethodGet {
			writeJSON(w, http.StatusOK, fakeSession)
			return
		}
		writeError(w, *answerP.Load())
	})
	_, c := newFake(t, mux)
	ctx := t.Context()
	sess := getSession(t, c)

	t.Run("SpecRejected", func(t *testing.T) {
		setAnswer(api.ErrorFrom(&sandbox.SpecRejectedError{Field: "network", Reason: sandbox.ReasonPolicy, Message: "network egress is looser than the ceiling none"}))
		_, err := c.CreateSession(ctx, sandbox.SessionSpec{Image: "host"})
		var re *sandbox.SpecRejectedError
		if !errors.As(err, &re) || re.Field != "network" || re.Reason != sandbox.ReasonPolicy || re.Message != "network egress is looser than the ceiling none" {
			t.Fatalf("CreateSession: %T %+v; want the SpecRejectedError with its fields", err, err)
		}
		if !errors.Is(err, sandbox.ErrSpecRejected) {
			t.Errorf("%v does not match ErrSpecRejected", err)
		}
		inFamily(t, "SpecRejected", err)
	})
	t.Run("UserNotFound", func(t *testing.T) {
		setAnswer(api.ErrorFrom(&sandbox.UserNotFoundError{User: "alice"}))
		_, err := sess.Exec(ctx, []string{"id"}, sandbox.ExecOptions{Timeout: time.Second, User: "alice"})
		var nf *sandbox.UserNotFoundError
		if !errors.As(err, &nf) || nf.User != "alice" || !errors.Is(err, sandbox.ErrUserNotFound) {
			t.Fatalf("Exec: %T %+v; want the UserNotFoundError for alice", err, err)
		}
		inFamily(t, "UserNotFound", err)
	})
	t.Run("ExecTimeout", func(t *testing.T) {
		setAnswer(api.ErrorFrom(&sandbox.ExecTimeoutError{Timeout: 300 * time.Millisecond, StdoutLen: 12, StderrLen: 3, Note: "a child held the output"}))
		_, err := sess.Exec(ctx, []string{"sleep", "9"}, sandbox.ExecOptions{Timeout: 300 * time.Millisecond})
		var te *sandbox.ExecTimeoutError
		if !errors.As(err, &te) || te.Timeout != 300*time.Millisecond || te.StdoutLen != 12 || te.StderrLen != 3 || te.Note != "a child held the output" {
			t.Fatalf("Exec: %T %+v; want ExecTimeoutError{300ms, 12, 3, note}", err, err)
		}
		inFamily(t, "ExecTimeout", err)
	})
	t.Run("OutputLimit", func(t *testing.T) {
		setAnswer(api.ErrorFrom(&sandbox.OutputLimitError{Limit: 64 << 20, StdoutLen: 65 << 20, StderrLen: 0}))
		_, err := sess.Exec(ctx, []string{"yes"}, sandbox.ExecOptions{Timeout: time.Second})
		var le *sandbox.OutputLimitError
		if !errors.As(err, &le) || le.Limit != 64<<20 || le.StdoutLen != 65<<20 {
			t.Fatalf("Exec: %T %+v; want the OutputLimitError with its lengths", err, err)
		}
		inFamily(t, "OutputLimit", err)
	})
	t.Run("FileNotFound", func(t *testing.T) {
		setAnswer(api.ErrorFrom(&sandbox.FileNotFoundError{Path: "dir/missing.txt"}))
		_, err := sess.GetFile(ctx, "dir/missing.txt")
		var fe *sandbox.FileNotFoundError
		if !errors.As(err, &fe) || fe.Path != "dir/missing.txt" || !errors.Is(err, sandbox.ErrFileNotFound) {
			t.Fatalf("GetFile: %T %+v; want FileNotFoundError{dir/missing.txt}", err, err)
		}
		inFamily(t, "FileNotFound", err)
		rc, _, err := sess.(sandbox.FileStreamer).OpenFile(ctx, "dir/missing.txt")
		if !errors.As(err, &fe) || rc != nil {
			t.Errorf("OpenFile: %v, %v; want the FileNotFoundError decided before it returns", rc, err)
		}
	})
	t.Run("SessionNotFound", func(t *testing.T) {
		setAnswer(api.ErrorFrom(&sandbox.SessionNotFoundError{SessionID: "gone-1", Detail: "it expired"}))
		_, err := c.GetSession(ctx, "gone-1")
		var ne *sandbox.SessionNotFoundError
		if !errors.As(err, &ne) || ne.SessionID != "gone-1" || ne.Detail != "it expired" || !errors.Is(err, sandbox.ErrSessionNotFound) {
			t.Fatalf("GetSession: %T %+v; want SessionNotFoundError{gone-1}", err, err)
		}
		inFamily(t, "SessionNotFound", err)
		err = sess.Touch(ctx)
		if !errors.As(err, &ne) {
			t.Errorf("Touch: %v; want the SessionNotFoundError", err)
		}
	})
	t.Run("Unavailable", func(t *testing.T) {
		setAnswer(api.ErrorFrom(&sandbox.UnavailableError{Name: "vm", Registered: []string{"host"}}))
		_, err := c.ListSessions(ctx)
		var ue *sandbox.UnavailableError
		if !errors.As(err, &ue) || ue.Name != "vm" || len(ue.Registered) != 1 || !errors.Is(err, sandbox.ErrUnavailable) {
			t.Fatalf("ListSessions: %T %+v; want UnavailableError{vm, [host]}", err, err)
		}
		inFamily(t, "Unavailable", err)
	})
	t.Run("Plain", func(t *testing.T) {
		orig := sandbox.Errorf("get_file", "%q is a directory", "sub")
		setAnswer(api.ErrorFrom(orig))
		_, err := sess.GetFile(ctx, "sub")
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != "get_file" || err.Error() != orig.Error() {
			t.Fatalf("GetFile: %T %q; want the plain SandboxError %q", err, err, orig)
		}
		for _, k := range []error{sandbox.ErrFileNotFound, sandbox.ErrSessionNotFound, sandbox.ErrExecTimeout} {
			if errors.Is(err, k) {
				t.Errorf("%v matches %v; want a plain SandboxError", err, k)
			}
		}
	})
	t.Run("Transport", func(t *testing.T) {
		setAnswer(api.ErrorFrom(api.Transportf(api.KindTooLarge, "the body is over 1048576 bytes")))
		err := sess.PutFile(ctx, "big", []byte("x"))
		var te *api.TransportError
		if !errors.As(err, &te) || te.Kind != api.KindTooLarge {
			t.Fatalf("PutFile: %T %v; want a SandboxError caused by a too_large TransportError", err, err)
		}
		inFamily(t, "Transport", err)
	})
	t.Run("DestroyIdempotent", func(t *testing.T) {
		// A gone session: the daemon answers 204; an error kind would be
		// returned as it is.
		setAnswer(api.ErrorFrom(&sandbox.SessionNotFoundError{SessionID: "s1"}))
		if err := c.DestroySession(ctx, ""); err != nil {
			t.Errorf("DestroySession(\"\"): %v; want nil", err)
		}
	})
}

// An answer that is not an API error body is a SandboxError naming the
// status.
func TestNonAPIErrorBody(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, "<html><body>502 Bad Gateway from a proxy</body></html>")
	})
	_, c := newFake(t, mux)
	_, err := c.ListSessions(t.Context())
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "502") {
		t.Fatalf("ListSessions behind a broken proxy: %T %v; want a SandboxError naming 502", err, err)
	}
	inFamily(t, "502", err)
	for _, k := range []error{sandbox.ErrFileNotFound, sandbox.ErrSessionNotFound, sandbox.ErrExecTimeout, sandbox.ErrSpecRejected} {
		if errors.Is(err, k) {
			t.Errorf("%v matches %v", err, k)
		}
	}
	// The same for the exec stream's refused upgrade.
	mux2 := sessionMux()
	mux2.HandleFunc("/v1/sessions/s1/exec/stream", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, "not json")
	})
	_, c2 := newFake(t, mux2)
	_, err = getSession(t, c2).ExecStart(t.Context(), []string{"true"}, sandbox.StartOptions{Timeout: time.Second})
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "502") {
		t.Fatalf("ExecStart behind a broken proxy: %T %v; want a SandboxError naming 502", err, err)
	}
	inFamily(t, "ExecStart 502", err)
}

// A refused upgrade with an API error body returns that error.
func TestExecStartRefused(t *testing.T) {
	mux := sessionMux()
	mux.HandleFunc("/v1/sessions/s1/exec/stream", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, api.ErrorFrom(&sandbox.SessionNotFoundError{SessionID: "s1", Detail: "it was destroyed"}))
	})
	_, c := newFake(t, mux)
	_, err := getSession(t, c).ExecStart(t.Context(), []string{"true"}, sandbox.StartOptions{Timeout: time.Second})
	var ne *sandbox.SessionNotFoundError
	if !errors.As(err, &ne) || ne.SessionID != "s1" {
		t.Fatalf("ExecStart of a destroyed session: %T %v; want SessionNotFoundError{s1}", err, err)
	}
}

// A daemon that cannot be reached is a SandboxError naming it, caused by
// the network error.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := New("http://"+addr, testToken)
	defer c.Close()
	ctx := t.Context()
	check := func(what string, err error) {
		t.Helper()
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || !strings.Contains(se.Message, "cannot reach the daemon at http://"+addr) {
			t.Errorf("%s: %T %v; want a SandboxError saying the daemon at http://%s cannot be reached", what, err, err, addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: %v; want the cause, connection refused, kept", what, err)
		}
		inFamily(t, what, err)
	}
	_, err = c.ListSessions(ctx)
	check("ListSessions", err)
	err = c.Health(ctx)
	check("Health", err)
	_, err = c.Policy(ctx)
	check("Policy", err)
	sess := c.session(fakeSession)
	_, err = sess.ExecStart(ctx, []string{"true"}, sandbox.StartOptions{Timeout: time.Second})
	check("ExecStart", err)
	err = sess.PutFileFrom(ctx, "f", strings.NewReader("data"))
	check("PutFileFrom", err)
	if d := c.ExecDefaultTimeout(); d != 0 {
		t.Errorf("ExecDefaultTimeout of an unreachable daemon = %v; want 0 while unknown", d)
	}
}

// A call whose context ends returns an error matching the context's, in
// the family.
func TestContextEnd(t *testing.T) {
	mux := sessionMux()
	mux.HandleFunc("/v1/sessions/s1/exec", func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a gone client once the body is read
		<-r.Context().Done()
	})
	mux.HandleFunc("/v1/sessions", func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	_, c := newFake(t, mux)
	sess := getSession(t, c)

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := sess.Exec(ctx, []string{"sleep", "9"}, sandbox.ExecOptions{Timeout: time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Exec cancelled: %v; want errors.Is context.Canceled", err)
	}
	inFamily(t, "Exec cancelled", err)

	dctx, dcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer dcancel()
	_, err = c.ListSessions(dctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ListSessions past its deadline: %v; want errors.Is context.DeadlineExceeded", err)
	}
	inFamily(t, "ListSessions deadline", err)

	done, cancel2 := context.WithCancel(t.Context())
	cancel2()
	_, err = sess.ExecStart(done, []string{"true"}, sandbox.StartOptions{Timeout: time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ExecStart with a done context: %v; want errors.Is context.Canceled", err)
	}
	inFamily(t, "ExecStart cancelled", err)
}

// The bearer token is sent, and a refused one is a SandboxError that never
// shows it.
func TestToken(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/policy", func(w http.ResponseWriter, r *http.Request) {
		if authorized(w, r) {
			writeJSON(w, http.StatusOK, sandbox.Policy{Egress: sandbox.NetworkNone, Isolation: sandbox.IsolationNone})
		}
	})
	mux.HandleFunc("GET /v1/sessions/s1/exec/stream", func(w http.ResponseWriter, r *http.Request) {
		authorized(w, r)
	})
	ts, c := newFake(t, mux)
	p, err := c.Policy(t.Context())
	if err != nil || p.Egress != sandbox.NetworkNone {
		t.Fatalf("Policy: %+v, %v", p, err)
	}
	bad := New(ts.URL, "not-"+testToken)
	defer bad.Close()
	_, err = bad.Policy(t.Context())
	var te *api.TransportError
	if !errors.As(err, &te) || te.Kind != api.KindUnauthorized {
		t.Fatalf("Policy with a wrong token: %v; want an unauthorized TransportError cause", err)
	}
	inFamily(t, "wrong token", err)
	if strings.Contains(err.Error(), "not-"+testToken) {
		t.Errorf("the error shows the token: %v", err)
	}
	_, err = bad.session(fakeSession).ExecStart(t.Context(), []string{"true"}, sandbox.StartOptions{Timeout: time.Second})
	if !errors.As(err, &te) || te.Kind != api.KindUnauthorized {
		t.Fatalf("ExecStart with a wrong token: %v; want an unauthorized TransportError cause", err)
	}
	if strings.Contains(fmt.Sprintf("%#v %v", err, err), testToken) {
		t.Errorf("the error shows the token: %v", err)
	}
	// A URL with a password never shows it either.
	nc := New("http://user:"+testToken+"@127.0.0.1:1", testToken)
	defer nc.Close()
	_, err = nc.ListSessions(t.Context())
	inFamily(t, "URL with a password", err)
}

// A URL New cannot use is reported by every call, without the URL's
// secrets.
func TestBadURL(t *testing.T) {
	for _, u := range []string{"ftp://host", "http://", "unix:", "http://us er:" + testToken + "@h ost/"} {
		c := New(u, testToken)
		_, err := c.ListSessions(t.Context())
		inFamily(t, "New("+u+")", err)
		if err == nil {
			t.Errorf("New(%q).ListSessions: no error", u)
		}
		c.Close()
	}
}

// ExecDefaultTimeout and ReapInterval ask once, cache a success and retry a
// failure.
func TestDefaults(t *testing.T) {
	var calls atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandbox", func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		if fail.Load() {
			writeError(w, api.ErrorFrom(api.Transportf(api.KindShuttingDown, "stopping")))
			return
		}
		writeJSON(w, http.StatusOK, api.SandboxInfo{Provider: "host", ExecDefaultTimeoutSeconds: 60, ReapIntervalSeconds: 0.1})
	})
	_, c := newFake(t, mux)
	if d := c.ReapInterval(); d != 0 || calls.Load() != 1 {
		t.Errorf("ReapInterval while the daemon fails = %v after %d calls; want 0 after 1", d, calls.Load())
	}
	fail.Store(false)
	if d := c.ReapInterval(); d != 100*time.Millisecond || calls.Load() != 2 {
		t.Errorf("ReapInterval = %v after %d calls; want 100ms after 2 (a failure is retried)", d, calls.Load())
	}
	if d := c.ExecDefaultTimeout(); d != time.Minute || calls.Load() != 2 {
		t.Errorf("ExecDefaultTimeout = %v after %d calls; want 1m from the cache", d, calls.Load())
	}
}
