package kubernetes

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tai42/sandbox/kit"
)

// annotations of a session Pod in state, its teardown begun at since
// (destroying only).
func ldStateAnnotations(t *testing.T, id string, state kit.State, since time.Time) map[string]string {
	t.Helper()
	rec := ldRecord(id, state)
	rec.Spec.Env = nil
	rec.ExpiresAt = time.Now().Add(time.Hour)
	ann, err := recordAnnotations(rec)
	if err != nil {
		t.Fatal(err)
	}
	if state == kit.StateDestroying {
		ann[AnnotationDestroyingSince] = since.UTC().Format(time.RFC3339Nano)
	}
	return ann
}

// A sweep at a clock moved past each bound removes exactly the leftovers.
// The sweeper's clock is moved instead of the test waiting: the objects'
// own times are the apiserver's.
func TestSweep(t *testing.T) {
	c := ldTestCluster(t)
	ctx := context.Background()
	now := time.Now()

	creating, live, destroying, ended := ldNewID(t), ldNewID(t), ldNewID(t), ldNewID(t)
	c.sessionPod(t, creating, ldStateAnnotations(t, creating, kit.StateCreating, now), nil)
	livePod := c.sessionPod(t, live, ldStateAnnotations(t, live, kit.StateLive, now), nil)
	c.sessionPod(t, destroying, ldStateAnnotations(t, destroying, kit.StateDestroying, now), nil)
	c.sessionPod(t, ended, ldStateAnnotations(t, ended, kit.StateLive, now), []string{"true"})
	c.envSecret(t, livePod, map[string]string{"A": "a"})

	// An env Secret whose Pod is gone (no ownerReference: the GC would
	// not take it).
	gone := ldNewID(t)
	orphan := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(gone), Namespace: c.ns,
		Labels: map[string]string{LabelManaged: ManagedBy, LabelSession: gone}}, StringData: map[string]string{"A": "a"}}
	if _, err := c.client.CoreV1().Secrets(c.ns).Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.client.CoreV1().Secrets(c.ns).Delete(context.Background(), orphan.Name, metav1.DeleteOptions{})
	})

	// Workspaces: held by the live session (kept), held by a gone session
	// after it went live (claim cleared, PVC kept), pending for a gone
	// create (deleted).
	w := c.workspaces(t)
	kLive, kHeld, kPending := "ws-"+ldNewID(t), "ws-"+ldNewID(t), "ws-"+ldNewID(t)
	for _, k := range []string{kLive, kHeld, kPending} {
		c.cleanPVC(t, k)
	}
	mustClaim := func(id, key string, commit bool) {
		if _, err := w.claimWorkspace(ctx, id, key); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := w.commitWorkspace(ctx, id, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustClaim(live, kLive, true)
	mustClaim(gone, kHeld, true)
	mustClaim(ldNewID(t), kPending, false)

	// The ended Pod's phase must be final before the sweep judges it.
	ldEventually(t, 60*time.Second, "the Pod running true to end", func() bool {
		p, err := c.client.CoreV1().Pods(c.ns).Get(ctx, podName(ended), metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodSucceeded
	})

	s := newSweeper(c.client, c.ns, sweepOptions{CreateTimeout: 10 * time.Second, StoppedGrace: time.Hour})
	// Now: nothing is old enough (the ended Pod is within its grace).
	removed, err := s.sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range removed {
		for _, mine := range []string{creating, live, destroying, ended, gone} {
			if r == "pod/"+podName(mine) || r == "secret/"+secretName(mine) {
				t.Fatalf("a sweep at once removed %s", r)
			}
		}
		for _, k := range []string{kLive, kHeld, kPending} {
			if r == "pvc/"+pvcName(k) || r == "pvc/"+pvcName(k)+":held-by" {
				t.Fatalf("a sweep at once removed %s", r)
			}
		}
	}

	// An hour on: past every bound.
	s = newSweeper(c.client, c.ns, sweepOptions{CreateTimeout: 10 * time.Second})
	s.now = func() time.Time { return time.Now().Add(time.Hour) }
	removed, err = s.sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removed: %v", removed)
	for _, want := range []string{
		"pod/" + podName(creating), "pod/" + podName(destroying), "pod/" + podName(ended),
		"secret/" + secretName(gone),
		"pvc/" + pvcName(kHeld) + ":held-by", "pvc/" + pvcName(kPending),
	} {
		if !slices.Contains(removed, want) {
			t.Errorf("the sweep did not remove %s", want)
		}
	}
	for _, keep := range []string{"pod/" + podName(live), "secret/" + secretName(live), "pvc/" + pvcName(kLive), "pvc/" + pvcName(kLive) + ":held-by", "pvc/" + pvcName(kHeld)} {
		if slices.Contains(removed, keep) {
			t.Errorf("the sweep removed %s", keep)
		}
	}
	// As the apiserver has it.
	for _, id := range []string{creating, destroying, ended} {
		if _, err := c.client.CoreV1().Pods(c.ns).Get(ctx, podName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Pod %s after the sweep: %v", podName(id), err)
		}
	}
	if _, err := c.client.CoreV1().Pods(c.ns).Get(ctx, podName(live), metav1.GetOptions{}); err != nil {
		t.Errorf("the live Pod after the sweep: %v", err)
	}
	if p := c.pvc(t, kHeld); p.Annotations[AnnotationHeldBy] != "" || p.DeletionTimestamp != nil {
		t.Errorf("the workspace of a gone session: held-by %q, deleting %v; want kept and free", p.Annotations[AnnotationHeldBy], p.DeletionTimestamp)
	}
	if p := c.pvc(t, kLive); p.Annotations[AnnotationHeldBy] != live {
		t.Errorf("the live session's workspace: held-by %q", p.Annotations[AnnotationHeldBy])
	}
	ldEventually(t, 10*time.Second, "the pending PVC gone", func() bool {
		_, err := c.client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, pvcName(kPending), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if _, err := c.client.CoreV1().Secrets(c.ns).Get(ctx, secretName(live), metav1.GetOptions{}); err != nil {
		t.Errorf("the live session's env Secret after the sweep: %v", err)
	}
}
