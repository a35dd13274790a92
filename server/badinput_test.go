package server

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox/api"
)

// TestBadInput: each malformed request gets a 4xx JSON error with a clear
// message, and the daemon still answers /healthz after it.
func TestBadInput(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBodyBytes = 64 << 10 })
	id := e.create(hostSpec()).ID
	execPath := "/v1/sessions/" + id + "/exec"

	cases := []struct {
		name, method, path string
		body               string
		status             int
		kind               api.Kind
		mention            string // the message must contain it
	}{
		{"malformed JSON", "POST", "/v1/sessions", `{"image":`, 400, api.KindBadRequest, "malformed JSON"},
		{"not an object", "POST", "/v1/sessions", `[1,2]`, 400, api.KindBadRequest, "array"},
		{"unknown field", "POST", "/v1/sessions", `{"image":"host","bogus_field":1}`, 400, api.KindBadRequest, "bogus_field"},
		{"wrong type", "POST", "/v1/sessions", `{"image":"host","ttl_seconds":"ten"}`, 400, api.KindBadRequest, "ttl_seconds"},
		{"wrong env type", "POST", "/v1/sessions", `{"image":"host","env":{"A":1}}`, 400, api.KindBadRequest, "env"},
		{"two values", "POST", "/v1/sessions", `{} {}`, 400, api.KindBadRequest, "more than one JSON value"},
		{"trailing garbage", "POST", "/v1/sessions", `{}}`, 400, api.KindBadRequest, "malformed JSON"},
		{"empty body", "POST", "/v1/sessions", ``, 400, api.KindBadRequest, "empty"},
		{"body over the limit", "POST", "/v1/sessions", `{"image":"` + strings.Repeat("h", 70<<10) + `"}`, 413, api.KindTooLarge, "limit"},
		{"exec unknown field", "POST", execPath, `{"argv":["true"],"timeout_seconds":1,"stdin":"x"}`, 400, api.KindBadRequest, "stdin"},
		{"exec wrong argv type", "POST", execPath, `{"argv":"true","timeout_seconds":1}`, 400, api.KindBadRequest, "argv"},
		{"exec bad base64", "POST", execPath, `{"argv":["cat"],"timeout_seconds":1,"stdin_base64":"!!!"}`, 400, api.KindBadRequest, "stdin_base64"},
		{"exec with a frame type", "POST", execPath, `{"type":"start","argv":["true"],"timeout_seconds":1}`, 400, api.KindBadRequest, "type"},
		{"exec without argv", "POST", execPath, `{"timeout_seconds":1}`, 400, api.KindSandbox, "argv"},
		{"exec argv with NUL", "POST", execPath, `{"argv":["echo","a\u0000b"],"timeout_seconds":1}`, 400, api.KindSandbox, "NUL"},
		{"exec negative timeout", "POST", execPath, `{"argv":["true"],"timeout_seconds":-1}`, 400, api.KindSandbox, "timeout"},
		{"exec huge timeout", "POST", execPath, `{"argv":["true"],"timeout_seconds":1e300}`, 400, api.KindSandbox, "timeout"},
		{"cwd outside", "POST", execPath, `{"argv":["true"],"cwd":"../..","timeout_seconds":1}`, 400, api.KindSandbox, "refused"},
		{"path with NUL", "GET", "/v1/sessions/" + id + "/files?path=x%00y", ``, 400, api.KindBadRequest, "NUL"},
		{"unknown session", "GET", "/v1/sessions/sb-000000000000000000000000", ``, 404, api.KindSessionNotFound, "sb-000000000000000000000000"},
		{"unknown route", "GET", "/v2/anything", ``, 404, api.KindNotFound, "/v2/anything"},
		{"wrong method", "PUT", "/v1/sessions", ``, 405, api.KindMethodNotAllowed, "PUT"},
		{"stream without upgrade", "GET", "/v1/sessions/" + id + "/exec/stream", ``, 400, api.KindBadRequest, "WebSocket"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body any
			if c.body != "" {
				body = c.body
			}
			er := e.callErr(c.method, c.path, body, c.status, c.kind)
			if !strings.Contains(er.Message, c.mention) {
				t.Errorf("message %q does not mention %q", er.Message, c.mention)
			}
			e.healthy()
		})
	}

	t.Run("huge header", func(t *testing.T) {
		resp := e.req("GET", "/healthz", nil, "", "X-Huge", strings.Repeat("a", 2<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("status %d", resp.StatusCode)
		}
		e.healthy()
	})

	t.Run("stream without subprotocol", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, resp, err := websocket.Dial(ctx, e.wsURL(id), &websocket.DialOptions{
			HTTPClient: &http.Client{Transport: e.tr},
			HTTPHeader: http.Header{"Authorization": {"Bearer " + testToken}},
		})
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("dial without subprotocol: %v %+v", err, resp)
		}
		e.healthy()
	})

	t.Run("stream on an unknown session", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, resp, err := websocket.Dial(ctx, e.wsURL("sb-nope"), &websocket.DialOptions{
			HTTPClient:   &http.Client{Transport: e.tr},
			HTTPHeader:   http.Header{"Authorization": {"Bearer " + testToken}},
			Subprotocols: []string{api.ExecSubprotocol},
		})
		if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("dial an unknown session: %v %+v", err, resp)
		}
		e.healthy()
	})

	t.Run("stream bad frames", func(t *testing.T) {
		for _, f := range []struct {
			name string
			typ  websocket.MessageType
			data string
		}{
			{"binary first", websocket.MessageBinary, "\x00\x00\x00\x00\x00\x00\x00\x00\x01hi"},
			{"bad JSON start", websocket.MessageText, `{"type":"start",`},
			{"unknown start field", websocket.MessageText, `{"type":"start","argv":["true"],"timeout_seconds":1,"x":1}`},
			{"stdin in start", websocket.MessageText, `{"type":"start","argv":["cat"],"timeout_seconds":1,"stdin_base64":"eA=="}`},
			{"wrong first type", websocket.MessageText, `{"type":"kill","id":1}`},
		} {
			t.Run(f.name, func(t *testing.T) {
				w := wsClient{t, e.dial(id, nil)}
				w.sendRaw(f.typ, []byte(f.data))
				r := w.readToEnd(10 * time.Second)
				if r.last.Type != api.FrameError || r.last.Error == nil || r.last.Error.Kind != api.KindBadRequest {
					t.Fatalf("last frame %+v", r.last)
				}
				if r.closeStatus != websocket.StatusPolicyViolation {
					t.Errorf("close %v (%v)", r.closeStatus, r.closeErr)
				}
				e.healthy()
			})
		}
	})

	t.Run("request id", func(t *testing.T) {
		resp := e.req("GET", "/healthz", nil, "", api.HeaderRequestID, "my-id-1")
		resp.Body.Close()
		if got := resp.Header.Get(api.HeaderRequestID); got != "my-id-1" {
			t.Errorf("echoed %q", got)
		}
		resp = e.req("GET", "/healthz", nil, "", api.HeaderRequestID, strings.Repeat("x", 129))
		resp.Body.Close()
		if got := resp.Header.Get(api.HeaderRequestID); len(got) != 16 {
			t.Errorf("a too-long id gave %q", got)
		}
	})

	t.Run("raw garbage", func(t *testing.T) {
		// A request line net/http cannot parse: its own 400, and the
		// daemon keeps serving.
		c, err := net.Dial("tcp", e.ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "\x00\x01 garbage\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		if !strings.Contains(line, "400") {
			t.Errorf("reply %q", line)
		}
		e.healthy()
	})
}
