package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/agent"
)

// Benchmarks of the tunnel: on the cluster (skipped without one) beside
// kubectl exec on the same Pod, and on the fake apiserver (the SPDY layer
// and the agent alone, no apiserver, kubelet or runtime in between).
//
//	go test -run '^$' -bench Tunnel -benchtime 200x ./provider/kubernetes

// pfRoundTrips times n calls of f and reports their p50 and p99 as metrics
// named prefix-p50-ms and prefix-p99-ms.
func pfRoundTrips(b *testing.B, prefix string, n int, f func() error) {
	b.Helper()
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", prefix, err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(ds[len(ds)/2]), prefix+"-p50-ms")
	b.ReportMetric(ms(ds[min(len(ds)-1, len(ds)*99/100)]), prefix+"-p99-ms")
}

// pfExecTrue runs true through cl and checks it exited 0.
func pfExecTrue(ctx context.Context, cl *agent.Client, dir string) error {
	p, err := cl.Start(ctx, agent.ExecSpec{Argv: []string{"true"}, Env: pfEnv, Dir: dir}, nil)
	if err != nil {
		return err
	}
	defer p.Close()
	<-p.Done()
	if r := p.Result(); r.Err != nil || r.ExitCode != 0 {
		return r.Err
	}
	return nil
}

func pfBenchRoundTrips(b *testing.B, tun *tunnel, dir string) {
	cl := &agent.Client{Dial: tun.Dial}
	ctx := context.Background()
	for range 20 { // warm: the connection, the agent's pages
		if err := pfExecTrue(ctx, cl, dir); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	pfRoundTrips(b, "exec", b.N, func() error { return pfExecTrue(ctx, cl, dir) })
	b.StopTimer()
	pfRoundTrips(b, "ping", 100, func() error { return cl.Ping(ctx) })
	// Without the multiplexed connection: each operation waits for a
	// stream pair of its own.
	tun.mu.Lock()
	tun.noMux = true
	tun.mu.Unlock()
	pfRoundTrips(b, "exec-nomux", 100, func() error { return pfExecTrue(ctx, cl, dir) })
	pfRoundTrips(b, "ping-nomux", 100, func() error { return cl.Ping(ctx) })
	tun.mu.Lock()
	tun.noMux = false
	tun.mu.Unlock()
	pfRoundTrips(b, "dial", 100, func() error {
		c, err := tun.Dial(ctx)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func BenchmarkTunnelExecRoundTrip(b *testing.B) {
	c := newPFCluster(b)
	pod, tun := c.agentPod(b)
	pfBenchRoundTrips(b, tun, "/workspace")
	// The peer: kubectl exec, a new apiserver exec per call.
	pfRoundTrips(b, "kubectl-exec", 20, func() error {
		cmd := c.kc.KubectlCmd(context.Background(), "exec", "-n", c.ns, pod, "-c", "session", "--", "true")
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Logf("kubectl: %s", out)
		}
		return err
	})
}

func BenchmarkTunnelFakeExecRoundTrip(b *testing.B) {
	f := newFakeAPI(b)
	pfBenchRoundTrips(b, f.tunnel(b, fakePod, testAgentPort), f.dir)
	// The agent alone, over plain loopback TCP: what the tunnel adds is
	// the difference.
	direct := &agent.Client{Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", f.agentAddr)
	}}
	ctx := context.Background()
	pfRoundTrips(b, "direct-exec", 100, func() error { return pfExecTrue(ctx, direct, f.dir) })
	pfRoundTrips(b, "direct-ping", 100, func() error { return direct.Ping(ctx) })
}

func pfBenchPutGet(b *testing.B, tun *tunnel, root string) {
	cl := &agent.Client{Dial: tun.Dial}
	ctx := context.Background()
	data := make([]byte, 100<<20)
	rand.Read(data)
	ref := agent.FileRef{Root: root, Rel: "bench", Orig: "bench"}
	b.SetBytes(int64(2 * len(data)))
	var put, get time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := cl.PutFile(ctx, ref, bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
		put += time.Since(start)
		start = time.Now()
		r, _, err := cl.OpenFile(ctx, ref)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, r)
		r.Close()
		if err != nil || n != int64(len(data)) {
			b.Fatalf("get: %d bytes, %v", n, err)
		}
		get += time.Since(start)
	}
	b.ReportMetric(float64(b.N*100)/put.Seconds(), "put-MiB/s")
	b.ReportMetric(float64(b.N*100)/get.Seconds(), "get-MiB/s")
}

func BenchmarkTunnelPutGet100MB(b *testing.B) {
	c := newPFCluster(b)
	_, tun := c.agentPod(b)
	pfBenchPutGet(b, tun, "/workspace")
}

func BenchmarkTunnelFakePutGet100MB(b *testing.B) {
	f := newFakeAPI(b)
	pfBenchPutGet(b, f.tunnel(b, fakePod, testAgentPort), f.dir)
}
