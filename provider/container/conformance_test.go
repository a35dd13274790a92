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

// TestConformancePool runs the whole contract suite with a warm pool on,
// every create of a pooled shape (the image on each tier the clause's
// policy lets in) served from it: a session made ahead and handed out is
// indistinguishable from one made cold. On crun with busybox and on runc
// with the host image, the other two pairings of TestConformance.
func TestConformancePool(t *testing.T) {
	containertest.Require(t)
	var hits containertest.PoolHits
	for _, v := range []struct{ rt, image string }{{"crun", containertest.Busybox}, {"runc", "host"}} {
		t.Run(v.rt+"/"+v.image, func(t *testing.T) {
			if !containertest.HasRuntime(v.rt) {
				t.Skipf("%s is not installed (apt-get install -y %s)", v.rt, v.rt)
			}
			so := containertest.SuiteOptions(v.image)
			sandboxtest.Run(t, func(t *testing.T, c sandboxtest.Config) sandbox.Sandbox {
				opts := containertest.Options(t, v.rt, c.Policy)
				opts.ReapInterval = c.ReapInterval
				opts.Logger = c.Logger
				containertest.Pool(&opts, v.image)
				sb := containertest.New(t, opts)
				containertest.ServedFromPool(t, sb, &hits)
				return sb
			}, so)
		})
	}
	t.Cleanup(func() {
		if !t.Skipped() && hits.Load() == 0 {
			t.Error("no create was served from a pool")
		}
		t.Logf("%d creates served from pools", hits.Load())
	})
}
