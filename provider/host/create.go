package host

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/kit"
)

// Create makes a session as the steps below, in order. Each step that
// makes something pushes its undo on the session's teardown stack: a step
// that fails has the steps before it undone, last first, and a session
// made keeps the stack for its Destroy, which unwinds it the same way.
func (p *provider) Create(_ context.Context, req kit.CreateRequest) (_ kit.Resources, err error) {
	r := &session{p: p, id: req.ID, spec: req.Spec}
	if p.faults != nil {
		r.teardown.Fault = func(step string) error { return p.faults(req.ID, step) }
	}
	// First: from here on no other process sweeps what this one makes.
	if r.lock, err = p.locks.Hold(req.ID); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = r.cleanup() // the create's error is the one to report
		}
	}()
	if err := r.teardown.Run(
		undo.Step{Name: "workspace", Do: r.makeWorkspace},
		undo.Step{Name: "workspace root", Do: r.openRoot},
		undo.Step{Name: "tmp", Do: func() (undo.Func, error) { return r.makeTmp(os.Mkdir) }},
		undo.Step{Name: "network namespace", Do: r.takeNetns},
		undo.Step{Name: "cgroup", Do: r.makeCgroup},
		undo.Step{Name: "tracking", Do: r.makeGroup},
	); err != nil {
		return nil, err
	}
	return r, nil
}

// makeWorkspace makes the session's workspace: its key's directory (made
// at the key's first create, kept), or one of its own.
func (r *session) makeWorkspace() (undo.Func, error) {
	if r.spec.Durability == sandbox.Persistent {
		r.ws = filepath.Join(r.p.Store.Dir, r.spec.WorkspaceKey)
		return nil, os.MkdirAll(r.ws, 0o700)
	}
	r.ws = filepath.Join(r.p.ephDir, r.id)
	if err := os.Mkdir(r.ws, 0o700); err != nil {
		return nil, err
	}
	return r.removeWorkspace, nil
}

// removeWorkspace is the undo of an ephemeral workspace.
func (r *session) removeWorkspace(context.Context) error { return oscmd.RemoveAll(r.ws) }

// openRoot opens the workspace as an os.Root, through which every file
// operation goes.
func (r *session) openRoot() (undo.Func, error) {
	var err error
	if r.root, err = os.OpenRoot(r.ws); err != nil {
		return nil, err
	}
	return r.closeRoot, nil
}

func (r *session) closeRoot(context.Context) error {
	r.root.Close()
	return nil
}

// makeTmp makes the session's TMPDIR with mkdir (os.Mkdir at a create;
// os.MkdirAll at a reattach, where it may be left).
func (r *session) makeTmp(mkdir func(string, os.FileMode) error) (undo.Func, error) {
	r.tmp = filepath.Join(r.p.tmpDir, r.id)
	if err := mkdir(r.tmp, 0o700); err != nil {
		return nil, err
	}
	return r.removeTmp, nil
}

func (r *session) removeTmp(context.Context) error { return oscmd.RemoveAll(r.tmp) }

// takeNetns takes a network namespace of the pool for network "none".
func (r *session) takeNetns() (undo.Func, error) {
	if r.spec.Network != sandbox.NetworkNone {
		return nil, nil
	}
	var err error
	if r.netns, err = r.p.netPool.Take(); err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	return r.closeNetns, nil
}

func (r *session) closeNetns(context.Context) error {
	r.netns.Close()
	return nil
}

// makeCgroup makes the cgroup of the session's caps.
func (r *session) makeCgroup() (undo.Func, error) {
	if r.spec.CPU <= 0 && r.spec.MemoryMB <= 0 {
		return nil, nil
	}
	var err error
	if r.cg, err = r.p.cgroups.create("tai42-"+r.id, r.spec.CPU, r.spec.MemoryMB); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return r.destroyCgroup, nil
}

func (r *session) destroyCgroup(context.Context) error { return r.cg.destroy() }

// makeGroup makes the session's tracking cgroup, where its execs start.
// It is the last step: its undo, the teardown's first, ends every process
// of the session, the ones that left their process group included, before
// anything they use goes.
func (r *session) makeGroup() (undo.Func, error) {
	if r.p.track == nil {
		return nil, nil
	}
	var err error
	if r.grp, err = r.p.track.create(r.id); err != nil {
		return nil, err
	}
	return r.destroyGroup, nil
}

func (r *session) destroyGroup(context.Context) error { return r.grp.destroy() }
