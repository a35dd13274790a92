package hardening

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const timingRuns = 15

// TestRunTimings measures `RUNTIME run` of /bin/true, with and without the
// hardening (and without the network namespace, whose making is a large part
// of a run), and logs the medians (go test -v shows them). "hardened" is the
// profile as it is, native architecture only; the variant with the 32-bit
// modes is the profile as it was before, whose filter the runtime compiled
// for three architectures (amd64) instead of one. For crun the figure
// includes its unshare/sh wrapper, measured alone as well. It fails only
// when a run fails.
func TestRunTimings(t *testing.T) {
	if testing.Short() {
		t.Skip("timings take a few seconds")
	}
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		root := sharedRootfs(t)
		variants := []struct {
			name string
			make func() *specs.Spec
		}{
			{"hardened", func() *specs.Spec { return hardenedSpec(root, true, "/bin/true") }},
			{"hardened with the 32-bit modes (the profile before)", func() *specs.Spec {
				return withCompatModes(t, hardenedSpec(root, true, "/bin/true"))
			}},
			{"bare (no hardening)", func() *specs.Spec { return baseSpec(root, true, "/bin/true") }},
			{"bare, no network namespace", func() *specs.Spec {
				s := baseSpec(root, true, "/bin/true")
				s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool {
					return ns.Type == specs.NetworkNamespace
				})
				return s
			}},
		}
		// Round-robin, so that a change of the machine's load (other
		// processes share its cores) falls on every variant alike.
		times := make([][]time.Duration, len(variants))
		for range timingRuns {
			for i, v := range variants {
				r := rt.run(t, v.make())
				if r.code != 0 {
					t.Fatalf("%s run /bin/true, %s: exit %d: %s", rt.name, v.name, r.code, r.stderr)
				}
				times[i] = append(times[i], r.elapsed)
			}
		}
		for i, v := range variants {
			t.Logf("%s run /bin/true, %s: median %v over %d runs (min %v, max %v)",
				rt.name, v.name, median(times[i]), timingRuns, slices.Min(times[i]), slices.Max(times[i]))
		}
		if rt.hideUnified {
			times := make([]time.Duration, 0, timingRuns)
			for range timingRuns {
				ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
				cmd := exec.CommandContext(ctx, "unshare", "-m", "--propagation", "slave", "sh", "-c", hideUnifiedScript, "sh", "true")
				start := time.Now()
				err := cmd.Run()
				times = append(times, time.Since(start))
				cancel()
				if err != nil {
					t.Fatalf("the unshare wrapper alone: %v", err)
				}
			}
			t.Logf("crun's unshare/sh wrapper alone: median %v over %d runs", median(times), timingRuns)
		}
	})
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
