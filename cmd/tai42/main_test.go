package main

import (
	"os"
	"testing"

	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

// kubetestEnv opts this package's tests into the harness cluster: its
// TestMain then starts one (minutes, once built) for TestKubeDaemons.
// Unset, the package's other tests pay nothing for it and
// TestKubeDaemons skips, saying so.
const kubetestEnv = "TAI42_KUBETEST"

func TestMain(m *testing.M) {
	// The CLI's tests run on the host runner unless they name a provider:
	// the default depends on the machine (the container provider where an
	// OCI runtime is installed and we are root), and the container
	// provider runs its own executable as each container's agent, and a
	// test binary is not tai42.
	// The container provider's CLI paths have tests that name it.
	defaultProvider = host.Name
	if os.Getenv(kubetestEnv) != "" {
		kubetest.Main(m)
		return
	}
	os.Exit(m.Run())
}
