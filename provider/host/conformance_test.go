package host_test

import (
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/host/hosttest"
	"github.com/tai42/sandbox/sandboxtest"
)

// TestConformance runs the whole contract suite against the host runner.
// Network "none" and caps need root; as another user the suite checks that
// they are rejected instead (hosttest.Options).
func TestConformance(t *testing.T) {
	opts := hosttest.Options(t)
	opts.Restartable = hosttest.Restartable
	sandboxtest.Run(t, func(t *testing.T, c sandboxtest.Config) sandbox.Sandbox {
		return hosttest.New(t, c)
	}, opts)
}
