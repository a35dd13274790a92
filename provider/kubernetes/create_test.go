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

// waitWith runs waitRunning on a fake cluster's Pod, with connect as the
// agent's dial, while updates change its status one after another, and
// returns the dial (ended) and waitRunning's result.
func waitWith(t *testing.T, timeout time.Duration, connect func(context.Context) error, updates ...func(*corev1.Pod)) (*agentDial, error) {
	t.Helper()
	return waitWithin(t, context.Background(), timeout, connect, updates...)
}

// waitWithin is waitWith with parent as the create's caller's context.
func waitWithin(t *testing.T, parent context.Context, timeout time.Duration, connect func(context.Context) error, updates ...func(*corev1.Pod)) (*agentDial, error) {
	t.Helper()
	cs := fake.NewClientset()
	p := testProvider(Options{CreateTimeout: timeout})
	p.cs, p.cfg = cs, &rest.Config{Host: "https://fake"}
	ctx, cancel := p.createContext(parent)
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
	dial := &agentDial{connect: connect}
	done := make(chan error, 1)
	go func() { err := p.waitRunning(ctx, pod, dial); dial.end(); done <- err }()
	for _, update := range updates {
		time.Sleep(50 * time.Millisecond) // the watch is set up; the last update seen
		got := pod.DeepCopy()
		update(got)
		if pod, err = cs.CoreV1().Pods(p.ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		return dial, err
	case <-time.After(timeout + 5*time.Second):
		t.Fatal("waitRunning did not return")
		return nil, nil
	}
}

// Status updates as the kubelet makes them.
func initialized(pod *corev1.Pod) {
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue})
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSession,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
}

func running(pod *corev1.Pod) {
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSession, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
}

func TestWaitRunning(t *testing.T) {
	answers := func(context.Context) error { return nil }
	never := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

	t.Run("DialsOnceInitialized", func(t *testing.T) {
		// The agent answers before the status says Running: the wait
		// ends with the dial, the Pod still Pending.
		var before time.Time
		dial, err := waitWith(t, 10*time.Second, answers, func(pod *corev1.Pod) { before = time.Now(); initialized(pod) })
		if err != nil {
			t.Fatalf("initialized: %v", err)
		}
		if dial.begun.IsZero() || dial.begun.Before(before) {
			t.Errorf("the dial began at %v, the Pod initialized at %v", dial.begun, before)
		}
	})
	t.Run("DialsOnceRunning", func(t *testing.T) {
		if dial, err := waitWith(t, 10*time.Second, answers, running); err != nil || dial.begun.IsZero() {
			t.Fatalf("running: %v (dial begun %v)", err, dial.begun)
		}
	})
	t.Run("PullFailure", func(t *testing.T) {
		start := time.Now()
		dial, err := waitWith(t, 10*time.Second, answers, func(pod *corev1.Pod) {
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
		if !dial.begun.IsZero() {
			t.Error("dialled a Pod that never initialized")
		}
	})
	t.Run("FailsWhileDialling", func(t *testing.T) {
		// The session's container ends while the dial waits for its
		// agent: the Pod's failure is the error, and the dial is stopped.
		var dialErr error
		_, err := waitWith(t, 10*time.Second, func(ctx context.Context) error { dialErr = never(ctx); return dialErr }, initialized, func(pod *corev1.Pod) {
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSession, Image: "img:1",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 127, Reason: "Error"}}}}
		})
		if err == nil || !strings.Contains(err.Error(), "exit 127") {
			t.Fatalf("container ended: %v", err)
		}
		if !errors.Is(dialErr, context.Canceled) {
			t.Errorf("the dial was not stopped: %v", dialErr)
		}
	})
	t.Run("DialFails", func(t *testing.T) {
		refused := errors.New("the agent refused")
		if _, err := waitWith(t, 10*time.Second, func(context.Context) error { return refused }, initialized); !errors.Is(err, refused) {
			t.Fatalf("dial failure: %v", err)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		_, err := waitWith(t, time.Second, never)
		var sbe *sandbox.SandboxError
		if !errors.As(err, &sbe) || !strings.Contains(err.Error(), "not running within 1s, the create timeout") {
			t.Fatalf("timeout: %v", err)
		}
	})
	t.Run("CallerDeadline", func(t *testing.T) {
		// The caller's deadline ends the wait before CreateTimeout: the
		// error names it (not the create timeout) and wraps its error.
		parent, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := waitWithin(t, parent, 10*time.Second, never)
		var sbe *sandbox.SandboxError
		if !errors.As(err, &sbe) || !errors.Is(err, context.DeadlineExceeded) ||
			!strings.Contains(err.Error(), "the caller's context ended") || strings.Contains(err.Error(), "within") {
			t.Fatalf("the caller's deadline: %v; want a SandboxError naming the caller's context, matching context.DeadlineExceeded", err)
		}
	})
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
