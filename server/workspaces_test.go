package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
)

// fakeWorkspaces serves a kit sandbox whose workspace calls it answers
// itself: list with list, remove with rmErr, recording the keys removed.
type fakeWorkspaces struct {
	*kit.Sandbox
	mu      sync.Mutex
	list    []sandbox.WorkspaceInfo
	rmErr   error
	removed []string
}

func (f *fakeWorkspaces) ListWorkspaces(context.Context) ([]sandbox.WorkspaceInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.list, nil
}

func (f *fakeWorkspaces) RemoveWorkspace(_ context.Context, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, key)
	return f.rmErr
}

func (f *fakeWorkspaces) set(list []sandbox.WorkspaceInfo, rmErr error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list, f.rmErr, f.removed = list, rmErr, nil
}

func (f *fakeWorkspaces) removedKeys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.removed...)
}

func TestWorkspaceRoutes(t *testing.T) {
	base := newEnv(t)
	f := &fakeWorkspaces{Sandbox: base.sb}
	e := newEnvOn(t, base.sb, f)

	// An empty list is [] on the wire, never null.
	b := e.call("GET", "/v1/workspaces", nil, http.StatusOK, nil)
	if strings.TrimSpace(string(b)) != `{"workspaces":[]}` {
		t.Errorf("an empty list: %s", b)
	}
	mod := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	f.set([]sandbox.WorkspaceInfo{{Key: "a", SizeBytes: 12, ModifiedAt: mod, InUseBy: "sb-1"}, {Key: "b", ModifiedAt: mod}}, nil)
	b = e.call("GET", "/v1/workspaces", nil, http.StatusOK, nil)
	want := `{"workspaces":[{"key":"a","size_bytes":12,"modified_at":"2025-01-02T03:04:05Z","in_use_by":"sb-1"},{"key":"b","size_bytes":0,"modified_at":"2025-01-02T03:04:05Z"}]}`
	if strings.TrimSpace(string(b)) != want {
		t.Errorf("GET /v1/workspaces:\n got  %s\n want %s", b, want)
	}

	// Removal: 204 with the key as the path names it, unescaped.
	resp := e.req("DELETE", "/v1/workspaces/proj", nil, testToken)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE: %d, want 204", resp.StatusCode)
	}
	resp = e.req("DELETE", "/v1/workspaces/..%2Fx", nil, testToken)
	resp.Body.Close()
	if got := f.removedKeys(); len(got) != 2 || got[0] != "proj" || got[1] != "../x" {
		t.Errorf("the sandbox was asked to remove %q; want [proj ../x] (validating is its job)", got)
	}

	// Errors through the kind table.
	f.set(nil, &sandbox.WorkspaceNotFoundError{Key: "gone"})
	er := e.callErr("DELETE", "/v1/workspaces/gone", nil, http.StatusNotFound, api.KindWorkspaceNotFound)
	if er.WorkspaceKey != "gone" || er.Op != "remove_workspace" {
		t.Errorf("workspace_not_found: %+v", er)
	}
	f.set(nil, &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict, Message: "in use by live session sb-9"})
	er = e.callErr("DELETE", "/v1/workspaces/busy", nil, http.StatusUnprocessableEntity, api.KindSpecRejected)
	if er.Field != "workspace_key" || er.Reason != string(sandbox.ReasonConflict) || er.Op != "remove_workspace" || !strings.Contains(er.Message, "sb-9") {
		t.Errorf("a conflict: %+v; want field workspace_key, reason conflict, op remove_workspace, naming the session", er)
	}

	// Without a token: nothing is asked of the sandbox.
	f.set(nil, nil)
	for _, c := range []struct{ method, path string }{{"GET", "/v1/workspaces"}, {"DELETE", "/v1/workspaces/proj"}} {
		resp := e.req(c.method, c.path, nil, "")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %d", c.method, c.path, resp.StatusCode)
		}
	}
	if got := f.removedKeys(); len(got) != 0 {
		t.Errorf("a refused request removed %v", got)
	}
	// Other methods: 405 with Allow.
	resp = e.req("PUT", "/v1/workspaces/proj", nil, testToken)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "DELETE" {
		t.Errorf("PUT /v1/workspaces/proj: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// The kit behind the route refuses a key that is not one, whatever the
// path's escaping made of it, with a sandbox_error; a valid key with no
// workspace is workspace_not_found.
func TestWorkspaceRoutesOnKit(t *testing.T) {
	e := newEnv(t)
	var list api.WorkspaceList
	e.call("GET", "/v1/workspaces", nil, http.StatusOK, &list)
	if list.Workspaces == nil || len(list.Workspaces) != 0 {
		t.Errorf("GET /v1/workspaces on a fresh daemon: %+v", list)
	}
	for _, p := range []string{"..%2Fx", "a%2Fb", "%2E%2E", "x%00y", strings.Repeat("k", sandbox.MaxWorkspaceKey+1)} {
		er := e.callErr("DELETE", "/v1/workspaces/"+p, nil, http.StatusBadRequest, api.KindSandbox)
		if er.Op != "remove_workspace" || !strings.Contains(er.Message, "workspace_key") {
			t.Errorf("DELETE /v1/workspaces/%s: %+v; want a remove_workspace error about the key", p, er)
		}
	}
	er := e.callErr("DELETE", "/v1/workspaces/never-made", nil, http.StatusNotFound, api.KindWorkspaceNotFound)
	if er.WorkspaceKey != "never-made" {
		t.Errorf("workspace_not_found without its key: %+v", er)
	}
}

// A daemon serving a sandbox that does not manage workspaces says so.
func TestWorkspacesNotManaged(t *testing.T) {
	base := newEnv(t)
	plain := struct{ sandbox.Sandbox }{base.sb} // only the contract's methods
	e := newEnvOn(t, base.sb, plain)
	for _, c := range []struct{ method, path, op string }{
		{"GET", "/v1/workspaces", "list_workspaces"},
		{"DELETE", "/v1/workspaces/proj", "remove_workspace"},
	} {
		er := e.callErr(c.method, c.path, nil, http.StatusBadRequest, api.KindSandbox)
		if er.Op != c.op || !strings.Contains(er.Message, "does not manage persistent workspaces") || !strings.Contains(er.Message, "host") {
			t.Errorf("%s %s: %+v; want op %s saying the sandbox (provider host) does not manage workspaces", c.method, c.path, er, c.op)
		}
	}
	var eb api.ErrorBody
	_ = json.Unmarshal(e.call("GET", "/v1/workspaces", nil, http.StatusBadRequest, nil), &eb)
	if err := eb.Error.Err(); !strings.Contains(err.Error(), "does not manage persistent workspaces") {
		t.Errorf("the rebuilt error: %v", err)
	}
}
