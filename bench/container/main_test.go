// Package container_test benchmarks the container provider against the
// same work done by docker and by the bare OCI runtimes (runc, crun), side
// by side in one run: session create to first exec, the exec round trip,
// create + destroy, the memory of an idle session, and 500 live idle
// sessions at once; and where a create's time goes
// (BenchmarkCreateSteps). bench/container.sh installs what it needs,
// starts a private dockerd, runs these in rounds and prints the table.
//
// Every provider a benchmark makes is checked at its cleanup: a session
// that left its directory, a cgroup or a mount fails the benchmark.
//
// BenchmarkEgress stands apart (bench/container.sh does not run it): the
// cost of the egress domain filter, a filtered session against an open
// one, over a router namespace of test hosts (package sessnettest).
//
// Every other peer uses network "none" (the provider's loopback-only tier,
// `docker --network none`, the bare runtimes' empty network namespace of
// `runc spec`) and the same busybox root filesystem (package imagestoretest):
// imported into the provider's image store, written as a plain directory
// for the bare runtimes (or BENCH_ROOTFS), and `docker import`ed from a
// tar of that directory (BENCH_DOCKER_IMAGE). The provider also runs its
// built-in "host" image.
//
// Env knobs (all optional; bench/container.sh sets them):
//
//	BENCH_DOCKER_HOST     the dockerd socket (unix://...); unset: docker's
//	                      sub-benchmarks skip, saying why
//	BENCH_DOCKER_BIN      the docker CLI (default "docker" in PATH)
//	BENCH_DOCKER_IMAGE    the imported busybox image (default busybox:test)
//	BENCH_ROOTFS          the busybox rootfs for the bare runtimes (default:
//	                      written by the benchmark into a temp dir)
//	BENCH_REVERSE         set: the peers of each benchmark run in reverse
//	                      order (the script alternates it between rounds)
//	BENCH_IDLE_SESSIONS   sessions or containers sampled per idle-memory
//	                      peer (default 5)
//	BENCH_IDLE_SETTLE     how long they idle before they are measured
//	                      (default 2s)
//	BENCH_SCALE_SESSIONS  sessions of BenchmarkIdleSessions (default 500)
//	BENCH_SCALE_CONCURRENCY  its creates and destroys in flight (default 8)
//
// Latencies are reported per op as p50-ns and p99-ns (ns/op is the mean);
// memory as bytes (cgroup-B, pss-B, total-B).
package container_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

func TestMain(m *testing.M) { containertest.Main(m) }

const execTimeout = 30 * time.Second

var (
	// policy lets in what the benchmarks create: container sessions on
	// network none.
	policy   = sandbox.Policy{Egress: sandbox.NetworkNone, Isolation: sandbox.IsolationContainer}
	trueArgv = []string{"/bin/true"}
)

// sessionSpec is an ephemeral session of image on network none.
func sessionSpec(image string) sandbox.SessionSpec {
	return sandbox.SessionSpec{Image: image, Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: 3600}
}

// tracked is a container provider that records the sessions made through
// it, so that the check at cleanup can look for what they left. Safe for
// concurrent use.
type tracked struct {
	*kit.Sandbox
	mu  sync.Mutex
	ids []string
}

func (p *tracked) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	s, err := p.Sandbox.CreateSession(ctx, spec)
	if err == nil {
		p.mu.Lock()
		p.ids = append(p.ids, s.ID())
		p.mu.Unlock()
	}
	return s, err
}

// newProvider returns a fresh container provider on runtime rt and its
// options; it skips b when rt is not installed. At b's cleanup the
// provider is closed (every session destroyed), and b fails if a session
// made through it left its directory, a cgroup or a mount.
func newProvider(b testing.TB, rt string) (*tracked, container.Options) {
	b.Helper()
	return newProviderWith(b, rt, nil)
}

// newProviderAgent is newProvider with agent as the agent binary ("" for
// the suite's static one).
func newProviderAgent(b testing.TB, rt, agent string) (*tracked, container.Options) {
	b.Helper()
	return newProviderWith(b, rt, func(o *container.Options) {
		if agent != "" {
			o.AgentBinary = agent
		}
	})
}

// newProviderWith is newProvider with its options changed by set (when
// not nil) before the provider is made.
func newProviderWith(b testing.TB, rt string, set func(*container.Options)) (*tracked, container.Options) {
	b.Helper()
	if !containertest.HasRuntime(rt) {
		b.Skipf("%s is not installed (apt-get install -y %s)", rt, rt)
	}
	opts := containertest.Options(b, rt, policy)
	opts.ReapInterval = -1
	if set != nil {
		set(&opts)
	}
	p := &tracked{}
	// Registered before containertest.New's Close, so it runs after it.
	b.Cleanup(func() {
		p.mu.Lock()
		ids := slices.Clone(p.ids)
		p.mu.Unlock()
		d, c, m := leftovers(filepath.Join(opts.StateDir, "container", "sessions"), opts.StateDir, ids, nil)
		if len(d)+len(c)+len(m) > 0 {
			b.Errorf("the %s provider left, after its Close: session dirs %v, cgroups %v, mounts %v", rt, d, c, m)
		}
	})
	p.Sandbox = containertest.New(b, opts)
	return p, opts
}

// execTrue runs /bin/true in s and fails unless it exits 0.
func execTrue(ctx context.Context, s sandbox.Session) error {
	r, err := s.Exec(ctx, trueArgv, sandbox.ExecOptions{Timeout: execTimeout})
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("/bin/true in session %s exited %d: %s", s.ID(), r.ExitCode, r.Stderr)
	}
	return nil
}

// peer is one sub-benchmark: the same work done one way.
type peer struct {
	name string
	fn   func(*testing.B)
}

// runPeers runs the peers as sub-benchmarks in order, or in reverse when
// BENCH_REVERSE is set, so that neither end always goes first.
func runPeers(b *testing.B, peers []peer) {
	if os.Getenv("BENCH_REVERSE") != "" {
		peers = slices.Clone(peers)
		slices.Reverse(peers)
	}
	for _, p := range peers {
		b.Run(p.name, p.fn)
	}
}

// latencies collects per-op durations; report gives their p50 and p99.
type latencies []time.Duration

func (l *latencies) add(d time.Duration) { *l = append(*l, d) }

// percentile is the q-th quantile (0..1) of l by the nearest rank below;
// 0 for none.
func (l latencies) percentile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q * float64(len(s)))
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	b.ReportMetric(float64(l.percentile(0.50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(l.percentile(0.99).Nanoseconds()), "p99-ns")
}

// envInt is the positive integer in env var name, or def when unset; a
// bad value fails b.
func envInt(b testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// envDuration is the duration in env var name, or def when unset.
func envDuration(b testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		b.Fatalf("%s=%q: want a duration such as 2s", name, v)
	}
	return d
}
