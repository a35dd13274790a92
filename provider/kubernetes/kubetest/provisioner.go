package kubetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/tai42/sandbox/internal/undo"
)

// The provisioner is a local-path one of the harness's own, run in the
// test process: for a PVC of StorageClass it makes a directory under
// the state directory and a hostPath PV bound to the claim; when such a
// PV is released (its claim deleted) it removes the directory and the
// PV (reclaim policy Delete). sig-storage-lib-external-provisioner would
// do the same with leader election, metrics and retries a single-node
// test cluster has no use for, and a second client-go in the build; the
// whole of it here is a work queue over two informers.
type provisioner struct {
	client kubernetes.Interface
	dir    string
	queue  workqueue.TypedRateLimitingInterface[string]
	logf   func(string, ...any)
}

const provisionedBy = "pv.kubernetes.io/provisioned-by"

func (c *Cluster) provisioner(ctx context.Context) (undo.Func, error) {
	if err := c.storageClass(ctx); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &provisioner{
		client: c.Client,
		dir:    c.path("pv"),
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		logf:   c.logf,
	}
	f := informers.NewSharedInformerFactory(c.Client, 0)
	pvcs := f.Core().V1().PersistentVolumeClaims().Informer()
	pvs := f.Core().V1().PersistentVolumes().Informer()
	enqueue := func(kind string) cache.ResourceEventHandlerFuncs {
		add := func(obj any) {
			if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
				p.queue.Add(kind + "/" + key)
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, o any) { add(o) }}
	}
	if _, err := pvcs.AddEventHandler(enqueue("pvc")); err != nil {
		cancel()
		return nil, err
	}
	if _, err := pvs.AddEventHandler(enqueue("pv")); err != nil {
		cancel()
		return nil, err
	}
	f.Start(pctx.Done())
	var wg sync.WaitGroup
	stop := func(context.Context) error {
		cancel()
		p.queue.ShutDown()
		f.Shutdown()
		wg.Wait()
		return nil
	}
	if !cache.WaitForCacheSync(ctx.Done(), pvcs.HasSynced, pvs.HasSynced) {
		return stop, errors.New("the provisioner's informers did not sync")
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			key, quit := p.queue.Get()
			if quit {
				return
			}
			err := p.sync(pctx, key, pvcs.GetIndexer(), pvs.GetIndexer())
			if err != nil && pctx.Err() == nil {
				p.logf("provisioner: %s: %v", key, err)
				p.queue.AddRateLimited(key)
			} else {
				p.queue.Forget(key)
			}
			p.queue.Done(key)
		}
	}()
	c.logf("provisioner for StorageClass %s", StorageClass)
	return stop, nil
}

func (p *provisioner) sync(ctx context.Context, key string, pvcs, pvs cache.Indexer) error {
	kind, k, _ := cutString(key, "/")
	if kind == "pvc" {
		obj, ok, err := pvcs.GetByKey(k)
		if err != nil || !ok {
			return err
		}
		return p.provision(ctx, obj.(*corev1.PersistentVolumeClaim))
	}
	obj, ok, err := pvs.GetByKey(k)
	if err != nil || !ok {
		return err
	}
	return p.reclaim(ctx, obj.(*corev1.PersistentVolume))
}

func cutString(s, sep string) (string, string, bool) {
	for i := 0; i+len(sep) <= len(s); i++ {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}

// provision makes the PV of an unbound claim of StorageClass.
func (p *provisioner) provision(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != StorageClass ||
		pvc.Spec.VolumeName != "" || pvc.DeletionTimestamp != nil || pvc.Status.Phase != corev1.ClaimPending {
		return nil
	}
	name := "pvc-" + string(pvc.UID)
	dir := filepath.Join(p.dir, name)
	// World-writable: a hostPath volume gets no fsGroup, and the pods run
	// as any user (the restricted standard's non-root).
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	capacity := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	hostType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{provisionedBy: Provisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: capacity},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              StorageClass,
			VolumeMode:                    pvc.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID, ResourceVersion: pvc.ResourceVersion,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostType},
			},
		},
	}
	if len(pv.Spec.AccessModes) == 0 {
		pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	_, err := p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err == nil {
		p.logf("provisioner: %s for %s/%s", name, pvc.Namespace, pvc.Name)
	}
	return err
}

// reclaim removes a released PV of this provisioner and its directory.
func (p *provisioner) reclaim(ctx context.Context, pv *corev1.PersistentVolume) error {
	if pv.Annotations[provisionedBy] != Provisioner || pv.Status.Phase != corev1.VolumeReleased ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.DeletionTimestamp != nil {
		return nil
	}
	if hp := pv.Spec.HostPath; hp != nil && filepath.Dir(hp.Path) == p.dir {
		if err := os.RemoveAll(hp.Path); err != nil {
			return err
		}
	}
	err := p.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// waitPoll polls cond every interval until it is true or timeout.
func waitPoll(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, cond)
}
