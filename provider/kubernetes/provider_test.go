package kubernetes

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

func TestNewBadOptions(t *testing.T) {
	var se *SetupError
	if _, err := New(Options{}); !errors.As(err, &se) || se.Check != CheckOptions || !strings.Contains(err.Error(), "AgentImage") {
		t.Fatalf("no agent image: %v", err)
	}
	if _, err := New(Options{AgentImage: "x", PodUser: "0:0"}); !errors.As(err, &se) || se.Check != CheckOptions {
		t.Fatalf("root pod user: %v", err)
	}
	if !errors.Is(se, sandbox.ErrSandbox) {
		t.Error("a SetupError is not a sandbox error")
	}
	if sbe, ok := errors.AsType[*sandbox.SandboxError](error(se)); !ok || !strings.Contains(sbe.Error(), "PodUser") {
		t.Errorf("a SetupError is not a *sandbox.SandboxError: %v", sbe)
	}
}

func TestNewBadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(bad, []byte("this: is: not: a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(dir, "missing")} {
		var se *SetupError
		_, err := New(Options{AgentImage: "x", Kubeconfig: path})
		if !errors.As(err, &se) || se.Check != CheckKubeconfig {
			t.Errorf("%s: %v", path, err)
		}
	}
}

func TestNewAPIServerGone(t *testing.T) {
	// A port nothing listens on: refused at once; the check is bounded
	// anyway.
	start := time.Now()
	var se *SetupError
	_, err := New(Options{AgentImage: "x", RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}})
	if !errors.As(err, &se) || se.Check != CheckAPIServer || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("%v", err)
	}
	if d := time.Since(start); d > setupTimeout+2*time.Second {
		t.Errorf("took %s", d)
	}
}

func TestParsePodUser(t *testing.T) {
	for in, want := range map[string][2]int64{"65532:65532": {65532, 65532}, "1000": {1000, 1000}, "1000:2000": {1000, 2000}} {
		u, g, err := parsePodUser(in)
		if err != nil || u != want[0] || g != want[1] {
			t.Errorf("%s: %d %d %v", in, u, g, err)
		}
	}
	for _, in := range []string{"0", "0:0", "a:b", "-1:1", ""} {
		if _, _, err := parsePodUser(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestCheck(t *testing.T) {
	p := testProvider(Options{})
	ok := sandbox.SessionSpec{Image: "x", Network: sandbox.NetworkEgress, CPU: 1, MemoryMB: 64, TTLSeconds: 1}
	if err := p.Check(ok); err != nil {
		t.Fatal(err)
	}
	var sre *sandbox.SpecRejectedError
	if err := p.Check(sandbox.SessionSpec{Image: "x", Network: sandbox.NetworkEgress, CPU: 0.0001}); !errors.As(err, &sre) || sre.Field != "cpu" || sre.Reason != sandbox.ReasonUnenforceable {
		t.Errorf("cpu: %v", err)
	}
	// Neither trusted nor provable (no probe image): every tier is
	// rejected, never granted unenforced.
	p.network = newNetwork(fake.NewClientset(), "ns", networkOptions{})
	if err := p.Check(ok); !errors.As(err, &sre) || sre.Field != "network" || sre.Reason != sandbox.ReasonUnenforceable {
		t.Errorf("network: %v", err)
	}
}

func TestPodFailure(t *testing.T) {
	p := testProvider(Options{})
	waiting := func(init bool, reason string) *corev1.Pod {
		st := []corev1.ContainerStatus{{Name: "c", Image: "img", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "msg"}}}}
		pod := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
		if init {
			pod.Status.InitContainerStatuses = st
		} else {
			pod.Status.ContainerStatuses = st
		}
		return pod
	}
	var ie *imageError
	if err := p.podFailure(waiting(false, "ImagePullBackOff")); !errors.As(err, &ie) {
		t.Errorf("session image pull: %v", err)
	}
	if err := p.podFailure(waiting(true, "ErrImagePull")); err == nil || errors.As(err, &ie) || !strings.Contains(err.Error(), "agent image") {
		t.Errorf("agent image pull: %v", err)
	}
	if err := p.podFailure(waiting(false, "CreateContainerConfigError")); err == nil {
		t.Error("config error not a failure")
	}
	if err := p.podFailure(waiting(false, "ContainerCreating")); err != nil {
		t.Errorf("creating is a failure: %v", err)
	}
	unsched := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 Insufficient cpu."}}}}
	if err := p.podFailure(unsched); err == nil || !strings.Contains(err.Error(), "Insufficient cpu") {
		t.Errorf("unschedulable: %v", err)
	}
	// A claim the scheduler has not bound or not seen yet: it retries.
	for _, msg := range []string{
		"0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are available.",
		`0/1 nodes are available: persistentvolumeclaim "tai42-ws-d17b5c8d" not found. not found`,
	} {
		claim := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: msg}}}}
		if err := p.podFailure(claim); err != nil {
			t.Errorf("unschedulable for its claim (%q): %v, want it waited for", msg, err)
		}
	}
	initFailed := &corev1.Pod{Status: corev1.PodStatus{InitContainerStatuses: []corev1.ContainerStatus{{Name: "i",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"}}}}}}
	if err := p.podFailure(initFailed); err == nil {
		t.Error("failed init not a failure")
	}
	if err := p.podFailure(&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}); err == nil {
		t.Error("failed pod not a failure")
	}
	// The spec's image, as the create reports it.
	pod := waiting(false, "ErrImagePull")
	err := failure(pod, "ns", p.podFailure(pod), "Warning Failed: pull")
	var sre *sandbox.SpecRejectedError
	if !errors.As(err, &sre) || sre.Field != "image" {
		t.Errorf("create error: %v", err)
	}
}

// fakeSetupAPI is an apiserver for New's checks: /version answers
// version (an HTTP status), the namespace exists, and a
// SelfSubjectAccessReview is allowed unless denied names its
// "verb group/resource".
func fakeSetupAPI(t *testing.T, version int, denied string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/version" && version != http.StatusOK:
			w.WriteHeader(version)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure",
				Code: int32(version), Reason: map[int]metav1.StatusReason{401: metav1.StatusReasonUnauthorized, 403: metav1.StatusReasonForbidden}[version]})
		case r.URL.Path == "/version":
			_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
		case strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/"):
			_, _ = w.Write([]byte(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"default"}}`))
		case strings.HasSuffix(r.URL.Path, "/selfsubjectaccessreviews"):
			var rev authv1.SelfSubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&rev); err != nil {
				t.Error(err)
			}
			a := rev.Spec.ResourceAttributes
			rev.Status.Allowed = a.Verb+" "+resourceName(*a) != denied
			rev.Kind, rev.APIVersion = "SelfSubjectAccessReview", "authorization.k8s.io/v1"
			_ = json.NewEncoder(w).Encode(&rev)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestNewVersionRefused: a 401 on /version is the kubeconfig's
// credentials, a 403 RBAC, each named; neither is "does not answer". The
// apiserver is named without the userinfo its URL carries.
func TestNewVersionRefused(t *testing.T) {
	for _, tc := range []struct {
		status int
		check  SetupCheck
		want   string
	}{
		{http.StatusUnauthorized, CheckKubeconfig, "rejected the kubeconfig's credentials"},
		{http.StatusForbidden, CheckRBAC, "forbids the kubeconfig's user reading /version"},
	} {
		srv := fakeSetupAPI(t, tc.status, "")
		host := strings.Replace(srv.URL, "http://", "http://someone:hunter2@", 1)
		var se *SetupError
		_, err := New(Options{AgentImage: "x", RESTConfig: &rest.Config{Host: host}})
		if !errors.As(err, &se) || se.Check != tc.check || !strings.Contains(se.Message, tc.want) {
			t.Errorf("%d: %v; want check %s saying %q", tc.status, err, tc.check, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%d: the error shows the URL's password: %v", tc.status, err)
		}
	}
}

// TestNewRBACClusterScoped: New names a forbidden cluster-scoped verb
// (the StorageClasses the workspaces read, the RuntimeClass of isolation
// vm) instead of every persistent or vm create failing later.
func TestNewRBACClusterScoped(t *testing.T) {
	for _, tc := range []struct {
		denied, runtimeClass, verb, resource string
	}{
		{"list storage.k8s.io/storageclasses", "", "list", "storage.k8s.io/storageclasses"},
		{"get storage.k8s.io/storageclasses", "", "get", "storage.k8s.io/storageclasses"},
		{"get node.k8s.io/runtimeclasses", "gvisor", "get", "node.k8s.io/runtimeclasses"},
	} {
		srv := fakeSetupAPI(t, http.StatusOK, tc.denied)
		var se *SetupError
		_, err := New(Options{AgentImage: "x", RuntimeClass: tc.runtimeClass, RESTConfig: &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}}})
		if !errors.As(err, &se) || se.Check != CheckRBAC || se.Verb != tc.verb || se.Resource != tc.resource || !strings.Contains(se.Message, "cluster-wide") {
			t.Errorf("%s: %v", tc.denied, err)
		}
	}
}

func TestAPIServerHost(t *testing.T) {
	for in, want := range map[string]string{
		"https://u:p@10.0.0.1:6443/base": "10.0.0.1:6443",
		"10.0.0.1:6443":                  "10.0.0.1:6443",
		"http://[::1]:8080":              "[::1]:8080",
		"u:p%zz@h:1":                     "h:1",
	} {
		if got := apiserverHost(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func TestSweepEvery(t *testing.T) {
	for _, tc := range []struct {
		reap, every time.Duration
		on          bool
	}{
		{0, kit.DefaultReapInterval, true},
		{5 * time.Second, 5 * time.Second, true},
		{-1, 0, false}, // the reaper off: no sweep either
	} {
		if every, on := sweepEvery(tc.reap); every != tc.every || on != tc.on {
			t.Errorf("ReapInterval %v: every %v on %v, want %v %v", tc.reap, every, on, tc.every, tc.on)
		}
	}
}
