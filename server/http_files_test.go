package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// fakeFileSandbox serves a host sandbox whose sessions' OpenFile is open:
// it returns whatever reader and size the test gives.
type fakeFileSandbox struct {
	sandbox.Sandbox
	open func() (io.ReadCloser, int64)
}

func (f fakeFileSandbox) GetSession(ctx context.Context, id string) (sandbox.Session, error) {
	s, err := f.Sandbox.GetSession(ctx, id)
	if err != nil {
		return nil, err
	}
	return fakeFileSession{s, f.open}, nil
}

type fakeFileSession struct {
	sandbox.Session
	open func() (io.ReadCloser, int64)
}

func (fakeFileSession) PutFileFrom(context.Context, string, io.Reader) error { return nil }

func (s fakeFileSession) OpenFile(context.Context, string) (io.ReadCloser, int64, error) {
	rc, n := s.open()
	return rc, n, nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk I/O error") }

// newFakeFileEnv serves a host sandbox through fakeFileSandbox.
func newFakeFileEnv(t *testing.T, open func() (io.ReadCloser, int64), mod ...any) *env {
	t.Helper()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	return newEnvOn(t, sb, fakeFileSandbox{sb, open}, mod...)
}

// TestDownloadCutShortIsAborted: a download whose read fails midway never
// reaches the client as a complete body, whether its size is known
// (Content-Length) or not (chunked: the body is aborted, not ended); the
// request still gets its log line, which says the body was cut.
func TestDownloadCutShortIsAborted(t *testing.T) {
	for _, size := range []int64{-1, 200000} {
		t.Run(fmt.Sprint("size ", size), func(t *testing.T) {
			e := newFakeFileEnv(t, func() (io.ReadCloser, int64) {
				return io.NopCloser(io.MultiReader(io.LimitReader(zeroReader{}, 100000), failingReader{})), size
			})
			id := e.create(hostSpec()).ID
			resp := e.req("GET", "/v1/sessions/"+id+"/files?path=x", nil, testToken)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil {
				t.Fatalf("status %d, %d bytes, clean EOF: a download cut short by a read error looks complete to the client", resp.StatusCode, len(b))
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			line := e.waitRequestLine("getFile", 5*time.Second)
			if line["status"] != float64(200) || line["body_cut"] != "error" {
				t.Errorf("request line %v", line)
			}
			if !strings.Contains(e.logs.String(), "get_file: the body was cut short") {
				t.Errorf("no warning in the log:\n%s", e.logs.String())
			}
			e.healthy()
		})
	}
}

// TestUnsizedDownloadComplete: a download of unknown size that reads to its
// end is whole, chunked, and ends its connection.
func TestUnsizedDownloadComplete(t *testing.T) {
	e := newFakeFileEnv(t, func() (io.ReadCloser, int64) {
		return io.NopCloser(io.LimitReader(zeroReader{}, 3<<20+7)), -1
	})
	id := e.create(hostSpec()).ID
	resp := e.req("GET", "/v1/sessions/"+id+"/files?path=x", nil, testToken)
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n != 3<<20+7 || resp.ContentLength != -1 || !resp.Close {
		t.Errorf("%d bytes, %v; length %d, close %v", n, err, resp.ContentLength, resp.Close)
	}
}

// TestStalledDownloadIsCut: a client that reads nothing of a download for
// the idle timeout is cut; the handler returns (nothing holds the
// shutdown) and the request is logged.
func TestStalledDownloadIsCut(t *testing.T) {
	idle := 500 * time.Millisecond
	for _, size := range []int64{-1, 1 << 40} {
		t.Run(fmt.Sprint("size ", size), func(t *testing.T) {
			e := newFakeFileEnv(t, func() (io.ReadCloser, int64) { return io.NopCloser(zeroReader{}), size },
				func(s *Server) { s.idle = idle })
			id := e.create(hostSpec()).ID
			rc := e.rawDial(t)
			// Taken before the send: the server may start the request,
			// and its idle clock, before the send returns here.
			begin := time.Now()
			rc.send("GET /v1/sessions/"+id+"/files?path=x HTTP/1.1", "Authorization: Bearer "+testToken)
			line := e.waitRequestLine("getFile", 10*time.Second)
			if d := time.Since(begin); d < idle {
				t.Errorf("cut after %v, before the idle timeout", d)
			}
			if line["body_cut"] != "idle_timeout" {
				t.Errorf("request line %v", line)
			}
			waitIdle(t, e.srv)
			if !rc.closedWithin(5 * time.Second) {
				t.Errorf("the connection is still open")
			}
		})
	}
}

// TestSlowDownloadIsNotCut: a client that reads slowly but steadily gets
// the whole file, however longer than the idle timeout it takes; and the
// connection serves a long request after it (no write deadline is left on
// it).
func TestSlowDownloadIsNotCut(t *testing.T) {
	idle := 500 * time.Millisecond
	e := newEnv(t, func(s *Server) { s.idle = idle })
	id := e.create(hostSpec()).ID
	data := make([]byte, 6<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	e.call("PUT", "/v1/sessions/"+id+"/files?path=f", data, http.StatusNoContent, nil)

	var conns []net.Conn
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conns = append(conns, i.Conn) }})
	r, _ := http.NewRequestWithContext(ctx, "GET", e.ts.URL+"/v1/sessions/"+id+"/files?path=f", nil)
	r.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := e.hc.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	var got bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("after %d bytes in %v: %v", got.Len(), time.Since(begin), err)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp.Body.Close()
	if d := time.Since(begin); d < 2*idle {
		t.Logf("the download took only %v; the test proves less", d)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("%d bytes, not the file", got.Len())
	}
	// The same connection, and a response that comes after the idle timeout.
	execAfter(t, ctx, e, id, "sleep 1; echo late", "late", "download", &conns)
}

// TestStalledUploadIsCut: an upload whose body stops coming is cut after the
// idle timeout with a 400 that says so, and the request is logged; a slow
// upload that keeps coming is not; after a request with a body the same
// connection serves a long request (no read deadline is left on it).
func TestStalledUploadIsCut(t *testing.T) {
	idle := 500 * time.Millisecond
	e := newEnv(t, func(s *Server) { s.idle = idle })
	id := e.create(hostSpec()).ID
	path := "/v1/sessions/" + id + "/files?path=f"
	for _, route := range []struct{ line, op string }{
		{"PUT " + path, "putFile"},
		{"POST /v1/sessions/" + id + "/exec", "exec"},
	} {
		rc := e.rawDial(t)
		rc.send(route.line+" HTTP/1.1", "Authorization: Bearer "+testToken, "Content-Length: 1000")
		_, _ = io.WriteString(rc.c, `{"argv":`)
		begin := time.Now()
		resp, err := rc.response("", 10*time.Second)
		if err != nil {
			t.Fatalf("%s: no answer: %v", route.op, err)
		}
		d := time.Since(begin)
		er := errorOf(t, resp)
		if resp.StatusCode != http.StatusBadRequest || er.Kind != api.KindBadRequest || !strings.Contains(er.Message, "stalled") || !resp.Close {
			t.Errorf("%s: %d %+v, close %v", route.op, resp.StatusCode, er, resp.Close)
		}
		if d < idle-idle/10 || d > 5*time.Second {
			t.Errorf("%s: cut after %v (idle %v)", route.op, d, idle)
		}
		if line := e.waitRequestLine(route.op, 5*time.Second); line["status"] != float64(400) {
			t.Errorf("%s: request line %v", route.op, line)
		}
	}

	// Slow but steady: 2 s of body in pieces 100 ms apart.
	pr, pw := io.Pipe()
	go func() {
		for range 20 {
			if _, err := pw.Write(bytes.Repeat([]byte("x"), 1000)); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
	}()
	var conns []net.Conn
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conns = append(conns, i.Conn) }})
	r, _ := http.NewRequestWithContext(ctx, "PUT", e.ts.URL+path, pr)
	r.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := e.hc.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("slow upload: %d", resp.StatusCode)
	}
	execAfter(t, ctx, e, id, "sleep 1; wc -c < f", "20000", "upload", &conns)
}

// execAfter runs script (which answers after a pause longer than the idle
// timeout) on the connection a transfer used, and checks that its output
// holds want and that the connection was reused: no deadline the transfer
// set is left on it. conns records the connections the test's client
// dialled; after names the transfer, for messages.
func execAfter(t *testing.T, ctx context.Context, e *env, id, script, want, after string, conns *[]net.Conn) {
	t.Helper()
	body, _ := json.Marshal(api.ExecRequest{Argv: []string{"sh", "-c", script}, TimeoutSeconds: 10})
	r, _ := http.NewRequestWithContext(ctx, "POST", e.ts.URL+"/v1/sessions/"+id+"/exec", bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := e.hc.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
		t.Errorf("exec after the %s: %d %s", after, resp.StatusCode, b)
	}
	if c := *conns; len(c) != 2 || c[0] != c[1] {
		t.Errorf("the exec did not reuse the %s's connection", after)
	}
}

// TestUploadToDestroyedSession: a session destroyed while an upload comes
// ends the upload promptly with session_not_found (the host provider
// itself would only fail at the last byte).
func TestUploadToDestroyedSession(t *testing.T) {
	for _, kind := range []string{"kit", "streamed", "whole"} {
		t.Run(kind, func(t *testing.T) {
			sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sb.Close(context.Background()) })
			var n atomic.Int64
			var served sandbox.Sandbox = sb
			if kind != "kit" {
				served = wrapSandbox{Sandbox: sb, streaming: kind == "streamed", streamed: &n}
			}
			e := newEnvOn(t, sb, served)
			id := e.create(hostSpec()).ID
			rc := e.rawDial(t)
			rc.send("PUT /v1/sessions/"+id+"/files?path=f HTTP/1.1", "Authorization: Bearer "+testToken, "Content-Length: 1000000000")
			stop := make(chan struct{})
			sent := make(chan struct{})
			go func() {
				defer close(sent)
				chunk := make([]byte, 32<<10)
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					_ = rc.c.SetWriteDeadline(time.Now().Add(time.Second))
					if _, err := rc.c.Write(chunk); err != nil {
						return
					}
				}
			}()
			defer func() { close(stop); <-sent }()
			time.Sleep(300 * time.Millisecond)
			e.call("DELETE", "/v1/sessions/"+id, nil, http.StatusNoContent, nil)
			begin := time.Now()
			resp, err := rc.response("PUT", 5*time.Second)
			if err != nil {
				t.Fatalf("no answer within 5s of the destroy: %v", err)
			}
			er := errorOf(t, resp)
			if resp.StatusCode != http.StatusNotFound || er.Kind != api.KindSessionNotFound || er.SessionID != id {
				t.Errorf("%d %+v", resp.StatusCode, er)
			}
			t.Logf("answered %v after the destroy", time.Since(begin))
		})
	}
}

// An upload whose client ends the body with the upload-failed trailer is
// refused before the answer, with the old content in place and no
// temporary file left: the client's call returns only after the cleanup.
func TestUploadFailedTrailer(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	if resp := e.req("PUT", "/v1/sessions/"+id+"/files?path=keep.txt", strings.NewReader("old content"), testToken); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("first put: %d", resp.StatusCode)
	}
	pr, pw := io.Pipe()
	req, err := http.NewRequest("PUT", e.ts.URL+"/v1/sessions/"+id+"/files?path=keep.txt", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Trailer = http.Header{api.TrailerUploadFailed: nil}
	go func() {
		_, _ = pw.Write(bytes.Repeat([]byte("new"), 100000))
		req.Trailer.Set(api.TrailerUploadFailed, "the source reader failed")
		pw.Close()
	}()
	resp, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "broke the upload off") {
		t.Errorf("a put ended with the upload-failed trailer: %d %s; want 400 saying the client broke it off", resp.StatusCode, body)
	}
	r := e.exec(id, api.ExecRequest{Argv: []string{"sh", "-c", "cat keep.txt; echo; ls -A"}, TimeoutSeconds: 10})
	if r.Stdout != "old content\nkeep.txt\n" {
		t.Errorf("after the failed put the workspace shows %q; want the old content and no temporary file", r.Stdout)
	}
}
