package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet"
)

// The network tiers are standing NetworkPolicies, one per tier and
// namespace, selecting the session Pods by LabelNetwork. They are never
// deleted by a daemon's Close: every daemon serving the namespace relies on
// them, and a Pod of a tier whose policy is gone would be open.
// Their names are NetworkPolicyNone, NetworkPolicyInternal and
// NetworkPolicyEgress (names.go).
const (
	// labelNetProbe marks the probe's Pods (value: the probe's run id), so
	// that a daemon that died mid-probe leaves nothing another cannot find.
	labelNetProbe = "tai42.dev/netprobe"
	// probePort is what the probe's listeners listen on.
	probePort = AgentPort
)

// egressExcept are the destinations the egress tier refuses, split by
// family: the container provider's own list (sessnet.RefusedPrefixes:
// private, carrier-grade NAT, link-local and the metadata services,
// loopback, "this network", multicast, reserved), so that egress means the
// same on both providers. A prefix inside another of the list is left out
// (fd00:ec2::254 is in fc00::/7): the policy says the same with fewer
// entries, and some enforcers build one rule per entry.
func egressExcept() (v4, v6 []string) {
	all := sessnet.RefusedPrefixes()
	for _, p := range all {
		covered := false
		for _, q := range all {
			if q != p && q.Bits() < p.Bits() && q.Contains(p.Addr()) {
				covered = true
				break
			}
		}
		if covered {
			continue
		}
		if p.Addr().Is4() {
			v4 = append(v4, p.Masked().String())
		} else {
			v6 = append(v6, p.Masked().String())
		}
	}
	return v4, v6
}

// wantedPolicies are the tier policies of namespace ns, as ensure makes them.
func wantedPolicies(ns string) []*networkingv1.NetworkPolicy {
	both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelManaged: ManagedBy}}
	}
	// A policy selects every Pod that claims its tier, managed or not (a Pod
	// that says it is none is held to none); a peer of the internal tier is
	// only a managed session's Pod.
	tier := func(n sandbox.Network) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{LabelNetwork: string(n)}}
	}
	internalPeer := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
		LabelNetwork: string(sandbox.NetworkInternal), LabelManaged: ManagedBy,
	}}}}
	v4, v6 := egressExcept()
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns := intstr.FromInt32(53)
	return []*networkingv1.NetworkPolicy{
		{
			// none: selected for both directions with no rule allows nothing.
			ObjectMeta: meta(NetworkPolicyNone),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: tier(sandbox.NetworkNone),
				PolicyTypes: both,
			},
		},
		{
			ObjectMeta: meta(NetworkPolicyInternal),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: tier(sandbox.NetworkInternal),
				PolicyTypes: both,
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: internalPeer}},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: internalPeer}},
			},
		},
		{
			ObjectMeta: meta(NetworkPolicyEgress),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: tier(sandbox.NetworkEgress),
				PolicyTypes: both,
				Egress: []networkingv1.NetworkPolicyEgressRule{
					{To: []networkingv1.NetworkPolicyPeer{
						{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: v4}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: v6}},
					}},
					// The cluster's DNS is on a private address: without this
					// rule an egress session could not resolve a name.
					{
						To: []networkingv1.NetworkPolicyPeer{{
							NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
							PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
						}},
						Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}},
					},
				},
			},
		},
	}
}

// networkOptions are the operator's settings of the tiers' enforcement.
type networkOptions struct {
	// ProbeImage is the image of the probe's Pods: it must have /bin/sh and
	// a busybox-style nc (-l, -ll, -e, -w). Without it the probe cannot run
	// and every tier is rejected, unless Trust.
	ProbeImage string
	// PullSecrets are the imagePullSecrets of the probe's Pods.
	PullSecrets []string
	// PodUser is the uid and gid the probe's Pods run as (restricted Pod
	// Security: never root). 0 means 65532.
	PodUser int64
	// Trust skips the probe: the operator says the cluster enforces
	// NetworkPolicy. Logged at every start, at warning level.
	Trust bool
	// Timeout bounds one probe; 0 means 30 s.
	Timeout time.Duration
	// Wait bounds how long check waits for a probe still running; 0
	// means Timeout plus 10 s.
	Wait time.Duration
	// RetryAfter is how long after a probe that failed (an error, not a
	// finding) the next check starts another; 0 means one minute.
	RetryAfter time.Duration
	Log        *slog.Logger
}

// network is the provider's side of the network tiers: it keeps the tier
// policies of its namespace and proves, once per start, that the cluster
// enforces them, rejecting every tier until it has (never trusting
// silently: a cluster without an enforcer accepts NetworkPolicies and
// ignores them).
type network struct {
	client kubernetes.Interface
	ns     string
	opts   networkOptions
	log    *slog.Logger

	mu      sync.Mutex
	running chan struct{} // closed when the current probe ends; nil before the first
	result  probeResult
	bg      context.Context // the probes'; close cancels it
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// probeResult is the latest probe's: what it found, or why it could not tell.
type probeResult struct {
	enforced bool
	reason   string
	err      error
	at       time.Time
}

// newNetwork returns the tiers of namespace ns.
func newNetwork(client kubernetes.Interface, ns string, opts networkOptions) *network {
	if opts.PodUser == 0 {
		opts.PodUser = 65532
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Wait <= 0 {
		opts.Wait = opts.Timeout + 10*time.Second
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = time.Minute
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &network{client: client, ns: ns, opts: opts, log: log}
}

// ensure creates the tier policies of the namespace, or updates one that
// differs from the wanted spec (another daemon's older version, or an
// edit). Several daemons may race: a conflict or an AlreadyExists is
// retried against the object as it is now.
func (n *network) ensure(ctx context.Context) error {
	pols := n.client.NetworkingV1().NetworkPolicies(n.ns)
	for _, want := range wantedPolicies(n.ns) {
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			if err = n.ensureOne(ctx, pols, want); err == nil || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
				break
			}
		}
		if err != nil {
			return sandbox.WrapError("ensure_network_policies", fmt.Sprintf("kubernetes: the NetworkPolicy %s/%s", n.ns, want.Name), err)
		}
	}
	return nil
}

type policyClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*networkingv1.NetworkPolicy, error)
	Create(ctx context.Context, p *networkingv1.NetworkPolicy, opts metav1.CreateOptions) (*networkingv1.NetworkPolicy, error)
	Update(ctx context.Context, p *networkingv1.NetworkPolicy, opts metav1.UpdateOptions) (*networkingv1.NetworkPolicy, error)
}

func (n *network) ensureOne(ctx context.Context, pols policyClient, want *networkingv1.NetworkPolicy) error {
	have, err := pols.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = pols.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(have.Spec, want.Spec) && have.Labels[LabelManaged] == ManagedBy {
		return nil
	}
	upd := have.DeepCopy()
	upd.Spec = want.Spec
	if upd.Labels == nil {
		upd.Labels = map[string]string{}
	}
	upd.Labels[LabelManaged] = ManagedBy
	_, err = pols.Update(ctx, upd, metav1.UpdateOptions{})
	return err
}

// start ensures the policies and probes their enforcement in the
// background (the provider's start does not wait for it; check does).
// Once per network: a probe already started (by an earlier check) is the
// one.
func (n *network) start(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.running == nil {
		n.startLocked(ctx)
	}
}

func (n *network) startLocked(ctx context.Context) {
	// Every probe runs under the one context close cancels (not the
	// caller's, which may be a request's).
	if n.cancel == nil {
		n.bg, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	}
	ctx = n.bg
	done := make(chan struct{})
	n.running = done
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer close(done)
		r := n.run(ctx)
		n.mu.Lock()
		n.result = r
		n.mu.Unlock()
	}()
}

// run is one probe: the policies first (the probe tests tai42-network-none
// itself), then the Pods. Each is bounded by Timeout (the run's context is
// the network's, cancelled only by close): a run that never ended would
// leave every check waiting out Wait, and none starting another run.
func (n *network) run(ctx context.Context) probeResult {
	r := probeResult{}
	ectx, cancel := context.WithTimeout(ctx, n.opts.Timeout)
	err := n.ensure(ectx)
	cancel()
	if err != nil {
		r.err = err
	} else if n.opts.Trust {
		n.log.Warn("kubernetes: NetworkPolicy enforcement NOT probed: the operator said the cluster enforces it (TrustNetworkPolicy); if it does not, every network tier is open",
			"namespace", n.ns)
		r.enforced, r.reason = true, "trusted by the operator (TrustNetworkPolicy), not probed"
	} else {
		r.enforced, r.reason, r.err = n.probe(ctx)
		switch {
		case r.err != nil:
			n.log.Error("kubernetes: the NetworkPolicy probe failed: every network tier is rejected until a probe succeeds", "namespace", n.ns, "err", r.err)
		case !r.enforced:
			n.log.Error("kubernetes: every network tier is rejected", "namespace", n.ns, "finding", r.reason)
		default:
			n.log.Info("kubernetes: NetworkPolicy is enforced", "namespace", n.ns, "finding", r.reason)
		}
	}
	r.at = time.Now()
	return r
}

// close stops a probe under way (its Pods are deleted on its way out).
// The policies stay.
func (n *network) close() {
	n.mu.Lock()
	if n.cancel != nil {
		n.cancel()
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// check rejects spec's network tier unless the cluster was proven to
// enforce the tier policies. Every tier is rejected alike: a none session
// without an enforcer is as reachable as an egress one. It waits for a
// probe under way, at most Wait; a check before start starts the probe.
func (n *network) check(spec sandbox.SessionSpec) error {
	ctx := context.Background()
	n.mu.Lock()
	if n.running == nil {
		n.startLocked(ctx)
	}
	done := n.running
	n.mu.Unlock()

	t := time.NewTimer(n.opts.Wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return &sandbox.SpecRejectedError{Field: "network", Reason: sandbox.ReasonUnenforceable, Message: fmt.Sprintf(
			"network %q: the probe of NetworkPolicy enforcement in namespace %s has not finished within %s; no tier is offered before it has", spec.Network, n.ns, n.opts.Wait)}
	}

	n.mu.Lock()
	r := n.result
	if r.err != nil && time.Since(r.at) >= n.opts.RetryAfter && n.running == done {
		// A probe that could not tell is tried again, for the checks to
		// come; this one is answered with the failure it waited for.
		n.startLocked(ctx)
	}
	n.mu.Unlock()
	switch {
	case r.err != nil:
		return &sandbox.SpecRejectedError{Field: "network", Reason: sandbox.ReasonUnenforceable, Message: fmt.Sprintf(
			"network %q: whether the cluster enforces NetworkPolicy is unknown, the probe failed: %v", spec.Network, r.err)}
	case !r.enforced:
		return &sandbox.SpecRejectedError{Field: "network", Reason: sandbox.ReasonUnenforceable, Message: fmt.Sprintf(
			"network %q: %s", spec.Network, r.reason)}
	}
	return nil
}

// The probe's findings, in its client Pods' termination messages: the
// open client's one word per step, "control1 target control2"; the none
// client's one word, "control".
const (
	probeOK      = "ok"
	probeFail    = "fail"
	probeReached = "reached"
	probeBlocked = "blocked"
)

// probeTry is the shell loop that tries "$1" (an address) for a while,
// since an enforcer may install a new Pod's rules a moment after the Pod
// runs, setting t to reached or blocked. Two refusals or timeouts in a
// row are a block: one alone could be a listener not yet listening, and
// "enforced" must never be a guess (a flapping peer counts as reached).
const probeTry = `try() {
  t=` + probeReached + `; i=0; f=0
  while [ $i -lt 8 ]; do
    if nc -w 2 "$1" "$PORT" </dev/null >/dev/null 2>&1; then f=0; else f=$((f+1)); fi
    if [ $f -ge 2 ]; then t=` + probeBlocked + `; break; fi
    i=$((i+1)); sleep 1
  done
}
`

// probeScript is the open client Pod's (no tier, so no policy selects
// it): it reaches the control listener (no policy selects it either) to
// show the Pod network works, then tries the target (under
// tai42-network-none: its ingress). The control once more after a block
// shows the block was the policy's and not the client losing its network.
const probeScript = probeTry + `c1=` + probeFail + `; i=0
while [ $i -lt 10 ]; do if nc -w 2 "$CONTROL" "$PORT" </dev/null >/dev/null 2>&1; then c1=` + probeOK + `; break; fi; i=$((i+1)); sleep 0.5; done
t=` + probeReached + `; c2=-
if [ $c1 = ` + probeOK + ` ]; then
  try "$TARGET"
  c2=` + probeFail + `
  if [ $t = ` + probeBlocked + ` ]; then
    i=0
    while [ $i -lt 4 ]; do if nc -w 2 "$CONTROL" "$PORT" </dev/null >/dev/null 2>&1; then c2=` + probeOK + `; break; fi; i=$((i+1)); sleep 0.5; done
  fi
fi
echo "$c1 $t $c2" >/dev/termination-log
`

// probeEgressScript is the none client Pod's (under tai42-network-none:
// its egress): it tries the control listener, which the open client
// reaches.
const probeEgressScript = probeTry + `try "$CONTROL"
echo "$t" >/dev/termination-log
`

// probe proves that the cluster enforces NetworkPolicy, both ways: a
// listener Pod labelled as a none session (the target), a control
// listener no policy selects, a client Pod (no tier) that connects to
// both, and a client Pod labelled as a none session that connects to the
// control. Each client reports in its termination message (no exec, no
// logs: the finding is the Pod's status). The target reached, or the
// control reached from the none client: not enforced (an enforcer of
// ingress rules alone would leave a none session free to reach anything).
// Both blocked while the open client reaches the control: enforced.
// Anything else (a Pod that never runs, a control that cannot be reached)
// is an error, never "enforced". Bounded by Timeout (the two clients run
// at once); the Pods are deleted whatever happens.
func (n *network) probe(ctx context.Context) (enforced bool, reason string, err error) {
	if n.opts.ProbeImage == "" {
		return false, "", errors.New("no probe image is configured (an image with /bin/sh and a busybox nc): the provider cannot prove NetworkPolicy is enforced; configure one, or say the cluster enforces it (TrustNetworkPolicy)")
	}
	ctx, cancel := context.WithTimeout(ctx, n.opts.Timeout)
	defer cancel()
	pods := n.client.CoreV1().Pods(n.ns)
	n.sweepProbes(ctx)

	var b [4]byte
	_, _ = rand.Read(b[:])
	run := hex.EncodeToString(b[:])
	name := func(role string) string { return "tai42-netprobe-" + run + "-" + role }
	target, control, client, noneClient := name("target"), name("control"), name("client"), name("noneclient")
	defer func() {
		// Deleted with a context of their own: the probe's may be done.
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer dcancel()
		zero := int64(0)
		for _, name := range []string{client, noneClient, control, target} {
			if derr := pods.Delete(dctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); derr != nil && !apierrors.IsNotFound(derr) {
				n.log.Warn("kubernetes: the NetworkPolicy probe could not delete its Pod", "pod", name, "err", derr)
			}
		}
	}()

	none := map[string]string{LabelNetwork: string(sandbox.NetworkNone)}
	listen := []string{"nc", "-ll", "-p", fmt.Sprint(probePort), "-e", "/bin/true"}
	tp := n.probePod(target, run, none, listen, nil)
	cp := n.probePod(control, run, nil, listen, nil)
	for _, p := range []*corev1.Pod{tp, cp} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return false, "", fmt.Errorf("creating the probe Pod %s: %w", p.Name, err)
		}
	}
	tIP, err := n.waitProbe(ctx, target)
	if err != nil {
		return false, "", err
	}
	cIP, err := n.waitProbe(ctx, control)
	if err != nil {
		return false, "", err
	}
	port := corev1.EnvVar{Name: "PORT", Value: fmt.Sprint(probePort)}
	xp := n.probePod(client, run, nil, []string{"/bin/sh", "-c", probeScript}, []corev1.EnvVar{
		{Name: "TARGET", Value: tIP}, {Name: "CONTROL", Value: cIP}, port,
	})
	np := n.probePod(noneClient, run, none, []string{"/bin/sh", "-c", probeEgressScript}, []corev1.EnvVar{
		{Name: "CONTROL", Value: cIP}, port,
	})
	for _, p := range []*corev1.Pod{xp, np} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return false, "", fmt.Errorf("creating the probe Pod %s: %w", p.Name, err)
		}
	}
	msg, err := n.waitProbeDone(ctx, client)
	if err != nil {
		return false, "", err
	}
	egress, err := n.waitProbeDone(ctx, noneClient)
	if err != nil {
		return false, "", err
	}
	f := strings.Fields(msg)
	if len(f) != 3 {
		return false, "", fmt.Errorf("the probe Pod %s reported %q, not its three findings", client, msg)
	}
	switch {
	case f[0] != probeOK:
		return false, "", fmt.Errorf("the probe Pod %s could not reach the control Pod %s (%s:%d), which no policy selects: the Pod network does not work, so the probe cannot tell", client, control, cIP, probePort)
	case f[1] == probeReached:
		return false, fmt.Sprintf("the cluster does not enforce NetworkPolicy: a Pod under %s (%s, %s:%d) was reachable from %s", NetworkPolicyNone, target, tIP, probePort, client), nil
	case egress == probeReached:
		return false, fmt.Sprintf("the cluster does not enforce NetworkPolicy egress rules: a Pod under %s (%s) reached the control Pod %s (%s:%d), which no policy selects", NetworkPolicyNone, noneClient, control, cIP, probePort), nil
	case f[1] == probeBlocked && f[2] == probeOK && egress == probeBlocked:
		return true, fmt.Sprintf("a Pod under %s (%s) was unreachable from %s, which reached a Pod no policy selects (%s), and a Pod under %s (%s) could not reach that Pod", NetworkPolicyNone, target, client, control, NetworkPolicyNone, noneClient), nil
	case f[1] == probeBlocked && f[2] != probeOK:
		return false, "", fmt.Errorf("the probe Pod %s lost the control Pod %s after the target was blocked: the probe cannot tell a policy from a network failure", client, control)
	case egress != probeBlocked:
		return false, "", fmt.Errorf("the probe Pod %s reported %q", noneClient, egress)
	}
	return false, "", fmt.Errorf("the probe Pod %s reported %q", client, msg)
}

// probePod is one of the probe's Pods: restricted Pod Security, no token,
// no links, not restarted.
func (n *network) probePod(name, run string, extra map[string]string, cmd []string, env []corev1.EnvVar) *corev1.Pod {
	labels := map[string]string{LabelManaged: ManagedBy, labelNetProbe: run}
	for k, v := range extra {
		labels[k] = v
	}
	f, t, zero := false, true, int64(0)
	uid := n.opts.PodUser
	var secrets []corev1.LocalObjectReference
	for _, s := range n.opts.PullSecrets {
		secrets = append(secrets, corev1.LocalObjectReference{Name: s})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.ns, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			TerminationGracePeriodSeconds: &zero,
			ImagePullSecrets:              secrets,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: &t, RunAsUser: &uid, RunAsGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:                     "probe",
				Image:                    n.opts.ProbeImage,
				ImagePullPolicy:          corev1.PullIfNotPresent,
				Command:                  cmd,
				Env:                      env,
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &f,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// waitProbe waits until Pod name runs with an IP and returns the IP.
func (n *network) waitProbe(ctx context.Context, name string) (string, error) {
	var last *corev1.Pod
	for {
		p, err := n.client.CoreV1().Pods(n.ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				return p.Status.PodIP, nil
			}
			if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				return "", fmt.Errorf("the probe Pod %s ended before the probe (%s)", name, podSummary(p))
			}
			if podStuck(p) { // fail at once, not at the bound
				return "", fmt.Errorf("the probe Pod %s cannot start (%s)", name, podSummary(p))
			}
		}
		if werr := sleepCtx(ctx, 200*time.Millisecond); werr != nil {
			if err == nil {
				err = werr
			}
			return "", fmt.Errorf("the probe Pod %s did not run within %s (%s): %w", name, n.opts.Timeout, podSummary(last), err)
		}
	}
}

// waitProbeDone waits until Pod name has ended and returns its
// termination message.
func (n *network) waitProbeDone(ctx context.Context, name string) (string, error) {
	var last *corev1.Pod
	for {
		p, err := n.client.CoreV1().Pods(n.ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				for _, cs := range p.Status.ContainerStatuses {
					if cs.State.Terminated != nil && strings.TrimSpace(cs.State.Terminated.Message) != "" {
						return strings.TrimSpace(cs.State.Terminated.Message), nil
					}
				}
				return "", fmt.Errorf("the probe Pod %s ended without its finding (%s)", name, podSummary(p))
			}
		}
		if werr := sleepCtx(ctx, 250*time.Millisecond); werr != nil {
			if err == nil {
				err = werr
			}
			return "", fmt.Errorf("the probe Pod %s did not finish within %s (%s): %w", name, n.opts.Timeout, podSummary(last), err)
		}
	}
}

// sweepProbes deletes probe Pods left by a daemon that died mid-probe: any
// older than two probes' time (a live probe of another daemon is younger).
func (n *network) sweepProbes(ctx context.Context) {
	pods := n.client.CoreV1().Pods(n.ns)
	l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labelNetProbe})
	if err != nil {
		return
	}
	zero := int64(0)
	for _, p := range l.Items {
		if time.Since(p.CreationTimestamp.Time) > 2*n.opts.Timeout+time.Minute {
			_ = pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
