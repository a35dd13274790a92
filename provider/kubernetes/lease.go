package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Defaults of [leaseOptions]: client-go's usual ones. A reaper that died
// holding the Lease is replaced within LeaseDuration (+ a RetryPeriod).
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// leaseOptions are the reaper election's durations. Zero fields take the
// defaults; the three must keep LeaseDuration > RenewDeadline >
// 1.2*RetryPeriod (client-go refuses otherwise).
type leaseOptions struct {
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// Identity names this elector in the Lease; "" is hostname_pid_random.
	Identity string
	// Log gets client-go's election lines (nil: discarded), which would
	// otherwise go to klog's stderr.
	Log *slog.Logger
	// noRelease leaves the Lease held at stop, as a process killed with
	// SIGKILL would (tests only).
	noRelease bool
}

// reaperLease elects, among every daemon serving the namespace, the one
// that reaps: it holds the Lease [LeaseName] while it leads. Reaping is
// true only while it leads; at Close it releases the Lease, so the next
// one leads after a RetryPeriod rather than a whole LeaseDuration.
type reaperLease struct {
	client   k8s.Interface
	ns       string
	release  bool
	bound    time.Duration // of the release at Close
	identity string
	leading  atomic.Bool
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
	elector  atomic.Pointer[leaderelection.LeaderElector]
	writes   *leaseWrites
}

// leaseWrites wraps the election's Lease client to tell Close whether a
// write of the election's was cut off (its context ended before the
// answer): the apiserver may still apply it after the cut, and name this
// elector in the Lease after Close looked.
type leaseWrites struct {
	coordinationv1client.LeasesGetter
	cut atomic.Bool
}

func (w *leaseWrites) Leases(ns string) coordinationv1client.LeaseInterface {
	return leaseWriter{w.LeasesGetter.Leases(ns), w}
}

type leaseWriter struct {
	coordinationv1client.LeaseInterface
	w *leaseWrites
}

func (l leaseWriter) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	r, err := l.LeaseInterface.Create(ctx, lease, opts)
	l.w.note(ctx, err)
	return r, err
}

func (l leaseWriter) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	r, err := l.LeaseInterface.Update(ctx, lease, opts)
	l.w.note(ctx, err)
	return r, err
}

// note records a write's end: cut off, or answered (a later answered
// write means an earlier cut one can no longer land: its resourceVersion
// is stale).
func (w *leaseWrites) note(ctx context.Context, err error) {
	switch {
	case err != nil && ctx.Err() != nil:
		w.cut.Store(true)
	case err == nil:
		w.cut.Store(false)
	}
}

// newReaperLease starts the election for Lease LeaseName in namespace ns.
// It returns at once; Reaping turns true once this process leads. Close
// stops it.
func newReaperLease(client k8s.Interface, ns string, o leaseOptions) (*reaperLease, error) {
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.Identity == "" {
		o.Identity = leaseIdentity()
	}
	l := &reaperLease{client: client, ns: ns, release: !o.noRelease, bound: o.RenewDeadline, identity: o.Identity, done: make(chan struct{}),
		writes: &leaseWrites{LeasesGetter: client.CoordinationV1()}}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: ns},
		Client:     l.writes,
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
		Labels:     map[string]string{LabelManaged: ManagedBy},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            LeaseName,
		LeaseDuration:   o.LeaseDuration,
		RenewDeadline:   o.RenewDeadline,
		RetryPeriod:     o.RetryPeriod,
		ReleaseOnCancel: !o.noRelease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { l.leading.Store(true) },
			OnStoppedLeading: func() { l.leading.Store(false) },
		},
	}
	// Validate once here, so that a bad duration is the caller's error and
	// not a loop that never elects.
	if _, err := leaderelection.NewLeaderElector(cfg); err != nil {
		return nil, fmt.Errorf("kubernetes: the reaper's Lease %s/%s: %w", ns, LeaseName, err)
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.FromSlogHandler(log.Handler())))
	l.cancel = cancel
	go func() {
		defer close(l.done)
		// Run returns when leadership is lost (a renewal missed its
		// deadline: the apiserver away); the daemon stays a candidate, so
		// a new elector runs until Close.
		for ctx.Err() == nil {
			le, err := leaderelection.NewLeaderElector(cfg)
			if err != nil {
				return // validated above
			}
			l.elector.Store(le)
			le.Run(ctx)
			l.leading.Store(false)
			select {
			case <-ctx.Done():
			case <-time.After(o.RetryPeriod):
			}
		}
	}()
	return l, nil
}

// leaseIdentity is unique per process: two daemons on one host, or one
// restarted with the same pid, never share it.
func leaseIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s_%d_%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Reaping reports whether this process holds the Lease now.
func (l *reaperLease) Reaping() bool {
	if l == nil || !l.leading.Load() {
		return false
	}
	// The callback says it led; the elector says whether its last observed
	// record still names it (a renewal that failed turns it off sooner).
	le := l.elector.Load()
	return le != nil && le.IsLeader()
}

// Identity is this elector's name in the Lease.
func (l *reaperLease) Identity() string { return l.identity }

// Close stops the election and, unless noRelease, releases the Lease
// (bounded by RenewDeadline). It waits for the elector to stop.
func (l *reaperLease) Close() error {
	if l == nil {
		return nil
	}
	var err error
	l.once.Do(func() {
		l.cancel()
		<-l.done
		l.leading.Store(false)
		if l.release {
			err = l.releaseStranded()
		}
	})
	return err
}

// releaseStranded empties the Lease if it still names this elector: a
// Close that cancels the election while an acquire's update is in flight
// leaves the Lease taken (the apiserver applied it; client-go saw the
// cancel and, not leading, releases nothing), and the next daemon would
// wait a whole LeaseDuration. A write the cancel cut off may land after
// the first look: then it looks again, for up to landWait. The update is
// conditional on what was read; a conflict reads again.
func (l *reaperLease) releaseStranded() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.bound)
	defer cancel()
	watchUntil := time.Now().Add(min(l.bound, landWait))
	leases := l.client.CoordinationV1().Leases(l.ns)
	for {
		lease, err := leases.Get(ctx, LeaseName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) && !l.writes.cut.Load():
			return nil
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("kubernetes: reading the reaper's Lease %s/%s to release it: %w", l.ns, LeaseName, err)
		case lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == l.identity:
			lease.Spec.HolderIdentity = nil
			one := int32(1)
			lease.Spec.LeaseDurationSeconds = &one
			_, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
			switch {
			case err == nil || apierrors.IsNotFound(err):
				return nil
			case apierrors.IsConflict(err):
				continue // written meanwhile: read again
			}
			return fmt.Errorf("kubernetes: releasing the reaper's Lease %s/%s: %w", l.ns, LeaseName, err)
		case !l.writes.cut.Load():
			return nil
		}
		if time.Now().After(watchUntil) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(landPoll):
		}
	}
}

// landWait bounds how long a Close watches for a cut-off write to land,
// looking every landPoll: an apiserver applies a write it got well within
// that, or never.
const (
	landWait = 3 * time.Second
	landPoll = 100 * time.Millisecond
)
