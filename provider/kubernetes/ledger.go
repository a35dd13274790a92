package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// Annotations the ledger owns besides the core's record annotations.
const (
	// AnnotationEnvKeys lists (JSON array, sorted) the names of the
	// session's env; their values are in the Secret secretName(id).
	// Names only: never a value.
	AnnotationEnvKeys = "tai42.dev/env-keys"
	// AnnotationDestroyingSince is when the record went destroying, so
	// that the sweeper removes a teardown whose daemon died a minute after
	// it began, not a minute after the session was made.
	AnnotationDestroyingSince = "tai42.dev/destroying-since"
)

// DefaultSyncTimeout bounds newLedger's wait for the first list of Pods.
const DefaultSyncTimeout = 30 * time.Second

// sessionSelector picks the session Pods of the provider: managed and
// carrying a session id.
var sessionSelector = LabelManaged + "=" + ManagedBy + "," + LabelSession

// ledger is the kubernetes provider's kit.SharedLedger: the records are
// the session Pods' annotations, read from an informer's cache (a watch),
// so every daemon serving the namespace sees every session and Get costs
// no round trip.
//
// What this process wrote and the informer has not yet shown back is kept
// in an overlay (by the resourceVersion the write returned), so that a Get
// right after a Put or Delete of this process sees it.
type ledger struct {
	client   k8s.Interface
	ns       string
	provider string

	factory informers.SharedInformerFactory
	pods    listerscorev1.PodLister
	cancel  context.CancelFunc // stops the informer
	lease   *reaperLease       // nil: Reaping is false

	mu sync.Mutex
	// local: records this process wrote that the cache may not show yet.
	local map[string]localRecord
	// env: the env values of each session, read once from its Secret.
	env map[string]map[string]sandbox.Secret

	closeOnce sync.Once
}

// localRecord is one overlay entry: rec as written at resourceVersion rv
// (0: nothing remote yet, a creating note), or a deletion.
type localRecord struct {
	rec     kit.Record
	rv      uint64
	deleted bool
	at      time.Time
}

var _ kit.SharedLedger = (*ledger)(nil)

// localTTL bounds how long an overlay entry outlives the write it notes,
// when the watch never shows it back (a Pod deleted before it was seen).
const localTTL = 5 * time.Minute

// newLedger starts the informer on the managed Pods of ns and waits,
// bounded by ctx and DefaultSyncTimeout, until its cache holds the first
// list. Reaping is false until attachLease.
func newLedger(ctx context.Context, client k8s.Interface, ns, provider string) (*ledger, error) {
	l := &ledger{
		client: client, ns: ns, provider: provider,
		local: map[string]localRecord{},
		env:   map[string]map[string]sandbox.Secret{},
	}
	// No resync: the watch delivers every change; a resync would only
	// replay the cache.
	l.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sessionSelector }))
	inf := l.factory.Core().V1().Pods()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: l.podGone,
	}); err != nil {
		return nil, fmt.Errorf("kubernetes: ledger: %w", err)
	}
	// The reflector retries a failed list for ever; the last failure is
	// the cause a sync that times out reports (never a secret: it is the
	// apiserver's answer to a list of Pods).
	var lastErr atomic.Pointer[error]
	if err := inf.Informer().SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		lastErr.Store(&err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return nil, fmt.Errorf("kubernetes: ledger: %w", err)
	}
	l.pods = inf.Lister()
	// The informer outlives ctx (a setup bound) but logs through its
	// logger (klog's contextual one: the daemon's, not klog's stderr).
	ictx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.FromContext(ctx)))
	l.cancel = cancel
	l.factory.StartWithContext(ictx)

	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, DefaultSyncTimeout)
	defer cancel()
	synced := l.factory.WaitForCacheSync(sctx.Done())
	for _, ok := range synced {
		if !ok {
			l.Close()
			host := client.CoreV1().RESTClient().Get().URL().Host
			cause := ctx.Err()
			if p := lastErr.Load(); p != nil {
				cause = *p
			}
			return nil, sandbox.WrapError("", fmt.Sprintf("kubernetes: the apiserver %s did not list the session Pods of namespace %q in %v (is it reachable, and may this daemon list and watch pods there?)",
				host, ns, time.Since(start).Round(time.Millisecond)), cause)
		}
	}
	return l, nil
}

// podGone drops what this process kept of a session whose Pod the watch
// reports deleted.
func (l *ledger) podGone(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	id := pod.Labels[LabelSession]
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.env, id)
	if e, ok := l.local[id]; ok && (e.deleted || e.rv != 0) {
		delete(l.local, id)
	}
}

// Put records r. A creating record is noted here only: the Pod is made
// with state=creating by Create, and nothing remote is written before it
// exists. A live or destroying record is a merge patch of the Pod's
// annotations; a missing Pod is an error naming it.
func (l *ledger) Put(ctx context.Context, r kit.Record) error {
	if r.State == kit.StateCreating {
		l.mu.Lock()
		l.local[r.ID] = localRecord{rec: cloneRecord(r), at: time.Now()}
		l.mu.Unlock()
		return nil
	}
	ann, err := recordAnnotations(r)
	if err != nil {
		return sandbox.WrapError("", "kubernetes: ledger: the record of session "+r.ID, err)
	}
	if r.State == kit.StateDestroying {
		ann[AnnotationDestroyingSince] = time.Now().UTC().Format(time.RFC3339Nano)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return sandbox.WrapError("", "kubernetes: ledger: the record of session "+r.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	pod, err := l.client.CoreV1().Pods(l.ns).Patch(ctx, podName(r.ID), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return sandbox.WrapError("", fmt.Sprintf("kubernetes: ledger: the Pod %s/%s of session %s is gone", l.ns, podName(r.ID), r.ID), err)
		}
		return sandbox.WrapError("", fmt.Sprintf("kubernetes: ledger: recording session %s on its Pod %s/%s", r.ID, l.ns, podName(r.ID)), err)
	}
	rv, _ := strconv.ParseUint(pod.ResourceVersion, 10, 64)
	l.mu.Lock()
	l.local[r.ID] = localRecord{rec: cloneRecord(r), rv: rv, at: time.Now()}
	if r.Spec.Env != nil {
		l.env[r.ID] = maps.Clone(r.Spec.Env)
	}
	l.mu.Unlock()
	return nil
}

// Delete deletes the session's Pod (grace 0) if it is still there; its
// env Secret goes with it (an ownerReference). A missing Pod is fine.
func (l *ledger) Delete(ctx context.Context, id string) error {
	l.mu.Lock()
	l.local[id] = localRecord{deleted: true, at: time.Now()}
	l.mu.Unlock()
	grace := int64(0)
	ctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	err := l.client.CoreV1().Pods(l.ns).Delete(ctx, podName(id), metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if apierrors.IsNotFound(err) {
		err = nil
	}
	if err != nil {
		l.mu.Lock()
		delete(l.local, id)
		l.mu.Unlock()
		return sandbox.WrapError("", fmt.Sprintf("kubernetes: ledger: deleting the Pod %s/%s of session %s", l.ns, podName(id), id), err)
	}
	l.mu.Lock()
	delete(l.env, id)
	l.mu.Unlock()
	return nil
}

// Load returns every session of the namespace, as the cache holds it now
// with this process's own writes over it. Env values are not read (one
// Secret per session): Get has them.
func (l *ledger) Load(ctx context.Context) ([]kit.Record, error) {
	pods, err := l.pods.List(labels.Everything())
	if err != nil {
		return nil, sandbox.WrapError("", "kubernetes: ledger: listing the session Pods of "+l.ns, err)
	}
	seen := map[string]bool{}
	var out []kit.Record
	for _, pod := range pods {
		id := pod.Labels[LabelSession]
		seen[id] = true
		r, ok, err := l.view(ctx, id, pod)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, r)
		}
	}
	l.mu.Lock()
	var rest []string
	for id, e := range l.local {
		if !seen[id] && !e.deleted {
			rest = append(rest, id)
		}
	}
	l.mu.Unlock()
	for _, id := range rest {
		r, ok, err := l.view(ctx, id, nil)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// Get returns the record id from the cache (or this process's newer
// write), env values included: those are read once from the session's
// Secret, when its Pod says it has env, and kept.
func (l *ledger) Get(ctx context.Context, id string) (kit.Record, bool, error) {
	pod, err := l.pods.Pods(l.ns).Get(podName(id))
	if err != nil {
		if !apierrors.IsNotFound(err) {
			return kit.Record{}, false, sandbox.WrapError("", "kubernetes: ledger: session "+id, err)
		}
		pod = nil
	}
	r, ok, err := l.view(ctx, id, pod)
	if err != nil || !ok {
		return kit.Record{}, false, err
	}
	if r.Spec.Env != nil || r.State == kit.StateCreating {
		return r, true, nil
	}
	env, err := l.envOf(ctx, id)
	if err != nil {
		return kit.Record{}, false, err
	}
	r.Spec.Env = env
	return r, true, nil
}

// view merges the cache's Pod (nil: none) with this process's overlay.
// ok is false when neither holds a record of id.
func (l *ledger) view(ctx context.Context, id string, pod *corev1.Pod) (kit.Record, bool, error) {
	l.mu.Lock()
	e, has := l.local[id]
	if has && time.Since(e.at) > localTTL {
		delete(l.local, id)
		has = false
	}
	l.mu.Unlock()
	if has && e.deleted {
		return kit.Record{}, false, nil
	}
	if pod == nil && has && e.rv > 0 {
		// This process wrote the Pod, and the cache does not have it: not
		// yet seen, or deleted since. The apiserver says which.
		p, err := l.client.CoreV1().Pods(l.ns).Get(ctx, podName(id), metav1.GetOptions{})
		switch {
		case err == nil:
			pod = p
		case apierrors.IsNotFound(err):
			l.mu.Lock()
			if cur, ok := l.local[id]; ok && cur.rv == e.rv {
				delete(l.local, id)
			}
			l.mu.Unlock()
			return kit.Record{}, false, nil
		default:
			return kit.Record{}, false, sandbox.WrapError("", fmt.Sprintf("kubernetes: ledger: reading the Pod %s/%s of session %s", l.ns, podName(id), id), err)
		}
	}
	if pod == nil {
		if has && e.rv == 0 {
			r := cloneRecord(e.rec)
			r.Provider = l.provider
			return r, true, nil
		}
		return kit.Record{}, false, nil
	}
	if has && e.rv > 0 {
		if prv, _ := strconv.ParseUint(pod.ResourceVersion, 10, 64); prv < e.rv {
			r := cloneRecord(e.rec)
			r.Provider = l.provider
			if podStopped(pod) {
				r.State = kit.StateDestroying
			}
			return r, true, nil
		}
		l.mu.Lock()
		if cur, ok := l.local[id]; ok && cur.rv == e.rv {
			delete(l.local, id)
		}
		l.mu.Unlock()
	}
	r, err := recordFromPod(pod, nil)
	if err != nil {
		if has && e.rv == 0 {
			// The Pod as Create made it, before its record was whole.
			r = cloneRecord(e.rec)
			r.Provider = l.provider
			return r, true, nil
		}
		// Not a record this version can read: not a session it serves.
		return kit.Record{}, false, nil
	}
	r.Provider = l.provider
	if r.State == "" {
		r.State = kit.StateCreating
	}
	if podStopped(pod) {
		r.State = kit.StateDestroying
	}
	if has && e.rv == 0 {
		// The cache shows the Pod Create made; the note has the env.
		r.Spec.Env = maps.Clone(e.rec.Spec.Env)
	}
	return r, true, nil
}

// podStopped: a Pod whose agent is gone (its phase is final) or that is
// being deleted is no live session, whatever its annotations say.
func podStopped(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
}

// envOf returns session id's env values, from the Secret its Pod names
// (read once, then kept).
func (l *ledger) envOf(ctx context.Context, id string) (map[string]sandbox.Secret, error) {
	pod, err := l.pods.Pods(l.ns).Get(podName(id))
	if err != nil {
		// Written by this process, not yet in the cache: it has the env.
		return nil, nil
	}
	raw, ok := pod.Annotations[AnnotationEnvKeys]
	if !ok {
		return nil, nil
	}
	var keys []string
	if err := json.Unmarshal([]byte(raw), &keys); err != nil {
		return nil, sandbox.WrapError("", fmt.Sprintf("kubernetes: ledger: the annotation %s of Pod %s/%s", AnnotationEnvKeys, l.ns, pod.Name), err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	l.mu.Lock()
	env, ok := l.env[id]
	l.mu.Unlock()
	if ok {
		return maps.Clone(env), nil
	}
	name := secretName(id)
	sec, err := l.client.CoreV1().Secrets(l.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, sandbox.WrapError("", fmt.Sprintf("kubernetes: ledger: reading the env Secret %s/%s of session %s", l.ns, name, id), err)
	}
	env = make(map[string]sandbox.Secret, len(keys))
	for _, k := range keys {
		v, ok := sec.Data[k]
		if !ok {
			// The key's name only: never a value.
			return nil, sandbox.Errorf("", "kubernetes: ledger: the env Secret %s/%s of session %s has no key %s", l.ns, name, id, k)
		}
		env[k] = sandbox.NewSecret(string(v))
	}
	l.mu.Lock()
	l.env[id] = env
	l.mu.Unlock()
	return maps.Clone(env), nil
}

// attachLease makes Reaping the election's, and Close close it. Call it
// before the ledger is handed to the kit.
func (l *ledger) attachLease(lease *reaperLease) { l.lease = lease }

// Reaping reports whether this daemon holds the reaper's Lease.
func (l *ledger) Reaping() bool { return l.lease.Reaping() }

// Close stops the informer and the election (releasing the Lease).
func (l *ledger) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.cancel()
		l.factory.Shutdown()
		err = l.lease.Close()
	})
	return err
}

func cloneRecord(r kit.Record) kit.Record {
	r.Spec.Env = maps.Clone(r.Spec.Env)
	r.Spec.Labels = maps.Clone(r.Spec.Labels)
	r.Handle = slices.Clone(r.Handle)
	return r
}
