package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

var _ sandbox.WorkspaceManager = (*Client)(nil)

// ListWorkspaces returns the daemon's persistent workspaces, sorted by key
// (GET /v1/workspaces), each with the id of the live session holding it.
// A daemon whose sandbox does not manage workspaces answers a
// *sandbox.SandboxError saying so.
func (c *Client) ListWorkspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error) {
	var list api.WorkspaceList
	if err := c.doJSON(ctx, "list_workspaces", http.MethodGet, "/v1/workspaces", nil, nil, &list); err != nil {
		return nil, err
	}
	if list.Workspaces == nil {
		list.Workspaces = []sandbox.WorkspaceInfo{}
	}
	return list.Workspaces, nil
}

// RemoveWorkspace deletes the daemon's persistent workspace key and its
// files (DELETE /v1/workspaces/{key}). A key a live session holds is a
// *sandbox.SpecRejectedError of Reason ReasonConflict naming the session;
// a key with no workspace is a *sandbox.WorkspaceNotFoundError. A key that
// is not a valid workspace_key is refused without a request, with the
// *sandbox.SandboxError the daemon would answer.
func (c *Client) RemoveWorkspace(ctx context.Context, key string) error {
	if err := sandbox.ValidWorkspaceKey(key); err != nil {
		return sandbox.Errorf("remove_workspace", "%v; no workspace can have it", err)
	}
	return c.doJSON(ctx, "remove_workspace", http.MethodDelete, "/v1/workspaces/"+url.PathEscape(key), nil, nil, nil)
}
