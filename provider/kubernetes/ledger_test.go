package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

// The cluster tests run against the package's harness cluster
// (kubetest), each in a namespace of its own, with its busybox image.

type ldCluster struct {
	client k8s.Interface
	cfg    *rest.Config
	ns     string
	image  string
}

func ldTestCluster(t *testing.T) *ldCluster {
	t.Helper()
	c := kubetest.Require(t)
	return &ldCluster{client: c.Client, cfg: c.RESTConfig(), ns: newNamespace(t, c), image: c.Busybox}
}

func ldNewID(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "t" + hex.EncodeToString(b[:])
}

// sessionPod makes a session Pod as Create would (labels, annotations),
// running argv (sleep 3600 when nil), and deletes it at the test's end.
func (c *ldCluster) sessionPod(t *testing.T, id string, ann map[string]string, argv []string) *corev1.Pod {
	t.Helper()
	if argv == nil {
		argv = []string{"sleep", "3600"}
	}
	uid, zero, no, yes := int64(65532), int64(0), false, true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        podName(id),
			Namespace:   c.ns,
			Labels:      map[string]string{LabelManaged: ManagedBy, LabelSession: id},
			Annotations: ann,
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "session", Image: c.image, ImagePullPolicy: corev1.PullIfNotPresent, Command: argv,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.client.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Pod %s: %v", pod.Name, err)
	}
	t.Cleanup(func() { c.deletePod(podName(id)) })
	return out
}

func (c *ldCluster) deletePod(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	zero := int64(0)
	_ = c.client.CoreV1().Pods(c.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
}

// envSecret makes session id's env Secret, owned by its Pod, as Create
// would.
func (c *ldCluster) envSecret(t *testing.T, pod *corev1.Pod, env map[string]string) {
	t.Helper()
	id := pod.Labels[LabelSession]
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: secretName(id), Namespace: c.ns,
			Labels:          map[string]string{LabelManaged: ManagedBy, LabelSession: id},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		StringData: env,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.client.CoreV1().Secrets(c.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Secret %s: %v", sec.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.client.CoreV1().Secrets(c.ns).Delete(ctx, sec.Name, metav1.DeleteOptions{})
	})
}

func (c *ldCluster) ledger(t *testing.T) *ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := newLedger(ctx, c.client, c.ns, "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// testRecord is a record with every field set, times with nanoseconds.
func ldRecord(id string, state kit.State) kit.Record {
	created := time.Date(2026, 12, 2, 7, 30, 1, 123456789, time.UTC)
	return kit.Record{
		ID: id, Provider: "kubernetes", State: state,
		Spec: sandbox.SessionSpec{
			Image: "sandbox.local/busybox:1", WorkspaceKey: "key-" + id, Durability: sandbox.Persistent,
			Env:     map[string]sandbox.Secret{"A": sandbox.NewSecret("alpha"), "B_2": sandbox.NewSecret("beta = 2\nnewline")},
			Network: sandbox.Network("none"), Isolation: sandbox.IsolationContainer,
			CPU: 0.5, MemoryMB: 256, TTLSeconds: 600,
			Labels: map[string]string{"team": "x", "run": "42"},
		},
		WorkspacePath: "/workspace",
		CreatedAt:     created,
		ExpiresAt:     created.Add(10 * time.Minute),
		Handle:        json.RawMessage(`{"pod":"tai42-` + id + `","uid":"u"}`),
	}
}

func ldPlainEnv(env map[string]sandbox.Secret) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v.Reveal()
	}
	return out
}

// sameRecord fails unless got holds every field of want.
func ldSameRecord(t *testing.T, got, want kit.Record) {
	t.Helper()
	if got.ID != want.ID || got.Provider != want.Provider || got.State != want.State || got.WorkspacePath != want.WorkspacePath {
		t.Errorf("record: got id %q provider %q state %q path %q, want %q %q %q %q", got.ID, got.Provider, got.State, got.WorkspacePath, want.ID, want.Provider, want.State, want.WorkspacePath)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Errorf("times: got %v..%v, want %v..%v", got.CreatedAt, got.ExpiresAt, want.CreatedAt, want.ExpiresAt)
	}
	if string(got.Handle) != string(want.Handle) {
		t.Errorf("handle: got %s, want %s", got.Handle, want.Handle)
	}
	if !maps.Equal(ldPlainEnv(got.Spec.Env), ldPlainEnv(want.Spec.Env)) {
		t.Errorf("env: got keys %v, want %v (values differ or missing)", ldKeysOf(got.Spec.Env), ldKeysOf(want.Spec.Env))
	}
	gs, ws := got.Spec, want.Spec
	gs.Env, ws.Env = nil, nil
	if !reflect.DeepEqual(gs, ws) {
		t.Errorf("spec: got %+v, want %+v", gs, ws)
	}
}

func ldKeysOf(m map[string]sandbox.Secret) []string { return slices.Sorted(maps.Keys(m)) }

// eventually polls f every 20 ms until it is true or d is past, and
// returns how long it took.
func ldEventually(t *testing.T, d time.Duration, what string, f func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !f() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func TestLedgerRoundTrip(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	l1 := c.ledger(t)
	id := ldNewID(t)
	rec := ldRecord(id, kit.StateCreating)

	// creating: noted here, nothing remote.
	if err := l1.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, ok, err := l1.Get(ctx, id)
	if err != nil || !ok {
		t.Fatalf("Get of a creating note: ok %v err %v", ok, err)
	}
	ldSameRecord(t, got, rec)
	if _, err := c.client.CoreV1().Pods(c.ns).Get(ctx, podName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Put(creating) made something remote: %v", err)
	}
	if !ldHasRecord(t, l1, id, kit.StateCreating) {
		t.Fatal("Load does not list the creating note")
	}

	// Create makes the Pod (state creating) and its env Secret.
	ann, err := recordAnnotations(rec)
	if err != nil {
		t.Fatal(err)
	}
	pod := c.sessionPod(t, id, ann, nil)
	c.envSecret(t, pod, ldPlainEnv(rec.Spec.Env))

	rec.State = kit.StateLive
	if err := l1.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// This process sees its own write at once.
	got, ok, err = l1.Get(ctx, id)
	if err != nil || !ok {
		t.Fatalf("Get after Put(live): ok %v err %v", ok, err)
	}
	ldSameRecord(t, got, rec)

	// Another daemon: a ledger started now finds the session whole, env
	// read from the Secret.
	l2 := c.ledger(t)
	got, ok, err = l2.Get(ctx, id)
	if err != nil || !ok {
		t.Fatalf("Get in a second ledger: ok %v err %v", ok, err)
	}
	ldSameRecord(t, got, rec)
	if !ldHasRecord(t, l2, id, kit.StateLive) {
		t.Fatal("the second ledger's Load does not list the live session")
	}

	// A touch through l2 reaches l1 by the watch.
	touched := rec
	touched.ExpiresAt = rec.ExpiresAt.Add(time.Hour + 7*time.Nanosecond)
	start := time.Now()
	if err := l2.Put(ctx, touched); err != nil {
		t.Fatal(err)
	}
	took := ldEventually(t, 5*time.Second, "the touch made through another ledger seen by Get", func() bool {
		r, ok, err := l1.Get(ctx, id)
		return err == nil && ok && r.ExpiresAt.Equal(touched.ExpiresAt)
	})
	t.Logf("a Put through one ledger seen by another's Get after %v (Put took %v)", took, time.Since(start)-took)
	got, _, _ = l1.Get(ctx, id)
	ldSameRecord(t, got, touched)

	// Delete through l1: gone here at once, in l2 by the watch.
	if err := l1.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l1.Get(ctx, id); ok || err != nil {
		t.Fatalf("Get after Delete: ok %v err %v", ok, err)
	}
	if ldHasRecord(t, l1, id, "") {
		t.Fatal("Load lists a deleted session")
	}
	ldEventually(t, 5*time.Second, "the Delete seen by the other ledger", func() bool {
		_, ok, err := l2.Get(ctx, id)
		return err == nil && !ok
	})
	ldEventually(t, 10*time.Second, "the Pod gone", func() bool {
		_, err := c.client.CoreV1().Pods(c.ns).Get(ctx, podName(id), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// A second Delete of a missing Pod is fine.
	if err := l1.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a missing session: %v", err)
	}
}

func ldHasRecord(t *testing.T, l *ledger, id string, state kit.State) bool {
	t.Helper()
	recs, err := l.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == id && (state == "" || r.State == state) {
			return true
		}
	}
	return false
}

func TestLedgerPutMissingPod(t *testing.T) {
	c := ldTestCluster(t)
	l := c.ledger(t)
	id := ldNewID(t)
	err := l.Put(context.Background(), ldRecord(id, kit.StateLive))
	if err == nil {
		t.Fatal("Put(live) of a session without a Pod succeeded")
	}
	if _, ok := errors.AsType[*sandbox.SandboxError](err); !ok || !strings.Contains(err.Error(), podName(id)) {
		t.Fatalf("want a *sandbox.SandboxError naming Pod %s, got %v", podName(id), err)
	}
	if _, ok, _ := l.Get(context.Background(), id); ok {
		t.Fatal("a failed Put left a record")
	}
}

// A Pod whose agent ended, or one being deleted, is no live session.
func TestLedgerStoppedPodIsDestroying(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	l := c.ledger(t)
	id := ldNewID(t)
	rec := ldRecord(id, kit.StateLive)
	rec.Spec.Env = nil
	ann, err := recordAnnotations(rec)
	if err != nil {
		t.Fatal(err)
	}
	c.sessionPod(t, id, ann, []string{"true"})
	ldEventually(t, 60*time.Second, "the Pod's phase Succeeded seen as destroying", func() bool {
		r, ok, err := l.Get(ctx, id)
		return err == nil && ok && r.State == kit.StateDestroying
	})
	if !ldHasRecord(t, l, id, kit.StateDestroying) {
		t.Fatal("Load does not list the stopped Pod as destroying")
	}
}

// An apiserver that does not answer is a typed error naming it, within
// the caller's bound.
func TestLedgerUnreachable(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
	client, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = newLedger(ctx, client, "nowhere", "kubernetes")
	if err == nil {
		t.Fatal("newLedger on an unreachable apiserver succeeded")
	}
	if _, ok := errors.AsType[*sandbox.SandboxError](err); !ok || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("want a *sandbox.SandboxError naming the apiserver, got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("newLedger took %v past its 2 s bound", d)
	}
}
