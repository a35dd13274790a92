package kit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tai42/sandbox"
)

var _ sandbox.WorkspaceManager = (*Sandbox)(nil)

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
		return nil, sandbox.WrapForeign("list_workspaces", "provider "+s.prov.Name()+" could not list its persistent workspaces", err)
	}
	out := slices.Clone(list)
	if out == nil {
		out = []sandbox.WorkspaceInfo{}
	}
	var shared map[string]string // over a SharedLedger: every sandbox's holders
	if s.shared != nil {
		if shared, err = s.sharedKeysInUse(ctx); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	s.mu.Lock()
	for i := range out {
		out[i].InUseBy = shared[out[i].Key]
		if h := s.keys[out[i].Key]; h != nil && h.inUse(now) {
			out[i].InUseBy = h.ss.id
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b sandbox.WorkspaceInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
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
	hold := &keyHold{state: holdRemoving}
	if err := s.holdKey(ctx, key, hold, "remove_workspace"); err != nil {
		return err
	}
	defer s.releaseKey(key, hold)
	if err := store.RemoveWorkspace(ctx, key); err != nil {
		return sandbox.WrapForeign("remove_workspace", fmt.Sprintf("provider %s could not remove persistent workspace %q", s.prov.Name(), key), err)
	}
	s.log.Info("persistent workspace removed", "workspace_key", key)
	return nil
}
