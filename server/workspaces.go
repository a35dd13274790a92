package server

import (
	"net/http"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// workspaces returns the served sandbox as a [sandbox.WorkspaceManager],
// or a *sandbox.SandboxError for op saying this daemon's sandbox does not
// manage persistent workspaces.
func (s *Server) workspaces(op string) (sandbox.WorkspaceManager, error) {
	if wm, ok := s.sb.(sandbox.WorkspaceManager); ok {
		return wm, nil
	}
	which := "this daemon's sandbox"
	if s.provider != "" {
		which += " (provider " + s.provider + ")"
	}
	return nil, sandbox.Errorf(op, "%s does not manage persistent workspaces (it does not implement sandbox.WorkspaceManager): it cannot list or remove them", which)
}

// listWorkspaces is GET /v1/workspaces.
func (s *Server) listWorkspaces(w http.ResponseWriter, r *http.Request) {
	wm, err := s.workspaces("list_workspaces")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	infos, err := wm.ListWorkspaces(r.Context())
	if err != nil {
		s.writeError(w, r, s.callError(r, err))
		return
	}
	if infos == nil {
		infos = []sandbox.WorkspaceInfo{}
	}
	writeJSON(w, http.StatusOK, api.WorkspaceList{Workspaces: infos})
}

// removeWorkspace is DELETE /v1/workspaces/{key}. A conflict (a live
// session holds the key) is spec_rejected with op remove_workspace.
func (s *Server) removeWorkspace(w http.ResponseWriter, r *http.Request) {
	wm, err := s.workspaces("remove_workspace")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := wm.RemoveWorkspace(r.Context(), r.PathValue("key")); err != nil {
		s.writeError(w, r, s.callError(r, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
