package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// Annotations on a workspace PVC.
const (
	// AnnotationHeldSince is when the claim was taken: a holder without a
	// Pod yet is mid-create until the create timeout (+ a margin) is past.
	AnnotationHeldSince = "tai42.dev/held-since"
	// AnnotationPending names the session whose create made the PVC, until
	// it went live: a PVC still pending when that session is gone holds
	// nothing anyone wrote, and is deleted.
	AnnotationPending = "tai42.dev/pending"

	// AnnotationDefaultClass marks the cluster's default StorageClass.
	AnnotationDefaultClass = "storageclass.kubernetes.io/is-default-class"
)

// Defaults of [wsOptions].
const (
	DefaultWorkspaceSize = "1Gi"
	staleMargin          = 30 * time.Second
	// removeWait bounds RemoveWorkspace's wait for the PVC to be gone.
	removeWait = 60 * time.Second
	// classProbeTTL is how long check trusts its last look at the
	// StorageClasses.
	classProbeTTL = 30 * time.Second
	probeTimeout  = 5 * time.Second
)

// wsOptions configure persistent workspaces.
type wsOptions struct {
	// StorageClass of the PVCs; "" is the cluster's default StorageClass.
	StorageClass string
	// Size requested for each PVC; "" is DefaultWorkspaceSize.
	Size string
	// CreateTimeout is the core's create bound; 0 is DefaultCreateTimeout.
	CreateTimeout time.Duration
}

// workspaces keeps persistent workspaces as PVCs named pvcName(key) in the
// namespace. It implements kit.WorkspaceStore (the provider's Workspaces
// and RemoveWorkspace call it), and claims a key for a session across
// every daemon serving the namespace.
type workspaces struct {
	client k8s.Interface
	ns     string
	class  string
	size   resource.Quantity
	stale  time.Duration

	mu      sync.Mutex
	probed  time.Time
	probeOK string // the class PVCs get ("" with probeErr set)
	probeEr error
}

var _ kit.WorkspaceStore = (*workspaces)(nil)

func newWorkspaces(client k8s.Interface, ns string, o wsOptions) (*workspaces, error) {
	if o.Size == "" {
		o.Size = DefaultWorkspaceSize
	}
	size, err := resource.ParseQuantity(o.Size)
	if err != nil || size.Sign() <= 0 {
		return nil, fmt.Errorf("kubernetes: workspace size %q is not a positive quantity (like 1Gi)", o.Size)
	}
	if o.CreateTimeout <= 0 {
		o.CreateTimeout = DefaultCreateTimeout
	}
	return &workspaces{client: client, ns: ns, class: o.StorageClass, size: size, stale: o.CreateTimeout + staleMargin}, nil
}

// check rejects a persistent spec where no usable StorageClass exists: the
// one the options name is missing, or, with none named, the cluster has no
// default StorageClass (a PVC would never bind, and the create would wait
// out its timeout).
func (w *workspaces) check(spec sandbox.SessionSpec) error {
	if spec.Durability != sandbox.Persistent {
		return nil
	}
	if _, err := w.storageClass(); err != nil {
		return &sandbox.SpecRejectedError{Field: "durability", Reason: sandbox.ReasonUnenforceable,
			Message: "persistent workspaces are PersistentVolumeClaims on this cluster, and " + err.Error()}
	}
	return nil
}

// storageClass is the StorageClass PVCs get, probed at most every
// classProbeTTL.
func (w *workspaces) storageClass() (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.probed.IsZero() && time.Since(w.probed) < classProbeTTL {
		return w.probeOK, w.probeEr
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	w.probeOK, w.probeEr = w.probeClass(ctx)
	w.probed = time.Now()
	return w.probeOK, w.probeEr
}

func (w *workspaces) probeClass(ctx context.Context) (string, error) {
	sc := w.client.StorageV1().StorageClasses()
	if w.class != "" {
		_, err := sc.Get(ctx, w.class, metav1.GetOptions{})
		switch {
		case err == nil:
			return w.class, nil
		case apierrors.IsNotFound(err):
			return "", fmt.Errorf("the StorageClass %q the daemon is configured with does not exist", w.class)
		default:
			return "", fmt.Errorf("the StorageClass %q could not be read (%v)", w.class, err)
		}
	}
	list, err := sc.List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("the cluster's StorageClasses could not be listed to find the default one (%v); name one with the daemon's storage class option", err)
	}
	var defaults []storagev1.StorageClass
	for _, c := range list.Items {
		if c.Annotations[AnnotationDefaultClass] == "true" {
			defaults = append(defaults, c)
		}
	}
	if len(defaults) == 0 {
		return "", fmt.Errorf("the cluster has no default StorageClass (none annotated %s=true) and the daemon names none", AnnotationDefaultClass)
	}
	// Several defaults: the apiserver gives a PVC the newest; so do we.
	slices.SortFunc(defaults, func(a, b storagev1.StorageClass) int {
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	return defaults[0].Name, nil
}

// claimWorkspace readies the PVC of key for session id and marks it held
// by id, and returns its name. A PVC it creates is pending until
// commitWorkspace. A key held by another session that is live (or
// mid-create) is a *sandbox.SpecRejectedError of Field workspace_key and
// Reason conflict naming the holder; a stale holder is replaced.
func (w *workspaces) claimWorkspace(ctx context.Context, id, key string) (string, error) {
	name := pvcName(key)
	pvcs := w.client.CoreV1().PersistentVolumeClaims(w.ns)
	for {
		now := time.Now().UTC().Format(time.RFC3339Nano)
		pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// The class the options name, else the default check found
			// (cached), named on the PVC: without the DefaultStorageClass
			// admission plugin a PVC naming none never binds.
			class := w.class
			if class == "" {
				var cerr error
				if class, cerr = w.storageClass(); cerr != nil {
					return "", &sandbox.SpecRejectedError{Field: "durability", Reason: sandbox.ReasonUnenforceable,
						Message: "persistent workspaces are PersistentVolumeClaims on this cluster, and " + cerr.Error()}
				}
			}
			_, err = pvcs.Create(ctx, w.newPVC(id, key, now, class), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue // made by another daemon meanwhile: claim that one
			}
			if err != nil {
				return "", w.apiErr("creating the PersistentVolumeClaim", name, key, err)
			}
			return name, nil
		}
		if err != nil {
			return "", w.apiErr("reading the PersistentVolumeClaim", name, key, err)
		}
		if pvc.DeletionTimestamp != nil {
			// Being removed (a remove_workspace elsewhere): wait for it to
			// go, then make the key's workspace anew.
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				return "", sandbox.WrapError("create_session", fmt.Sprintf("kubernetes: the persistent workspace %q is being removed (PersistentVolumeClaim %s/%s)", key, w.ns, name), err)
			}
			continue
		}
		if k := pvc.Annotations[AnnotationWorkspaceKey]; k != "" && k != key {
			return "", sandbox.Errorf("create_session", "kubernetes: the PersistentVolumeClaim %s/%s holds workspace %q, not %q (a hash collision)", w.ns, name, k, key)
		}
		holder := pvc.Annotations[AnnotationHeldBy]
		if holder != "" && holder != id {
			live, err := w.holderLive(ctx, holder, pvc.Annotations[AnnotationHeldSince])
			if err != nil {
				return "", err
			}
			if live {
				return "", &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict,
					Message: fmt.Sprintf("persistent workspace %q is held by session %s (destroy it first)", key, holder)}
			}
		}
		if pvc.Annotations == nil {
			pvc.Annotations = map[string]string{}
		}
		pvc.Annotations[AnnotationHeldBy] = id
		pvc.Annotations[AnnotationHeldSince] = now
		if p := pvc.Annotations[AnnotationPending]; p != "" && p != id {
			// Never went live with its first holder: still nothing in it
			// anyone was told is kept.
			pvc.Annotations[AnnotationPending] = id
		}
		// The resourceVersion read above makes the update conditional: a
		// claim another daemon took meanwhile fails it, and we look again.
		_, err = pvcs.Update(ctx, pvc, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", w.apiErr("claiming the PersistentVolumeClaim", name, key, err)
		}
		return name, nil
	}
}

// newPVC is the PVC of key, claimed by session id, of StorageClass class.
func (w *workspaces) newPVC(id, key, now, class string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      pvcName(key),
			Namespace: w.ns,
			Labels:    map[string]string{LabelManaged: ManagedBy, LabelWorkspace: workspaceHash(key)},
			Annotations: map[string]string{
				AnnotationWorkspaceKey: key,
				AnnotationHeldBy:       id,
				AnnotationHeldSince:    now,
				AnnotationPending:      id,
			},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: w.size},
			},
		},
	}
	if class != "" {
		pvc.Spec.StorageClassName = &class
	}
	return pvc
}

// holderLive reports whether session holder still holds its claim: its Pod
// exists, is not stopped, and is live and unexpired, or creating within
// the create timeout; or it has no Pod yet and its claim is younger than
// the create timeout (it is mid-create, on some daemon).
func (w *workspaces) holderLive(ctx context.Context, holder, heldSince string) (bool, error) {
	pod, err := w.client.CoreV1().Pods(w.ns).Get(ctx, podName(holder), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		since, perr := time.Parse(time.RFC3339Nano, heldSince)
		return perr == nil && time.Since(since) < w.stale, nil
	}
	if err != nil {
		return false, sandbox.WrapError("create_session", fmt.Sprintf("kubernetes: reading the Pod %s/%s of session %s, which holds a persistent workspace", w.ns, podName(holder), holder), err)
	}
	return podHolds(pod, w.stale, time.Now()), nil
}

// podHolds reports whether a session Pod still holds what it claimed: not
// stopped, and live and unexpired, or creating for less than stale.
func podHolds(pod *corev1.Pod, stale time.Duration, now time.Time) bool {
	if podStopped(pod) {
		return false
	}
	switch kit.State(pod.Annotations[AnnotationState]) {
	case kit.StateLive:
		exp, err := time.Parse(time.RFC3339Nano, pod.Annotations[AnnotationExpiresAt])
		return err == nil && now.Before(exp)
	case kit.StateCreating, "":
		return now.Sub(pod.CreationTimestamp.Time) < stale
	default: // destroying
		return false
	}
}

// commitWorkspace marks the PVC of key as holding a session that went
// live: from now on it is kept whatever happens to session id.
func (w *workspaces) commitWorkspace(ctx context.Context, id, key string) error {
	return w.edit(ctx, "commit", key, func(pvc *corev1.PersistentVolumeClaim) bool {
		if pvc.Annotations[AnnotationPending] != id {
			return false
		}
		delete(pvc.Annotations, AnnotationPending)
		return true
	})
}

// releaseWorkspace lets go of session id's claim on the PVC of key (a
// destroy, or a create that failed). A PVC its create made that never went
// live is deleted: nothing anyone was told is kept is in it.
func (w *workspaces) releaseWorkspace(ctx context.Context, id, key string) error {
	ctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	name := pvcName(key)
	pvcs := w.client.CoreV1().PersistentVolumeClaims(w.ns)
	for {
		pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return w.apiErr("reading the PersistentVolumeClaim", name, key, err)
		}
		if pvc.Annotations[AnnotationHeldBy] != id {
			return nil
		}
		if pvc.Annotations[AnnotationPending] == id {
			rv, uid := pvc.ResourceVersion, pvc.UID
			err = pvcs.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		} else {
			delete(pvc.Annotations, AnnotationHeldBy)
			delete(pvc.Annotations, AnnotationHeldSince)
			_, err = pvcs.Update(ctx, pvc, metav1.UpdateOptions{})
		}
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return w.apiErr("releasing the PersistentVolumeClaim", name, key, err)
		}
		return nil
	}
}

// edit applies change to the PVC of key with an optimistic-concurrency
// Update, again on a conflict; change returns false for no update. A
// missing PVC is a *sandbox.WorkspaceNotFoundError.
func (w *workspaces) edit(ctx context.Context, what, key string, change func(*corev1.PersistentVolumeClaim) bool) error {
	name := pvcName(key)
	pvcs := w.client.CoreV1().PersistentVolumeClaims(w.ns)
	for {
		pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return &sandbox.WorkspaceNotFoundError{Key: key}
		}
		if err != nil {
			return w.apiErr("reading the PersistentVolumeClaim", name, key, err)
		}
		if pvc.Annotations == nil {
			pvc.Annotations = map[string]string{}
		}
		if !change(pvc) {
			return nil
		}
		_, err = pvcs.Update(ctx, pvc, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if apierrors.IsNotFound(err) {
			return &sandbox.WorkspaceNotFoundError{Key: key}
		}
		if err != nil {
			return w.apiErr(what+" of the PersistentVolumeClaim", name, key, err)
		}
		return nil
	}
}

// Workspaces lists the persistent workspaces: every managed PVC of the
// namespace that is not being removed. SizeBytes is the PVC's capacity
// (0 until a volume is bound), ModifiedAt its creation.
func (w *workspaces) Workspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error) {
	list, err := w.client.CoreV1().PersistentVolumeClaims(w.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelManaged + "=" + ManagedBy + "," + LabelWorkspace})
	if err != nil {
		return nil, sandbox.WrapError("list_workspaces", "kubernetes: listing the PersistentVolumeClaims of namespace "+w.ns, err)
	}
	out := []sandbox.WorkspaceInfo{}
	for _, pvc := range list.Items {
		key := pvc.Annotations[AnnotationWorkspaceKey]
		if pvc.DeletionTimestamp != nil || sandbox.ValidWorkspaceKey(key) != nil || pvc.Name != pvcName(key) {
			continue
		}
		var size int64
		if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
			size = q.Value()
		}
		out = append(out, sandbox.WorkspaceInfo{Key: key, SizeBytes: size, ModifiedAt: pvc.CreationTimestamp.UTC()})
	}
	slices.SortFunc(out, func(a, b sandbox.WorkspaceInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// RemoveWorkspace deletes the PVC of key (its volume goes by the
// StorageClass's reclaim policy) and waits, bounded, until it is gone. A
// claim a live session holds (on any daemon) is a conflict; a missing PVC
// is a *sandbox.WorkspaceNotFoundError.
func (w *workspaces) RemoveWorkspace(ctx context.Context, key string) error {
	if err := sandbox.ValidWorkspaceKey(key); err != nil {
		return sandbox.Errorf("remove_workspace", "%v; no workspace can have it", err)
	}
	name := pvcName(key)
	pvcs := w.client.CoreV1().PersistentVolumeClaims(w.ns)
	var uid string
	for {
		pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return &sandbox.WorkspaceNotFoundError{Key: key}
		}
		if err != nil {
			return w.apiErr("reading the PersistentVolumeClaim", name, key, err)
		}
		if pvc.DeletionTimestamp == nil {
			if holder := pvc.Annotations[AnnotationHeldBy]; holder != "" {
				live, err := w.holderLive(ctx, holder, pvc.Annotations[AnnotationHeldSince])
				if err != nil {
					return err
				}
				if live {
					return &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict,
						Message: fmt.Sprintf("persistent workspace %q is held by session %s (destroy it first)", key, holder)}
				}
			}
			// Conditional on what was read: a claim taken meanwhile fails
			// the delete, and we look again.
			rv, u := pvc.ResourceVersion, pvc.UID
			err = pvcs.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &u, ResourceVersion: &rv}})
			if apierrors.IsConflict(err) {
				continue
			}
			if apierrors.IsNotFound(err) {
				return &sandbox.WorkspaceNotFoundError{Key: key}
			}
			if err != nil {
				return w.apiErr("deleting the PersistentVolumeClaim", name, key, err)
			}
		}
		uid = string(pvc.UID)
		break
	}
	// The pvc-protection finalizer keeps it while a Pod still mounts it (a
	// stale holder's being torn down).
	deadline := time.Now().Add(removeWait)
	for {
		pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && string(pvc.UID) != uid) {
			return nil
		}
		if err != nil {
			return w.apiErr("waiting for the removal of the PersistentVolumeClaim", name, key, err)
		}
		if time.Now().After(deadline) {
			return sandbox.Errorf("remove_workspace", "kubernetes: the PersistentVolumeClaim %s/%s of workspace %q is still there %v after its deletion (finalizers %v: a Pod still mounting it?)",
				w.ns, name, key, removeWait, pvc.Finalizers)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return sandbox.WrapError("remove_workspace", fmt.Sprintf("kubernetes: waiting for the removal of the PersistentVolumeClaim %s/%s", w.ns, name), err)
		}
	}
}

func (w *workspaces) apiErr(what, name, key string, err error) error {
	return sandbox.WrapError("", fmt.Sprintf("kubernetes: persistent workspace %q: %s %s/%s", key, what, w.ns, name), err)
}
