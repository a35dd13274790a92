package kubernetes_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/kubernetes"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkCreateFirstExec: a new session until its first exec of
// /bin/true has finished (create + Exec; the destroy is not timed); beside
// it the cluster's own Pod start: a Pod of the session's own shape (the
// provider's Pod read back from a session: the init container copying the
// agent, its volumes, the agent as the command) created through client-go
// until Ready, a bare busybox Pod the same way (create + watch), and
// `kubectl run --restart=Never` + `kubectl wait --for=condition=Ready`
// (the bare Pod through kubectl, two processes).
func BenchmarkCreateFirstExec(b *testing.B) {
	runPeers(b, []peer{
		{"ours", oursCreateFirstExec},
		{"session-pod-ready", sessionPodReady},
		{"pod-ready", podReady},
		{"kubectl-run", kubectlRunWait},
	})
}

func oursCreateFirstExec(b *testing.B) {
	c := need(b)
	sb := newProvider(b)
	ctx := context.Background()
	op := func() (time.Duration, string, error) {
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, sessionSpec(c.busybox))
		if err != nil {
			return 0, "", err
		}
		err = execTrue(ctx, s)
		return time.Since(t0), s.ID(), err
	}
	if _, id, err := op(); err != nil { // warm-up (the image pulled), not timed
		b.Fatal(err)
	} else if err := sb.DestroySession(ctx, id); err != nil {
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		d, id, err := op()
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		l.add(d)
		if err := sb.DestroySession(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
}

func podReady(b *testing.B) {
	c := need(b)
	podStart(b, "ready", c.barePod)
}

// sessionPodReady starts copies of a session's own Pod: its spec, under
// a peer's name and label, so that no provider takes it for a session.
func sessionPodReady(b *testing.B) {
	c := need(b)
	sb := newProvider(b)
	ctx := context.Background()
	s, err := sb.CreateSession(ctx, sessionSpec(c.busybox))
	if err != nil {
		b.Fatal(err)
	}
	pods, err := c.cs.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelSession + "=" + s.ID()})
	if err != nil || len(pods.Items) != 1 {
		b.Fatalf("the session's Pod: %v (%d found)", err, len(pods.Items))
	}
	spec := pods.Items[0].Spec
	if err := sb.DestroySession(ctx, s.ID()); err != nil {
		b.Fatal(err)
	}
	podStart(b, "shape", func(name string) *corev1.Pod {
		pod := c.barePod(name)
		pod.Spec = *spec.DeepCopy()
		pod.Spec.NodeName = "" // the scheduler's, as for a session
		return pod
	})
}

// podStart times c.startPod of the Pods pod makes, one warm-up first.
func podStart(b *testing.B, kind string, pod func(name string) *corev1.Pod) {
	c := need(b)
	ctx := context.Background()
	op := func() (time.Duration, string, error) {
		name := podName(kind)
		t0 := time.Now()
		err := c.startPod(ctx, pod(name))
		return time.Since(t0), name, err
	}
	if _, name, err := op(); err != nil {
		b.Fatal(err)
	} else if err := c.deletePod(ctx, name); err != nil {
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		d, name, err := op()
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		l.add(d)
		if err := c.deletePod(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
}

func kubectlRunWait(b *testing.B) {
	c := need(b)
	ctx := context.Background()
	op := func() (time.Duration, string, error) {
		name := podName("kubectl")
		t0 := time.Now()
		err := c.kubectlRun(ctx, "run", name, "--restart=Never", "--image", c.busybox, "--image-pull-policy=IfNotPresent",
			"--overrides", `{"spec":{"automountServiceAccountToken":false,"terminationGracePeriodSeconds":0}}`, "--command", "--", "sleep", "3600")
		if err == nil {
			err = c.kubectlRun(ctx, "wait", "--for=condition=Ready", "--timeout=120s", "pod/"+name)
		}
		return time.Since(t0), name, err
	}
	if _, name, err := op(); err != nil {
		b.Fatal(err)
	} else if err := c.deletePod(ctx, name); err != nil {
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		d, name, err := op()
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		l.add(d)
		if err := c.deletePod(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
}

// BenchmarkExecTrue: the exec round trip of /bin/true in a live session,
// beside `kubectl exec POD -- true` in a live Pod.
func BenchmarkExecTrue(b *testing.B) {
	runPeers(b, []peer{
		{"ours", oursExec},
		{"kubectl-exec", kubectlExec},
	})
}

func oursExec(b *testing.B) {
	c := need(b)
	sb := newProvider(b)
	ctx := context.Background()
	s, err := sb.CreateSession(ctx, sessionSpec(c.busybox))
	if err != nil {
		b.Fatal(err)
	}
	if err := execTrue(ctx, s); err != nil { // the stream up, not timed
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		if err := execTrue(ctx, s); err != nil {
			b.Fatal(err)
		}
		l.add(time.Since(t0))
	}
	l.report(b)
}

// livePod starts a peer Pod for b, deleted at its end.
func livePod(b *testing.B, kind string) string {
	c := need(b)
	ctx := context.Background()
	name := podName(kind)
	if err := c.startPod(ctx, c.barePod(name)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.deletePod(context.Background(), name) })
	return name
}

func kubectlExec(b *testing.B) {
	c := need(b)
	ctx := context.Background()
	name := livePod(b, "exec")
	if err := c.kubectlRun(ctx, "exec", name, "--", "true"); err != nil {
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		if err := c.kubectlRun(ctx, "exec", name, "--", "true"); err != nil {
			b.Fatal(err)
		}
		l.add(time.Since(t0))
	}
	l.report(b)
}

// BenchmarkPutGet: a file of BENCH_PUT_MB (default 100) MB written into a
// live session and read back (each timed alone), beside the same bytes
// through `kubectl exec -i POD -- sh -c 'cat >F'` and `kubectl exec POD --
// cat F`.
func BenchmarkPutGet(b *testing.B) {
	runPeers(b, []peer{
		{"ours-put", func(b *testing.B) { oursPutGet(b, true) }},
		{"ours-get", func(b *testing.B) { oursPutGet(b, false) }},
		{"kubectl-exec-put", func(b *testing.B) { kubectlPutGet(b, true) }},
		{"kubectl-exec-get", func(b *testing.B) { kubectlPutGet(b, false) }},
	})
}

// payload is the put/get data: not all zeros, so that no layer gets to
// compress it away.
func payload(b *testing.B) []byte {
	n := envInt(b, "BENCH_PUT_MB", 100) * 1_000_000
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + i>>11)
	}
	b.SetBytes(int64(n))
	return p
}

func oursPutGet(b *testing.B, put bool) {
	c := need(b)
	sb := newProvider(b)
	ctx := context.Background()
	data := payload(b)
	s, err := sb.CreateSession(ctx, sessionSpec(c.busybox))
	if err != nil {
		b.Fatal(err)
	}
	if err := s.PutFile(ctx, "f", data); err != nil { // warm-up; the file get reads
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		if put {
			if err := s.PutFile(ctx, "f", data); err != nil {
				b.Fatal(err)
			}
		} else {
			got, err := s.GetFile(ctx, "f")
			if err != nil {
				b.Fatal(err)
			}
			if len(got) != len(data) {
				b.Fatalf("got %d bytes back, put %d", len(got), len(data))
			}
		}
		l.add(time.Since(t0))
	}
	l.report(b)
}

// countWriter counts what it is given.
type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

func kubectlPutGet(b *testing.B, put bool) {
	c := need(b)
	ctx := context.Background()
	data := payload(b)
	name := livePod(b, "cp")
	do := func() error {
		if put {
			// The size written is checked: kubectl can exit 0 having
			// delivered part of its stdin (seen on the lab cluster).
			cmd := c.kubectlCmd(ctx, "exec", "-i", name, "--", "sh", "-c", "cat >/tmp/f && wc -c </tmp/f")
			cmd.Stdin = bytes.NewReader(data)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				return fmt.Errorf("kubectl exec -i: %w: %s", err, stderr.Bytes())
			}
			if got := strings.TrimSpace(string(out)); got != strconv.Itoa(len(data)) {
				return fmt.Errorf("kubectl exec -i exited 0 having delivered %s of %d bytes: %s", got, len(data), stderr.Bytes())
			}
			return nil
		}
		var w countWriter
		var stderr bytes.Buffer
		cmd := c.kubectlCmd(ctx, "exec", name, "--", "cat", "/tmp/f")
		cmd.Stdout, cmd.Stderr = &w, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("kubectl exec cat: %w: %s", err, stderr.Bytes())
		}
		if w.n != int64(len(data)) {
			return fmt.Errorf("kubectl exec cat: %d bytes, want %d", w.n, len(data))
		}
		return nil
	}
	saved := put
	put = true
	if err := do(); err != nil { // the file for get; warm-up
		b.Fatal(err)
	}
	put = saved
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		if err := do(); err != nil {
			b.Fatal(err)
		}
		l.add(time.Since(t0))
	}
	l.report(b)
}

// BenchmarkConcurrentCreates: BENCH_CONCURRENT (default 50) sessions
// created at once, each to its first exec; total-ns is the wall time until
// all answered, p50/p99 each one's; beside the same number of bare Pods
// created at once through client-go until Ready. Run it with -benchtime
// 1x: one op is the whole batch.
func BenchmarkConcurrentCreates(b *testing.B) {
	runPeers(b, []peer{
		{"ours", oursConcurrent},
		{"pods", podsConcurrent},
	})
}

func oursConcurrent(b *testing.B) {
	c := need(b)
	sb := newProvider(b)
	n := envInt(b, "BENCH_CONCURRENT", 50)
	ctx := context.Background()
	var l latencies
	var total time.Duration
	for b.Loop() {
		var mu sync.Mutex
		var made []sandbox.Session
		var g errgroup.Group
		t0 := time.Now()
		for range n {
			g.Go(func() error {
				t1 := time.Now()
				s, err := sb.CreateSession(ctx, sessionSpec(c.busybox))
				if err != nil {
					return err
				}
				mu.Lock()
				made = append(made, s)
				mu.Unlock()
				if err := execTrue(ctx, s); err != nil {
					return err
				}
				mu.Lock()
				l.add(time.Since(t1))
				mu.Unlock()
				return nil
			})
		}
		err := g.Wait()
		total += time.Since(t0)
		b.StopTimer()
		var d errgroup.Group
		d.SetLimit(8)
		for _, s := range made {
			d.Go(func() error { return s.Destroy(ctx) })
		}
		if derr := d.Wait(); err == nil {
			err = derr
		}
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "total-ns")
}

func podsConcurrent(b *testing.B) {
	c := need(b)
	n := envInt(b, "BENCH_CONCURRENT", 50)
	ctx := context.Background()
	var l latencies
	var total time.Duration
	for b.Loop() {
		var mu sync.Mutex
		var names []string
		var g errgroup.Group
		t0 := time.Now()
		for range n {
			name := podName("many")
			names = append(names, name)
			g.Go(func() error {
				t1 := time.Now()
				if err := c.startPod(ctx, c.barePod(name)); err != nil {
					return err
				}
				mu.Lock()
				l.add(time.Since(t1))
				mu.Unlock()
				return nil
			})
		}
		err := g.Wait()
		total += time.Since(t0)
		b.StopTimer()
		for _, name := range names {
			_ = c.deletePod(ctx, name)
		}
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "total-ns")
}
