// Package hostsuite is what the conformance suite needs of the host
// runner, shared by the host's own conformance test and the tests that run
// the suite through the daemon's API (client): the options the host
// honours on this machine, and a fresh host runner per clause.
package hostsuite

import (
	"context"
	"os"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/sandboxtest"
)

// Options are the host runner's suite options. Network "none" and caps need
// root (a network namespace, a cgroup); as another user they are declared
// unhonoured, so the suite checks that they are rejected instead.
func Options(t testing.TB) sandboxtest.Options {
	opts := sandboxtest.Options{
		Image:                           host.Image,
		Isolation:                       sandbox.IsolationNone,
		Networks:                        []sandbox.Network{sandbox.NetworkEgress},
		Durable:                         true,
		AbsoluteOutsideWorkspaceRefused: true,
		KillStopsLeftovers:              true,
	}
	if os.Geteuid() == 0 {
		opts.Networks = append(opts.Networks, sandbox.NetworkNone)
		opts.Caps = true
	} else {
		t.Log("not root: network none and caps are checked as rejected, not as enforced")
	}
	return opts
}

// New builds a host runner with cfg's policy and reap interval in a
// temporary state directory; it is closed (every session destroyed) at
// cleanup.
func New(t testing.TB, cfg sandboxtest.Config) *kit.Sandbox {
	t.Helper()
	sb, err := host.New(host.Options{StateDir: t.TempDir(), Policy: cfg.Policy, ReapInterval: cfg.ReapInterval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the host sandbox: %v", err)
		}
	})
	return sb
}
