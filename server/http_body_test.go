package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox/api"
)

// TestUnauthenticatedStalledBodyAnsweredAtOnce: a request refused for its
// token whose body never comes is answered at once with Connection: close,
// and the server closes the connection, instead of first reading (up to
// 256 KiB of) the body with no deadline.
func TestUnauthenticatedStalledBodyAnsweredAtOnce(t *testing.T) {
	e := newEnv(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(e.ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "PUT /v1/sessions/x/files?path=a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 512)
	n, err := c.Read(b)
	if err != nil {
		t.Fatalf("no answer within 3s to an unauthenticated request with a stalled body: %v", err)
	}
	if !bytes.HasPrefix(b[:n], []byte("HTTP/1.1 401 ")) || !bytes.Contains(b[:n], []byte("\r\nConnection: close\r\n")) {
		t.Errorf("answer %q", b[:n])
	}
}

// TestRefusedBeforeBodyClosesConnection: every request refused before its
// body is read (bad token, unknown route, wrong method, bad query, unknown
// or impossible session, declared length over the limit) is answered at
// once with Connection: close while its body has not come, and the server
// then closes the connection.
func TestRefusedBeforeBodyClosesConnection(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodyBytes = 4096 })
	id := e.create(hostSpec()).ID
	auth := "Authorization: Bearer " + testToken
	long := strings.Repeat("s", 300)
	for _, c := range []struct {
		name, line string
		auth       bool
		cl         int
		status     int
		kind       api.Kind
	}{
		{"no token", "PUT /v1/sessions/" + id + "/files?path=a HTTP/1.1", false, 1000, 401, api.KindUnauthorized},
		{"unknown route", "POST /v1/nope HTTP/1.1", true, 1000, 404, api.KindNotFound},
		{"wrong method", "POST /v1/policy HTTP/1.1", true, 1000, 405, api.KindMethodNotAllowed},
		{"no path", "PUT /v1/sessions/" + id + "/files HTTP/1.1", true, 1000, 400, api.KindBadRequest},
		{"unknown session", "PUT /v1/sessions/sb-nope/files?path=a HTTP/1.1", true, 1000, 404, api.KindSessionNotFound},
		{"overlong session id", "PUT /v1/sessions/" + long + "/files?path=a HTTP/1.1", true, 1000, 404, api.KindSessionNotFound},
		{"file over the limit", "PUT /v1/sessions/" + id + "/files?path=a HTTP/1.1", true, 4097, 413, api.KindTooLarge},
		{"JSON over the limit", "POST /v1/sessions/" + id + "/exec HTTP/1.1", true, 4097, 413, api.KindTooLarge},
		{"a route without a body", "GET /v1/policy HTTP/1.1", true, 1000, 200, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rc := e.rawDial(t)
			hdr := []string{fmt.Sprintf("Content-Length: %d", c.cl)}
			if c.auth {
				hdr = append(hdr, auth)
			}
			rc.send(c.line, hdr...)
			resp, err := rc.response("", 3*time.Second)
			if err != nil {
				t.Fatalf("no answer within 3s while the body has not come: %v", err)
			}
			if resp.StatusCode != c.status || !resp.Close {
				t.Errorf("status %d, close %v (Connection %q)", resp.StatusCode, resp.Close, resp.Header.Get("Connection"))
			}
			if c.kind != "" {
				if er := errorOf(t, resp); er.Kind != c.kind {
					t.Errorf("kind %q (%s)", er.Kind, er.Message)
				}
			}
			if !rc.closedWithin(3 * time.Second) {
				t.Errorf("the server kept the connection open")
			}
		})
	}
}

// TestConsumedBodyKeepsConnection: a request whose body was read to its
// end keeps its connection for the next request.
func TestConsumedBodyKeepsConnection(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	var conns []net.Conn
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conns = append(conns, i.Conn) }}
	do := func(method, path, body string, want int) *http.Response {
		t.Helper()
		r, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method, e.ts.URL+path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := e.hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || resp.Close {
			t.Fatalf("%s %s: %d, close %v", method, path, resp.StatusCode, resp.Close)
		}
		return resp
	}
	do("PUT", "/v1/sessions/"+id+"/files?path=f", "content", http.StatusNoContent)
	do("POST", "/v1/sessions/"+id+"/exec", `{"argv":["cat","f"],"timeout_seconds":10}`, http.StatusOK)
	do("GET", "/v1/sessions/"+id+"/files?path=f", "", http.StatusOK)
	do("POST", "/v1/sessions/"+id+"/exec", `{"argv":["true"],"timeout_seconds":-1}`, http.StatusBadRequest)
	for _, c := range conns[1:] {
		if c != conns[0] {
			t.Fatalf("a new connection after a request whose body was read")
		}
	}
}

// TestDeclaredLengthOverLimit: a body whose Content-Length is over the
// limit gets 413 before a byte of it is read, with Connection: close, and
// with "Expect: 100-continue" no 100 Continue comes first.
func TestDeclaredLengthOverLimit(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodyBytes = 1024 })
	id := e.create(hostSpec()).ID
	for _, expect := range []bool{false, true} {
		t.Run(fmt.Sprintf("expect %v", expect), func(t *testing.T) {
			rc := e.rawDial(t)
			hdr := []string{"Authorization: Bearer " + testToken, "Content-Length: 1025"}
			if expect {
				hdr = append(hdr, "Expect: 100-continue")
			}
			rc.send("PUT /v1/sessions/"+id+"/files?path=big HTTP/1.1", hdr...)
			resp, err := rc.response("PUT", 3*time.Second)
			if err != nil {
				t.Fatalf("no answer within 3s: %v", err)
			}
			if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
				t.Fatalf("status %d, close %v", resp.StatusCode, resp.Close)
			}
			if er := errorOf(t, resp); er.Kind != api.KindTooLarge || !strings.Contains(er.Message, "1024") {
				t.Errorf("error %+v", er)
			}
		})
	}
	// At the limit exactly, the body is taken (and the 100 Continue sent).
	resp := e.req("PUT", "/v1/sessions/"+id+"/files?path=big", bytes.NewReader(make([]byte, 1024)), testToken, "Expect", "100-continue")
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("a body at the limit: %d", resp.StatusCode)
	}
}

// TestBodyOverLimitWithoutLength: a chunked body (no Content-Length) is
// cut at the limit: 413, and the old content stays.
func TestBodyOverLimitWithoutLength(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodyBytes = 64 << 10 })
	id := e.create(hostSpec()).ID
	path := "/v1/sessions/" + id + "/files?path=f"
	e.call("PUT", path, "old", http.StatusNoContent, nil)
	body := struct{ io.Reader }{bytes.NewReader(make([]byte, 64<<10+1))} // hides the length: chunked
	resp := e.req("PUT", path, body, testToken)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if er := errorOf(t, resp); er.Kind != api.KindTooLarge || !strings.Contains(er.Message, "65536") {
		t.Errorf("error %+v", er)
	}
	if got := e.call("GET", path, nil, http.StatusOK, nil); string(got) != "old" {
		t.Errorf("the file holds %d bytes after a refused put", len(got))
	}
	// The JSON routes too.
	resp = e.req("POST", "/v1/sessions", struct{ io.Reader }{strings.NewReader(`{"image":"` + strings.Repeat("h", 64<<10) + `"}`)}, testToken)
	if er := errorOf(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge || er.Kind != api.KindTooLarge {
		t.Errorf("chunked JSON over the limit: %d %+v", resp.StatusCode, er)
	}
}

// TestJSONBodyLimit: JSON bodies have a limit of their own, 64 MiB, below
// the default MaxBodyBytes; its message points large stdin elsewhere; a
// file may be larger.
func TestJSONBodyLimit(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	for _, path := range []string{"/v1/sessions/" + id + "/exec", "/v1/sessions"} {
		rc := e.rawDial(t)
		rc.send("POST "+path+" HTTP/1.1", "Authorization: Bearer "+testToken, fmt.Sprintf("Content-Length: %d", maxJSONBytes+1))
		resp, err := rc.response("POST", 3*time.Second)
		if err != nil {
			t.Fatalf("%s: no answer within 3s: %v", path, err)
		}
		er := errorOf(t, resp)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || er.Kind != api.KindTooLarge {
			t.Fatalf("%s: %d %+v", path, resp.StatusCode, er)
		}
		for _, want := range []string{"67108864", "48 MiB", "interactive exec"} {
			if !strings.Contains(er.Message, want) {
				t.Errorf("%s: message %q does not mention %q", path, er.Message, want)
			}
		}
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), int(maxJSONBytes+1<<20)/16)
	e.call("PUT", "/v1/sessions/"+id+"/files?path=big", data, http.StatusNoContent, nil)
	res := e.exec(id, api.ExecRequest{Argv: []string{"wc", "-c", "big"}, TimeoutSeconds: 10})
	if !strings.HasPrefix(res.Stdout, fmt.Sprint(len(data), " ")) {
		t.Errorf("wc says %q", res.Stdout)
	}

	// A small MaxBodyBytes is the JSON limit too.
	small := newEnv(t, func(o *Options) { o.MaxBodyBytes = 1000 })
	er := small.callErr("POST", "/v1/sessions", `{"image":"`+strings.Repeat("h", 1000)+`"}`, http.StatusRequestEntityTooLarge, api.KindTooLarge)
	if !strings.Contains(er.Message, "1000 bytes") {
		t.Errorf("message %q", er.Message)
	}
}

// TestRefusedBodyAnswerArrives: a client that sends a body refused before it
// was read (over the limit by its Content-Length) gets the 413, not a
// connection reset: net/http still closes such a connection gracefully.
func TestRefusedBodyAnswerArrives(t *testing.T) {
	const limit = 256 << 10
	e := newEnv(t, func(o *Options) { o.MaxBodyBytes = limit })
	path := "/v1/sessions/" + e.create(hostSpec()).ID + "/files?path=x"
	over := make([]byte, limit+1)
	for range 20 {
		r, _ := http.NewRequest("PUT", e.ts.URL+path, bytes.NewReader(over))
		r.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := e.hc.Do(r)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
}
