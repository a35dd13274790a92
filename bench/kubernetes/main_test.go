// Package kubernetes_test benchmarks the kubernetes provider on a real
// cluster beside the cluster's own tools on the same cluster, in the same
// run: create to first exec (and the cluster's own Pod start to Running:
// client-go's create + watch, and `kubectl run` + `kubectl wait`), the exec
// round trip (and `kubectl exec POD -- true`), a 100 MB put and get (and
// the same bytes through `kubectl exec -i`), and 50 concurrent creates (and
// 50 concurrent bare Pods). bench/kubernetes.sh brings up the harness
// cluster, runs these in rounds beside the container provider's, and
// prints the table.
//
// The cluster is named by the environment (bench/kubernetes.sh sets it
// from the harness's STATE/env); without BENCH_KUBECONFIG every benchmark
// skips, saying so:
//
//	BENCH_KUBECONFIG     the cluster's admin kubeconfig
//	BENCH_AGENT_IMAGE    the agent image (tai42 agent-image push)
//	BENCH_BUSYBOX_IMAGE  a busybox image the cluster pulls (the sessions'
//	                     and the peers' image)
//	BENCH_KUBECTL        kubectl (default "kubectl" in PATH)
//	BENCH_CONCURRENT     BenchmarkConcurrentCreates' creates (default 50)
//	BENCH_PUT_MB         the put/get size in MB (default 100)
//	BENCH_REVERSE        set: the peers run in reverse order
//	BENCH_NAMESPACE      an existing namespace to run in (its peer Pods,
//	                     labelled tai42.dev/bench=peer, deleted at the end);
//	                     unset: each benchmark binary run makes its own
//	                     (tai42-bench-XXXX), deleted at its end with
//	                     everything in it
//
// Latencies are reported per op as p50-ns and p99-ns.
package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/kubernetes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const execTimeout = 60 * time.Second

var (
	policy   = sandbox.Policy{Egress: sandbox.NetworkNone, Isolation: sandbox.IsolationContainer}
	trueArgv = []string{"/bin/true"}
)

// cluster is the benchmarks' cluster, from the environment.
type cluster struct {
	kubeconfig, agentImage, busybox, kubectl string
	cfg                                      *rest.Config
	cs                                       k8s.Interface
	ns                                       string
	ownNS                                    bool // made by this run, deleted at its end
}

var (
	theCluster *cluster
	clusterErr error
	nsOnce     sync.Once
)

func TestMain(m *testing.M) {
	code := m.Run()
	if c := theCluster; c != nil && c.ns != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		zero := int64(0)
		sel := metav1.ListOptions{}
		if !c.ownNS {
			sel.LabelSelector = "tai42.dev/bench=peer"
		}
		_ = c.cs.CoreV1().Pods(c.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, sel)
		if c.ownNS {
			if err := c.cs.CoreV1().Namespaces().Delete(ctx, c.ns, metav1.DeleteOptions{}); err != nil {
				fmt.Fprintf(os.Stderr, "deleting namespace %s: %v\n", c.ns, err)
			}
		}
		cancel()
	}
	os.Exit(code)
}

// need is the cluster, or skips b saying why.
func need(b testing.TB) *cluster {
	b.Helper()
	nsOnce.Do(func() { theCluster, clusterErr = openCluster() })
	if clusterErr != nil {
		b.Skip(clusterErr.Error())
	}
	return theCluster
}

func openCluster() (*cluster, error) {
	c := &cluster{kubeconfig: os.Getenv("BENCH_KUBECONFIG"), agentImage: os.Getenv("BENCH_AGENT_IMAGE"),
		busybox: os.Getenv("BENCH_BUSYBOX_IMAGE"), kubectl: os.Getenv("BENCH_KUBECTL")}
	if c.kubeconfig == "" || c.agentImage == "" || c.busybox == "" {
		return nil, fmt.Errorf("no cluster named: set BENCH_KUBECONFIG, BENCH_AGENT_IMAGE and BENCH_BUSYBOX_IMAGE (bench/kubernetes.sh does)")
	}
	if c.kubectl == "" {
		c.kubectl = "kubectl"
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("BENCH_KUBECONFIG %s: %w", c.kubeconfig, err)
	}
	// The peers' creates are many and fast: the client's own rate limit
	// (5 qps) would measure itself.
	cfg.QPS, cfg.Burst = 500, 1000
	c.cfg = cfg
	if c.cs, err = k8s.NewForConfig(cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.ns = os.Getenv("BENCH_NAMESPACE"); c.ns != "" {
		if _, err := c.cs.CoreV1().Namespaces().Get(ctx, c.ns, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("BENCH_NAMESPACE %s: %w", c.ns, err)
		}
		return c, nil
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	c.ns, c.ownNS = "tai42-bench-"+hex.EncodeToString(b), true
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", c.ns, err)
	}
	for ctx.Err() == nil { // Pods wait for the namespace's default service account
		if _, err := c.cs.CoreV1().ServiceAccounts(c.ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return c, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("namespace %s: no default service account within 30s", c.ns)
}

// newProvider is a kubernetes provider on the benchmarks' namespace,
// closed at b's end.
func newProvider(b testing.TB) *kit.Sandbox {
	b.Helper()
	c := need(b)
	sb, err := kubernetes.New(kubernetes.Options{
		Options:           kit.Options{Policy: policy, ReapInterval: -1},
		Namespace:         c.ns,
		AgentImage:        c.agentImage,
		NetworkProbeImage: c.busybox,
		RESTConfig:        rest.CopyConfig(c.cfg),
	})
	if err != nil {
		b.Fatalf("kubernetes.New: %v", err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			b.Errorf("closing the provider: %v", err)
		}
	})
	// One session made and destroyed first, untimed: the first create
	// waits for the NetworkPolicy probe New started, which no benchmark
	// is about.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := sb.CreateSession(ctx, sessionSpec(c.busybox))
	if err != nil {
		b.Fatalf("the warm-up session: %v", err)
	}
	if err := s.Destroy(ctx); err != nil {
		b.Fatalf("destroying the warm-up session: %v", err)
	}
	return sb
}

func sessionSpec(image string) sandbox.SessionSpec {
	return sandbox.SessionSpec{Image: image, Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: 3600}
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

// barePod is the peers' Pod: busybox sleeping, on the same node and
// image as the sessions, no service-account token.
func (c *cluster) barePod(name string) *corev1.Pod {
	f, zero := false, int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tai42.dev/bench": "peer"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{Name: "main", Image: c.busybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sleep", "3600"}}},
		},
	}
}

// startPod creates pod and waits until it is Ready (its containers
// started), through a watch of it alone, watched again from the Pod's
// last resourceVersion if the apiserver ends the watch; bounded by 2
// minutes.
func (c *cluster) startPod(ctx context.Context, pod *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	pods := c.cs.CoreV1().Pods(c.ns)
	name := pod.Name
	p, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	for {
		if done, err := podReadyOrFailed(p); done || err != nil {
			return err
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: p.ResourceVersion})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			if np, ok := ev.Object.(*corev1.Pod); ok {
				p = np
				if done, err := podReadyOrFailed(p); done || err != nil {
					w.Stop()
					return err
				}
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return fmt.Errorf("pod %s not Ready within 2 minutes (phase %s)", name, p.Status.Phase)
		}
		// The watch ended (an error event, a timeout): read the Pod as it
		// is and watch again from there.
		if p, err = pods.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
}

// podReadyOrFailed reports whether p is Ready, or an error if it ended.
func podReadyOrFailed(p *corev1.Pod) (bool, error) {
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return true, fmt.Errorf("pod %s ended: %s", p.Name, p.Status.Phase)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			return true, nil
		}
	}
	return false, nil
}

func (c *cluster) deletePod(ctx context.Context, name string) error {
	zero := int64(0)
	return c.cs.CoreV1().Pods(c.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
}

// kubectlCmd runs kubectl on the benchmarks' namespace.
func (c *cluster) kubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig, "-n", c.ns}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	return cmd
}

func (c *cluster) kubectlRun(ctx context.Context, args ...string) error {
	out, err := c.kubectlCmd(ctx, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

var podSeq struct {
	sync.Mutex
	n int
}

// podName is a new peer Pod's name.
func podName(kind string) string {
	podSeq.Lock()
	defer podSeq.Unlock()
	podSeq.n++
	return fmt.Sprintf("bench-%s-%d", kind, podSeq.n)
}

// peer is one sub-benchmark: the same work done one way.
type peer struct {
	name string
	fn   func(*testing.B)
}

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
