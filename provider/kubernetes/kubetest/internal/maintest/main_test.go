// Package maintest checks kubetest.Main and Require as a test package uses them.
package maintest

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

func TestShared(t *testing.T) {
	c := kubetest.Require(t)
	ns := c.NewNamespace(t)
	n, err := c.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil || n.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Fatalf("%v %v", err, n.Labels)
	}
	c.AssertNoLeaks(t)
	t.Logf("ns %s registry %s agent %s", ns, c.Registry, c.AgentImage)
}
