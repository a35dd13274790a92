package host_test

import (
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/hostsuite"
	"github.com/tai42/sandbox/sandboxtest"
)

// TestConformance runs the whole contract suite against the host runner.
// Network "none" and caps need root; as another user the suite checks that
// they are rejected instead (hostsuite.Options).
func TestConformance(t *testing.T) {
	opts := hostsuite.Options(t)
	opts.Restartable = hostsuite.Restartable
	sandboxtest.Run(t, func(t *testing.T, c sandboxtest.Config) sandbox.Sandbox {
		return hostsuite.New(t, c)
	}, opts)
}
