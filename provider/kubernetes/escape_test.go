package kubernetes_test

// The escape battery's network and filesystem checks, against sessions of
// the provider on the harness's cluster (kube-router enforcing the tier
// NetworkPolicies). Nothing here sends a packet beyond this machine: the
// targets are Pods of the cluster, the node as its Pods reach it (the
// bridge's address, their gateway), and test hosts behind a router in a
// network namespace the test makes (sessnettest.Upstream), to which the
// host routes only the pod subnet's traffic; the harness routes the rest
// of what leaves the pod subnet nowhere. Every target is first reached by
// a Pod no policy selects (the positive control), so a session's failure
// to reach it is its tier's policy, not a missing route or listener.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/kubernetes"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

const (
	escProbePath = "/workspace/escapeprobe"
	// escListenPort is where each session's test listener listens.
	escListenPort = 8080
	escTimeout    = 2 * time.Minute
)

type escResult struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	Detail string `json:"detail"`
}

func escCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), escTimeout)
	t.Cleanup(cancel)
	return ctx
}

// escSandbox is the provider on the harness cluster, in a namespace of
// t's, with every tier allowed by the policy.
func escSandbox(t *testing.T) (*kubetest.Cluster, string, *kit.Sandbox) {
	t.Helper()
	c := kubetest.Require(t)
	if !c.Enforcer {
		t.Skip("the test cluster runs no NetworkPolicy enforcer: the provider rejects every tier")
	}
	ns := kubernetes.NewTestNamespace(t, c)
	sb, err := kubernetes.New(kubernetes.Options{
		Options:           kit.Options{Policy: sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationContainer}, ReapInterval: -1},
		RESTConfig:        c.RESTConfig(),
		Namespace:         ns,
		AgentImage:        c.AgentImage,
		NetworkProbeImage: c.Busybox,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			t.Errorf("closing the sandbox: %v", err)
		}
	})
	return c, ns, sb
}

// escSession is a session of tier n with the probe installed and a TCP
// listener on escListenPort (busybox nc, which accepts and closes), and
// its Pod's IP.
type escSession struct {
	sandbox.Session
	name string
	ip   netip.Addr
}

func newEscSession(t *testing.T, c *kubetest.Cluster, ns string, sb *kit.Sandbox, name string, n sandbox.Network) *escSession {
	t.Helper()
	ctx := escCtx(t)
	sess, err := sb.CreateSession(ctx, sandbox.SessionSpec{Image: c.Busybox, Network: n, Durability: sandbox.Ephemeral, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("creating the %s session (%s): %v", name, n, err)
	}
	t.Cleanup(func() { _ = sess.Destroy(context.Background()) })
	s := &escSession{Session: sess, name: name + "(" + string(n) + ")"}
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelSession + "=" + sess.ID()})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the %s session's Pod: %v (%d Pods)", s.name, err, len(pods.Items))
	}
	pod := pods.Items[0]
	if pod.Labels[kubernetes.LabelNetwork] != string(n) {
		t.Fatalf("the %s session's Pod is labelled %s=%q", s.name, kubernetes.LabelNetwork, pod.Labels[kubernetes.LabelNetwork])
	}
	if s.ip, err = netip.ParseAddr(pod.Status.PodIP); err != nil {
		t.Fatalf("the %s session's Pod IP %q: %v", s.name, pod.Status.PodIP, err)
	}
	escInstallProbe(t, s)
	h, err := sess.ExecStart(ctx, []string{"nc", "-ll", "-p", fmt.Sprint(escListenPort), "-e", "/bin/true"}, sandbox.StartOptions{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("starting the %s session's listener: %v", s.name, err)
	}
	t.Cleanup(func() { _ = h.Kill(context.Background()) })
	// The listener answers in its own session before anyone relies on it.
	self := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), escListenPort).String()
	deadline := time.Now().Add(10 * time.Second)
	for r := escProbe(t, s, "dial", self); !r.OK; r = escProbe(t, s, "dial", self) {
		if time.Now().After(deadline) {
			t.Fatalf("the %s session's listener does not answer on %s: %+v", s.name, self, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s
}

var escProbeBytes struct {
	once sync.Once
	b    []byte
	err  error
}

func escInstallProbe(t *testing.T, s *escSession) {
	t.Helper()
	path := escapeprobetest.Build(t)
	escProbeBytes.once.Do(func() { escProbeBytes.b, escProbeBytes.err = os.ReadFile(path) })
	if escProbeBytes.err != nil {
		t.Fatal(escProbeBytes.err)
	}
	ctx := escCtx(t)
	if err := s.PutFile(ctx, "escapeprobe", escProbeBytes.b); err != nil {
		t.Fatalf("PutFile(escapeprobe) into %s: %v", s.name, err)
	}
	if res, err := s.Exec(ctx, []string{"chmod", "+x", escProbePath}, sandbox.ExecOptions{Timeout: 30 * time.Second}); err != nil || res.ExitCode != 0 {
		t.Fatalf("chmod the probe in %s: %v %+v", s.name, err, res)
	}
}

func escProbe(t *testing.T, s *escSession, args ...string) escResult {
	t.Helper()
	res, err := s.Exec(escCtx(t), append([]string{escProbePath}, args...), sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("escapeprobe %q in %s: %v", args, s.name, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("escapeprobe %q in %s: exit %d, stdout %q, stderr %q", args, s.name, res.ExitCode, res.Stdout, res.Stderr)
	}
	var r escResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &r); err != nil {
		t.Fatalf("escapeprobe %q in %s: stdout %q: %v", args, s.name, res.Stdout, err)
	}
	return r
}

func escReaches(t *testing.T, from *escSession, what string, to netip.AddrPort) {
	t.Helper()
	if r := escProbe(t, from, "dial", to.String()); !r.OK {
		t.Errorf("%s does not reach %s (%s): %s %s; it must", from.name, what, to, r.Err, r.Detail)
	}
}

func escBlocked(t *testing.T, from *escSession, what string, to netip.AddrPort) {
	t.Helper()
	if r := escProbe(t, from, "dial", to.String()); r.OK {
		t.Errorf("%s reaches %s (%s): %s; it must not", from.name, what, to, r.Detail)
	} else {
		t.Logf("%s -> %s (%s): %s %s", from.name, what, to, r.Err, r.Detail)
	}
}

// escHosts are the targets past the namespace's Pods, each with a
// listener of the test's own: the node (its address on the bridge, the
// pods' gateway) and the test hosts behind an Upstream: two public ones
// (TEST-NET-3 and -2) and one in each range the egress tier refuses (10/8,
// 172.16/12, 192.168/16, 100.64/10, the metadata address).
type escHosts struct {
	node   netip.AddrPort
	public []netip.AddrPort
	// refused are the test hosts no tier reaches, by what they are.
	refused map[string]netip.AddrPort
}

// all are every target, by what it is.
func (h *escHosts) all() map[string]netip.AddrPort {
	out := map[string]netip.AddrPort{"the node (the pods' gateway)": h.node}
	for i, a := range h.public {
		out[fmt.Sprintf("the public test host %d", i+1)] = a
	}
	maps.Copy(out, h.refused)
	return out
}

func newEscHosts(t *testing.T, c *kubetest.Cluster) *escHosts {
	t.Helper()
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(c.Gateway(), 0).String())
	if err != nil {
		t.Fatalf("listening on the node's bridge address %s: %v", c.Gateway(), err)
	}
	h := &escHosts{node: sessnettest.Serve(t, ln).Addr, refused: map[string]netip.AddrPort{}}
	u := sessnettest.NewUpstream(t, fmt.Sprintf("kt%04x", rand.IntN(1<<16)), c.PodSubnet())
	// The pods' packets come unmasqueraded: the router's way back to them.
	back := &netlink.Route{Dst: sessnettest.IPNet(c.PodSubnet()), Gw: u.HostAddr.AsSlice()}
	if err := u.Router.RouteAdd(back); err != nil {
		t.Fatalf("the router's route back to the pod subnet %s: %v", c.PodSubnet(), err)
	}
	h.public = []netip.AddrPort{u.Hosts[sessnettest.Public].TCP.Addr, u.Hosts[sessnettest.Public2].TCP.Addr}
	for _, name := range []string{sessnettest.Private10, sessnettest.Private172, sessnettest.Private192, sessnettest.Shared, sessnettest.Metadata} {
		h.refused["the "+name+" test host"] = u.Hosts[name].TCP.Addr
	}
	return h
}

// TestEscapeNetworkKubernetes: none reaches nothing (no other tier's Pod,
// not another none, not the node, no test host); internal reaches an
// internal Pod and nothing else; egress reaches the public test hosts and
// no private address (the other Pods, the node, the test hosts of every
// refused range, the metadata address included); every tier's own
// listener answers in its own session, and every target answers a Pod no
// policy selects (the positive controls).
func TestEscapeNetworkKubernetes(t *testing.T) {
	c, ns, sb := escSandbox(t)
	none := newEscSession(t, c, ns, sb, "none1", sandbox.NetworkNone)
	none2 := newEscSession(t, c, ns, sb, "none2", sandbox.NetworkNone)
	intA := newEscSession(t, c, ns, sb, "intA", sandbox.NetworkInternal)
	intB := newEscSession(t, c, ns, sb, "intB", sandbox.NetworkInternal)
	egr := newEscSession(t, c, ns, sb, "egress", sandbox.NetworkEgress)
	at := func(s *escSession) netip.AddrPort { return netip.AddrPortFrom(s.ip, escListenPort) }
	h := newEscHosts(t, c)
	hosts := h.all()
	// A Pod no policy selects: what keeps a session from it is that
	// session's own egress rules (for egress, the 10/8 except), not the
	// target's ingress.
	hosts["a Pod no policy selects"] = bystander(t, c, ns)
	reachedWithoutPolicy(t, c, ns, hosts)

	t.Run("internal reaches internal", func(t *testing.T) {
		escReaches(t, intA, intB.name, at(intB))
		escReaches(t, intB, intA.name, at(intA))
	})
	t.Run("none", func(t *testing.T) {
		for _, to := range []*escSession{none2, intA, egr} {
			escBlocked(t, none, to.name, at(to))
		}
		for what, to := range hosts {
			escBlocked(t, none, what, to)
		}
		// Nothing reaches a none session either.
		for _, from := range []*escSession{none2, intA, egr} {
			escBlocked(t, from, none.name, at(none))
		}
	})
	t.Run("internal", func(t *testing.T) {
		for _, to := range []*escSession{none, egr} {
			escBlocked(t, intA, to.name, at(to))
		}
		for what, to := range hosts {
			escBlocked(t, intA, what, to)
		}
		// Not reachable from the other tiers.
		escBlocked(t, egr, intA.name, at(intA))
	})
	t.Run("egress", func(t *testing.T) {
		for i, to := range h.public {
			escReaches(t, egr, fmt.Sprintf("the public test host %d", i+1), to)
		}
		for _, to := range []*escSession{none, intA} {
			escBlocked(t, egr, to.name, at(to))
		}
		for what, to := range hosts {
			if !slices.Contains(h.public, to) {
				escBlocked(t, egr, what, to)
			}
		}
		// Nothing reaches an egress session.
		escBlocked(t, intB, egr.name, at(egr))
	})
}

// TestEscapeFilesystemKubernetes: a session's Pod has no service-account
// token, no host path, a root filesystem the session user cannot write
// where the image's files are root's, the agent's directory read-only,
// and /proc and /sys as the runtime masks them.
func TestEscapeFilesystemKubernetes(t *testing.T) {
	c, ns, sb := escSandbox(t)
	s := newEscSession(t, c, ns, sb, "fs", sandbox.NetworkNone)

	// The Pod itself: no hostPath volume, no token, no host namespaces.
	pods, err := c.Client.CoreV1().Pods(ns).List(escCtx(t), metav1.ListOptions{LabelSelector: kubernetes.LabelSession + "=" + s.ID()})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the session's Pod: %v", err)
	}
	pod := pods.Items[0]
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath %s", v.Name, v.HostPath.Path)
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					t.Errorf("volume %s projects a service-account token", v.Name)
				}
			}
		}
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken is not false")
	}
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Error("a host namespace")
	}

	// From inside: no token where client-go looks for one.
	for _, p := range []string{"/var/run/secrets/kubernetes.io/serviceaccount/token", "/run/secrets/kubernetes.io/serviceaccount/token"} {
		if r := escProbe(t, s, "stat", p); r.OK || r.Err != "ENOENT" {
			t.Errorf("stat %s: %+v; want ENOENT", p, r)
		}
	}
	// A host canary is not visible (the Pod's /tmp is the image's).
	canary, err := os.CreateTemp("", "tai42-k8s-escape-canary-")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := canary.WriteString("host canary\n"); err != nil {
		t.Fatal(err)
	}
	if err := canary.Close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(canary.Name()) })
	if r := escProbe(t, s, "read", canary.Name()); r.OK {
		t.Errorf("the session reads the host's %s: %q", canary.Name(), r.Detail)
	}
	// The image's root-owned files and directories are not writable by
	// the session's user; the agent's directory is read-only.
	for _, p := range []string{"/bin/tai42-escape", "/etc/passwd", "/tai42-escape", "/.tai42/tai42", "/.tai42/escape"} {
		if r := escProbe(t, s, "write", p); r.OK {
			t.Errorf("the session wrote %s", p)
		} else if r.Err != "EACCES" && r.Err != "EROFS" && r.Err != "EPERM" {
			t.Errorf("write %s: %+v; want EACCES, EROFS or EPERM", p, r)
		}
	}
	// The workspace is the session's.
	if r := escProbe(t, s, "write", "/workspace/ok"); !r.OK {
		t.Errorf("the session cannot write its workspace: %+v", r)
	}
	// /proc and /sys as the runtime masks them: the masked files read
	// empty or not at all; sysrq-trigger is not writable (opened only);
	// /sys is read-only (cgroup-write only opens files and tries a mkdir).
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"} {
		if r := escProbe(t, s, "read", p); r.OK && r.Detail != "" {
			t.Errorf("read %s: %d bytes; the runtime masks it", p, len(r.Detail))
		}
	}
	if r := escProbe(t, s, "sysrq"); r.OK {
		t.Errorf("/proc/sysrq-trigger opens for writing: %+v", r)
	}
	if r := escProbe(t, s, "cgroup-write"); r.OK {
		t.Errorf("cgroup files open for writing or a child cgroup was made: %+v", r)
	}
	for _, args := range [][]string{{"mount"}, {"hostname"}, {"mknod"}} {
		if r := escProbe(t, s, args...); r.OK {
			t.Errorf("escapeprobe %v succeeded: %+v", args, r)
		}
	}
}

// bystander starts a listener Pod with no tier label (no policy selects
// it) and returns its address, once it runs.
func bystander(t *testing.T, c *kubetest.Cluster, ns string) netip.AddrPort {
	t.Helper()
	p := runPlainPod(t, c, ns, "escape-bystander", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	}, "nc", "-ll", "-p", fmt.Sprint(escListenPort), "-e", "/bin/true")
	return netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), escListenPort)
}

// reachedWithoutPolicy is the positive control: a Pod no policy selects
// reaches every target (retrying each a few times, as a policy or a route
// can take a moment to settle), so a session's failure to reach one is its
// tier's doing.
func reachedWithoutPolicy(t *testing.T, c *kubetest.Cluster, ns string, targets map[string]netip.AddrPort) {
	t.Helper()
	var script strings.Builder
	script.WriteString("rc=0\n")
	for _, to := range targets {
		fmt.Fprintf(&script, "i=0; until nc -w 2 %s %d </dev/null; do i=$((i+1)); if [ $i -ge 10 ]; then echo unreached %s; rc=1; break; fi; sleep 0.5; done\n", to.Addr(), to.Port(), to)
	}
	script.WriteString("exit $rc\n")
	p := runPlainPod(t, c, ns, fmt.Sprintf("escape-control-%04x", rand.IntN(1<<16)), func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}, "/bin/sh", "-c", script.String())
	if p.Status.Phase != corev1.PodSucceeded {
		logs, _ := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(escCtx(t))
		t.Fatalf("control: a Pod without policy does not reach every target %v: %s", targets, strings.TrimSpace(string(logs)))
	}
}

// runPlainPod runs a busybox Pod no policy selects (restricted, like the
// sessions) with cmd, deleted at the end of t, and waits up to a minute
// until ready says it is.
func runPlainPod(t *testing.T, c *kubetest.Cluster, ns, name string, ready func(*corev1.Pod) bool, cmd ...string) *corev1.Pod {
	t.Helper()
	ctx := escCtx(t)
	pods := c.Client.CoreV1().Pods(ns)
	f, tr, uid, zero := false, true, int64(65532), int64(0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tai42.dev/escape-test": "plain"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &f, EnableServiceLinks: &f,
			TerminationGracePeriodSeconds: &zero,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &tr, RunAsUser: &uid, RunAsGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "c", Image: c.Busybox, ImagePullPolicy: corev1.PullIfNotPresent, Command: cmd,
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &f, Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}) })
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err == nil && ready(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Pod %s: %v %+v", name, err, p.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
