package kubernetes

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// A StorageClass that no cluster has: the tests' PVCs stay Pending, which
// claims, releases, lists and removes do not mind.
const ldTestClass = "tai42-test-unprovisioned"

func (c *ldCluster) workspaces(t *testing.T) *workspaces {
	t.Helper()
	w, err := newWorkspaces(c.client, c.ns, wsOptions{StorageClass: ldTestClass, CreateTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// cleanPVC deletes the PVC of key at the test's end.
func (c *ldCluster) cleanPVC(t *testing.T, key string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.client.CoreV1().PersistentVolumeClaims(c.ns).Delete(ctx, pvcName(key), metav1.DeleteOptions{})
	})
}

func (c *ldCluster) pvc(t *testing.T, key string) *corev1.PersistentVolumeClaim {
	t.Helper()
	p, err := c.client.CoreV1().PersistentVolumeClaims(c.ns).Get(context.Background(), pvcName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the PVC of %q: %v", key, err)
	}
	return p
}

func ldWantConflict(t *testing.T, err error, holder string) {
	t.Helper()
	se, ok := errors.AsType[*sandbox.SpecRejectedError](err)
	if !ok || se.Field != "workspace_key" || se.Reason != sandbox.ReasonConflict || !strings.Contains(se.Message, holder) {
		t.Fatalf("want a workspace_key conflict naming %s, got %v", holder, err)
	}
}

// livePod makes session id's Pod in state live, expiring at exp.
func (c *ldCluster) livePod(t *testing.T, id string, exp time.Time) {
	rec := ldRecord(id, kit.StateLive)
	rec.Spec.Env = nil
	rec.ExpiresAt = exp
	ann, err := recordAnnotations(rec)
	if err != nil {
		t.Fatal(err)
	}
	c.sessionPod(t, id, ann, nil)
}

func TestWorkspaceClaim(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	w := c.workspaces(t)
	key := "ws-" + ldNewID(t)
	c.cleanPVC(t, key)
	a, b := ldNewID(t), ldNewID(t)

	name, err := w.claimWorkspace(ctx, a, key)
	if err != nil {
		t.Fatal(err)
	}
	if name != pvcName(key) {
		t.Fatalf("claim returned %s, want %s", name, pvcName(key))
	}
	p := c.pvc(t, key)
	if p.Labels[LabelManaged] != ManagedBy || p.Labels[LabelWorkspace] != workspaceHash(key) ||
		p.Annotations[AnnotationWorkspaceKey] != key || p.Annotations[AnnotationHeldBy] != a || p.Annotations[AnnotationPending] != a {
		t.Fatalf("the new PVC: labels %v annotations %v", p.Labels, p.Annotations)
	}
	if p.Spec.StorageClassName == nil || *p.Spec.StorageClassName != ldTestClass ||
		len(p.Spec.AccessModes) != 1 || p.Spec.AccessModes[0] != corev1.ReadWriteOnce ||
		p.Spec.Resources.Requests.Storage().String() != "1Gi" {
		t.Fatalf("the new PVC's spec: %+v", p.Spec)
	}

	// a has no Pod yet but its claim is young: it is mid-create (on some
	// daemon), and b conflicts.
	_, err = w.claimWorkspace(ctx, b, key)
	ldWantConflict(t, err, a)
	// So does a remove.
	ldWantConflict(t, w.RemoveWorkspace(ctx, key), a)

	// a goes live: its Pod live and unexpired still holds it.
	c.livePod(t, a, time.Now().Add(time.Hour))
	if err := w.commitWorkspace(ctx, a, key); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.pvc(t, key).Annotations[AnnotationPending]; ok {
		t.Fatal("commit left the PVC pending")
	}
	_, err = w.claimWorkspace(ctx, b, key)
	ldWantConflict(t, err, a)

	// A claim by the holder itself is fine (a retry).
	if _, err := w.claimWorkspace(ctx, a, key); err != nil {
		t.Fatalf("the holder's own claim: %v", err)
	}

	// a released: b claims it; the workspace is kept, not pending.
	if err := w.releaseWorkspace(ctx, a, key); err != nil {
		t.Fatal(err)
	}
	if h := c.pvc(t, key).Annotations[AnnotationHeldBy]; h != "" {
		t.Fatalf("after release held-by is %q", h)
	}
	if _, err := w.claimWorkspace(ctx, b, key); err != nil {
		t.Fatalf("claim of a released workspace: %v", err)
	}
	p = c.pvc(t, key)
	if p.Annotations[AnnotationHeldBy] != b || p.Annotations[AnnotationPending] != "" {
		t.Fatalf("after b's claim: %v", p.Annotations)
	}
	// A release by a session that does not hold it touches nothing.
	if err := w.releaseWorkspace(ctx, a, key); err != nil {
		t.Fatal(err)
	}
	if c.pvc(t, key).Annotations[AnnotationHeldBy] != b {
		t.Fatal("a release by a non-holder cleared the claim")
	}
}

func TestWorkspaceStaleHolders(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	w := c.workspaces(t)

	// A holder whose Pod is live but expired is stale.
	key := "ws-" + ldNewID(t)
	c.cleanPVC(t, key)
	a, b := ldNewID(t), ldNewID(t)
	if _, err := w.claimWorkspace(ctx, a, key); err != nil {
		t.Fatal(err)
	}
	c.livePod(t, a, time.Now().Add(-time.Second))
	if _, err := w.claimWorkspace(ctx, b, key); err != nil {
		t.Fatalf("claim over an expired holder: %v", err)
	}
	if h := c.pvc(t, key).Annotations[AnnotationHeldBy]; h != b {
		t.Fatalf("held by %q, want %s", h, b)
	}
	// a was pending when replaced: the PVC is b's pending one now.
	if p := c.pvc(t, key).Annotations[AnnotationPending]; p != b {
		t.Fatalf("pending %q, want %s", p, b)
	}

	// A holder without a Pod whose claim is past the create timeout is
	// stale: shown with a create timeout of 0 (+ the margin) and an old
	// held-since.
	key2 := "ws-" + ldNewID(t)
	c.cleanPVC(t, key2)
	if _, err := w.claimWorkspace(ctx, a, key2); err != nil {
		t.Fatal(err)
	}
	p := c.pvc(t, key2)
	p.Annotations[AnnotationHeldSince] = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	if _, err := c.client.CoreV1().PersistentVolumeClaims(c.ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.claimWorkspace(ctx, b, key2); err != nil {
		t.Fatalf("claim over a holder that never made its Pod: %v", err)
	}
	// A release of a pending claim deletes the PVC: nothing anyone was
	// told is kept is in it.
	if err := w.releaseWorkspace(ctx, b, key2); err != nil {
		t.Fatal(err)
	}
	ldEventually(t, 10*time.Second, "the pending PVC deleted at release", func() bool {
		_, err := c.client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, pvcName(key2), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// Two claims of one new key at once, as two daemons would: exactly one
// wins, the other is a conflict naming it.
func TestWorkspaceClaimRace(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	w1, w2 := c.workspaces(t), c.workspaces(t)
	for range 5 {
		key := "ws-" + ldNewID(t)
		c.cleanPVC(t, key)
		a, b := ldNewID(t), ldNewID(t)
		errs := make(chan error, 2)
		go func() { _, err := w1.claimWorkspace(ctx, a, key); errs <- err }()
		go func() { _, err := w2.claimWorkspace(ctx, b, key); errs <- err }()
		e1, e2 := <-errs, <-errs
		if (e1 == nil) == (e2 == nil) {
			t.Fatalf("two claims of %s: %v and %v; want exactly one to win", key, e1, e2)
		}
		lost := e1
		if lost == nil {
			lost = e2
		}
		holder := c.pvc(t, key).Annotations[AnnotationHeldBy]
		ldWantConflict(t, lost, holder)
	}
}

func TestWorkspaceListRemove(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	w := c.workspaces(t)
	key := "ws-" + ldNewID(t)
	c.cleanPVC(t, key)
	a := ldNewID(t)
	if _, err := w.claimWorkspace(ctx, a, key); err != nil {
		t.Fatal(err)
	}
	if err := w.commitWorkspace(ctx, a, key); err != nil {
		t.Fatal(err)
	}
	list, err := w.Workspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found *sandbox.WorkspaceInfo
	for i := range list {
		if list[i].Key == key {
			found = &list[i]
		}
	}
	created := c.pvc(t, key).CreationTimestamp.Time
	if found == nil || !found.ModifiedAt.Equal(created) || found.SizeBytes != 0 || found.InUseBy != "" {
		t.Fatalf("Workspaces: %+v; want %s created %v, size 0 (no volume bound)", list, key, created)
	}

	// Held by a live session on some daemon: a conflict.
	c.livePod(t, a, time.Now().Add(time.Hour))
	ldWantConflict(t, w.RemoveWorkspace(ctx, key), a)

	// Released: removed, and gone when RemoveWorkspace returns.
	if err := w.releaseWorkspace(ctx, a, key); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := w.RemoveWorkspace(ctx, key); err != nil {
		t.Fatal(err)
	}
	t.Logf("RemoveWorkspace took %v", time.Since(start))
	if _, err := c.client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, pvcName(key), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the PVC after RemoveWorkspace: %v", err)
	}
	err = w.RemoveWorkspace(ctx, key)
	if _, ok := errors.AsType[*sandbox.WorkspaceNotFoundError](err); !ok {
		t.Fatalf("RemoveWorkspace of a missing key: want *sandbox.WorkspaceNotFoundError, got %v", err)
	}
	if err := w.RemoveWorkspace(ctx, "../x"); err == nil {
		t.Fatal("RemoveWorkspace of an invalid key succeeded")
	}
	list, err = w.Workspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range list {
		if i.Key == key {
			t.Fatalf("Workspaces lists the removed %s", key)
		}
	}
}

// check on a fake apiserver: the StorageClasses are all it reads.
func TestWorkspaceCheck(t *testing.T) {
	persistent := sandbox.SessionSpec{Durability: sandbox.Persistent, WorkspaceKey: "k"}
	class := func(name string, dflt bool, age time.Duration) *storagev1.StorageClass {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Now().Add(-age))}, Provisioner: "example.com/p"}
		if dflt {
			sc.Annotations = map[string]string{AnnotationDefaultClass: "true"}
		}
		return sc
	}
	rejected := func(t *testing.T, err error, why string) {
		t.Helper()
		se, ok := errors.AsType[*sandbox.SpecRejectedError](err)
		if !ok || se.Field != "durability" || se.Reason != sandbox.ReasonUnenforceable || !strings.Contains(se.Message, why) {
			t.Fatalf("want durability unenforceable saying %q, got %v", why, err)
		}
	}
	for _, tc := range []struct {
		name    string
		option  string
		classes []*storagev1.StorageClass
		want    string // the class; "" rejected
		why     string
	}{
		{"no class at all", "", nil, "", "no default StorageClass"},
		{"no default", "", []*storagev1.StorageClass{class("slow", false, 0)}, "", "no default StorageClass"},
		{"the default", "", []*storagev1.StorageClass{class("slow", false, 0), class("fast", true, 0)}, "fast", ""},
		{"the newest of two defaults", "", []*storagev1.StorageClass{class("old", true, time.Hour), class("new", true, time.Minute)}, "new", ""},
		{"named, present", "slow", []*storagev1.StorageClass{class("slow", false, 0)}, "slow", ""},
		{"named, missing", "gold", []*storagev1.StorageClass{class("fast", true, 0)}, "", `"gold"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			for _, sc := range tc.classes {
				if _, err := cs.StorageV1().StorageClasses().Create(context.Background(), sc, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			w, err := newWorkspaces(cs, "ns", wsOptions{StorageClass: tc.option})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.check(sandbox.SessionSpec{Durability: sandbox.Ephemeral}); err != nil {
				t.Fatalf("an ephemeral spec: %v", err)
			}
			err = w.check(persistent)
			if tc.want == "" {
				rejected(t, err, tc.why)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := w.storageClass(); got != tc.want {
				t.Fatalf("class %q, want %q", got, tc.want)
			}
			// The PVC names the class found: a cluster without the
			// DefaultStorageClass admission plugin would never bind one
			// that names none.
			name, err := w.claimWorkspace(context.Background(), "s1", "k")
			if err != nil {
				t.Fatal(err)
			}
			pvc, err := cs.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c := pvc.Spec.StorageClassName; c == nil || *c != tc.want {
				t.Errorf("the PVC's StorageClassName is %v, want %q", c, tc.want)
			}
		})
	}
	if _, err := newWorkspaces(fake.NewClientset(), "ns", wsOptions{Size: "lots"}); err == nil {
		t.Fatal("a size that is no quantity was accepted")
	}
}

func TestPodHolds(t *testing.T) {
	now := time.Now()
	pod := func(state kit.State, exp time.Time, age time.Duration, phase corev1.PodPhase, deleting bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			CreationTimestamp: metav1.NewTime(now.Add(-age)),
			Annotations:       map[string]string{AnnotationState: string(state), AnnotationExpiresAt: exp.Format(time.RFC3339Nano)},
		}, Status: corev1.PodStatus{Phase: phase}}
		if deleting {
			d := metav1.NewTime(now)
			p.DeletionTimestamp = &d
		}
		return p
	}
	stale := time.Minute
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"live", pod(kit.StateLive, now.Add(time.Hour), 0, corev1.PodRunning, false), true},
		{"live, expired", pod(kit.StateLive, now.Add(-time.Second), 0, corev1.PodRunning, false), false},
		{"live, agent ended", pod(kit.StateLive, now.Add(time.Hour), 0, corev1.PodFailed, false), false},
		{"live, being deleted", pod(kit.StateLive, now.Add(time.Hour), 0, corev1.PodRunning, true), false},
		{"creating, young", pod(kit.StateCreating, now, time.Second, corev1.PodPending, false), true},
		{"creating, past the timeout", pod(kit.StateCreating, now, time.Hour, corev1.PodPending, false), false},
		{"destroying", pod(kit.StateDestroying, now.Add(time.Hour), 0, corev1.PodRunning, false), false},
	} {
		if got := podHolds(tc.pod, stale, now); got != tc.want {
			t.Errorf("%s: holds %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A workspace PVC bound to a volume is a workspace kept across sessions:
// one session's Pod writes, a later session (another claim) reads. The
// volume is a hostPath PersistentVolume the test makes, pre-bound to the
// PVC (the cluster's kubelet runs on this machine: the tests' clusters are
// loopback ones).
func TestWorkspaceMounted(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	w := c.workspaces(t)
	key := "ws-" + ldNewID(t)
	c.cleanPVC(t, key)
	dir, err := os.MkdirTemp("", "tai42-ledger-pv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The session runs as an unprivileged user, and fsGroup does not reach
	// a hostPath volume.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "tai42-test-" + ldNewID(t), Labels: map[string]string{LabelManaged: ManagedBy}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              ldTestClass,
			ClaimRef:                      &corev1.ObjectReference{Namespace: c.ns, Name: pvcName(key)},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		},
	}
	if _, err := c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})

	run := func(id string, argv ...string) string {
		t.Helper()
		claim, err := w.claimWorkspace(ctx, id, key)
		if err != nil {
			t.Fatal(err)
		}
		ann := ldStateAnnotations(t, id, kit.StateCreating, time.Now())
		pod := c.podWithClaim(t, id, ann, claim, argv)
		var phase corev1.PodPhase
		ldEventually(t, 90*time.Second, "the Pod mounting the workspace to end", func() bool {
			p, err := c.client.CoreV1().Pods(c.ns).Get(ctx, pod, metav1.GetOptions{})
			if err == nil {
				phase = p.Status.Phase
			}
			return phase == corev1.PodSucceeded || phase == corev1.PodFailed
		})
		logs, err := c.client.CoreV1().Pods(c.ns).GetLogs(pod, &corev1.PodLogOptions{}).Do(ctx).Raw()
		if err != nil {
			t.Fatal(err)
		}
		if phase != corev1.PodSucceeded {
			t.Fatalf("the Pod %s: %s: %s", pod, phase, logs)
		}
		if err := w.commitWorkspace(ctx, id, key); err != nil {
			t.Fatal(err)
		}
		c.deletePod(pod)
		if err := w.releaseWorkspace(ctx, id, key); err != nil {
			t.Fatal(err)
		}
		return string(logs)
	}
	run(ldNewID(t), "sh", "-c", "echo kept > /workspace/f")
	if got := run(ldNewID(t), "cat", "/workspace/f"); got != "kept\n" {
		t.Fatalf("the second session read %q", got)
	}
	list, err := w.Workspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range list {
		if i.Key == key && i.SizeBytes != 1<<30 {
			t.Fatalf("a bound workspace's size: %d, want its volume's 1Gi", i.SizeBytes)
		}
	}
	if err := w.RemoveWorkspace(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// podWithClaim is sessionPod with the PVC claim mounted at /workspace.
func (c *ldCluster) podWithClaim(t *testing.T, id string, ann map[string]string, claim string, argv []string) string {
	t.Helper()
	uid, zero, no, yes := int64(65532), int64(0), false, true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: c.ns,
			Labels: map[string]string{LabelManaged: ManagedBy, LabelSession: id}, Annotations: ann},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
			AutomountServiceAccountToken: &no, EnableServiceLinks: &no,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Volumes: []corev1.Volume{{Name: "workspace", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
			Containers: []corev1.Container{{
				Name: "session", Image: c.image, ImagePullPolicy: corev1.PullIfNotPresent, Command: argv,
				VolumeMounts: []corev1.VolumeMount{{Name: "workspace", MountPath: "/workspace"}},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.client.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Pod %s: %v", pod.Name, err)
	}
	t.Cleanup(func() { c.deletePod(pod.Name) })
	return pod.Name
}
