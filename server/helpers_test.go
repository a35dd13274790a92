package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/internal/syncbuf"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// Every test leaves no goroutine behind: the server's, the kit's and the
// clients' are all ended by each test's cleanup. Nothing is ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testToken = "test-token-3f9a"

var testPolicy = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}

// syncBuffer is a log or output sink safe to read while it is written.
type syncBuffer = syncbuf.Buffer

// env is one host sandbox served by one Server through httptest.
type env struct {
	t    *testing.T
	sb   *kit.Sandbox
	srv  *Server
	ts   *httptest.Server
	tr   *http.Transport
	hc   *http.Client
	logs *syncBuffer
}

// newEnv builds a host sandbox and its server; each mod is a
// func(*Options) run before New, a func(*Server) run after it, or a
// func(*httptest.Server) run before the test server starts. Cleanup: the
// client's idle connections, the server's handlers (streams included)
// drained, the test server closed, the sandbox closed.
func newEnv(t *testing.T, mod ...any) *env {
	t.Helper()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	return newEnvOn(t, sb, sb, mod...)
}

// newEnvOn serves served (which may wrap sb) and closes nothing of sb.
func newEnvOn(t *testing.T, sb *kit.Sandbox, served sandbox.Sandbox, mod ...any) *env {
	t.Helper()
	logs := &syncBuffer{}
	opts := Options{
		Token: testToken, Policy: testPolicy, Provider: host.Name, Version: "v-test",
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	}
	for _, m := range mod {
		if f, ok := m.(func(*Options)); ok {
			f(&opts)
		}
	}
	srv, err := New(served, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mod {
		switch f := m.(type) {
		case func(*Server):
			f(srv)
		case func(*Options), func(*httptest.Server):
		default:
			t.Fatalf("newEnv: a mod of type %T", m)
		}
	}
	ts := httptest.NewUnstartedServer(srv)
	for _, m := range mod {
		if f, ok := m.(func(*httptest.Server)); ok {
			f(ts)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	t.Cleanup(func() { waitIdle(t, srv) })
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &env{t: t, sb: sb, srv: srv, ts: ts, tr: tr, hc: &http.Client{Transport: tr}, logs: logs}
}

// waitIdle waits until no handler of srv runs (interactive execs end in
// their handler).
func waitIdle(t *testing.T, srv *Server) {
	t.Helper()
	select {
	case <-srv.inflight.idle():
	case <-time.After(30 * time.Second):
		t.Errorf("server handlers still running at cleanup: %d", srv.inflight.count())
	}
}

// req sends one request; token "" sends none.
func (e *env) req(method, path string, body io.Reader, token string, hdr ...string) *http.Response {
	e.t.Helper()
	r, err := http.NewRequest(method, e.ts.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.hc.Do(r)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// call sends in as JSON (nil: no body; []byte or string: as is), checks the
// status and decodes the response into out (when not nil). It returns the
// body.
func (e *env) call(method, path string, in any, wantStatus int, out any) []byte {
	e.t.Helper()
	var body io.Reader
	switch v := in.(type) {
	case nil:
	case []byte:
		body = bytes.NewReader(v)
	case string:
		body = strings.NewReader(v)
	default:
		b, err := json.Marshal(v)
		if err != nil {
			e.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	resp := e.req(method, path, body, testToken)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != wantStatus {
		e.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, resp.StatusCode, wantStatus, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			e.t.Fatalf("%s %s: decoding %s: %v", method, path, b, err)
		}
	}
	return b
}

// callErr calls and returns the error body, checking status and kind.
func (e *env) callErr(method, path string, in any, wantStatus int, wantKind api.Kind) api.Error {
	e.t.Helper()
	var eb api.ErrorBody
	e.call(method, path, in, wantStatus, &eb)
	if eb.Error.Kind != wantKind {
		e.t.Fatalf("%s %s: kind %q, want %q (message %q)", method, path, eb.Error.Kind, wantKind, eb.Error.Message)
	}
	if eb.Error.Message == "" {
		e.t.Fatalf("%s %s: error without a message", method, path)
	}
	return eb.Error
}

func hostSpec() api.SessionSpec {
	return api.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 600}
}

func (e *env) create(spec api.SessionSpec) sandbox.SessionInfo {
	e.t.Helper()
	var info sandbox.SessionInfo
	e.call("POST", "/v1/sessions", spec, http.StatusCreated, &info)
	if info.ID == "" {
		e.t.Fatal("created session has no id")
	}
	return info
}

func (e *env) exec(id string, req api.ExecRequest) api.ExecResult {
	e.t.Helper()
	var res api.ExecResult
	e.call("POST", "/v1/sessions/"+id+"/exec", req, http.StatusOK, &res)
	return res
}

func (e *env) healthy() {
	e.t.Helper()
	var h api.Health
	e.call("GET", "/healthz", nil, http.StatusOK, &h)
	if h.Status != "ok" {
		e.t.Fatalf("healthz: %+v", h)
	}
}

func randHex(t *testing.T) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// uniqueSleep returns a sleep duration argument (e.g. "1000.1234567") that
// no other process on the machine has in its command line.
func uniqueSleep(t *testing.T, secs int) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d.%d", secs, 1000000+int(b[0])<<16|int(b[1])<<8|int(b[2]))
}

// procsWith lists the live (not zombie) processes whose command line holds
// marker.
func procsWith(t *testing.T, marker string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmd, []byte(marker)) {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// waitProcs waits until some process holds marker (want true) or none does.
func waitProcs(t *testing.T, marker string, want bool, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := len(procsWith(t, marker)) > 0
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes with %q: present=%v after %v, want %v (pids %v)", marker, got, within, want, procsWith(t, marker))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wsURL is the interactive exec's URL for a session.
func (e *env) wsURL(id string) string {
	return "ws" + strings.TrimPrefix(e.ts.URL, "http") + "/v1/sessions/" + id + "/exec/stream"
}

// dial opens an interactive exec WebSocket with the token and subprotocol.
func (e *env) dial(id string, client *http.Client) *websocket.Conn {
	e.t.Helper()
	if client == nil {
		client = &http.Client{Transport: e.tr}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, e.wsURL(id), &websocket.DialOptions{
		HTTPClient:   client,
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + testToken}},
		Subprotocols: []string{api.ExecSubprotocol},
	})
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	if c.Subprotocol() != api.ExecSubprotocol {
		e.t.Fatalf("subprotocol %q", c.Subprotocol())
	}
	c.SetReadLimit(8 << 20)
	e.t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

// wsClient is the test's side of one interactive exec.
type wsClient struct {
	t *testing.T
	c *websocket.Conn
}

func (w wsClient) sendJSON(v any) {
	w.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		w.t.Fatal(err)
	}
	w.sendRaw(websocket.MessageText, b)
}

func (w wsClient) sendRaw(typ websocket.MessageType, b []byte) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, typ, b); err != nil {
		w.t.Fatalf("write frame: %v", err)
	}
}

func (w wsClient) start(argv []string, timeout float64, env map[string]string) {
	w.t.Helper()
	w.sendJSON(api.ExecRequest{Type: api.FrameStart, Argv: argv, Env: env, TimeoutSeconds: timeout})
}

// frame is one frame the server sent.
type frame struct {
	binary bool
	tag    byte
	data   []byte
	text   api.Frame
}

// next reads one frame; err is the connection's end.
func (w wsClient) next(within time.Duration) (frame, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	typ, b, err := w.c.Read(ctx)
	if err != nil {
		return frame{}, err
	}
	if typ == websocket.MessageBinary {
		if len(b) == 0 {
			w.t.Fatalf("empty binary frame from the server")
		}
		return frame{binary: true, tag: b[0], data: b[1:]}, nil
	}
	var f api.Frame
	if err := json.Unmarshal(b, &f); err != nil {
		w.t.Fatalf("bad text frame %s: %v", b, err)
	}
	return frame{text: f}, nil
}

// expectStarted reads the started frame.
func (w wsClient) expectStarted() {
	w.t.Helper()
	f, err := w.next(10 * time.Second)
	if err != nil {
		w.t.Fatalf("waiting for started: %v", err)
	}
	if f.binary || f.text.Type != api.FrameStarted {
		w.t.Fatalf("first frame %+v, want started", f)
	}
}

// result is everything a stream sent after started, up to its close.
type result struct {
	stdout, stderr bytes.Buffer
	acks           []api.Frame
	last           api.Frame // the exit or error frame
	closeStatus    websocket.StatusCode
	closeErr       error
	order          []string // frame kinds in order
}

// readToEnd reads frames until the connection closes.
func (w wsClient) readToEnd(within time.Duration) *result {
	w.t.Helper()
	r := &result{}
	deadline := time.Now().Add(within)
	for {
		f, err := w.next(time.Until(deadline))
		if err != nil {
			r.closeErr = err
			r.closeStatus = websocket.CloseStatus(err)
			return r
		}
		switch {
		case f.binary && f.tag == api.TagStdout:
			r.stdout.Write(f.data)
			r.order = append(r.order, "stdout")
		case f.binary && f.tag == api.TagStderr:
			r.stderr.Write(f.data)
			r.order = append(r.order, "stderr")
		case f.binary:
			w.t.Fatalf("binary frame with tag %#x from the server", f.tag)
		case f.text.Type == api.FrameAck:
			if r.last.Type != "" {
				w.t.Errorf("ack %+v after the last frame %+v", f.text, r.last)
			}
			r.acks = append(r.acks, f.text)
			r.order = append(r.order, "ack")
		case f.text.Type == api.FrameExit || f.text.Type == api.FrameError:
			if r.last.Type != "" {
				w.t.Errorf("a second last frame %+v after %+v", f.text, r.last)
			}
			r.last = f.text
			r.order = append(r.order, f.text.Type)
		default:
			w.t.Fatalf("unexpected frame %+v", f.text)
		}
	}
}

// waitFor polls cond every 10ms up to within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawDialer keeps the TCP connections it makes, to close them abruptly.
type rawDialer struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *rawDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *rawDialer) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
}

func newJSONLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }
