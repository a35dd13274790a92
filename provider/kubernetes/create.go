package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/kit"
)

// Timing is how long the phases of one create took (logged at the
// create's end; zero for an adopted session).
type Timing struct {
	PodCreated  time.Duration // the Pod (and Secret) accepted by the apiserver
	Initialized time.Duration // the Pod's status said its agent was copied: the dialling began
	AgentReady  time.Duration // the agent answered a ping through the tunnel
}

// Create makes session req.ID: its workspace claim (persistent), its Pod,
// its env Secret (owned by the Pod, so that the garbage collector removes
// it with the Pod), and waits, within CreateTimeout, until the Pod runs
// and its agent answers. A Pod that cannot start fails the create at once
// with the Pod's own events and container statuses as the reason; what
// the create made is deleted.
func (p *provider) Create(ctx context.Context, req kit.CreateRequest) (_ kit.Resources, err error) {
	start := time.Now()
	ctx, cancel := p.createContext(ctx)
	defer cancel()
	r := &session{p: p, id: req.ID, spec: req.Spec, pod: podName(req.ID)}
	var stack undo.Stack
	defer func() {
		if err != nil {
			// The rollback runs without the create's (maybe expired)
			// context, bounded on its own.
			uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			defer ucancel()
			if uerr := stack.Unwind(uctx); uerr != nil {
				p.log.Warn("create: the rollback left something behind", "id", req.ID, "err", uerr)
			}
		}
	}()
	pvc := ""
	var release undo.Func // lets go of the workspace's claim; nil: none
	var pod *corev1.Pod
	err = stack.Run(
		undo.Step{Name: "claim the workspace", Do: func() (undo.Func, error) {
			if req.Spec.Durability != sandbox.Persistent {
				return nil, nil
			}
			key := req.Spec.WorkspaceKey
			name, err := p.workspaces.claimWorkspace(ctx, req.ID, key)
			if err != nil {
				return nil, err
			}
			pvc = name
			release = func(ctx context.Context) error { return p.workspaces.releaseWorkspace(ctx, req.ID, key) }
			return release, nil
		}},
		undo.Step{Name: "create the pod", Do: func() (undo.Func, error) {
			now := time.Now()
			rec := kit.Record{ID: req.ID, Provider: Name, State: kit.StateCreating, Spec: req.Spec,
				WorkspacePath: workspaceDir, CreatedAt: now, ExpiresAt: now.Add(req.Spec.TTL()), Handle: r.Handle()}
			want, err := p.buildPod(rec, pvc)
			if err != nil {
				return nil, err
			}
			pod, err = p.cs.CoreV1().Pods(p.ns).Create(ctx, want, metav1.CreateOptions{})
			if err != nil {
				var undo undo.Func
				if !apierrors.IsAlreadyExists(err) && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
					// A request cut off by its context may have been
					// carried out: the Pod of this session's (unique)
					// name is deleted whatever its uid.
					undo = func(ctx context.Context) error { return r.removePod(ctx, false) }
				}
				return undo, p.apiError("create_session", "cannot create the session's Pod", err)
			}
			r.uid = pod.UID
			// The undo of a failed create does not wait for the Pod to be
			// gone; Destroy's does (Create sets it below).
			return func(ctx context.Context) error { return r.removePod(ctx, false) }, nil
		}},
		undo.Step{Name: "create the env secret", Do: func() (undo.Func, error) {
			if len(req.Spec.Env) == 0 {
				return nil, nil
			}
			if err := p.createSecret(ctx, pod, req.Spec.Env); err != nil {
				return r.deleteSecret, err // it may have been made (and its Pod owns it anyway)
			}
			return r.deleteSecret, nil
		}},
	)
	if err != nil {
		return nil, unwrapStep(err)
	}
	r.timing.PodCreated = time.Since(start)
	stack.Push("open the tunnel", r.closeTunnel)
	dial := &agentDial{connect: r.connect}
	err = p.waitRunning(ctx, pod, dial)
	dial.end()
	if !dial.begun.IsZero() {
		r.timing.Initialized = dial.begun.Sub(start)
	}
	if err != nil {
		return nil, err
	}
	r.timing.AgentReady = time.Since(start)
	if req.Spec.Durability == sandbox.Persistent {
		// The claim is a workspace now: the sweeper keeps it.
		if err := p.workspaces.commitWorkspace(ctx, req.ID, req.Spec.WorkspaceKey); err != nil {
			return nil, err
		}
	}
	// Destroy's teardown: the create's steps, but the Pod's deletion
	// waits until it is gone, and only then is the workspace let go.
	r.teardown.Push("claim the workspace", release)
	r.teardown.Push("create the pod", r.deletePod)
	if len(req.Spec.Env) > 0 {
		r.teardown.Push("create the env secret", r.deleteSecret)
	}
	r.teardown.Push("open the tunnel", r.closeTunnel)
	p.log.Info("session pod ready", "id", req.ID, "pod", r.pod,
		"pod_created", r.timing.PodCreated, "initialized", r.timing.Initialized, "agent_ready", r.timing.AgentReady)
	return r, nil
}

// unwrapStep is a step's own error: the step's name is for the log, a
// typed error stays matchable as it is.
func unwrapStep(err error) error {
	var se *undo.StepError
	if errors.As(err, &se) {
		var sbe *sandbox.SandboxError
		var sre *sandbox.SpecRejectedError
		if errors.As(se.Err, &sbe) || errors.As(se.Err, &sre) {
			return se.Err
		}
		return sandbox.WrapError("create_session", se.Step, se.Err)
	}
	return err
}

// apiError is a failed apiserver call as a *sandbox.SandboxError naming the
// apiserver (a request that timed out is not the session's fault).
func (p *provider) apiError(op, what string, err error) error {
	return sandbox.WrapError(op, fmt.Sprintf("%s (apiserver %s, namespace %s)", what, apiserverHost(p.cfg.Host), p.ns), err)
}

// createSecret creates the session's env Secret, owned by its Pod.
func (p *provider) createSecret(ctx context.Context, pod *corev1.Pod, env map[string]sandbox.Secret) error {
	data := make(map[string][]byte, len(env))
	for k, v := range env {
		data[k] = []byte(v.Reveal())
	}
	id := pod.Labels[LabelSession]
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      secretName(id),
			Namespace: p.ns,
			Labels:    map[string]string{LabelManaged: ManagedBy, LabelSession: id},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	if _, err := p.cs.CoreV1().Secrets(p.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		// The apiserver's error names the object, never its data.
		return p.apiError("create_session", "cannot create the session's env Secret", err)
	}
	return nil
}

// pullFailures are the waiting reasons of a container whose image the
// cluster cannot get or that cannot be started as configured: the create
// fails at the first one rather than waiting out its back-off.
var pullFailures = []string{"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
var configFailures = []string{"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "PreCreateHookError", "PostStartHookError"}

// podFailure is why pod cannot become Running, or nil while it still may.
// An image the cluster cannot pull is the spec's image when it is the
// session's container (a *sandbox.SpecRejectedError), the operator's agent
// image when it is the init container.
func (p *provider) podFailure(pod *corev1.Pod) error {
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return fmt.Errorf("the pod ended: %s", podSummary(pod))
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			// The claim is being bound ("pod has unbound immediate
			// PersistentVolumeClaims"), or the scheduler has not seen the
			// claim made just before the pod yet ("persistentvolumeclaim
			// NAME not found"): it retries, and the create's bound ends a
			// claim that never comes.
			if strings.Contains(strings.ToLower(c.Message), "persistentvolumeclaim") {
				continue
			}
			return fmt.Errorf("the pod cannot be scheduled: %s", c.Message)
		}
	}
	check := func(st corev1.ContainerStatus, init bool) error {
		who := "the session's container (image " + st.Image + ")"
		if init {
			who = "the agent's init container (agent image " + p.opts.AgentImage + ")"
		}
		if w := st.State.Waiting; w != nil {
			switch {
			case slices.Contains(pullFailures, w.Reason):
				err := fmt.Errorf("%s: %s: %s", who, w.Reason, w.Message)
				if !init {
					return &imageError{err}
				}
				return err
			case slices.Contains(configFailures, w.Reason):
				return fmt.Errorf("%s: %s: %s", who, w.Reason, w.Message)
			}
		}
		if t := st.State.Terminated; t != nil && (!init || t.ExitCode != 0) {
			return fmt.Errorf("%s ended: exit %d, %s %s", who, t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
		}
		return nil
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if err := check(st, true); err != nil {
			return err
		}
	}
	for _, st := range pod.Status.ContainerStatuses {
		if err := check(st, false); err != nil {
			return err
		}
	}
	return nil
}

// imageError marks a failure that is the spec's image's.
type imageError struct{ error }

func (e *imageError) Unwrap() error { return e.error }

// podRunning reports whether pod runs its session container.
func podRunning(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == containerSession {
			return st.State.Running != nil
		}
	}
	return false
}

// podSummary says, for a message, where pod stands: its phase, why it is
// not scheduled, and its containers' (init containers' first) states.
func podSummary(pod *corev1.Pod) string {
	if pod == nil {
		return "never seen"
	}
	parts := []string{"phase " + string(pod.Status.Phase)}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue && c.Message != "" {
			parts = append(parts, "unscheduled: "+c.Message)
		}
	}
	for _, st := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		switch s := st.State; {
		case s.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting (%s)", st.Name, strings.TrimSpace(s.Waiting.Reason+" "+s.Waiting.Message)))
		case s.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated (exit %d, %s)", st.Name, s.Terminated.ExitCode, s.Terminated.Reason))
		case s.Running != nil:
			parts = append(parts, st.Name+" running")
		}
	}
	return strings.Join(parts, "; ")
}

// podStuck reports whether pod waits on something that does not pass by
// itself (an image the cluster cannot pull, a container it cannot make).
func podStuck(pod *corev1.Pod) bool {
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && (slices.Contains(pullFailures, w.Reason) || slices.Contains(configFailures, w.Reason)) {
			return true
		}
	}
	return false
}

// agentDial is a create's connect to its agent, run beside the watch of
// its Pod. The Pod's status says its session container runs only at the
// kubelet's next relist of the runtime's containers (up to a second after
// the relist that saw the init container end and started the session's
// container), so the dialling begins as soon as the status says the Pod is
// initialized: the agent answers a moment after its container starts,
// mostly before the status says it runs.
type agentDial struct {
	connect func(context.Context) error // the session's connect
	begun   time.Time                   // when begin started it
	cancel  context.CancelFunc
	done    chan error // nil until begun; connect's result
	ended   bool       // done's result was taken
}

// begin starts connect, once, bounded by ctx.
func (d *agentDial) begin(ctx context.Context) {
	if d.done != nil {
		return
	}
	d.begun = time.Now()
	ctx, d.cancel = context.WithCancel(ctx)
	d.done = make(chan error, 1)
	go func() { d.done <- d.connect(ctx) }()
}

// result is connect's result once it is there (nil channel until begun).
func (d *agentDial) result() <-chan error { return d.done }

// taken notes that the caller received connect's result.
func (d *agentDial) taken() { d.ended = true }

// end stops a connect still running and waits for it: r.tun is connect's
// until it returns.
func (d *agentDial) end() {
	if d.done == nil || d.ended {
		return
	}
	d.cancel()
	<-d.done
	d.ended = true
}

// podInitialized reports whether pod's init container (the agent's copy)
// is done.
func podInitialized(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodInitialized {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitRunning watches pod until its agent answers (dial, begun once the
// Pod is initialized), the Pod fails, or ctx (the create's deadline)
// ends. A failure is the create's error, with the Pod's events quoted.
func (p *provider) waitRunning(ctx context.Context, pod *corev1.Pod, dial *agentDial) error {
	if podInitialized(pod) || podRunning(pod) {
		dial.begin(ctx)
	}
	w, err := p.cs.CoreV1().Pods(p.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return p.apiError("create_session", "cannot watch the session's Pod", err)
	}
	defer w.Stop()
	cur := pod
	for {
		select {
		case err := <-dial.result():
			dial.taken()
			return err
		case ev, ok := <-w.ResultChan():
			if !ok {
				if ctx.Err() != nil {
					return p.notRunning(ctx, cur)
				}
				// The apiserver ended the watch: start again from the
				// Pod as it is now.
				got, err := p.cs.CoreV1().Pods(p.ns).Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return p.createFailed(cur, p.apiError("create_session", "lost the watch of the session's Pod", err))
				}
				return p.waitRunning(ctx, got, dial)
			}
			switch ev.Type {
			case watch.Deleted:
				return p.createFailed(cur, errors.New("the pod was deleted while it was starting"))
			case watch.Error:
				return p.createFailed(cur, fmt.Errorf("the watch of the pod failed: %v", apierrors.FromObject(ev.Object)))
			}
			got, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			cur = got
			if err := p.podFailure(cur); err != nil {
				return p.createFailed(cur, err)
			}
			if podInitialized(cur) || podRunning(cur) {
				dial.begin(ctx)
			}
		case <-ctx.Done():
			return p.notRunning(ctx, cur)
		}
	}
}

// createContext is ctx bounded by CreateTimeout, with errCreateTimeout
// as the cause when that bound ends it.
func (p *provider) createContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, p.opts.CreateTimeout, errCreateTimeout)
}

// errCreateTimeout is the cause of a create's context when CreateTimeout
// ended it, rather than the caller's own deadline or cancel.
var errCreateTimeout = errors.New("the create timeout")

// notRunning is waitRunning's error once ctx has ended, naming what ended
// it: CreateTimeout, or the caller's context (whose error it wraps, so
// that errors.Is matches context.DeadlineExceeded or Canceled).
func (p *provider) notRunning(ctx context.Context, cur *corev1.Pod) error {
	if errors.Is(context.Cause(ctx), errCreateTimeout) {
		return p.createFailed(cur, fmt.Errorf("the pod was not running within %s, the create timeout (%s)", p.opts.CreateTimeout, podSummary(cur)))
	}
	return p.createFailed(cur, fmt.Errorf("the pod was not running when the caller's context ended: %w (%s)", ctx.Err(), podSummary(cur)))
}

// createFailed is the create's error for why: a *sandbox.SpecRejectedError
// of field image when the cluster cannot pull the session's image, else a
// *sandbox.SandboxError; both quote the Pod's events.
func (p *provider) createFailed(pod *corev1.Pod, why error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return failure(pod, p.ns, why, p.podEvents(ctx, pod))
}

// failure is createFailed's error, events quoted.
func failure(pod *corev1.Pod, ns string, why error, events string) error {
	msg := why.Error()
	if events != "" {
		msg += "; pod events: " + events
	}
	var ie *imageError
	if errors.As(why, &ie) {
		return &sandbox.SpecRejectedError{Field: "image", Reason: sandbox.ReasonUnenforceable,
			Message: "the cluster cannot pull the image: " + msg}
	}
	var sbe *sandbox.SandboxError
	if errors.As(why, &sbe) {
		return sandbox.WrapError("create_session", fmt.Sprintf("session pod %s/%s: %s", ns, pod.Name, msg), sbe.Err)
	}
	return sandbox.WrapError("create_session", fmt.Sprintf("session pod %s/%s did not start: %s", ns, pod.Name, msg), why)
}

// podEvents quotes the last events of pod, oldest first.
func (p *provider) podEvents(ctx context.Context, pod *corev1.Pod) string {
	sel := fields.Set{"involvedObject.name": pod.Name, "involvedObject.kind": "Pod"}
	if pod.UID != "" {
		sel["involvedObject.uid"] = string(pod.UID)
	}
	list, err := p.cs.CoreV1().Events(p.ns).List(ctx, metav1.ListOptions{FieldSelector: sel.AsSelector().String()})
	if err != nil || len(list.Items) == 0 {
		return ""
	}
	items := list.Items
	slices.SortFunc(items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	if len(items) > 8 {
		items = items[len(items)-8:]
	}
	var parts []string
	for _, e := range items {
		parts = append(parts, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, strings.TrimSpace(e.Message)))
	}
	return strings.Join(parts, " | ")
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}
