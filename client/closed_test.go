package client

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// hangUp answers a request by closing its connection: with nothing sent,
// or after part of a 200 answer (partial, sent as is).
func hangUp(t *testing.T, partial string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("fake: hijack: %v", err)
			return
		}
		if partial != "" {
			_, _ = brw.WriteString(partial)
			_ = brw.Flush()
		}
		conn.Close()
	}
}

// checkClosed fails unless err is the family's, says the connection
// closed, and never passes for the clean end of a stream (io.EOF).
func checkClosed(t *testing.T, what string, err error) {
	t.Helper()
	var se *sandbox.SandboxError
	if err == nil || !errors.As(err, &se) {
		t.Errorf("%s: %T %v; want a SandboxError", what, err, err)
		return
	}
	if errors.Is(err, io.EOF) || err == io.EOF {
		t.Errorf("%s: %v matches io.EOF, the clean end of a stream", what, err)
	}
	if !errors.Is(err, ErrConnectionClosed) || !strings.Contains(err.Error(), "closed the connection") {
		t.Errorf("%s: %q is not ErrConnectionClosed saying the daemon closed the connection", what, err)
	}
	inFamily(t, what, err)
}

// TestConnectionClosed: a daemon that closes the connection, before its
// answer or within it, is a SandboxError saying so, never io.EOF (which a
// caller reading a stream takes for its clean end).
func TestConnectionClosed(t *testing.T) {
	mux := sessionMux()
	mux.HandleFunc("GET /v1/sessions", hangUp(t, ""))
	mux.HandleFunc("POST /v1/sessions/s1/exec", hangUp(t, ""))
	mux.HandleFunc("GET /v1/sessions/s1/exec/stream", hangUp(t, ""))
	mux.HandleFunc("GET /v1/policy", hangUp(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"egress\":"))
	mux.HandleFunc("GET /v1/sessions/s1/files", hangUp(t, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"))
	_, c := newFake(t, mux)
	ctx := t.Context()
	sess := getSession(t, c)

	_, err := c.ListSessions(ctx)
	checkClosed(t, "ListSessions", err)
	_, err = sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: time.Second})
	checkClosed(t, "Exec", err)
	_, err = c.Policy(ctx)
	checkClosed(t, "Policy (answer cut short)", err)
	_, err = sess.ExecStart(ctx, []string{"true"}, sandbox.StartOptions{Timeout: time.Second})
	checkClosed(t, "ExecStart", err)
	_, err = sess.GetFile(ctx, "f")
	checkClosed(t, "GetFile (download cut short)", err)
}
