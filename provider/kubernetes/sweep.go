package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/tai42/sandbox/kit"
)

// Defaults of [sweepOptions].
const (
	DefaultDestroyingAfter = time.Minute
	DefaultStoppedGrace    = 10 * time.Second
)

// sweepOptions bound how long each leftover may stay before it is swept.
type sweepOptions struct {
	// CreateTimeout is the core's create bound; a Pod still creating
	// CreateTimeout + staleMargin after it was made belongs to a create
	// whose daemon died. 0 is DefaultCreateTimeout.
	CreateTimeout time.Duration
	// DestroyingAfter: a teardown begun this long ago whose Pod is still
	// there was left by a daemon that died. 0 is DefaultDestroyingAfter.
	DestroyingAfter time.Duration
	// StoppedGrace: a Pod whose agent ended (phase Failed or Succeeded)
	// stays this long, so that the daemon serving it reads why (an OOM
	// kill) before the session is gone. 0 is DefaultStoppedGrace.
	StoppedGrace time.Duration
}

// sweeper removes what no session owns any more, besides the expired
// sessions the kit reaps: it runs on the reaper's cadence, only in the
// daemon that holds the reaper's Lease.
type sweeper struct {
	client k8s.Interface
	ns     string
	o      sweepOptions
	stale  time.Duration
	now    func() time.Time
}

func newSweeper(client k8s.Interface, ns string, o sweepOptions) *sweeper {
	if o.CreateTimeout <= 0 {
		o.CreateTimeout = DefaultCreateTimeout
	}
	if o.DestroyingAfter <= 0 {
		o.DestroyingAfter = DefaultDestroyingAfter
	}
	if o.StoppedGrace <= 0 {
		o.StoppedGrace = DefaultStoppedGrace
	}
	return &sweeper{client: client, ns: ns, o: o, stale: o.CreateTimeout + staleMargin, now: time.Now}
}

// sweep removes, in the namespace:
//   - session Pods still creating past the create timeout (+ a margin),
//     destroying for longer than DestroyingAfter, or stopped (the agent
//     ended: the session is gone) for longer than StoppedGrace;
//   - env Secrets whose session Pod is gone (the garbage collector
//     normally takes them with the Pod);
//   - the claim (held-by) of each workspace PVC whose holder's Pod is gone
//     and whose claim is past the create timeout; the PVC itself is a
//     workspace and is kept, unless it is still pending (made by a create
//     that never went live), which is deleted.
//
// removed names each object removed or claim cleared ("pod/NAME",
// "secret/NAME", "pvc/NAME", "pvc/NAME:held-by"). It goes on past a
// failure and returns every one, joined.
func (s *sweeper) sweep(ctx context.Context) (removed []string, err error) {
	var errs []error
	now := s.now()
	podList, err := s.client.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: sessionSelector})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: sweep: listing the session Pods of %s: %w", s.ns, err)
	}
	pods := map[string]*corev1.Pod{} // by session id, after this sweep
	grace := int64(0)
	for i := range podList.Items {
		pod := &podList.Items[i]
		id := pod.Labels[LabelSession]
		if why := s.leftover(pod, now); why != "" {
			err := s.client.CoreV1().Pods(s.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{
				GracePeriodSeconds: &grace,
				// Only the Pod that was judged: not one made anew since.
				Preconditions: &metav1.Preconditions{UID: &pod.UID},
			})
			if err == nil || apierrors.IsNotFound(err) {
				removed = append(removed, "pod/"+pod.Name)
				continue
			}
			if !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("deleting Pod %s/%s (%s): %w", s.ns, pod.Name, why, err))
			}
		}
		pods[id] = pod
	}

	secrets, err := s.client.CoreV1().Secrets(s.ns).List(ctx, metav1.ListOptions{LabelSelector: sessionSelector})
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the session Secrets of %s: %w", s.ns, err))
	} else {
		for i := range secrets.Items {
			sec := &secrets.Items[i]
			id := sec.Labels[LabelSession]
			// Made after its Pod and owned by it (Create makes the Pod
			// first), a Secret goes with its Pod by the garbage collector;
			// this deletes one the collector has not yet, once its Pod is
			// gone. A young one may be mid-create (its Pod made after the
			// list above), so it waits out a create's length.
			if now.Sub(sec.CreationTimestamp.Time) < s.stale || s.podExists(ctx, pods, id) {
				continue
			}
			err := s.client.CoreV1().Secrets(s.ns).Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &sec.UID}})
			if err == nil || apierrors.IsNotFound(err) {
				removed = append(removed, "secret/"+sec.Name)
			} else if !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("deleting Secret %s/%s: %w", s.ns, sec.Name, err))
			}
		}
	}

	pvcs, err := s.client.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelManaged + "=" + ManagedBy + "," + LabelWorkspace})
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the workspace PersistentVolumeClaims of %s: %w", s.ns, err))
	} else {
		for i := range pvcs.Items {
			what, err := s.sweepPVC(ctx, &pvcs.Items[i], pods, now)
			if what != "" {
				removed = append(removed, what)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return removed, fmt.Errorf("kubernetes: sweep of namespace %s: %w", s.ns, errors.Join(errs...))
	}
	return removed, nil
}

// leftover says why pod is a leftover to delete now ("" when it is not).
func (s *sweeper) leftover(pod *corev1.Pod, now time.Time) string {
	if pod.DeletionTimestamp != nil {
		return "" // going already
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		if now.Sub(stoppedAt(pod)) >= s.o.StoppedGrace {
			return "its agent ended (phase " + string(pod.Status.Phase) + ")"
		}
		return ""
	}
	switch kit.State(pod.Annotations[AnnotationState]) {
	case kit.StateCreating, "":
		if now.Sub(pod.CreationTimestamp.Time) >= s.stale {
			return "still creating past the create timeout"
		}
	case kit.StateDestroying:
		since := pod.CreationTimestamp.Time
		if t, err := time.Parse(time.RFC3339Nano, pod.Annotations[AnnotationDestroyingSince]); err == nil {
			since = t
		}
		if now.Sub(since) >= s.o.DestroyingAfter {
			return "its teardown began over " + s.o.DestroyingAfter.String() + " ago"
		}
	}
	return ""
}

// stoppedAt is when a stopped Pod's last container ended (its creation
// when none says).
func stoppedAt(pod *corev1.Pod) time.Time {
	t := pod.CreationTimestamp.Time
	for _, cs := range pod.Status.ContainerStatuses {
		if term := cs.State.Terminated; term != nil && term.FinishedAt.After(t) {
			t = term.FinishedAt.Time
		}
	}
	return t
}

// podExists: the session's Pod is in this sweep's list, or (made since
// the list) the apiserver has it.
func (s *sweeper) podExists(ctx context.Context, pods map[string]*corev1.Pod, id string) bool {
	if id == "" {
		return false
	}
	if _, ok := pods[id]; ok {
		return true
	}
	_, err := s.client.CoreV1().Pods(s.ns).Get(ctx, podName(id), metav1.GetOptions{})
	return !apierrors.IsNotFound(err) // an error other than 404: keep, next sweep knows
}

// sweepPVC clears the claim of a PVC whose holder is gone, and deletes one
// still pending whose creating session is gone.
func (s *sweeper) sweepPVC(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pods map[string]*corev1.Pod, now time.Time) (string, error) {
	if pvc.DeletionTimestamp != nil {
		return "", nil
	}
	holder := pvc.Annotations[AnnotationHeldBy]
	pending := pvc.Annotations[AnnotationPending]
	if holder == "" && pending == "" {
		return "", nil
	}
	// A claim younger than the create timeout may be a create whose Pod
	// is not made yet.
	if since, err := time.Parse(time.RFC3339Nano, pvc.Annotations[AnnotationHeldSince]); err == nil && now.Sub(since) < s.stale {
		return "", nil
	}
	if now.Sub(pvc.CreationTimestamp.Time) < s.stale {
		return "", nil
	}
	if holder != "" && s.podExists(ctx, pods, holder) {
		return "", nil
	}
	if pending != "" && pending != holder && s.podExists(ctx, pods, pending) {
		return "", nil
	}
	api := s.client.CoreV1().PersistentVolumeClaims(s.ns)
	if pending != "" {
		rv := pvc.ResourceVersion
		err := api.Delete(ctx, pvc.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pvc.UID, ResourceVersion: &rv}})
		if err == nil || apierrors.IsNotFound(err) {
			return "pvc/" + pvc.Name, nil
		}
		if apierrors.IsConflict(err) {
			return "", nil // claimed meanwhile: the next sweep looks again
		}
		return "", fmt.Errorf("deleting the PersistentVolumeClaim %s/%s of a create that never went live: %w", s.ns, pvc.Name, err)
	}
	c := pvc.DeepCopy()
	delete(c.Annotations, AnnotationHeldBy)
	delete(c.Annotations, AnnotationHeldSince)
	_, err := api.Update(ctx, c, metav1.UpdateOptions{})
	if err == nil {
		return "pvc/" + pvc.Name + ":held-by", nil
	}
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return "", nil
	}
	return "", fmt.Errorf("clearing the claim of PersistentVolumeClaim %s/%s: %w", s.ns, pvc.Name, err)
}
