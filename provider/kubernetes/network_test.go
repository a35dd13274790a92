package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

func policyByName(t *testing.T, ns, name string) *networkingv1.NetworkPolicy {
	t.Helper()
	for _, p := range wantedPolicies(ns) {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no wanted policy %s", name)
	return nil
}

func bothTypes(t *testing.T, p *networkingv1.NetworkPolicy) {
	t.Helper()
	if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Errorf("%s: policyTypes %v, want Ingress and Egress (a missing type means that direction is open)", p.Name, p.Spec.PolicyTypes)
	}
}

func TestPolicyNone(t *testing.T) {
	p := policyByName(t, "ns1", NetworkPolicyNone)
	if p.Namespace != "ns1" || p.Labels[LabelManaged] != ManagedBy {
		t.Errorf("meta %+v", p.ObjectMeta)
	}
	if got := p.Spec.PodSelector.MatchLabels; len(got) != 1 || got[LabelNetwork] != "none" {
		t.Errorf("podSelector %v", got)
	}
	bothTypes(t, p)
	if len(p.Spec.Ingress) != 0 || len(p.Spec.Egress) != 0 {
		t.Errorf("none has rules: ingress %v egress %v", p.Spec.Ingress, p.Spec.Egress)
	}
}

func TestPolicyInternal(t *testing.T) {
	p := policyByName(t, "ns1", NetworkPolicyInternal)
	if got := p.Spec.PodSelector.MatchLabels; len(got) != 1 || got[LabelNetwork] != "internal" {
		t.Errorf("podSelector %v", got)
	}
	bothTypes(t, p)
	peerOK := func(peers []networkingv1.NetworkPolicyPeer) bool {
		if len(peers) != 1 {
			return false
		}
		pe := peers[0]
		// No namespaceSelector: the same namespace only. No ipBlock.
		return pe.NamespaceSelector == nil && pe.IPBlock == nil && pe.PodSelector != nil &&
			pe.PodSelector.MatchLabels[LabelNetwork] == "internal" && pe.PodSelector.MatchLabels[LabelManaged] == ManagedBy &&
			len(pe.PodSelector.MatchExpressions) == 0
	}
	if len(p.Spec.Ingress) != 1 || !peerOK(p.Spec.Ingress[0].From) || len(p.Spec.Ingress[0].Ports) != 0 {
		t.Errorf("ingress %+v", p.Spec.Ingress)
	}
	if len(p.Spec.Egress) != 1 || !peerOK(p.Spec.Egress[0].To) || len(p.Spec.Egress[0].Ports) != 0 {
		t.Errorf("egress %+v", p.Spec.Egress)
	}
}

func TestPolicyEgress(t *testing.T) {
	p := policyByName(t, "ns1", NetworkPolicyEgress)
	if got := p.Spec.PodSelector.MatchLabels; len(got) != 1 || got[LabelNetwork] != "egress" {
		t.Errorf("podSelector %v", got)
	}
	bothTypes(t, p)
	if len(p.Spec.Ingress) != 0 {
		t.Errorf("egress has ingress rules %v", p.Spec.Ingress)
	}
	if len(p.Spec.Egress) != 2 {
		t.Fatalf("egress rules %d, want 2", len(p.Spec.Egress))
	}
	inet := p.Spec.Egress[0]
	if len(inet.Ports) != 0 || len(inet.To) != 2 {
		t.Fatalf("internet rule %+v", inet)
	}
	var blocks []*networkingv1.IPBlock
	for _, pe := range inet.To {
		if pe.IPBlock == nil || pe.PodSelector != nil || pe.NamespaceSelector != nil {
			t.Fatalf("internet peer %+v", pe)
		}
		blocks = append(blocks, pe.IPBlock)
	}
	if blocks[0].CIDR != "0.0.0.0/0" || blocks[1].CIDR != "::/0" {
		t.Errorf("cidrs %s %s", blocks[0].CIDR, blocks[1].CIDR)
	}
	// Every destination the container provider refuses is refused here:
	// each refused prefix lies inside an except of its family.
	for _, r := range sessnet.RefusedPrefixes() {
		b := blocks[0]
		if !r.Addr().Is4() {
			b = blocks[1]
		}
		if !slices.ContainsFunc(b.Except, func(s string) bool {
			e := netip.MustParsePrefix(s)
			return e.Bits() <= r.Bits() && e.Contains(r.Addr())
		}) {
			t.Errorf("refused %s is not in the excepts %v", r, b.Except)
		}
	}
	// And nothing more (no public range is refused) and each except is
	// valid and canonical (the apiserver rejects host bits).
	for _, b := range blocks {
		for _, s := range b.Except {
			e, err := netip.ParsePrefix(s)
			if err != nil || e.Masked() != e || e.Bits() == 0 {
				t.Errorf("except %q not a canonical proper prefix", s)
			}
			if !slices.Contains(sessnet.RefusedPrefixes(), e) {
				t.Errorf("except %s is not one of the container provider's refused prefixes", s)
			}
		}
	}
	for _, want := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10", "127.0.0.0/8"} {
		if !slices.Contains(blocks[0].Except, want) {
			t.Errorf("v4 excepts miss %s: %v", want, blocks[0].Except)
		}
	}
	for _, want := range []string{"fc00::/7", "fe80::/10", "::1/128"} {
		if !slices.Contains(blocks[1].Except, want) {
			t.Errorf("v6 excepts miss %s: %v", want, blocks[1].Except)
		}
	}
	// The metadata addresses are refused.
	for _, a := range []string{"169.254.169.254", "fd00:ec2::254"} {
		addr := netip.MustParseAddr(a)
		b := blocks[0]
		if addr.Is6() {
			b = blocks[1]
		}
		if !slices.ContainsFunc(b.Except, func(s string) bool { return netip.MustParsePrefix(s).Contains(addr) }) {
			t.Errorf("metadata %s reachable", a)
		}
	}
	dns := p.Spec.Egress[1]
	if len(dns.To) != 1 || dns.To[0].IPBlock != nil || dns.To[0].NamespaceSelector == nil || dns.To[0].PodSelector == nil ||
		dns.To[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "kube-system" ||
		dns.To[0].PodSelector.MatchLabels["k8s-app"] != "kube-dns" {
		t.Errorf("dns peer %+v", dns.To)
	}
	var ports []string
	for _, pt := range dns.Ports {
		ports = append(ports, string(*pt.Protocol)+"/"+pt.Port.String())
	}
	slices.Sort(ports)
	if !slices.Equal(ports, []string{"TCP/53", "UDP/53"}) {
		t.Errorf("dns ports %v", ports)
	}
}

// countVerbs counts the client's actions on networkpolicies by verb.
func countVerbs(c *fake.Clientset) map[string]int {
	m := map[string]int{}
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "networkpolicies" {
			m[a.GetVerb()]++
		}
	}
	return m
}

func TestEnsureIdempotent(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	n := newNetwork(c, "ns1", networkOptions{})
	if err := n.ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v := countVerbs(c); v["create"] != 3 || v["update"] != 0 {
		t.Fatalf("first ensure: %v", v)
	}
	c.ClearActions()
	if err := n.ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v := countVerbs(c); v["create"] != 0 || v["update"] != 0 || v["get"] != 3 {
		t.Fatalf("second ensure changed something: %v", v)
	}

	// An edited policy (someone opened none) is put back; the others are
	// left alone.
	pols := c.NetworkingV1().NetworkPolicies("ns1")
	p, err := pols.Get(ctx, NetworkPolicyNone, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	p.Labels = map[string]string{"other": "x"}
	if _, err := pols.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.ClearActions()
	if err := n.ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v := countVerbs(c); v["update"] != 1 || v["create"] != 0 {
		t.Fatalf("repair: %v", v)
	}
	p, _ = pols.Get(ctx, NetworkPolicyNone, metav1.GetOptions{})
	if len(p.Spec.Ingress) != 0 || p.Labels[LabelManaged] != ManagedBy || p.Labels["other"] != "x" {
		t.Errorf("not repaired: %+v %v", p.Spec, p.Labels)
	}
	// close never deletes the standing policies.
	n.close()
	l, _ := pols.List(ctx, metav1.ListOptions{})
	if len(l.Items) != 3 {
		t.Errorf("%d policies after close", len(l.Items))
	}
}

// A daemon racing another: a create that finds the policy made meanwhile
// goes on to compare and update.
func TestEnsureRace(t *testing.T) {
	c := fake.NewClientset()
	raced := false
	c.PrependReactor("create", "networkpolicies", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !raced {
			raced = true
			obj := a.(k8stesting.CreateAction).GetObject().(*networkingv1.NetworkPolicy).DeepCopy()
			obj.Spec.PolicyTypes = nil // the other daemon's older spec
			if err := c.Tracker().Add(obj); err != nil {
				t.Fatal(err)
			}
			return true, nil, errAlreadyExists(obj.Name)
		}
		return false, nil, nil
	})
	n := newNetwork(c, "ns1", networkOptions{})
	if err := n.ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, want := range wantedPolicies("ns1") {
		p, err := c.NetworkingV1().NetworkPolicies("ns1").Get(context.Background(), want.Name, metav1.GetOptions{})
		if err != nil || len(p.Spec.PolicyTypes) != 2 {
			t.Errorf("%s: %v %+v", want.Name, err, p)
		}
	}
}

func TestEnsureForbidden(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("*", "networkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errForbidden()
	})
	n := newNetwork(c, "ns1", networkOptions{})
	err := n.ensure(context.Background())
	if !errors.Is(err, sandbox.ErrSandbox) || !strings.Contains(err.Error(), NetworkPolicyNone) || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("err %v", err)
	}
}

// setResult makes n answer as if a probe had ended with r.
func setResult(n *network, r probeResult) {
	done := make(chan struct{})
	close(done)
	n.mu.Lock()
	n.running, n.result = done, r
	n.mu.Unlock()
}

func TestNetworkCheck(t *testing.T) {
	tiers := []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress}
	n := newNetwork(fake.NewClientset(), "ns1", networkOptions{})

	setResult(n, probeResult{enforced: true, reason: "ok", at: time.Now()})
	for _, tier := range tiers {
		if err := n.check(sandbox.SessionSpec{Network: tier}); err != nil {
			t.Errorf("%s enforced: %v", tier, err)
		}
	}
	finding := "the cluster does not enforce NetworkPolicy: a Pod under tai42-network-none (p, 1.2.3.4:7421) was reachable from q"
	setResult(n, probeResult{reason: finding, at: time.Now()})
	for _, tier := range tiers {
		err := n.check(sandbox.SessionSpec{Network: tier})
		var se *sandbox.SpecRejectedError
		if !errors.As(err, &se) || se.Field != "network" || se.Reason != sandbox.ReasonUnenforceable || !strings.Contains(se.Message, finding) {
			t.Errorf("%s not enforced: %v", tier, err)
		}
	}
	setResult(n, probeResult{err: errors.New("pod never ran"), at: time.Now()})
	err := n.check(sandbox.SessionSpec{Network: sandbox.NetworkNone})
	var se *sandbox.SpecRejectedError
	if !errors.As(err, &se) || se.Reason != sandbox.ReasonUnenforceable || !strings.Contains(se.Message, "pod never ran") {
		t.Errorf("probe error: %v", err)
	}
}

// A probe still running past Wait rejects, bounded.
func TestNetworkCheckBounded(t *testing.T) {
	n := newNetwork(fake.NewClientset(), "ns1", networkOptions{Wait: 100 * time.Millisecond})
	n.mu.Lock()
	n.running = make(chan struct{})
	n.mu.Unlock()
	t0 := time.Now()
	err := n.check(sandbox.SessionSpec{Network: sandbox.NetworkEgress})
	var se *sandbox.SpecRejectedError
	if !errors.As(err, &se) || se.Reason != sandbox.ReasonUnenforceable || time.Since(t0) > 2*time.Second {
		t.Errorf("err %v after %s", err, time.Since(t0))
	}
}

// Trust skips the probe (no Pod is made) and offers every tier.
func TestTrust(t *testing.T) {
	c := fake.NewClientset()
	n := newNetwork(c, "ns1", networkOptions{Trust: true})
	n.start(context.Background())
	if err := n.check(sandbox.SessionSpec{Network: sandbox.NetworkInternal}); err != nil {
		t.Fatal(err)
	}
	n.close()
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "pods" {
			t.Errorf("trusted, yet %s pods", a.GetVerb())
		}
	}
	if v := countVerbs(c); v["create"] != 3 {
		t.Errorf("policies not ensured: %v", v)
	}
}

// Without a probe image the probe cannot run: every tier is rejected
// saying so, and no Pod is made.
func TestNoProbeImage(t *testing.T) {
	c := fake.NewClientset()
	n := newNetwork(c, "ns1", networkOptions{})
	err := n.check(sandbox.SessionSpec{Network: sandbox.NetworkNone})
	var se *sandbox.SpecRejectedError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "probe image") {
		t.Fatalf("err %v", err)
	}
	n.close()
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "pods" && a.GetVerb() == "create" {
			t.Errorf("a Pod was created")
		}
	}
}

// The probe's Pods meet the restricted Pod Security standard.
func TestProbePodRestricted(t *testing.T) {
	n := newNetwork(fake.NewClientset(), "ns1", networkOptions{ProbeImage: "bb:1", PullSecrets: []string{"s"}})
	p := n.probePod("x", "r", map[string]string{LabelNetwork: "none"}, []string{"true"}, nil)
	sc, c := p.Spec.SecurityContext, p.Spec.Containers[0]
	switch {
	case *p.Spec.AutomountServiceAccountToken, *p.Spec.EnableServiceLinks, p.Spec.HostNetwork, p.Spec.HostPID, p.Spec.HostIPC:
		t.Error("token, links or host namespaces")
	case !*sc.RunAsNonRoot || *sc.RunAsUser != 65532 || sc.SeccompProfile.Type != "RuntimeDefault":
		t.Error("pod security context")
	case *c.SecurityContext.AllowPrivilegeEscalation || len(c.SecurityContext.Capabilities.Drop) != 1 || c.SecurityContext.Capabilities.Drop[0] != "ALL":
		t.Error("container security context")
	case p.Labels[LabelNetwork] != "none" || p.Labels[labelNetProbe] != "r" || p.Labels[LabelManaged] != ManagedBy:
		t.Errorf("labels %v", p.Labels)
	case c.Image != "bb:1" || p.Spec.ImagePullSecrets[0].Name != "s" || p.Spec.RestartPolicy != "Never":
		t.Error("image, secrets or restart")
	}
}

func errAlreadyExists(name string) error {
	return apierrors.NewAlreadyExists(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, name)
}

func errForbidden() error {
	return apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, "x", errors.New("RBAC says no"))
}

// noProbePods fails t if a probe Pod is left in ns.
func noProbePods(t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: labelNetProbe})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range l.Items {
				t.Errorf("probe Pod %s left (phase %s)", p.Name, p.Status.Phase)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestProbeEnforced: on the harness's cluster (kube-router enforcing
// NetworkPolicy) the probe finds the none tier unreachable, and every
// tier is offered; its Pods are gone after.
func TestProbeEnforced(t *testing.T) {
	c := kubetest.Require(t)
	if !c.Enforcer {
		t.Skip("the test cluster runs no NetworkPolicy enforcer")
	}
	ns := newNamespace(t, c)
	n := newNetwork(c.Client, ns, networkOptions{ProbeImage: c.Busybox, Log: testLog(t)})
	t0 := time.Now()
	if err := n.ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	enforced, reason, err := n.probe(context.Background())
	t.Logf("probe: enforced=%v in %v: %s", enforced, time.Since(t0), reason)
	if err != nil || !enforced {
		t.Fatalf("enforced=%v reason %q err %v; want enforced", enforced, reason, err)
	}
	noProbePods(t, c.Client, ns)
	n.start(context.Background())
	defer n.close()
	for _, tier := range []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress} {
		if err := n.check(sandbox.SessionSpec{Network: tier}); err != nil {
			t.Errorf("%s: %v", tier, err)
		}
	}
}

// TestProbeImageUnpullable: a probe whose image the cluster cannot pull
// fails fast, as an error naming the Pod's state, never "enforced".
func TestProbeImageUnpullable(t *testing.T) {
	c := kubetest.Require(t)
	ns := newNamespace(t, c)
	n := newNetwork(c.Client, ns, networkOptions{ProbeImage: c.Registry + "/no/such:image"})
	t0 := time.Now()
	enforced, _, err := n.probe(context.Background())
	if err == nil || enforced || !strings.Contains(err.Error(), "Pull") {
		t.Fatalf("enforced=%v err %v", enforced, err)
	}
	t.Logf("failed in %v: %v", time.Since(t0), err)
	noProbePods(t, c.Client, ns)
}

// TestProbeNotEnforced runs on the harness cluster with its enforcer
// stopped (started again at the end): the probe must say so, and every
// tier is rejected naming the finding.
func TestProbeNotEnforced(t *testing.T) {
	kc := kubetest.Require(t)
	ns := newNamespace(t, kc)
	// Registered first: a StopEnforcer that stopped kube-router and then
	// failed (its chains) must not leave the package's cluster without one.
	wasEnforced := kc.Enforcer
	t.Cleanup(func() {
		if !wasEnforced || kc.Enforcer {
			return // none ran, or StopEnforcer did not stop it
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := kc.StartEnforcer(ctx); err != nil {
			t.Errorf("starting the enforcer again: %v", err)
		}
	})
	if err := kc.StopEnforcer(); err != nil {
		t.Fatal(err)
	}
	c, bb := kc.Client, kc.Busybox
	t.Cleanup(func() {
		for _, p := range wantedPolicies(ns) {
			_ = c.NetworkingV1().NetworkPolicies(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{})
		}
	})
	n := newNetwork(c, ns, networkOptions{ProbeImage: bb, Log: testLog(t)})
	t0 := time.Now()
	n.start(context.Background())
	defer n.close()
	for _, tier := range []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress} {
		err := n.check(sandbox.SessionSpec{Network: tier})
		var se *sandbox.SpecRejectedError
		if !errors.As(err, &se) || se.Field != "network" || se.Reason != sandbox.ReasonUnenforceable ||
			!strings.Contains(se.Message, "does not enforce NetworkPolicy") || !strings.Contains(se.Message, NetworkPolicyNone) {
			t.Errorf("%s: %v; want rejected as not enforced", tier, err)
		}
	}
	t.Logf("not enforced, found in %v: %v", time.Since(t0), n.result.reason)
	// The apiserver took the wanted specs as they are.
	for _, want := range wantedPolicies(ns) {
		have, err := c.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), want.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: %v", want.Name, err)
		} else if !equality.Semantic.DeepEqual(have.Spec, want.Spec) {
			t.Errorf("%s: the apiserver holds %+v, want %+v", want.Name, have.Spec, want.Spec)
		}
	}
	noProbePods(t, c, ns)
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// fakeProbeCluster answers the probe's Pods as a cluster would: the
// listeners run with an IP, the open client ends with msg as its
// termination message and the none client with egress (or, with stuck,
// the listeners wait on an image pull).
func fakeProbeCluster(msg, egress string, stuck bool) *fake.Clientset {
	c := fake.NewClientset()
	ip := 0
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		switch {
		case strings.HasSuffix(p.Name, "-client"):
			p.Status.Phase = corev1.PodSucceeded
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "probe", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: msg + "\n"}}}}
		case strings.HasSuffix(p.Name, "-noneclient"):
			if p.Labels[LabelNetwork] != string(sandbox.NetworkNone) {
				return true, nil, fmt.Errorf("the none client %s is labelled %v", p.Name, p.Labels)
			}
			p.Status.Phase = corev1.PodSucceeded
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "probe", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: egress + "\n"}}}}
		case stuck:
			p.Status.Phase = corev1.PodPending
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "probe", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}}}}
		default:
			ip++
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIP = fmt.Sprintf("10.244.0.%d", ip)
		}
		return false, nil, nil
	})
	return c
}

func TestProbeFindings(t *testing.T) {
	for _, tc := range []struct {
		msg      string
		egress   string // the none client's; "" is blocked
		stuck    bool
		enforced bool
		want     string // in the reason, or in the error when wantErr
		wantErr  bool
	}{
		{msg: "ok reached fail", want: "does not enforce NetworkPolicy: a Pod under tai42-network-none"},
		{msg: "ok blocked ok", enforced: true, want: "unreachable"},
		// An enforcer of ingress rules alone: the none client reaches out.
		{msg: "ok blocked ok", egress: "reached", want: "does not enforce NetworkPolicy egress rules: a Pod under tai42-network-none"},
		{msg: "ok reached fail", egress: "reached", want: "does not enforce NetworkPolicy: a Pod under"},
		{msg: "ok blocked ok", egress: "what", wantErr: true, want: `noneclient reported "what"`},
		{msg: "fail reached -", wantErr: true, want: "could not reach the control Pod"},
		{msg: "ok blocked fail", wantErr: true, want: "lost the control Pod"},
		{msg: "what", wantErr: true, want: "three findings"},
		{msg: "ok maybe ok", wantErr: true, want: "reported"},
		{stuck: true, wantErr: true, want: "ImagePullBackOff"},
	} {
		if tc.egress == "" {
			tc.egress = probeBlocked
		}
		t.Run(strings.ReplaceAll(tc.msg, " ", "_")+"_"+tc.egress+fmt.Sprint(tc.stuck), func(t *testing.T) {
			c := fakeProbeCluster(tc.msg, tc.egress, tc.stuck)
			n := newNetwork(c, "ns1", networkOptions{ProbeImage: "bb:1", Timeout: 5 * time.Second})
			t0 := time.Now()
			enforced, reason, err := n.probe(context.Background())
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err %v, want one saying %q", err, tc.want)
			case !tc.wantErr && (err != nil || !strings.Contains(reason, tc.want)):
				t.Errorf("reason %q err %v, want %q", reason, err, tc.want)
			case enforced != tc.enforced:
				t.Errorf("enforced %v", enforced)
			case time.Since(t0) > 3*time.Second:
				t.Errorf("took %v", time.Since(t0))
			}
			l, _ := c.CoreV1().Pods("ns1").List(context.Background(), metav1.ListOptions{})
			for _, p := range l.Items {
				t.Errorf("Pod %s left", p.Name)
			}
		})
	}
}
