package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// shared is the package's cluster, started by Main.
var shared struct {
	c      *Cluster
	reason string // why there is none: Require skips
	err    error  // the machine can run one and it failed: Require fails
}

// Main is a TestMain: it starts one cluster for the package's tests when
// the machine can run one (else Require skips with the reason), runs
// them, closes the cluster and exits. A SIGINT or SIGTERM closes it too.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit, for a TestMain that checks more after
// the cluster is closed (goleak): it returns m.Run's code, or 1 when the
// cluster did not close cleanly.
func Run(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse() // m.Run parses too; testing.Verbose needs it now
	}
	if why := CanRun(); why != "" {
		shared.reason = why
		return m.Run()
	}
	if os.Getenv("TAI42_KUBETEST_SKIP") != "" {
		shared.reason = "kubetest: TAI42_KUBETEST_SKIP is set"
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	var logf func(string, ...any)
	if testing.Verbose() || os.Getenv("TAI42_KUBETEST_LOG") != "" {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	}
	c, err := Start(ctx, Options{Logf: logf})
	cancel()
	if err != nil {
		shared.err = err
		return m.Run()
	}
	shared.c = c
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			fmt.Fprintf(os.Stderr, "kubetest: %s: closing the cluster\n", s)
			_ = c.Close()
			os.Exit(1)
		case <-done:
		}
	}()
	code := m.Run()
	close(done)
	signal.Stop(sig)
	if err := c.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: closing the cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Require is the package's cluster (Main started it); it skips t where
// the machine cannot run one and fails it where one failed to start.
func Require(t testing.TB) *Cluster {
	t.Helper()
	switch {
	case shared.c != nil:
		return shared.c
	case shared.err != nil:
		t.Fatalf("kubetest: the package's cluster did not start: %v", shared.err)
	case shared.reason != "":
		t.Skip(shared.reason)
	default:
		t.Skip("kubetest: no cluster: the package's TestMain does not call kubetest.Main")
	}
	return nil
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// NewNamespace creates a namespace for t (enforcing the restricted Pod
// Security standard), waits for its default service account, and
// deletes it when t ends. It returns its name.
func (c *Cluster) NewNamespace(t testing.TB) string {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 48 {
		base = strings.Trim(base[:48], "-")
	}
	name := "kt-" + base + "-" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
		"tai42.dev/kubetest":                 "true",
	}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		zero := int64(0)
		// The pods first, at once, so their sandboxes go now; the
		// namespace controller deletes the rest.
		_ = c.Client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", name, err)
		}
	})
	err := waitPoll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("namespace %s: no default service account: %v", name, err)
	}
	return name
}

// AssertNoLeaks fails t naming every Pod, PVC, NetworkPolicy, Lease and
// Secret labelled app.kubernetes.io/managed-by=tai42 in any namespace.
func (c *Cluster) AssertNoLeaks(t testing.TB) {
	t.Helper()
	if left := c.Leaks(context.Background()); len(left) > 0 {
		t.Errorf("objects the provider made are left: %s", strings.Join(left, ", "))
	}
}

// AssertNamespaceClean fails t naming every managed object left in ns
// but the standing ones ("Kind name", e.g. "Lease tai42-reaper": what
// every daemon of a namespace shares, made once and kept), once objects
// being deleted have had 30 seconds to go.
func (c *Cluster) AssertNamespaceClean(t testing.TB, ns string, standing ...string) {
	t.Helper()
	keep := map[string]bool{}
	for _, s := range standing {
		kind, name, _ := strings.Cut(s, " ")
		keep[kind+" "+ns+"/"+name] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		for _, o := range c.Leaks(context.Background()) {
			if strings.Contains(o, " "+ns+"/") && !keep[o] || strings.HasPrefix(o, "(") {
				left = append(left, o)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left behind in namespace %s: %s", ns, strings.Join(left, ", "))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Leaks lists the managed objects left (kind namespace/name); a list
// that fails is named in it.
func (c *Cluster) Leaks(ctx context.Context) []string {
	sel := metav1.ListOptions{LabelSelector: LabelManaged + "=tai42"}
	var left []string
	add := func(kind string, err error, names func() []metav1.ObjectMeta) {
		if err != nil {
			left = append(left, fmt.Sprintf("(listing %ss: %v)", kind, err))
			return
		}
		for _, m := range names() {
			left = append(left, kind+" "+m.Namespace+"/"+m.Name)
		}
	}
	pods, err := c.Client.CoreV1().Pods("").List(ctx, sel)
	add("Pod", err, func() (o []metav1.ObjectMeta) {
		for _, x := range pods.Items {
			o = append(o, x.ObjectMeta)
		}
		return
	})
	pvcs, err := c.Client.CoreV1().PersistentVolumeClaims("").List(ctx, sel)
	add("PersistentVolumeClaim", err, func() (o []metav1.ObjectMeta) {
		for _, x := range pvcs.Items {
			o = append(o, x.ObjectMeta)
		}
		return
	})
	nps, err := c.Client.NetworkingV1().NetworkPolicies("").List(ctx, sel)
	add("NetworkPolicy", err, func() (o []metav1.ObjectMeta) {
		for _, x := range nps.Items {
			o = append(o, x.ObjectMeta)
		}
		return
	})
	leases, err := c.Client.CoordinationV1().Leases("").List(ctx, sel)
	add("Lease", err, func() (o []metav1.ObjectMeta) {
		for _, x := range leases.Items {
			o = append(o, x.ObjectMeta)
		}
		return
	})
	secrets, err := c.Client.CoreV1().Secrets("").List(ctx, sel)
	add("Secret", err, func() (o []metav1.ObjectMeta) {
		for _, x := range secrets.Items {
			o = append(o, x.ObjectMeta)
		}
		return
	})
	return left
}
