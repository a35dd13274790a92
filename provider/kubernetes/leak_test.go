package kubernetes

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

// NewTestNamespace is newNamespace, for the package's external tests.
func NewTestNamespace(t testing.TB, c *kubetest.Cluster) string { return newNamespace(t, c) }

// newNamespace is a namespace for t whose leak check runs when t ends,
// after the sandboxes t opens next have closed, before the namespace is
// deleted.
func newNamespace(t testing.TB, c *kubetest.Cluster) string {
	t.Helper()
	ns := c.NewNamespace(t)
	t.Cleanup(func() {
		removeWorkspaces(t, c, ns)
		checkNoLeak(t, c, ns)
	})
	return ns
}

// removeWorkspaces removes, through a sandbox of the namespace, every
// persistent workspace the test's sessions kept: they outlive their
// sessions by design, and the leak check then finds none.
func removeWorkspaces(t testing.TB, c *kubetest.Cluster, ns string) {
	ctx := context.Background()
	pvcs, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pvcs.Items) == 0 {
		return // the leak check names a list that fails
	}
	permissive := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	sb, err := New(Options{Options: kit.Options{Policy: permissive, ReapInterval: -1}, Kubeconfig: c.Kubeconfig, Namespace: ns,
		AgentImage: c.AgentImage, StorageClass: c.StorageClass, TrustNetworkPolicy: c.Enforcer})
	if err != nil {
		t.Errorf("a sandbox to remove the workspaces: %v", err)
		return
	}
	defer func() {
		if err := sb.Close(ctx); err != nil {
			t.Errorf("closing the sandbox that removed the workspaces: %v", err)
		}
	}()
	ws, err := sb.ListWorkspaces(ctx)
	if err != nil {
		t.Errorf("ListWorkspaces: %v", err)
		return
	}
	for _, w := range ws {
		if err := sb.RemoveWorkspace(ctx, w.Key); err != nil {
			t.Errorf("RemoveWorkspace(%s): %v", w.Key, err)
		}
	}
}

// standingObjects are what every daemon of a namespace shares, made once
// and kept: the three tier policies and the reaper's Lease (released).
var standingObjects = []string{
	"NetworkPolicy " + NetworkPolicyNone, "NetworkPolicy " + NetworkPolicyInternal,
	"NetworkPolicy " + NetworkPolicyEgress, "Lease " + LeaseName,
}

// checkNoLeak fails t if anything the provider made is left in the
// namespace once its sandboxes closed (a Pod being deleted is given a
// moment): no Pod, Secret or PersistentVolumeClaim, and of NetworkPolicies
// and Leases only the standing ones every daemon of the namespace shares
// (the three tier policies; the reaper's Lease, released).
func checkNoLeak(t testing.TB, c *kubetest.Cluster, ns string) {
	t.Helper()
	ctx := context.Background()
	c.AssertNamespaceClean(t, ns, standingObjects...)
	l, err := c.Client.CoordinationV1().Leases(ns).Get(ctx, LeaseName, metav1.GetOptions{})
	if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		t.Errorf("the reaper's Lease is still held by %q after every sandbox closed", *l.Spec.HolderIdentity)
	}
}
