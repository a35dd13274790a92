package host_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/provider/host"
)

var errInjected = errors.New("injected failure")

// TestCreateFailsAtEachStep fails a create at each of its steps in turn,
// for an ephemeral session with the most a host session can have (as
// root: network "none", a memory cap, a tracking cgroup) and a persistent
// one: each failure must name its step and leave nothing but the
// persistent workspace, and a create after them must succeed.
func TestCreateFailsAtEachStep(t *testing.T) {
	before := countFDs(t)
	sb, state := newHost(t, host.Options{})
	ctx := context.Background()
	eph := hostSpec(sandbox.NetworkEgress)
	if os.Geteuid() == 0 {
		eph.Network, eph.MemoryMB = sandbox.NetworkNone, 128
	}
	per := eph
	per.Durability, per.WorkspaceKey = sandbox.Persistent, "steps"
	var ids []string
	for _, sp := range []sandbox.SessionSpec{eph, per} {
		var steps []string
		host.FailCreateSteps(sb, func(_, step string) error { steps = append(steps, step); return nil })
		s, err := sb.CreateSession(ctx, sp)
		if err != nil {
			t.Fatalf("CreateSession, no failure injected: %v", err)
		}
		ids = append(ids, s.ID())
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		if want := []string{"workspace", "workspace root", "tmp", "network namespace", "cgroup", "tracking"}; !slices.Equal(steps, want) {
			t.Fatalf("the create's steps were %q, want %q", steps, want)
		}
		for _, fail := range steps {
			var id string
			host.FailCreateSteps(sb, func(sid, step string) error {
				if step != fail {
					return nil
				}
				id = sid
				return errInjected
			})
			_, err := sb.CreateSession(ctx, sp)
			if id != "" {
				ids = append(ids, id)
			}
			switch {
			case err == nil:
				t.Errorf("a create failed at step %q succeeded", fail)
			case !errors.Is(err, errInjected) || !strings.Contains(err.Error(), errInjected.Error()):
				t.Errorf("a create failed at step %q: %v, want the injected failure", fail, err)
			case undo.FailedStep(err) != fail:
				t.Errorf("a create failed at step %q: the failure names step %q", fail, undo.FailedStep(err))
			}
			for _, d := range []string{"host/sessions", "host/tmp", "host/locks"} {
				ents, err := os.ReadDir(filepath.Join(state, d))
				if err != nil || len(ents) != 0 {
					t.Errorf("after a create failed at step %q, %s holds %d entries (%v)", fail, d, len(ents), err)
				}
			}
			if g := host.TrackingGroup(sb, id); g != "" {
				if _, err := os.Stat(g); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("after a create failed at step %q, its tracking cgroup %s is left (%v)", fail, g, err)
				}
			}
		}
		host.FailCreateSteps(sb, nil)
		s, err = sb.CreateSession(ctx, sp)
		if err != nil {
			t.Fatalf("CreateSession after the failed ones: %v", err)
		}
		ids = append(ids, s.ID())
		run(t, s, nil, "true")
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "host/workspaces/steps")); err != nil {
		t.Errorf("the persistent workspace is gone: %v", err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := countFDs(t); after > before {
		t.Errorf("file descriptors: %d before the sandbox, %d after it closed", before, after)
	}
	for _, id := range ids {
		cgs, _ := filepath.Glob("/sys/fs/cgroup/*/tai42-" + id)
		more, _ := filepath.Glob("/sys/fs/cgroup/*/*/tai42-" + id)
		if left := append(cgs, more...); len(left) > 0 {
			t.Errorf("session %s's cap cgroups are left: %v", id, left)
		}
	}
}
