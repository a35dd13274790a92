package kubernetes

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// The tests' durations: a 2 s lease.
var ldTestLease = leaseOptions{LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 250 * time.Millisecond}

func (c *ldCluster) elector(t *testing.T, name string, noRelease bool) *reaperLease {
	t.Helper()
	o := ldTestLease
	o.Identity = name + "_" + ldNewID(t)
	o.noRelease = noRelease
	l, err := newReaperLease(c.client, c.ns, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// cleanLease deletes the Lease at the test's end (after the electors'
// Close: cleanups run last first).
func (c *ldCluster) cleanLease(t *testing.T) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := c.client.CoordinationV1().Leases(c.ns).Delete(ctx, LeaseName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the Lease: %v", err)
		}
	})
}

func TestLeaseOneLeads(t *testing.T) {
	c := ldTestCluster(t)
	c.cleanLease(t)
	a, b := c.elector(t, "a", false), c.elector(t, "b", false)
	ldEventually(t, 10*time.Second, "one of two electors leading", func() bool { return a.Reaping() || b.Reaping() })
	// Never both, over several renewals. (Neither, for a moment, is
	// allowed: a renewal the loaded apiserver answers past its deadline
	// steps the leader down.)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if a.Reaping() && b.Reaping() {
			t.Fatal("both electors lead")
		}
	}
	ldEventually(t, 10*time.Second, "exactly one leading", func() bool { return a.Reaping() != b.Reaping() })
	leader, other := a, b
	if b.Reaping() {
		leader, other = b, a
	}
	lease, err := c.client.CoordinationV1().Leases(c.ns).Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h != leader.Identity() {
		t.Fatalf("the Lease names %v, want the leader %s", h, leader.Identity())
	}
	if lease.Labels[LabelManaged] != ManagedBy {
		t.Errorf("the Lease has labels %v, want %s=%s", lease.Labels, LabelManaged, ManagedBy)
	}

	// The leader's Close releases the Lease: the other leads within the
	// lease duration.
	leader.Close()
	if leader.Reaping() {
		t.Fatal("a closed elector reports it reaps")
	}
	took := ldEventually(t, ldTestLease.LeaseDuration, "the other leading after the leader's release", other.Reaping)
	t.Logf("takeover after a release: %v (lease %v)", took, ldTestLease.LeaseDuration)
}

func TestLeaseLeaderKilled(t *testing.T) {
	c := ldTestCluster(t)
	c.cleanLease(t)
	// a dies without releasing (as a SIGKILLed daemon would).
	a := c.elector(t, "a", true)
	ldEventually(t, 10*time.Second, "a leading alone", a.Reaping)
	b := c.elector(t, "b", false)
	time.Sleep(ldTestLease.LeaseDuration) // b sees a renew
	if b.Reaping() || !a.Reaping() {
		t.Fatalf("b leads %v while a leads %v", b.Reaping(), a.Reaping())
	}
	died := time.Now()
	a.Close()
	lease, err := c.client.CoordinationV1().Leases(c.ns).Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h != a.Identity() {
		t.Fatalf("after a's death the Lease names %v, want still a (%s): not released", h, a.Identity())
	}
	ldEventually(t, ldTestLease.LeaseDuration+2*time.Second, "b leading after a's lease expired", b.Reaping)
	took := time.Since(died)
	t.Logf("takeover after a leader died: %v (lease %v)", took, ldTestLease.LeaseDuration)
	// Not before the lease ran out (a release is seen in one RetryPeriod).
	// b counts the lease from when it last saw a renewal: a renewed every
	// RetryPeriod, b looks every RetryPeriod (+ a jitter of up to 1.2
	// times it), so b may have seen the renewal before a's last, that
	// much before a died.
	if took < ldTestLease.LeaseDuration-ldTestLease.RetryPeriod*32/10-100*time.Millisecond {
		t.Fatalf("b led %v after a's death, before a's %v lease could expire", took, ldTestLease.LeaseDuration)
	}
}

func TestLeaseBadDurations(t *testing.T) {
	// Validated before anything runs: no cluster needed.
	client := k8s.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:1"})
	if _, err := newReaperLease(client, "ns", leaseOptions{LeaseDuration: time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond}); err == nil {
		t.Fatal("a renew deadline past the lease duration was accepted")
	}
}

// The ledger's Reaping is its Lease's, and its Close releases the Lease.
func TestLedgerReaping(t *testing.T) {
	c := ldTestCluster(t)
	c.cleanLease(t)
	l := c.ledger(t)
	if l.Reaping() {
		t.Fatal("a ledger without a Lease reaps")
	}
	o := ldTestLease
	lease, err := newReaperLease(c.client, c.ns, o)
	if err != nil {
		t.Fatal(err)
	}
	l.attachLease(lease)
	ldEventually(t, 10*time.Second, "the ledger reaping", l.Reaping)
	l.Close()
	if l.Reaping() {
		t.Fatal("a closed ledger reaps")
	}
	got, err := c.client.CoordinationV1().Leases(c.ns).Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := got.Spec.HolderIdentity; h != nil && *h != "" {
		t.Fatalf("after the ledger's Close the Lease is held by %s", *h)
	}
}

// TestLeaseReleaseCutWrite: a write of the election's that Close cut off
// and that the apiserver applies afterwards, naming this elector, is
// still released: Close looks again while such a write may land.
func TestLeaseReleaseCutWrite(t *testing.T) {
	client := fake.NewClientset()
	l := &reaperLease{client: client, ns: "ns", release: true, bound: 5 * time.Second, identity: "me",
		writes: &leaseWrites{LeasesGetter: client.CoordinationV1()}}
	// The election's acquire, cut off by the cancel.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.writes.note(ctx, context.Canceled)
	// It lands 300 ms later.
	me := "me"
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = client.CoordinationV1().Leases("ns").Create(context.Background(), &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: LeaseName, Namespace: "ns"},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &me}}, metav1.CreateOptions{})
	}()
	if err := l.releaseStranded(); err != nil {
		t.Fatal(err)
	}
	got, err := client.CoordinationV1().Leases("ns").Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.HolderIdentity != nil {
		t.Errorf("the Lease is still held by %q", *got.Spec.HolderIdentity)
	}

	// Nothing cut off, nothing there: Close returns at once.
	l2 := &reaperLease{client: fake.NewClientset(), ns: "ns", release: true, bound: 5 * time.Second, identity: "me",
		writes: &leaseWrites{}}
	start := time.Now()
	if err := l2.releaseStranded(); err != nil || time.Since(start) > time.Second {
		t.Errorf("release with nothing cut: %v after %v", err, time.Since(start))
	}
}
