package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// testToken is the bearer token of the fakes; tests check it never shows in
// an error.
const testToken = "tai42-test-token-7f3a9c1e"

// writeError answers an API error body.
func writeError(w http.ResponseWriter, e api.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status())
	_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// authorized refuses a request without the test token, as the daemon does.
func authorized(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		writeError(w, api.ErrorFrom(api.Transportf(api.KindUnauthorized, "a bearer token is required")))
		return false
	}
	return true
}

// newFake serves mux on loopback and returns a client of it; both are
// closed at cleanup.
func newFake(t *testing.T, mux *http.ServeMux) (*httptest.Server, *Client) {
	t.Helper()
	ts := httptest.NewServer(mux)
	c := New(ts.URL, testToken)
	t.Cleanup(func() {
		c.Close()
		ts.Close()
	})
	return ts, c
}

// fakeSession is the session every fake hands out.
var fakeSession = sandbox.SessionInfo{ID: "s1", Image: "host", WorkspacePath: "/ws/s1", Durability: sandbox.Ephemeral,
	CreatedAt: time.Unix(1700000000, 0).UTC(), ExpiresAt: time.Unix(1700000600, 0).UTC()}

// sessionMux answers GET /v1/sessions/s1, so that tests can get a session.
func sessionMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sessions/s1", func(w http.ResponseWriter, r *http.Request) {
		if authorized(w, r) {
			writeJSON(w, http.StatusOK, fakeSession)
		}
	})
	return mux
}

func getSession(t *testing.T, c *Client) sandbox.Session {
	t.Helper()
	sess, err := c.GetSession(t.Context(), "s1")
	if err != nil {
		t.Fatalf("GetSession: %v", err)
	}
	return sess
}

// wsPeer is the daemon's side of one fake exec stream.
type wsPeer struct {
	t     *testing.T
	c     *websocket.Conn
	start api.ExecRequest
	// frames carries what the client sends after the start frame; it is
	// closed when the connection ends.
	frames chan clientFrame
}

// clientFrame is one frame from the client: stdin (binary) or a control
// frame (text).
type clientFrame struct {
	stdin   bool
	id      uint64
	data    []byte
	control api.Frame
	at      time.Time // when the fake read it
}

func (p *wsPeer) text(f api.Frame) error {
	b, _ := json.Marshal(f)
	return p.c.Write(context.Background(), websocket.MessageText, b)
}

func (p *wsPeer) output(tag byte, data []byte) error {
	return p.c.Write(context.Background(), websocket.MessageBinary, append([]byte{tag}, data...))
}

func (p *wsPeer) ack(id uint64, e *api.Error) error {
	return p.text(api.Frame{Type: api.FrameAck, ID: id, Error: e})
}

func (p *wsPeer) exit(code int) error {
	return p.text(api.Frame{Type: api.FrameExit, ExitCode: &code})
}

// next returns the client's next frame, or false when the connection ended
// or d passed.
func (p *wsPeer) next(d time.Duration) (clientFrame, bool) {
	select {
	case f, ok := <-p.frames:
		return f, ok
	case <-time.After(d):
		return clientFrame{}, false
	}
}

// execMux adds the exec stream route to mux: each connection is accepted,
// its start frame read, and serve runs as the daemon's side of it. Unless
// noReader is set, a goroutine reads the client's frames into peer.frames.
func execMux(t *testing.T, mux *http.ServeMux, noReader bool, serve func(p *wsPeer)) {
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	mux.HandleFunc("GET /v1/sessions/s1/exec/stream", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r) {
			return
		}
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{api.ExecSubprotocol}})
		if err != nil {
			t.Errorf("fake: Accept: %v", err)
			return
		}
		defer func() { _ = c.CloseNow() }()
		c.SetReadLimit(api.MaxClientFrame)
		typ, b, err := c.Read(context.Background())
		if err != nil || typ != websocket.MessageText {
			t.Errorf("fake: reading the start frame: %v (type %v)", err, typ)
			return
		}
		p := &wsPeer{t: t, c: c, frames: make(chan clientFrame, 1024)}
		if err := json.Unmarshal(b, &p.start); err != nil || p.start.Type != api.FrameStart {
			t.Errorf("fake: start frame %s: %v", b, err)
			return
		}
		if !noReader {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(p.frames)
				for {
					typ, b, err := c.Read(context.Background())
					if err != nil {
						return
					}
					f := clientFrame{at: time.Now()}
					if typ == websocket.MessageBinary {
						f.stdin = true
						if f.id, f.data, err = api.ParseStdinFrame(b); err != nil {
							t.Errorf("fake: %v", err)
							return
						}
					} else if err := json.Unmarshal(b, &f.control); err != nil {
						t.Errorf("fake: control frame %s: %v", b, err)
						return
					}
					p.frames <- f
				}
			}()
		}
		serve(p)
	})
}

// closeNormally closes the stream after the last frame, as the daemon does.
func (p *wsPeer) closeNormally() {
	p.c.Close(websocket.StatusNormalClosure, "")
}
