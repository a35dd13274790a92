package kubernetes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/tai42/sandbox"
)

// waitWith runs waitRunning on a fake cluster's Pod while update changes
// its status, and returns waitRunning's result.
func waitWith(t *testing.T, timeout time.Duration, update func(*corev1.Pod)) error {
	t.Helper()
	cs := fake.NewClientset()
	p := testProvider(Options{CreateTimeout: timeout})
	p.cs, p.cfg = cs, &rest.Config{Host: "https://fake"}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tai42-x", Namespace: p.ns, UID: "u1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending}}
	pod, err := cs.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = cs.CoreV1().Events(p.ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e1", Namespace: p.ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: pod.Name, UID: pod.UID},
		Type:           "Warning", Reason: "Failed", Message: "Failed to pull image: not found"}, metav1.CreateOptions{})
	done := make(chan error, 1)
	go func() { done <- p.waitRunning(ctx, pod) }()
	time.Sleep(50 * time.Millisecond) // the watch is set up
	if update != nil {
		got := pod.DeepCopy()
		update(got)
		if _, err := cs.CoreV1().Pods(p.ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		return err
	case <-time.After(timeout + 5*time.Second):
		t.Fatal("waitRunning did not return")
		return nil
	}
}

func TestWaitRunning(t *testing.T) {
	err := waitWith(t, 10*time.Second, func(pod *corev1.Pod) {
		pod.Status.Phase = corev1.PodRunning
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSession, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	})
	if err != nil {
		t.Fatalf("running: %v", err)
	}

	start := time.Now()
	err = waitWith(t, 10*time.Second, func(pod *corev1.Pod) {
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSession, Image: "nope:1",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}}}}
	})
	var sre *sandbox.SpecRejectedError
	if !errors.As(err, &sre) || sre.Field != "image" || !strings.Contains(err.Error(), "Failed to pull image") {
		t.Fatalf("pull failure: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("did not fail fast: %s", time.Since(start))
	}

	err = waitWith(t, time.Second, nil)
	var sbe *sandbox.SandboxError
	if !errors.As(err, &sbe) || !strings.Contains(err.Error(), "not running within") {
		t.Fatalf("timeout: %v", err)
	}
}

// TestPodStuckOneList: the probe's Pods and the sessions' fail fast on the
// same waiting reasons (the two lists had drifted).
func TestPodStuckOneList(t *testing.T) {
	waiting := func(reason string, init bool) *corev1.Pod {
		st := []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}}
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
		if init {
			p.Status.InitContainerStatuses = st
		} else {
			p.Status.ContainerStatuses = st
		}
		return p
	}
	for _, r := range append(slices.Clone(pullFailures), configFailures...) {
		if !podStuck(waiting(r, false)) || !podStuck(waiting(r, true)) {
			t.Errorf("%s: not stuck", r)
		}
	}
	if podStuck(waiting("ContainerCreating", false)) || podStuck(waiting("PodInitializing", true)) {
		t.Error("a Pod still starting is stuck")
	}
	if got := podSummary(nil); got != "never seen" {
		t.Errorf("podSummary(nil) = %q", got)
	}
	if got := podSummary(waiting("ImagePullBackOff", true)); got != "phase Pending; c waiting (ImagePullBackOff)" {
		t.Errorf("podSummary = %q", got)
	}
}
