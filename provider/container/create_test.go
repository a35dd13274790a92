package container_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

var errInjected = errors.New("injected failure")

// TestCreateFailsAtEachStep fails a create at each of its steps in turn,
// per runtime, user namespace mode and disk cap, for a session that makes
// the most (an image of the store, network egress, a persistent workspace)
// and one that makes the least (the host image, network none, ephemeral):
// each failure must name its step and leave nothing (the census of the
// leak tests), and the next create must succeed.
func TestCreateFailsAtEachStep(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		for _, mode := range userNSModes {
			for _, diskOff := range []bool{false, true} {
				name := "userns-" + string(mode) + "/disk-on"
				if diskOff {
					name = "userns-" + string(mode) + "/disk-off"
				}
				t.Run(name, func(t *testing.T) {
					p := newProviderMode(t, rt, mode, func(o *container.Options) { o.DiskOff = diskOff })
					createFailsAtEachStep(t, p)
				})
			}
		}
	})
}

func createFailsAtEachStep(t *testing.T, p *testProvider) {
	warmUp(t, p)
	base := takeBaseline(t)
	most := spec(containertest.Busybox, sandbox.NetworkEgress)
	most.Durability, most.WorkspaceKey = sandbox.Persistent, "steps-"+randomToken(6)
	least := spec(sandbox.HostImage, sandbox.NetworkNone)
	var ids []string
	for _, sp := range []sandbox.SessionSpec{most, least} {
		// The steps of a create of sp, as a create that succeeds asks.
		var mu sync.Mutex
		var steps []string
		container.FailCreateSteps(p.sb, func(_, step string) error {
			mu.Lock()
			defer mu.Unlock()
			steps = append(steps, step)
			return nil
		})
		sess, err := p.sb.CreateSession(ctxFor(t), sp)
		if err != nil {
			t.Fatalf("CreateSession (%s, %s), no failure injected: %v", sp.Image, sp.Network, err)
		}
		ids = append(ids, sess.ID())
		if err := sess.Destroy(ctxFor(t)); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		// The last: the agent's ping, then the warm-up of a session made
		// for a pool (which does nothing for this one).
		if len(steps) < 2 || steps[len(steps)-2] != "agent" || steps[len(steps)-1] != "warm" {
			t.Fatalf("the create's steps were %q; the last are the agent's ping and the warm-up", steps)
		}
		// A kept session's teardown, as recovery pushes it, is in the
		// order of the create's steps.
		kept := container.KeptTeardown(p.opts.UserNamespace == container.UserNamespaceOn)
		if !inOrder(kept, steps) {
			t.Errorf("recovery pushes a kept session's teardown as %q, not in the order of the create's steps %q", kept, steps)
		}
		for _, fail := range steps {
			var id string
			container.FailCreateSteps(p.sb, func(sid, step string) error {
				if step != fail {
					return nil
				}
				id = sid
				return errInjected
			})
			_, err := p.sb.CreateSession(ctxFor(t), sp)
			if id != "" {
				ids = append(ids, id)
			}
			switch {
			case err == nil:
				t.Errorf("a create failed at step %q succeeded", fail)
			case !errors.Is(err, errInjected):
				t.Errorf("a create failed at step %q: %v, want the injected failure", fail, err)
			case undo.FailedStep(err) != fail:
				t.Errorf("a create failed at step %q: the failure names step %q", fail, undo.FailedStep(err))
			case !strings.Contains(err.Error(), errInjected.Error()):
				t.Errorf("a create failed at step %q: %q does not say why", fail, err)
			}
		}
		container.FailCreateSteps(p.sb, nil)
		// Nothing left in the way of the next create (a key's workspace
		// included).
		sess, err = p.sb.CreateSession(ctxFor(t), sp)
		if err != nil {
			t.Fatalf("CreateSession after the failed ones: %v", err)
		}
		ids = append(ids, sess.ID())
		run(t, sess, "true")
		if err := sess.Destroy(ctxFor(t)); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		t.Logf("%s, network %s, %s: failed at each of %d steps: %s", sp.Image, sp.Network, sp.Durability, len(steps), strings.Join(steps, ", "))
	}
	if slices.Contains(ids, "") {
		t.Fatalf("a session id is empty: %q", ids)
	}
	checkNoLeaks(t, p, ids, base, true)
}

// inOrder reports whether sub is a subsequence of seq: its elements there,
// in the same order.
func inOrder(sub, seq []string) bool {
	i := 0
	for _, s := range seq {
		if i < len(sub) && sub[i] == s {
			i++
		}
	}
	return i == len(sub)
}

// TestCreateRuntimeFailsAfterRun: a runtime whose run fails after it made
// the container (its state, its cgroup, PID 1 running) has the create
// undo that too, not only the steps before it: the fault injection of
// TestCreateFailsAtEachStep fails steps before they run, never inside the
// runtime. The runtime here is a wrapper named as the real one that runs
// it and then exits 1, while the test's flag file exists.
func TestCreateRuntimeFailsAfterRun(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		realBin, err := exec.LookPath(rt)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		flag, wrapper := filepath.Join(dir, "fail"), filepath.Join(dir, rt)
		// "$3": the wrapper is called as RUNTIME --root DIR run ...
		script := fmt.Sprintf(`#!/bin/sh
%q "$@"
rc=$?
if [ "$3" = run ] && [ -e %q ]; then
	echo "tai42 test: the runtime fails after its run" >&2
	exit 1
fi
exit $rc
`, realBin, flag)
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		p := newProviderMode(t, rt, container.UserNamespaceOn, func(o *container.Options) { o.Runtime = wrapper })
		warmUp(t, p)
		base := takeBaseline(t)
		if err := os.WriteFile(flag, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var id string
		container.FailCreateSteps(p.sb, func(sid, _ string) error {
			mu.Lock()
			defer mu.Unlock()
			id = sid
			return nil
		})
		_, err = p.sb.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkInternal))
		container.FailCreateSteps(p.sb, nil)
		if rerr := os.Remove(flag); rerr != nil {
			t.Fatal(rerr)
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			t.Fatal("a create whose runtime failed its run succeeded")
		case undo.FailedStep(err) != "container":
			t.Errorf("a create whose runtime failed its run: the failure names step %q, want %q: %v", undo.FailedStep(err), "container", err)
		case !strings.Contains(err.Error(), "the runtime fails after its run"):
			t.Errorf("a create whose runtime failed its run: %q does not carry the runtime's own message", err)
		}
		if id == "" {
			t.Fatal("the failed create asked no step")
		}
		checkNoLeaks(t, p, []string{id}, base, true)
		// The runtime (the wrapper, now passing through) runs the next.
		sess := p.session(t, spec(containertest.Busybox, sandbox.NetworkInternal))
		run(t, sess, "true")
	})
}
