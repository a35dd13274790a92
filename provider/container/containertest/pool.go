package containertest

import (
	"sync/atomic"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
)

// Pool sets opts to keep a warm pool of image: one session ahead for each
// network tier opts' policy lets in, and every create of those shapes
// waiting for one rather than being made cold (kit.Options.PoolWait), so
// that each is served from the pool.
func Pool(opts *container.Options, image string) {
	for _, n := range []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress} {
		if sandbox.NetworkOpenness(n) <= sandbox.NetworkOpenness(opts.Policy.Egress) &&
			sandbox.IsolationStrength(opts.Policy.Isolation) <= sandbox.IsolationStrength(sandbox.IsolationContainer) {
			opts.Pool = append(opts.Pool, kit.PoolShape{Image: image, Network: n, Size: 1})
		}
	}
	opts.PoolWait = true
}

// ServedFromPool fails t, at its cleanup (before the sandbox's Close
// registered earlier), if a create of a pooled shape of sb was made cold,
// and adds sb's pool hits to hits.
func ServedFromPool(t testing.TB, sb *kit.Sandbox, hits *PoolHits) {
	t.Cleanup(func() {
		for _, st := range sb.PoolStats() {
			if st.Misses > 0 {
				t.Errorf("pool %s:%s: %d creates were made cold (and %d served from the pool); every one must be served from it", st.Image, st.Network, st.Misses, st.Hits)
			}
			hits.add(st.Hits)
		}
	})
}

// PoolHits counts creates served from pools across sandboxes; safe for
// concurrent use.
type PoolHits struct{ n atomic.Uint64 }

func (h *PoolHits) add(n uint64) { h.n.Add(n) }

// Load is the count so far.
func (h *PoolHits) Load() uint64 { return h.n.Load() }
