package kubernetes

import (
	"encoding/json"
	"errors"
	"k8s.io/client-go/kubernetes/fake"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tai42/sandbox"
)

func testProvider(opts Options) *provider {
	if opts.AgentImage == "" {
		opts.AgentImage = "sandbox.local/tai42-agent:test"
	}
	p := &provider{opts: opts, ns: "ns", uid: 65532, gid: 65532}
	p.network = newNetwork(fake.NewClientset(), "ns", networkOptions{Trust: true})
	p.workspaces, _ = newWorkspaces(nil, "ns", wsOptions{})
	return p
}

func checkRestricted(t *testing.T, name string, sc *corev1.SecurityContext) {
	t.Helper()
	switch {
	case sc == nil:
		t.Fatalf("%s: no securityContext", name)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Errorf("%s: runAsNonRoot not true", name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: allowPrivilegeEscalation not false", name)
	case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0:
		t.Errorf("%s: capabilities %+v", name, sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: seccomp %+v", name, sc.SeccompProfile)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("%s: privileged", name)
	case sc.RunAsUser == nil || *sc.RunAsUser == 0:
		t.Errorf("%s: runAsUser %v", name, sc.RunAsUser)
	}
}

func TestPodSpec(t *testing.T) {
	p := testProvider(Options{ImagePullSecrets: []string{"regcred"}})
	r := testRecord()
	r.Spec.Durability, r.Spec.WorkspaceKey = sandbox.Ephemeral, ""
	pod, err := p.buildPod(r, "")
	if err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Error("service-account token mounted")
	}
	if s.EnableServiceLinks == nil || *s.EnableServiceLinks {
		t.Error("service links on")
	}
	if s.HostNetwork || s.HostPID || s.HostIPC {
		t.Error("host namespaces")
	}
	if s.RestartPolicy != corev1.RestartPolicyNever || s.TerminationGracePeriodSeconds == nil || *s.TerminationGracePeriodSeconds != 0 {
		t.Errorf("restart %s grace %v", s.RestartPolicy, s.TerminationGracePeriodSeconds)
	}
	psc := s.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || *psc.RunAsUser != 65532 || *psc.RunAsGroup != 65532 ||
		*psc.FSGroup != 65532 || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	if len(s.InitContainers) != 1 || len(s.Containers) != 1 {
		t.Fatalf("containers: %d init, %d", len(s.InitContainers), len(s.Containers))
	}
	ic, c := s.InitContainers[0], s.Containers[0]
	checkRestricted(t, "init", ic.SecurityContext)
	checkRestricted(t, "session", c.SecurityContext)
	if strings.Join(ic.Command, " ") != "/tai42 agent install /.tai42/tai42" || ic.Image != p.opts.AgentImage {
		t.Errorf("init: %s %v", ic.Image, ic.Command)
	}
	if strings.Join(c.Command, " ") != "/.tai42/tai42 agent --listen 127.0.0.1:7421" || c.Image != r.Spec.Image || c.WorkingDir != "/workspace" {
		t.Errorf("session: %s %v %s", c.Image, c.Command, c.WorkingDir)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if !mounts["/.tai42"].ReadOnly || mounts["/workspace"].Name != volumeWorkspace {
		t.Errorf("mounts %+v", c.VolumeMounts)
	}
	for _, v := range s.Volumes {
		if v.Name == volumeWorkspace && v.EmptyDir == nil {
			t.Errorf("ephemeral workspace is not an emptyDir: %+v", v)
		}
	}
	cpu, mem := c.Resources.Limits[corev1.ResourceCPU], c.Resources.Limits[corev1.ResourceMemory]
	if cpu.Cmp(resource.MustParse("500m")) != 0 || mem.Cmp(resource.MustParse("64Mi")) != 0 {
		t.Errorf("limits %v", c.Resources.Limits)
	}
	for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if rq, v := c.Resources.Requests[k], c.Resources.Limits[k]; rq.Cmp(v) != 0 {
			t.Errorf("request %s %v != limit %v", k, rq, v)
		}
	}
	if len(s.ImagePullSecrets) != 1 || s.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("imagePullSecrets %v", s.ImagePullSecrets)
	}
	if s.RuntimeClassName != nil {
		t.Errorf("runtimeClassName %q at isolation container", *s.RuntimeClassName)
	}
	if pod.Labels[LabelManaged] != ManagedBy || pod.Labels[LabelSession] != r.ID || pod.Labels[LabelNetwork] != "none" {
		t.Errorf("labels %v", pod.Labels)
	}
	if _, ok := pod.Labels[LabelWorkspace]; ok {
		t.Error("an ephemeral session's pod has a workspace label")
	}
	b, _ := json.Marshal(pod)
	if strings.Contains(string(b), secretValue) {
		t.Fatal("an env value is in the Pod")
	}
	for _, ct := range append(s.InitContainers, s.Containers...) {
		if len(ct.Env) > 0 || len(ct.EnvFrom) > 0 {
			t.Errorf("%s has env in the Pod", ct.Name)
		}
	}
}

func TestPodPersistentAndVM(t *testing.T) {
	p := testProvider(Options{RuntimeClass: "kata"})
	r := testRecord()
	r.Spec.Isolation = sandbox.IsolationVM
	pod, err := p.buildPod(r, pvcName(r.Spec.WorkspaceKey))
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "kata" {
		t.Errorf("runtimeClassName %v", pod.Spec.RuntimeClassName)
	}
	if pod.Labels[LabelWorkspace] != workspaceHash(r.Spec.WorkspaceKey) {
		t.Errorf("workspace label %q", pod.Labels[LabelWorkspace])
	}
	found := false
	for _, v := range pod.Spec.Volumes {
		if v.Name == volumeWorkspace {
			found = v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvcName(r.Spec.WorkspaceKey)
		}
	}
	if !found {
		t.Errorf("workspace volume is not the PVC: %+v", pod.Spec.Volumes)
	}
	r.Spec.Isolation = sandbox.IsolationContainer
	pod, _ = p.buildPod(r, "")
	if pod.Spec.RuntimeClassName != nil {
		t.Error("isolation container got the RuntimeClass")
	}
	if p.Isolation() != sandbox.IsolationVM || testProvider(Options{}).Isolation() != sandbox.IsolationContainer {
		t.Error("Isolation")
	}
}

// TestPodDiskLimit: the session's container has an ephemeral-storage
// limit (its writable layer, its logs and its emptyDir workspace count
// against it), so one session cannot fill its node's disk and get the
// node's other Pods evicted; of DefaultDiskMB unless set, none with
// DiskOff. Its request is an explicit 0: a request left out would be
// defaulted to the limit, and the scheduler would then reserve 10 GiB of
// the node's disk per session (none at all on a node that reports no
// ephemeral storage).
func TestPodDiskLimit(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string // "": no limit
	}{
		{Options{}, "10Gi"},
		{Options{DiskMB: 512}, "512Mi"},
		{Options{DiskOff: true}, ""},
	} {
		pod, err := testProvider(tc.opts).buildPod(testRecord(), "")
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[0]
		lim, hasLim := c.Resources.Limits[corev1.ResourceEphemeralStorage]
		req, hasReq := c.Resources.Requests[corev1.ResourceEphemeralStorage]
		switch {
		case tc.want == "" && (hasLim || hasReq):
			t.Errorf("DiskOff: ephemeral-storage limit %v request %v, want none", lim.String(), req.String())
		case tc.want != "" && (!hasLim || lim.Cmp(resource.MustParse(tc.want)) != 0):
			t.Errorf("DiskMB %d: ephemeral-storage limit %v (set: %v), want %s", tc.opts.DiskMB, lim.String(), hasLim, tc.want)
		case tc.want != "" && (!hasReq || !req.IsZero()):
			t.Errorf("DiskMB %d: ephemeral-storage request %v (set: %v), want an explicit 0", tc.opts.DiskMB, req.String(), hasReq)
		}
		// The limit leaves cpu and memory as they were: requests = limits.
		cpu, mem := c.Resources.Limits[corev1.ResourceCPU], c.Resources.Requests[corev1.ResourceMemory]
		if cpu.Cmp(resource.MustParse("500m")) != 0 || mem.Cmp(resource.MustParse("64Mi")) != 0 {
			t.Errorf("DiskMB %d: resources %+v", tc.opts.DiskMB, c.Resources)
		}
	}
	var se *SetupError
	if _, err := New(Options{AgentImage: "x", DiskMB: -1}); !errors.As(err, &se) || se.Check != CheckOptions || !strings.Contains(err.Error(), "DiskMB") {
		t.Errorf("DiskMB -1: %v, want a SetupError of the options naming DiskMB", err)
	}
}

func TestNoResourcesWithoutCaps(t *testing.T) {
	rr := podResources(sandbox.SessionSpec{})
	if len(rr.Limits) != 0 || len(rr.Requests) != 0 {
		t.Errorf("%+v", rr)
	}
	rr = podResources(sandbox.SessionSpec{CPU: 0.0015})
	if q := rr.Limits[corev1.ResourceCPU]; q.MilliValue() != 2 {
		t.Errorf("cpu 0.0015 -> %v (rounded up, never down)", q.String())
	}
}

func TestMilliCPU(t *testing.T) {
	for cpu, want := range map[float64]int64{
		2.007:  2007, // 2007.0000000000002 in float
		0.1:    100,
		0.3:    300, // 300.00000000000006
		1:      1000,
		0.001:  1,
		0.0015: 2, // between millicores: up
		1.0001: 1001,
		4.2:    4200,
	} {
		if got := milliCPU(cpu); got != want {
			t.Errorf("milliCPU(%v) = %d, want %d", cpu, got, want)
		}
	}
}
