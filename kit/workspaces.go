package kit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tai42/sandbox"
)

var _ sandbox.WorkspaceManager = (*Sandbox)(nil)

// removalID is the id of the stand-in that holds a workspace_key in the
// kit's key map while its workspace is removed: a create of that key meets
// it and is refused as a conflict (claim), naming it by this id. A real
// session id never has this shape.
const removalID = "(none: the workspace is being removed)"

// ListWorkspaces implements [sandbox.WorkspaceManager]: the provider's
// persistent workspaces (through its [WorkspaceStore]), sorted by key,
// each with InUseBy set to the id of the session holding it when that
// session is live (created, not being destroyed, not expired). A provider
// without a WorkspaceStore keeps no workspaces the kit can see: the list is
// empty. A failure of the provider is a *sandbox.SandboxError. Safe for
// concurrent use; the in-use marks are as of the moment the provider's
// listing returned.
func (s *Sandbox) ListWorkspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error) {
	store, ok := s.prov.(WorkspaceStore)
	if !ok {
		return []sandbox.WorkspaceInfo{}, nil
	}
	list, err := store.Workspaces(ctx)
	if err != nil {
		var se *sandbox.SandboxError
		if !errors.As(err, &se) {
			err = sandbox.WrapError("list_workspaces", "provider "+s.prov.Name()+" could not list its persistent workspaces", err)
		}
		return nil, err
	}
	out := slices.Clone(list)
	if out == nil {
		out = []sandbox.WorkspaceInfo{}
	}
	now := time.Now()
	s.mu.Lock()
	for i := range out {
		out[i].InUseBy = ""
		if h := s.keys[out[i].Key]; h != nil && holds(h, now) {
			out[i].InUseBy = h.id
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b sandbox.WorkspaceInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// holds reports whether h, a holder of s.keys, is a live session: created,
// not being destroyed, not expired at now. Call with s.mu held.
func holds(h *session, now time.Time) bool {
	return h.res != nil && !h.destroying && now.Before(h.expires)
}

// RemoveWorkspace implements [sandbox.WorkspaceManager]: it deletes the
// persistent workspace key through the provider's [WorkspaceStore].
//
// Errors: a key that is not a valid workspace_key is a *sandbox.SandboxError
// (nothing is touched); a key a live session holds, or one being created,
// is a *sandbox.SpecRejectedError of Field "workspace_key" and Reason
// ReasonConflict naming the session (destroy it first), as is a key whose
// removal is already under way; a key with no workspace (or a provider
// without a WorkspaceStore) is a *sandbox.WorkspaceNotFoundError; a closed
// sandbox and a failure of the provider are *sandbox.SandboxError.
//
// A holder that has expired, or whose teardown has begun, is torn down
// first (its teardown finished), as a create of the key would. While the
// provider removes the workspace the kit holds the key: a concurrent
// create of it is refused as a conflict rather than handed a workspace
// that is going away. Safe for concurrent use.
func (s *Sandbox) RemoveWorkspace(ctx context.Context, key string) error {
	if err := sandbox.ValidWorkspaceKey(key); err != nil {
		return sandbox.Errorf("remove_workspace", "%v; no workspace can have it", err)
	}
	store, ok := s.prov.(WorkspaceStore)
	if !ok {
		return &sandbox.WorkspaceNotFoundError{Key: key}
	}
	stand := &session{kit: s, id: removalID, spec: sandbox.SessionSpec{Durability: sandbox.Persistent, WorkspaceKey: key},
		gone: make(chan struct{})}
	if err := s.holdForRemoval(ctx, stand); err != nil {
		return err
	}
	defer s.release(stand)
	if err := store.RemoveWorkspace(ctx, key); err != nil {
		var se *sandbox.SandboxError
		if !errors.As(err, &se) {
			err = sandbox.WrapError("remove_workspace", fmt.Sprintf("provider %s could not remove persistent workspace %q", s.prov.Name(), key), err)
		}
		return err
	}
	s.log.Info("persistent workspace removed", "workspace_key", key)
	return nil
}

// holdForRemoval puts stand in s.keys for its key, tearing down an expired
// or destroying holder first; a live holder, one being created and another
// removal are a conflict.
func (s *Sandbox) holdForRemoval(ctx context.Context, stand *session) error {
	key := stand.spec.WorkspaceKey
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return sandbox.Errorf("remove_workspace", "the sandbox is closed")
		}
		holder := s.keys[key]
		if holder == nil {
			s.keys[key] = stand
			s.mu.Unlock()
			return nil
		}
		live := holds(holder, time.Now())
		creating := holder.res == nil
		s.mu.Unlock()
		switch {
		case creating && holder.id == removalID:
			return &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict,
				Message: fmt.Sprintf("persistent workspace %q is already being removed by another call", key)}
		case creating:
			return &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict,
				Message: fmt.Sprintf("persistent workspace %q is held by session %s, which is being created; destroy that session first", key, holder.id)}
		case live:
			return &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict,
				Message: fmt.Sprintf("persistent workspace %q is in use by live session %s; destroy that session first", key, holder.id)}
		}
		// Expired or being destroyed: finish its teardown, then try again.
		if err := s.destroy(ctx, holder); err != nil {
			return sandbox.WrapError("remove_workspace", fmt.Sprintf("workspace %q: tearing down expired session %s failed", key, holder.id), err)
		}
	}
}
