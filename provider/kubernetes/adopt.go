package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// adoptTimeout bounds bringing one session back: its Pod read, its agent
// pinged.
const adoptTimeout = 15 * time.Second

var _ kit.Adopter = (*provider)(nil)

// Adopt serves session k from its existing Pod, made by another daemon
// (or by this one before a restart): the Pod must be running, its agent
// answering. A Pod that is gone is a *sandbox.SessionNotFoundError; one
// that does not run or answer, a *sandbox.SandboxError.
func (p *provider) Adopt(ctx context.Context, k kit.Kept) (kit.Resources, error) {
	ctx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	name := podName(k.ID)
	if len(k.Handle) > 0 {
		var h handle
		if err := json.Unmarshal(k.Handle, &h); err == nil && h.Pod != "" {
			if h.Namespace != "" && h.Namespace != p.ns {
				return nil, sandbox.Errorf("adopt", "session %s lives in namespace %q; this daemon serves %q", k.ID, h.Namespace, p.ns)
			}
			name = h.Pod
		}
	}
	pod, err := p.cs.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, &sandbox.SessionNotFoundError{SessionID: k.ID, Detail: fmt.Sprintf("its pod %s/%s is gone", p.ns, name)}
	case err != nil:
		return nil, p.apiError("adopt", fmt.Sprintf("cannot read the pod of session %s", k.ID), err)
	case pod.Labels[LabelSession] != k.ID:
		return nil, sandbox.Errorf("adopt", "pod %s/%s is not session %s's (label %s=%q)", p.ns, name, k.ID, LabelSession, pod.Labels[LabelSession])
	case pod.DeletionTimestamp != nil || pod.Annotations[AnnotationState] == string(kit.StateDestroying):
		return nil, &sandbox.SessionNotFoundError{SessionID: k.ID, Detail: "its pod is being deleted"}
	case !podRunning(pod):
		return nil, sandbox.Errorf("adopt", "the pod of session %s does not run: %s", k.ID, podSummary(pod))
	}
	r := &session{p: p, id: k.ID, spec: k.Spec, pod: name, uid: pod.UID}
	if err := r.connect(ctx); err != nil {
		_ = r.closeTunnel(ctx)
		return nil, err
	}
	// Destroy deletes what Create would have: the tunnel, the Secret, the
	// Pod, then lets go of a persistent session's key (last pushed, first
	// undone). Without the release, a key whose holder's Pod is gone stays
	// held for a create's length (see holderLive).
	if k.Spec.Durability == sandbox.Persistent {
		key := k.Spec.WorkspaceKey
		r.teardown.Push("claim the workspace", func(ctx context.Context) error { return p.workspaces.releaseWorkspace(ctx, k.ID, key) })
	}
	r.teardown.Push("create the pod", r.deletePod)
	r.teardown.Push("create the env secret", r.deleteSecret)
	r.teardown.Push("open the tunnel", r.closeTunnel)
	return r, nil
}
