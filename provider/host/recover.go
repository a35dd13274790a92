package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/sessionlock"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/kit"
)

var (
	_ kit.Recoverer   = (*provider)(nil)
	_ kit.Recoverable = (*session)(nil)
)

// handle is what the ledger keeps of a host session: where its workspace
// and temp directory are.
type ledgerHandle struct {
	Workspace string `json:"workspace"`
	Tmp       string `json:"tmp"`
}

// Handle implements kit.Recoverable.
func (r *session) Handle() json.RawMessage {
	b, _ := json.Marshal(ledgerHandle{Workspace: r.ws, Tmp: r.tmp})
	return b
}

// Recover implements kit.Recoverer. What is the runner's on the machine is
// found from its state directory: every session it made has a temp
// directory there (made before its cgroups), and an ephemeral one a
// workspace directory. For each, its processes are ended (through its
// tracking cgroup, and its caps cgroups), and for a session not kept
// everything is removed but a persistent workspace. A kept session is
// made again around its workspace: new tracking and caps cgroups, a new
// network namespace; the execs that were running are gone (their
// processes were ended).
//
// Interrupted put_file calls leave temporary files (.tai42-put-*) beside
// their targets; they are removed from the kept sessions' workspaces and
// every persistent workspace. Without a cgroup v2 hierarchy to track
// processes (a runner that is not root), the processes of a killed runner
// cannot be found: they are left running, and the log says so.
func (p *provider) Recover(ctx context.Context, keep []kit.Kept) ([]kit.Recovered, error) {
	kept := make(map[string]kit.Kept, len(keep))
	for _, k := range keep {
		kept[k.ID] = k
	}
	ids := map[string]bool{}
	for _, dir := range []string{p.tmpDir, p.ephDir} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("host: reading %s: %w", dir, err)
		}
		for _, e := range entries {
			ids[e.Name()] = true
		}
	}
	locked, err := p.locks.IDs()
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	for _, id := range locked {
		ids[id] = true
	}
	// A session whose lock another live process holds is that process's
	// (concurrent runs share a state directory): left alone.
	held := map[string]*sessionlock.Lock{}
	for id := range ids {
		l, err := p.locks.Hold(id)
		if err != nil {
			delete(ids, id)
			continue
		}
		held[id] = l
	}
	if p.trackErr != nil && len(ids) > 0 {
		p.log().Warn("host: processes of sessions an earlier run left cannot be found and are left running: their processes are not tracked (no writable cgroup v2 hierarchy)",
			"reason", p.trackErr.Error())
	}
	var errs []error
	for id := range ids {
		// Every process of an earlier run's session ends, kept or not.
		if p.track != nil {
			if err := killRemove(filepath.Join(p.track.parent, id)); err != nil {
				errs = append(errs, err)
			}
		}
		if p.cgroups != nil {
			if err := p.cgroups.remove("tai42-" + id); err != nil {
				errs = append(errs, err)
			}
		}
		if _, ok := kept[id]; ok {
			continue
		}
		gone := true
		for _, d := range []string{filepath.Join(p.tmpDir, id), filepath.Join(p.ephDir, id)} {
			if err := oscmd.RemoveAll(d); err != nil {
				errs = append(errs, err)
				gone = false
			}
		}
		held[id].Release(gone)
		delete(held, id)
		p.log().Info("host: removed a session an earlier run left", "id", id)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("host: sweeping what an earlier run left: %w", err)
	}
	if err := p.removePutTemps(ctx, p.Store.Dir); err != nil {
		p.log().Warn("host: cannot remove interrupted put_file temporaries from the persistent workspaces", "err", err)
	}
	out := make([]kit.Recovered, 0, len(keep))
	for _, k := range keep {
		lock := held[k.ID]
		if lock == nil {
			if lock, err = p.locks.Hold(k.ID); err != nil {
				out = append(out, kit.Recovered{ID: k.ID, Err: err})
				continue
			}
		}
		res, err := p.reattach(ctx, k, lock)
		if err != nil {
			// Nothing of it may stay but a persistent workspace.
			for _, d := range []string{filepath.Join(p.tmpDir, k.ID), filepath.Join(p.ephDir, k.ID)} {
				_ = oscmd.RemoveAll(d)
			}
			lock.Release(true)
		}
		out = append(out, kit.Recovered{ID: k.ID, Res: res, Err: err})
	}
	return out, nil
}

// reattach makes a kept session's resources again around its workspace,
// with Create's steps (the workspace is found, not made): its teardown is
// a created session's. On error the caller removes what is left and
// releases lock.
func (p *provider) reattach(ctx context.Context, k kit.Kept, lock *sessionlock.Lock) (_ kit.Resources, err error) {
	if err := validID(k.ID); err != nil {
		return nil, err
	}
	r := &session{p: p, id: k.ID, spec: k.Spec}
	defer func() {
		if err != nil {
			_ = r.cleanup()
		} else {
			r.lock = lock
		}
	}()
	if err := r.teardown.Run(
		undo.Step{Name: "workspace", Do: func() (undo.Func, error) { return r.findWorkspace(k.Handle) }},
		undo.Step{Name: "workspace root", Do: r.openRoot},
		undo.Step{Name: "put temps", Do: func() (undo.Func, error) {
			if k.Spec.Durability == sandbox.Persistent {
				return nil, nil // Recover removed them from every persistent workspace
			}
			if err := p.removePutTemps(ctx, r.ws); err != nil {
				return nil, fmt.Errorf("removing interrupted put_file temporaries: %w", err)
			}
			return nil, nil
		}},
		undo.Step{Name: "tmp", Do: func() (undo.Func, error) { return r.makeTmp(os.MkdirAll) }},
		undo.Step{Name: "network namespace", Do: func() (undo.Func, error) {
			if k.Spec.Network == sandbox.NetworkNone && p.netErr != nil {
				return nil, fmt.Errorf("network \"none\" needs a new network namespace, which this host refuses now: %w", p.netErr)
			}
			return r.takeNetns()
		}},
		undo.Step{Name: "cgroup", Do: func() (undo.Func, error) {
			if (k.Spec.CPU > 0 || k.Spec.MemoryMB > 0) && p.cgErr != nil {
				return nil, fmt.Errorf("its caps need a writable cgroup tree: %w", p.cgErr)
			}
			return r.makeCgroup()
		}},
		undo.Step{Name: "tracking", Do: r.makeGroup},
	); err != nil {
		return nil, err
	}
	return r, nil
}

// findWorkspace is a kept session's workspace, where its ledger handle
// (raw) says it is; an ephemeral one is the session's, removed at its
// teardown.
func (r *session) findWorkspace(raw json.RawMessage) (undo.Func, error) {
	var remove undo.Func
	if r.spec.Durability == sandbox.Persistent {
		r.ws = filepath.Join(r.p.Store.Dir, r.spec.WorkspaceKey)
	} else {
		r.ws = filepath.Join(r.p.ephDir, r.id)
		remove = r.removeWorkspace
	}
	var h ledgerHandle
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &h); err != nil {
			return nil, fmt.Errorf("its ledger handle is unreadable: %w", err)
		}
		if h.Workspace != r.ws {
			return nil, fmt.Errorf("its workspace was %s; this runner keeps it at %s", h.Workspace, r.ws)
		}
	}
	if fi, err := os.Lstat(r.ws); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("its workspace %s is gone", r.ws)
	}
	return remove, nil
}

// removePutTemps removes the temporary files of put_file calls that an
// earlier run did not finish, anywhere below dir, without following
// symlinks, but for those of a writer alive now (another process sharing
// the state directory). Only Recover calls it, before any put of this run.
func (p *provider) removePutTemps(ctx context.Context, dir string) error {
	return oscmd.RemoveTemps(ctx, dir, putTempPrefix, func(name string) bool { return !writerAlive(name) })
}

// writerAlive reports whether the put_file temporary name was made by a
// process alive now other than this one: another process sharing the state
// directory may be writing it. (Names are .tai42-put-<pid>-<n>.)
func writerAlive(name string) bool {
	pidStr, _, _ := strings.Cut(strings.TrimPrefix(name, putTempPrefix), "-")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM)
}

// validID refuses an id that could name a path outside the runner's
// directories.
func validID(id string) error {
	if !strings.HasPrefix(id, "sb-") || !filepath.IsLocal(id) || strings.ContainsAny(id, `/\`) {
		return fmt.Errorf("host: %q is not a session id", id)
	}
	return nil
}
