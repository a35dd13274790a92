package kubernetes

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

const secretValue = "s3cr3t-value-never-in-annotations"

func testRecord() kit.Record {
	created := time.Date(2026, 12, 2, 7, 0, 0, 123456789, time.UTC)
	return kit.Record{
		ID: "0123456789abcdef", Provider: Name, State: kit.StateLive,
		Spec: sandbox.SessionSpec{
			Image: "sandbox.local/busybox:1", WorkspaceKey: "my.key_-1", Durability: sandbox.Persistent,
			Env:     map[string]sandbox.Secret{"TOKEN": sandbox.NewSecret(secretValue)},
			Network: sandbox.NetworkNone, Isolation: sandbox.IsolationContainer, CPU: 0.5, MemoryMB: 64,
			TTLSeconds: 600, Labels: map[string]string{"team": "a b", "emoji": "✓", "": "empty-key", "k=v": "x\"y"},
		},
		WorkspacePath: workspaceDir, CreatedAt: created, ExpiresAt: created.Add(10 * time.Minute),
		Handle: json.RawMessage(`{"namespace":"ns","pod":"tai42-0123456789abcdef"}`),
	}
}

func TestRecordRoundTrip(t *testing.T) {
	r := testRecord()
	ann, err := recordAnnotations(r)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range ann {
		if strings.Contains(v, secretValue) {
			t.Fatalf("annotation %s holds an env value", k)
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(r.ID), Labels: recordLabels(r.ID, r.Spec), Annotations: ann}}
	got, err := recordFromPod(pod, r.Spec.Env)
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(r.CreatedAt) || !got.ExpiresAt.Equal(r.ExpiresAt) {
		t.Errorf("times: got %v %v, want %v %v", got.CreatedAt, got.ExpiresAt, r.CreatedAt, r.ExpiresAt)
	}
	if !maps.Equal(got.Spec.Labels, r.Spec.Labels) {
		t.Errorf("labels: got %v, want %v", got.Spec.Labels, r.Spec.Labels)
	}
	if got.Spec.WorkspaceKey != r.Spec.WorkspaceKey || got.Spec.Image != r.Spec.Image || got.Spec.CPU != r.Spec.CPU ||
		got.Spec.MemoryMB != r.Spec.MemoryMB || got.Spec.Network != r.Spec.Network || got.Spec.Durability != r.Spec.Durability ||
		got.Spec.Isolation != r.Spec.Isolation || got.Spec.TTLSeconds != r.Spec.TTLSeconds {
		t.Errorf("spec: got %+v, want %+v", got.Spec, r.Spec)
	}
	if got.State != r.State || got.ID != r.ID || got.Provider != Name || got.WorkspacePath != r.WorkspacePath || string(got.Handle) != string(r.Handle) {
		t.Errorf("record: got %+v", got)
	}
	if v := got.Spec.Env["TOKEN"].Reveal(); v != secretValue {
		t.Errorf("env from the secret: got %q", v)
	}
	// Without the Secret's env, none: never a masked value for a real one.
	got, err = recordFromPod(pod, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Env != nil {
		t.Errorf("env without a secret: %v", got.Spec.Env)
	}
	if pod.Annotations[AnnotationWorkspaceKey] != r.Spec.WorkspaceKey {
		t.Errorf("workspace key annotation %q", pod.Annotations[AnnotationWorkspaceKey])
	}
}

func TestDecodeSpecDropsEnv(t *testing.T) {
	spec, err := decodeSpec(`{"image":"x","env":{"A":"leaked"},"ttl_seconds":5}`)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Env != nil {
		t.Fatalf("decodeSpec kept env %v", spec.Env)
	}
	if _, err := decodeSpec("{"); err == nil {
		t.Fatal("decodeSpec took bad JSON")
	}
}

func TestRecordFromPodRejects(t *testing.T) {
	r := testRecord()
	ann, _ := recordAnnotations(r)
	for name, pod := range map[string]*corev1.Pod{
		"no session label": {ObjectMeta: metav1.ObjectMeta{Name: podName(r.ID), Annotations: ann}},
		"name mismatch":    {ObjectMeta: metav1.ObjectMeta{Name: "other", Labels: recordLabels(r.ID, r.Spec), Annotations: ann}},
		"bad time": {ObjectMeta: metav1.ObjectMeta{Name: podName(r.ID), Labels: recordLabels(r.ID, r.Spec),
			Annotations: map[string]string{AnnotationSpec: ann[AnnotationSpec], AnnotationCreatedAt: "yesterday"}}},
	} {
		if _, err := recordFromPod(pod, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestNamesAreValid(t *testing.T) {
	long := strings.Repeat("k", 128)
	for _, key := range []string{"a", "my.key_-1", long} {
		h := workspaceHash(key)
		if len(h) != 40 || len(validation.IsValidLabelValue(h)) > 0 {
			t.Errorf("workspaceHash(%q) = %q is not a label value", key, h)
		}
		if errs := validation.IsDNS1123Subdomain(pvcName(key)); len(errs) > 0 {
			t.Errorf("pvcName(%q): %v", key, errs)
		}
	}
	if workspaceHash("a") == workspaceHash("b") {
		t.Error("workspaceHash collides")
	}
	id := "0123456789abcdef0123456789abcdef"
	for _, n := range []string{podName(id), secretName(id)} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("%s: %v", n, errs)
		}
	}
	for k, v := range recordLabels(id, testRecord().Spec) {
		if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			t.Errorf("label %s=%s invalid", k, v)
		}
	}
}
