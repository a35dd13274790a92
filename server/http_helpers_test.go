package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox/api"
)

// rawConn is a client connection that writes a request by hand (a body
// that never comes, a stalled upload) and reads what the server answers.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (e *env) rawDial(t *testing.T) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", e.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// send writes a request head: the request line and the headers (each
// "Name: value"), Host included, then the blank line. No body follows.
func (rc *rawConn) send(line string, headers ...string) {
	rc.t.Helper()
	var b strings.Builder
	b.WriteString(line + "\r\nHost: tai42\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(rc.c, b.String()); err != nil {
		rc.t.Fatal(err)
	}
}

// response reads one response within d.
func (rc *rawConn) response(method string, d time.Duration) (*http.Response, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	return http.ReadResponse(rc.br, &http.Request{Method: method})
}

// closedWithin reports whether the server closes the connection within d
// (whatever is left of the response is read and dropped).
func (rc *rawConn) closedWithin(d time.Duration) bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, rc.br)
	var ne net.Error
	return err == nil || !(errors.As(err, &ne) && ne.Timeout())
}

// errorOf decodes an error response's body.
func errorOf(t *testing.T, resp *http.Response) api.Error {
	t.Helper()
	defer resp.Body.Close()
	var eb api.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatalf("status %d: decoding the error body: %v", resp.StatusCode, err)
	}
	return eb.Error
}

// requestLines returns the "request" log lines of route.
func (e *env) requestLines(route string) []map[string]any {
	e.t.Helper()
	var lines []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(e.logs.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			e.t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "request" && m["route"] == route {
			lines = append(lines, m)
		}
	}
	return lines
}

// waitRequestLine waits for the first request line of route.
func (e *env) waitRequestLine(route string, within time.Duration) map[string]any {
	e.t.Helper()
	var line map[string]any
	waitFor(e.t, within, "the request line of "+route, func() bool {
		if ls := e.requestLines(route); len(ls) > 0 {
			line = ls[0]
			return true
		}
		return false
	})
	return line
}
