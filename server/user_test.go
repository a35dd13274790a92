package server

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox/api"
)

// The exec body's user reaches the sandbox: the command runs as it; a name
// the session does not know is 400 user_not_found carrying it, a malformed
// one 400 sandbox_error.
func TestExecUser(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	path := "/v1/sessions/" + id + "/exec"
	if os.Geteuid() == 0 {
		res := e.exec(id, api.ExecRequest{Argv: []string{"id", "-u"}, TimeoutSeconds: 10, User: "65534"})
		if res.ExitCode != 0 || res.Stdout != "65534\n" {
			t.Errorf("exec as 65534: %+v; want uid 65534", res)
		}
	}
	er := e.callErr("POST", path, api.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 10, User: "tai42-no-such-user"}, http.StatusBadRequest, api.KindUserNotFound)
	if er.User != "tai42-no-such-user" || er.Op != "exec" || !strings.Contains(er.Message, "/etc/passwd") {
		t.Errorf("user_not_found: %+v; want user tai42-no-such-user, op exec, the message naming /etc/passwd", er)
	}
	er = e.callErr("POST", path, `{"argv":["true"],"timeout_seconds":10,"user":"a:b"}`, http.StatusBadRequest, api.KindSandbox)
	if er.User != "" || !strings.Contains(er.Message, "uid:gid") {
		t.Errorf("a malformed user: %+v; want a sandbox_error saying a user with ':' is uid:gid", er)
	}
	e.callErr("POST", path, `{"argv":["true"],"timeout_seconds":10,"user":7}`, http.StatusBadRequest, api.KindBadRequest)
	e.callErr("POST", path, `{"argv":["true"],"timeout_seconds":10,"User":"nobody"}`, http.StatusBadRequest, api.KindBadRequest)
}

// The start frame's user reaches the sandbox too; an unknown one ends the
// stream with an error frame of kind user_not_found.
func TestStreamUser(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	if os.Geteuid() == 0 {
		w := wsClient{t, e.dial(id, nil)}
		w.sendJSON(api.ExecRequest{Type: api.FrameStart, Argv: []string{"id", "-u"}, TimeoutSeconds: 10, User: "65534:65534"})
		w.expectStarted()
		r := w.readToEnd(10 * time.Second)
		checkExit(t, r, 0)
		if r.stdout.String() != "65534\n" {
			t.Errorf("stream as 65534:65534: stdout %q; want 65534", r.stdout.String())
		}
	}
	w := wsClient{t, e.dial(id, nil)}
	w.sendJSON(api.ExecRequest{Type: api.FrameStart, Argv: []string{"true"}, TimeoutSeconds: 10, User: "tai42-no-such-user"})
	r := w.readToEnd(10 * time.Second)
	if r.last.Type != api.FrameError || r.last.Error == nil || r.last.Error.Kind != api.KindUserNotFound || r.last.Error.User != "tai42-no-such-user" {
		t.Errorf("stream as an unknown user: last frame %+v; want an error frame of kind user_not_found carrying the user", r.last)
	}
}
