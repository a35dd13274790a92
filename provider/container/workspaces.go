package container

import (
	"context"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/wsdir"
	"github.com/tai42/sandbox/kit"
)

var _ kit.WorkspaceStore = (*provider)(nil)

// Workspaces implements kit.WorkspaceStore: the directories under
// <state>/container/workspaces.
func (p *provider) Workspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error) {
	return wsdir.Store{Dir: p.perDir}.List(ctx)
}

// RemoveWorkspace implements kit.WorkspaceStore.
func (p *provider) RemoveWorkspace(ctx context.Context, key string) error {
	return wsdir.Store{Dir: p.perDir}.Remove(ctx, key)
}
