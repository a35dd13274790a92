package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// wrapSandbox serves a real sandbox's sessions either as streaming ones
// (sandbox.FileStreamer over the session's own PutFile/GetFile, counted) or
// as plain ones that hide any FileStreamer, so that both paths of the file
// routes run whatever the kit implements.
type wrapSandbox struct {
	sandbox.Sandbox
	streaming bool
	streamed  *atomic.Int64
	panicOn   string // GetSession of this id panics
}

func (w wrapSandbox) wrap(s sandbox.Session) sandbox.Session {
	if w.streaming {
		return streamingSession{Session: s, n: w.streamed}
	}
	return plainSession{s}
}

func (w wrapSandbox) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	s, err := w.Sandbox.CreateSession(ctx, spec)
	if err != nil {
		return nil, err
	}
	return w.wrap(s), nil
}

func (w wrapSandbox) GetSession(ctx context.Context, id string) (sandbox.Session, error) {
	if w.panicOn != "" && id == w.panicOn {
		panic("provider bug holding secret-value-" + id)
	}
	s, err := w.Sandbox.GetSession(ctx, id)
	if err != nil {
		return nil, err
	}
	return w.wrap(s), nil
}

type plainSession struct{ sandbox.Session }

type streamingSession struct {
	sandbox.Session
	n *atomic.Int64
}

func (s streamingSession) PutFileFrom(ctx context.Context, path string, r io.Reader) error {
	s.n.Add(1)
	data, err := io.ReadAll(r)
	if err != nil {
		return sandbox.WrapError("put_file", "reading the data failed", err)
	}
	return s.PutFile(ctx, path, data)
}

func (s streamingSession) OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	s.n.Add(1)
	data, err := s.GetFile(ctx, path)
	if err != nil {
		return nil, 0, err
	}
	return io.NopCloser(bytes.NewReader(data)), int64(len(data)), nil
}

var _ sandbox.FileStreamer = streamingSession{}

// TestFiles: both paths of the file routes (streamed and whole), the body
// limit, HEAD, and the path parameter's checks.
func TestFiles(t *testing.T) {
	for _, streaming := range []bool{true, false} {
		name := "whole"
		if streaming {
			name = "streamed"
		}
		t.Run(name, func(t *testing.T) {
			sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sb.Close(context.Background()) })
			var n atomic.Int64
			const limit = 256 << 10
			e := newEnvOn(t, sb, wrapSandbox{Sandbox: sb, streaming: streaming, streamed: &n},
				func(o *Options) { o.MaxBodyBytes = limit })
			base := "/v1/sessions/" + e.create(hostSpec()).ID + "/files"

			data := make([]byte, limit)
			if _, err := rand.Read(data); err != nil {
				t.Fatal(err)
			}
			e.call("PUT", base+"?path=big.bin", data, http.StatusNoContent, nil)
			if got := e.call("GET", base+"?path=big.bin", nil, http.StatusOK, nil); !bytes.Equal(got, data) {
				t.Fatalf("round trip: %d bytes back", len(got))
			}
			e.call("PUT", base+"?path=empty", []byte{}, http.StatusNoContent, nil)
			if got := e.call("GET", base+"?path=empty", nil, http.StatusOK, nil); len(got) != 0 {
				t.Fatalf("empty file: %q", got)
			}
			resp := e.req("HEAD", base+"?path=big.bin", nil, testToken)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.ContentLength != limit {
				t.Errorf("HEAD: %d, length %d", resp.StatusCode, resp.ContentLength)
			}

			// Over the limit: 413, and the old content stays.
			over := append(bytes.Clone(data), 'x')
			er := e.callErr("PUT", base+"?path=big.bin", over, http.StatusRequestEntityTooLarge, api.KindTooLarge)
			if !strings.Contains(er.Message, "262144") {
				t.Errorf("too_large message %q", er.Message)
			}
			if got := e.call("GET", base+"?path=big.bin", nil, http.StatusOK, nil); !bytes.Equal(got, data) {
				t.Errorf("a refused put changed the file")
			}
			e.callErr("PUT", base+"?path=new.bin", over, http.StatusRequestEntityTooLarge, api.KindTooLarge)
			e.callErr("GET", base+"?path=new.bin", nil, http.StatusNotFound, api.KindFileNotFound)

			for _, q := range []string{"", "?path=", "?other=1"} {
				er := e.callErr("GET", base+q, nil, http.StatusBadRequest, api.KindBadRequest)
				if !strings.Contains(er.Message, "path") {
					t.Errorf("%q: %q", q, er.Message)
				}
			}
			er = e.callErr("PUT", base+"?path=a%00b", "x", http.StatusBadRequest, api.KindBadRequest)
			if !strings.Contains(er.Message, "NUL") {
				t.Errorf("NUL: %q", er.Message)
			}
			e.callErr("GET", base+"?path=a&path=b", nil, http.StatusBadRequest, api.KindBadRequest)
			e.callErr("GET", base+"?path=%zz", nil, http.StatusBadRequest, api.KindBadRequest)

			if streaming && n.Load() == 0 {
				t.Errorf("the FileStreamer path was not used")
			}
			if !streaming && n.Load() != 0 {
				t.Errorf("the FileStreamer path was used by a plain session")
			}
		})
	}
}

// TestPanicRecovery: a panic in a handler is a 500 internal, logged with
// the route and without the panic's text, and the daemon keeps serving.
func TestPanicRecovery(t *testing.T) {
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	e := newEnvOn(t, sb, wrapSandbox{Sandbox: sb, panicOn: "boom"})
	er := e.callErr("GET", "/v1/sessions/boom", nil, http.StatusInternalServerError, api.KindInternal)
	if strings.Contains(er.Message, "secret-value") {
		t.Errorf("the panic's text reached the client: %q", er.Message)
	}
	e.healthy()
	logs := e.logs.String()
	if strings.Contains(logs, "secret-value") {
		t.Errorf("the panic's text reached the log:\n%s", logs)
	}
	var sawPanic, sawLine bool
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "panic serving a request" && m["route"] == "getSession" {
			sawPanic = true
		}
		if m["msg"] == "request" && m["route"] == "getSession" && m["status"] == float64(500) {
			sawLine = true
		}
	}
	if !sawPanic || !sawLine {
		t.Errorf("panic logged %v, request line %v:\n%s", sawPanic, sawLine, logs)
	}
	// The reap route counts for the metric when the sandbox does not.
	e.call("POST", "/v1/reap", nil, http.StatusOK, nil)
}
