package sandboxtest

import (
	"errors"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
)

func (s *suite) workspaceClauses() []clause {
	return []clause{
		{"ListAndRemove", s.testWorkspaces},
	}
}

// findWorkspace lists the workspaces and returns key's, if listed.
func findWorkspace(t *testing.T, wm sandbox.WorkspaceManager, key string) (sandbox.WorkspaceInfo, bool) {
	t.Helper()
	list, err := wm.ListWorkspaces(callContext(t))
	if err != nil {
		t.Fatalf("ListWorkspaces: %v", err)
	}
	for i, w := range list {
		if i > 0 && list[i-1].Key >= w.Key {
			t.Errorf("ListWorkspaces is not sorted by key: %q before %q", list[i-1].Key, w.Key)
		}
	}
	for _, w := range list {
		if w.Key == key {
			return w, true
		}
	}
	return sandbox.WorkspaceInfo{}, false
}

// A sandbox that manages persistent workspaces lists each with its size
// and the live session holding it, refuses to remove a held one (naming
// the session, the files intact), removes a free one with its files, and
// answers a missing key with a *WorkspaceNotFoundError.
func (s *suite) testWorkspaces(t *testing.T) {
	s.needDurable(t)
	raw := s.factory(t, Config{Policy: permissive})
	wm, ok := raw.(sandbox.WorkspaceManager)
	if !ok {
		t.Skipf("%T does not implement sandbox.WorkspaceManager", raw)
	}
	sb := &guardedSandbox{g: guard{t}, sb: raw}
	ctx := s.testContext(t)
	key := persistent()
	name := s.spec(key).WorkspaceKey
	sess := s.newSession(t, sb, key)
	data := randomBytes(8 << 10)
	mustPut(t, ctx, sess, "kept/data.bin", data)

	w, ok := findWorkspace(t, wm, name)
	if !ok {
		t.Fatalf("ListWorkspaces does not list %q, which a live session writes in", name)
	}
	if w.InUseBy != sess.ID() || w.SizeBytes < int64(len(data)) {
		t.Errorf("workspace %q listed as in use by %q, %d bytes; want %q, at least %d", name, w.InUseBy, w.SizeBytes, sess.ID(), len(data))
	}
	err := wm.RemoveWorkspace(ctx, name)
	wantRejected(t, err, sandbox.ReasonConflict, "workspace_key", "RemoveWorkspace of a workspace a live session holds")
	if err != nil && !strings.Contains(err.Error(), sess.ID()) {
		t.Errorf("the refusal %q does not name the live session %s", err, sess.ID())
	}
	if got := mustGet(t, ctx, sess, "kept/data.bin"); len(got) != len(data) {
		t.Errorf("after a refused removal the file reads %d bytes; want %d", len(got), len(data))
	}

	if err := sess.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if w, ok := findWorkspace(t, wm, name); !ok || w.InUseBy != "" {
		t.Errorf("after its session's destroy, workspace %q is listed %v, in use by %q; want listed, in use by nobody", name, ok, w.InUseBy)
	}
	if err := wm.RemoveWorkspace(ctx, name); err != nil {
		t.Fatalf("RemoveWorkspace of a free workspace: %v", err)
	}
	if _, ok := findWorkspace(t, wm, name); ok {
		t.Errorf("workspace %q is listed after its removal", name)
	}
	err = wm.RemoveWorkspace(ctx, name)
	var nf *sandbox.WorkspaceNotFoundError
	if !errors.Is(err, sandbox.ErrWorkspaceNotFound) || !errors.As(err, &nf) || nf.Key != name || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("RemoveWorkspace of a removed workspace: %v; want a *WorkspaceNotFoundError for %q", err, name)
	}
	next := s.newSession(t, sb, key)
	if exists(t, ctx, next, "kept/data.bin") {
		t.Error("a new session on a removed workspace's key still sees its files")
	}
}
