// Package ledger_test measures what the durable session ledger adds to a
// session's create and destroy: the same provider with an in-memory ledger
// and with the durable one (bbolt, fsynced), interleaved in one run so
// that both see the same machine.
//
//	go test -run '^$' -bench Ledger -benchtime 400x ./bench/ledger/
package ledger_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/ledger"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
	"github.com/tai42/sandbox/provider/host"
)

var policy = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}

type opener func(dir string, l kit.Ledger) (*kit.Sandbox, error)

func hostOpen(dir string, l kit.Ledger) (*kit.Sandbox, error) {
	return host.New(host.Options{Options: kit.Options{Policy: policy, ReapInterval: -1, Ledger: l}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
}

func TestMain(m *testing.M) { containertest.Main(m) }

// containerOpener is the container provider on crun, with the static agent
// and network manager containertest prepared.
func containerOpener(b *testing.B) opener {
	return func(dir string, l kit.Ledger) (*kit.Sandbox, error) {
		opts := containertest.Options(b, "crun", policy)
		opts.StateDir, opts.Ledger, opts.ReapInterval = dir, l, -1
		return container.New(opts)
	}
}

// BenchmarkLedger/host and /container (crun, image host, network none):
// each iteration creates and destroys one session on the in-memory
// sandbox and one on the durable; the metrics are the medians of each
// step and the median added by the durable ledger.
func BenchmarkLedger(b *testing.B) {
	b.Run("host", func(b *testing.B) { bench(b, hostOpen, sandbox.NetworkEgress) })
	b.Run("container", func(b *testing.B) {
		containertest.Require(b)
		if !containertest.HasRuntime("crun") {
			b.Skip("crun is not installed")
		}
		bench(b, containerOpener(b), sandbox.NetworkNone)
	})
}

func bench(b *testing.B, open opener, network sandbox.Network) {
	ctx := context.Background()
	memDir, durDir := b.TempDir(), b.TempDir()
	mem, err := open(memDir, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close(ctx)
	l, err := ledger.Open(filepath.Join(durDir, ledger.FileName))
	if err != nil {
		b.Fatal(err)
	}
	tl := &timedLedger{DB: l}
	dur, err := open(durDir, tl)
	if err != nil {
		l.Close()
		b.Fatal(err)
	}
	defer dur.Close(ctx)
	spec := sandbox.SessionSpec{Image: "host", Durability: sandbox.Ephemeral, Network: network, TTLSeconds: 600}
	var memC, memD, durC, durD []time.Duration
	step := func(sb *kit.Sandbox, c, d *[]time.Duration) {
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := s.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		*c = append(*c, t1.Sub(t0))
		*d = append(*d, time.Since(t1))
	}
	for i := 0; b.Loop(); i++ {
		// Alternate which goes first, so neither always follows the other.
		if i%2 == 0 {
			step(mem, &memC, &memD)
			step(dur, &durC, &durD)
		} else {
			step(dur, &durC, &durD)
			step(mem, &memC, &memD)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(median(memC)), "create-mem-ms")
	b.ReportMetric(ms(median(durC)), "create-durable-ms")
	b.ReportMetric(ms(median(durC)-median(memC)), "create-added-ms")
	b.ReportMetric(ms(median(memD)), "destroy-mem-ms")
	b.ReportMetric(ms(median(durD)), "destroy-durable-ms")
	b.ReportMetric(ms(median(durD)-median(memD)), "destroy-added-ms")
	b.ReportMetric(ms(median(tl.puts)), "ledger-put-ms")
	b.ReportMetric(0, "ns/op")
}

// timedLedger times the durable ledger's writes, to tell its own cost
// from the rest of a create.
type timedLedger struct {
	*ledger.DB
	mu   sync.Mutex
	puts []time.Duration
}

func (t *timedLedger) Put(ctx context.Context, r kit.Record) error {
	t0 := time.Now()
	err := t.DB.Put(ctx, r)
	t.mu.Lock()
	t.puts = append(t.puts, time.Since(t0))
	t.mu.Unlock()
	return err
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
