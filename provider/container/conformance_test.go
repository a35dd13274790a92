package container_test

import (
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container/containertest"
	"github.com/tai42/sandbox/sandboxtest"
)

func TestMain(m *testing.M) { containertest.Main(m) }

// TestConformance runs the whole contract suite against the container
// provider, on runc and crun, for the built-in host image and for an
// imported image (busybox, packed as an OCI layout by the test).
func TestConformance(t *testing.T) {
	containertest.Require(t)
	for _, rt := range []string{"runc", "crun"} {
		for _, image := range []string{"host", containertest.Busybox} {
			t.Run(rt+"/"+image, func(t *testing.T) {
				if !containertest.HasRuntime(rt) {
					t.Skipf("%s is not installed (apt-get install -y %s)", rt, rt)
				}
				so := containertest.SuiteOptions(image)
				so.Restartable = containertest.Restartable(rt)
				sandboxtest.Run(t, func(t *testing.T, c sandboxtest.Config) sandbox.Sandbox {
					opts := containertest.Options(t, rt, c.Policy)
					opts.ReapInterval = c.ReapInterval
					opts.Logger = c.Logger
					return containertest.New(t, opts)
				}, so)
			})
		}
	}
}
