package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tai42/sandbox/api"
)

// TestAuth: every non-public route refuses a missing, wrong-scheme or wrong
// token, or more than one Authorization header (even each with the valid
// token: which one a proxy in front checked is unknown), with 401
// unauthorized and WWW-Authenticate, and does nothing.
func TestAuth(t *testing.T) {
	e := newEnv(t)
	spec, _ := json.Marshal(hostSpec())
	for _, c := range []struct {
		name string
		hdr  []string
	}{
		{"none", nil},
		{"basic scheme", []string{"Authorization", "Basic " + testToken}},
		{"no scheme", []string{"Authorization", testToken}},
		{"wrong token", []string{"Authorization", "Bearer wrong-" + testToken}},
		{"token prefix", []string{"Authorization", "Bearer " + testToken[:len(testToken)-1]}},
		{"empty bearer", []string{"Authorization", "Bearer "}},
		{"two valid", []string{"Authorization", "Bearer " + testToken, "Authorization", "Bearer " + testToken}},
		{"valid then wrong", []string{"Authorization", "Bearer " + testToken, "Authorization", "Bearer wrong"}},
		{"wrong then valid", []string{"Authorization", "Bearer wrong", "Authorization", "Bearer " + testToken}},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest("POST", e.ts.URL+"/v1/sessions", strings.NewReader(string(spec)))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(c.hdr); i += 2 {
				req.Header.Add(c.hdr[i], c.hdr[i+1]) // Add: a header given twice is sent twice
			}
			resp, err := e.hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", resp.StatusCode)
			}
			if got := resp.Header.Get("WWW-Authenticate"); got != "Bearer" {
				t.Errorf("WWW-Authenticate %q", got)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var eb api.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
				t.Fatal(err)
			}
			if eb.Error.Kind != api.KindUnauthorized || eb.Error.Message == "" {
				t.Errorf("error %+v", eb.Error)
			}
			if strings.Contains(eb.Error.Message, testToken) {
				t.Errorf("the message quotes the token: %q", eb.Error.Message)
			}
		})
	}
	// Nothing was created.
	var list api.SessionList
	e.call("GET", "/v1/sessions", nil, http.StatusOK, &list)
	if list.Sessions == nil || len(list.Sessions) != 0 {
		t.Fatalf("sessions after refused creates: %+v", list.Sessions)
	}
	if n, _ := e.sb.ListSessions(t.Context()); len(n) != 0 {
		t.Fatalf("the sandbox holds %d sessions", len(n))
	}

	// Public routes need no token; /metrics does.
	for _, path := range []string{"/healthz", "/openapi.json"} {
		resp := e.req("GET", path, nil, "")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" || !json.Valid(b) {
			t.Errorf("GET %s without a token: %d %q %.60s", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
	resp := e.req("GET", "/openapi.json", nil, "")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != string(api.OpenAPI) {
		t.Errorf("/openapi.json is not api.OpenAPI")
	}
	resp = e.req("GET", "/metrics", nil, "")
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics without a token: %d", resp.StatusCode)
	}
	resp = e.req("GET", "/metrics", nil, testToken)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /metrics with the token: %d", resp.StatusCode)
	}
	// Lower-case scheme is the same scheme (RFC 9110: case-insensitive).
	resp = e.req("GET", "/v1/policy", nil, "", "Authorization", "bearer "+testToken)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("lower-case bearer: %d", resp.StatusCode)
	}
}

// TestRoutes: the server registers exactly api.Routes: each answers (401
// without a token, or its public answer), an unknown path is 404 not_found
// and a known path with another method 405 method_not_allowed with Allow.
func TestRoutes(t *testing.T) {
	e := newEnv(t)
	for _, rt := range api.Routes {
		path := strings.NewReplacer("{id}", "sb-none", "{key}", "proj", "{name...}", "ghcr.io/o/r:tag").Replace(rt.Path)
		resp := e.req(rt.Method, path, nil, "")
		resp.Body.Close()
		want := http.StatusUnauthorized
		if rt.Public {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("%s %s without a token: %d, want %d", rt.Method, path, resp.StatusCode, want)
		}
	}
	for _, path := range []string{"/nope", "/v1", "/v1/sessions/x/y", "/v1/sessions/x/exec/stream/z", "/v1/policy/"} {
		er := e.callErr("GET", path, nil, http.StatusNotFound, api.KindNotFound)
		if !strings.Contains(er.Message, path) {
			t.Errorf("404 message %q does not name %s", er.Message, path)
		}
	}
	for _, c := range []struct{ method, path, allow string }{
		{"DELETE", "/healthz", "GET, HEAD"},
		{"POST", "/v1/policy", "GET, HEAD"},
		{"PATCH", "/v1/sessions/x", "GET, HEAD, DELETE"},
		{"GET", "/v1/reap", "POST"},
		{"DELETE", "/v1/sessions/x/files", "PUT, GET, HEAD"},
	} {
		resp := e.req(c.method, c.path, nil, testToken)
		var eb api.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || eb.Error.Kind != api.KindMethodNotAllowed {
			t.Errorf("%s %s: %d %+v", c.method, c.path, resp.StatusCode, eb.Error)
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
}
