package host_test

import (
	"context"
	"os"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/sandboxtest"
)

// TestConformance runs the whole contract suite against the host runner.
// Network "none" and caps need root (a network namespace, a cgroup); as
// another user they are declared unhonoured, so the suite checks that they
// are rejected instead.
func TestConformance(t *testing.T) {
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
	sandboxtest.Run(t, func(t *testing.T, c sandboxtest.Config) sandbox.Sandbox {
		sb, err := host.New(host.Options{StateDir: t.TempDir(), Policy: c.Policy, ReapInterval: c.ReapInterval})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := sb.Close(context.Background()); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return sb
	}, opts)
}
