package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox/api"
)

// TestOverlongSessionID: a session id over 128 bytes in a path is answered
// session_not_found at once, with the id clipped in the answer and the log
// (it reaches no sandbox call); DELETE, idempotent, is 204 as for any
// unknown id.
func TestOverlongSessionID(t *testing.T) {
	e := newEnv(t)
	long := "sb-" + strings.Repeat("0123456789", 100) + "-end"
	base := "/v1/sessions/" + long
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", base, nil},
		{"POST", base + "/touch", nil},
		{"POST", base + "/exec", api.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 1}},
		{"PUT", base + "/files?path=x", "x"},
		{"GET", base + "/files?path=x", nil},
		{"GET", base + "/exec/stream", nil},
	} {
		er := e.callErr(c.method, c.path, c.body, http.StatusNotFound, api.KindSessionNotFound)
		if strings.Contains(er.Message, "-end") || strings.Contains(er.SessionID, "-end") || len(er.Message) > 400 {
			t.Errorf("%s %s: the id is echoed whole: %+v", c.method, c.path, er)
		}
		if !strings.HasPrefix(er.SessionID, "sb-0123456789") || !strings.Contains(er.Message, "longer than 128") {
			t.Errorf("%s %s: %+v", c.method, c.path, er)
		}
	}
	e.call("DELETE", base, nil, http.StatusNoContent, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.ts.URL, "http")+base+"/exec/stream", &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: e.tr},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + testToken}},
		Subprotocols: []string{api.ExecSubprotocol},
	})
	if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("the stream of an overlong id: %v %+v", err, resp)
	}
	if strings.Contains(e.logs.String(), "-end") {
		t.Errorf("the log holds the whole id")
	}
	// An id of 128 bytes is an id like any other: looked up, not found.
	edge := strings.Repeat("a", 128)
	er := e.callErr("GET", "/v1/sessions/"+edge, nil, http.StatusNotFound, api.KindSessionNotFound)
	if er.SessionID != edge {
		t.Errorf("a 128-byte id comes back as %q", er.SessionID)
	}
}

// TestExecTimeoutOutOfRange: a timeout_seconds no duration holds is refused
// naming the value and the range, not as "-1ns".
func TestExecTimeoutOutOfRange(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	path := "/v1/sessions/" + id + "/exec"
	for _, c := range []struct{ body, value string }{
		{`{"argv":["true"],"timeout_seconds":1e300}`, "1e+300"},
		{`{"argv":["true"],"timeout_seconds":-1e300}`, "-1e+300"},
		{`{"argv":["true"],"timeout_seconds":9300000000}`, "9.3e+09"},
	} {
		er := e.callErr("POST", path, c.body, http.StatusBadRequest, api.KindSandbox)
		if !strings.Contains(er.Message, "timeout_seconds "+c.value) || !strings.Contains(er.Message, "9223372036") || strings.Contains(er.Message, "-1ns") {
			t.Errorf("%s: message %q", c.body, er.Message)
		}
		if er.Op != "exec" {
			t.Errorf("op %q", er.Op)
		}
	}
	// In range, the sandbox's own rule stands: > 0.
	er := e.callErr("POST", path, `{"argv":["true"],"timeout_seconds":0}`, http.StatusBadRequest, api.KindSandbox)
	if !strings.Contains(er.Message, "timeout") {
		t.Errorf("zero timeout: %q", er.Message)
	}
	// The longest timeout is taken.
	e.call("POST", path, `{"argv":["true"],"timeout_seconds":9223372036}`, http.StatusOK, nil)
}
