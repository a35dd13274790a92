package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/kubernetes"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
	"github.com/tai42/sandbox/sandboxtest"
)

func options(c *kubetest.Cluster, ns string, cfg sandboxtest.Config) kubernetes.Options {
	return kubernetes.Options{
		Options: kit.Options{Policy: cfg.Policy, ReapInterval: cfg.ReapInterval, Logger: cfg.Logger},
		ProviderOptions: kit.ProviderOptions{
			// Exec/OutputLimit sends the limit's worth of output twice
			// through the apiserver's port-forward, about 18 MB/s under
			// -race on this 2-core machine: at the default 64 MiB, with its
			// Pod's start, half of the clause's 40 s unloaded and past it
			// with CI's four lanes beside it. The limit's handling is the
			// same code at any size (kit's; the container provider's suite
			// runs it at the default).
			MaxOutputBytes: 16 << 20},
		Kubeconfig:   c.Kubeconfig,
		Namespace:    ns,
		AgentImage:   c.AgentImage,
		StorageClass: c.StorageClass,
		// The harness's enforcer is proven by the probe in TestProbeEnforced
		// and behind the escape battery's sandbox; a probe per sandbox here
		// (a namespace each) would add its ~10 s to every clause.
		TrustNetworkPolicy: c.Enforcer,
	}
}

func newSandbox(t *testing.T, opts kubernetes.Options) *kit.Sandbox {
	t.Helper()
	sb, err := kubernetes.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			t.Errorf("closing the kubernetes sandbox: %v", err)
		}
	})
	return sb
}

// TestConformance runs the suite with a namespace per sandbox (and per
// restartable pair): every sandbox of a namespace reaps its sessions and
// serves them, so one clause's sandbox would otherwise reap another's.
func TestConformance(t *testing.T) {
	c := kubetest.Require(t)
	so := sandboxtest.Options{
		Image:              c.Busybox,
		Isolation:          sandbox.IsolationContainer,
		Networks:           []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress},
		Durable:            true,
		Caps:               true,
		KillStopsLeftovers: true,
		Logs:               true,
		// A Pod's start on a node as loaded as CI's (four lanes on two
		// cores) took past 40 s: the create's own bound applies.
		CreateTimeout:     kubernetes.DefaultCreateTimeout,
		NetworkNoneFenced: func(t *testing.T, sess sandbox.Session) { noneFenced(t, c, sess) },
		Restartable: func(t *testing.T, cfg sandboxtest.Config) (sandbox.Sandbox, func(crash bool) sandbox.Sandbox) {
			// The apiserver is the ledger: a sandbox opened again on the
			// namespace finds what the last one left.
			ns := kubernetes.NewTestNamespace(t, c)
			open := func() *kit.Sandbox { return newSandbox(t, options(c, ns, cfg)) }
			sb := open()
			return sb, func(crash bool) sandbox.Sandbox {
				if crash {
					sb.Abandon()
				} else if err := sb.Close(context.Background()); err != nil {
					t.Fatalf("closing the sandbox before its restart: %v", err)
				}
				sb = open()
				return sb
			}
		},
	}
	sandboxtest.Run(t, func(t *testing.T, cfg sandboxtest.Config) sandbox.Sandbox {
		return newSandbox(t, options(c, kubernetes.NewTestNamespace(t, c), cfg))
	}, so)
}

// noneFenced is the NetworkNone clause for a session whose Pod keeps its
// interface: it reaches no Pod of its namespace, not the node, not a
// public test host and not the metadata address, each of which a Pod no
// policy selects does reach.
func noneFenced(t *testing.T, c *kubetest.Cluster, sess sandbox.Session) {
	ctx := escCtx(t)
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelSession + "=" + sess.ID()})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the session's Pod: %v (%d Pods)", err, len(pods.Items))
	}
	ns := pods.Items[0].Namespace
	h := newEscHosts(t, c)
	targets := map[string]netip.AddrPort{
		"a Pod of its namespace":       bystander(t, c, ns),
		"the node (the pods' gateway)": h.node,
		"a public test host":           h.public[0],
		"the metadata test host":       h.refused["the "+sessnettest.Metadata+" test host"],
	}
	reachedWithoutPolicy(t, c, ns, targets)
	for what, to := range targets {
		res, err := sess.Exec(ctx, []string{"nc", "-w", "2", to.Addr().String(), fmt.Sprint(to.Port())}, sandbox.ExecOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("a session on network none reaches %s (%s)", what, to)
		}
	}
}

// TestCreateFailsFast: an image the cluster cannot pull and a Pod that
// can never be scheduled each fail the create at once with the Pod's own
// reason, and leave nothing.
func TestCreateFailsFast(t *testing.T) {
	c := kubetest.Require(t)
	ns := kubernetes.NewTestNamespace(t, c)
	opts := options(c, ns, sandboxtest.Config{Policy: sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone}})
	opts.CreateTimeout = 90 * time.Second
	sb := newSandbox(t, opts)
	ctx := context.Background()
	base := sandbox.SessionSpec{Image: c.Busybox, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 60}

	t.Run("ImageNotPullable", func(t *testing.T) {
		spec := base
		spec.Image = "127.0.0.1:1/no/such:image"
		start := time.Now()
		_, err := sb.CreateSession(ctx, spec)
		var sre *sandbox.SpecRejectedError
		if !errors.As(err, &sre) || sre.Field != "image" {
			t.Fatalf("got %v", err)
		}
		t.Logf("failed in %s: %v", time.Since(start), err)
		if time.Since(start) > 60*time.Second {
			t.Errorf("took %s", time.Since(start))
		}
	})
	t.Run("Unschedulable", func(t *testing.T) {
		spec := base
		spec.CPU = 512 // more than any node of a test cluster has
		start := time.Now()
		_, err := sb.CreateSession(ctx, spec)
		if err == nil || !strings.Contains(err.Error(), "cannot be scheduled") {
			t.Fatalf("got %v", err)
		}
		t.Logf("failed in %s: %v", time.Since(start), err)
	})
	t.Run("EnvNeverInThePod", func(t *testing.T) {
		spec := base
		spec.Env = map[string]sandbox.Secret{"TOKEN": sandbox.NewSecret("never-in-the-pod-9f1c")}
		s, err := sb.CreateSession(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.Destroy(ctx) }()
		res, err := s.Exec(ctx, []string{"sh", "-c", "echo $TOKEN"}, sandbox.ExecOptions{Timeout: 10 * time.Second})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "never-in-the-pod-9f1c" {
			t.Fatalf("exec: %v %q", err, res.Stdout)
		}
		pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, "tai42-"+s.ID(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pod.Marshal()
		if strings.Contains(string(b), "never-in-the-pod-9f1c") {
			t.Fatal("the env value is in the Pod")
		}
		sec, err := c.Client.CoreV1().Secrets(ns).Get(ctx, "tai42-"+s.ID()+"-env", metav1.GetOptions{})
		if err != nil || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != pod.UID {
			t.Fatalf("secret: %v %+v", err, sec)
		}
	})
}

// TestFigures measures create → Running → agent ready → first exec, and
// the exec round trip, on the cluster.
func TestFigures(t *testing.T) {
	c := kubetest.Require(t)
	ns := kubernetes.NewTestNamespace(t, c)
	tl := &timingLog{}
	sb := newSandbox(t, options(c, ns, sandboxtest.Config{Policy: sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone},
		Logger: slog.New(tl)}))
	ctx := context.Background()
	spec := sandbox.SessionSpec{Image: c.Busybox, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 120}
	var firsts []time.Duration
	for range 5 {
		start := time.Now()
		s, err := sb.CreateSession(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
		firsts = append(firsts, time.Since(start))
		t.Logf("create: %s; first exec done %s", tl.last(), firsts[len(firsts)-1])
		if len(firsts) < 5 {
			_ = s.Destroy(ctx)
			continue
		}
		var rts []time.Duration
		for range 200 {
			st := time.Now()
			if _, err := s.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
				t.Fatal(err)
			}
			rts = append(rts, time.Since(st))
		}
		sort.Slice(rts, func(i, j int) bool { return rts[i] < rts[j] })
		t.Logf("exec round trip (true, 200 runs): p50 %s p99 %s", rts[len(rts)/2], rts[len(rts)*99/100])
		st := time.Now()
		_ = s.Destroy(ctx)
		t.Logf("destroy: %s", time.Since(st))
	}
	sort.Slice(firsts, func(i, j int) bool { return firsts[i] < firsts[j] })
	t.Logf("create → first exec (5 runs): p50 %s max %s", firsts[len(firsts)/2], firsts[len(firsts)-1])
}

// timingLog keeps the create phases of the provider's "session pod ready"
// lines.
type timingLog struct {
	mu    sync.Mutex
	attrs string
}

func (h *timingLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *timingLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "session pod ready" {
		return nil
	}
	var parts []string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "id" && a.Key != "pod" {
			parts = append(parts, a.Key+"="+a.Value.String())
		}
		return true
	})
	h.mu.Lock()
	h.attrs = strings.Join(parts, " ")
	h.mu.Unlock()
	return nil
}
func (h *timingLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *timingLog) WithGroup(string) slog.Handler      { return h }
func (h *timingLog) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attrs
}
