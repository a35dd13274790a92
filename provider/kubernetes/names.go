package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// Name is the provider's registered name.
const Name = "kubernetes"

// AgentPort is the TCP port the agent listens on, on the loopback of the
// session Pod's own network namespace; the port-forward reaches it there.
const AgentPort = 7421

// AgentListen is the agent's --listen address in a session Pod.
var AgentListen = fmt.Sprintf("127.0.0.1:%d", AgentPort)

// Labels: what the provider selects its objects by.
const (
	// LabelManaged is on every object the provider makes, at ManagedBy.
	LabelManaged = "app.kubernetes.io/managed-by"
	ManagedBy    = "tai42"
	// LabelSession holds a session's id, on its Pod and its env Secret.
	LabelSession = "tai42.dev/session"
	// LabelNetwork holds a session Pod's network tier: the tier
	// NetworkPolicies select Pods by it.
	LabelNetwork = "tai42.dev/network"
	// LabelWorkspace holds workspaceHash(key) on a persistent session's
	// Pod and on its PVC (a key may not be a label value: 128 bytes).
	LabelWorkspace = "tai42.dev/workspace"
)

// Annotations: the ledger's fields on a session's Pod (and PVC).
const (
	AnnotationWorkspaceKey  = "tai42.dev/workspace-key"
	AnnotationState         = "tai42.dev/state"
	AnnotationSpec          = "tai42.dev/spec"
	AnnotationCreatedAt     = "tai42.dev/created-at"
	AnnotationExpiresAt     = "tai42.dev/expires-at"
	AnnotationWorkspacePath = "tai42.dev/workspace-path"
	AnnotationHandle        = "tai42.dev/handle"
	// AnnotationHeldBy is on a PVC: the session id that holds its key.
	AnnotationHeldBy = "tai42.dev/held-by"
)

// Standing objects of a namespace.
const (
	NetworkPolicyNone     = "tai42-network-none"
	NetworkPolicyInternal = "tai42-network-internal"
	NetworkPolicyEgress   = "tai42-network-egress"
	LeaseName             = "tai42-reaper"
)

// Container and volume names in a session Pod.
const (
	containerInstall = "tai42-install"
	containerSession = "session"
	volumeAgent      = "tai42-agent"
	volumeWorkspace  = "workspace"
	agentDir         = "/.tai42"
	agentBinary      = agentDir + "/tai42"
	workspaceDir     = "/workspace"
)

// podName is the name of session id's Pod.
func podName(id string) string { return "tai42-" + id }

// secretName is the name of session id's env Secret.
func secretName(id string) string { return "tai42-" + id + "-env" }

// workspaceHash is the label value that stands for workspace key: the
// first 40 hex digits of its SHA-256 (a key may be longer than a label
// value and hold characters a name may not).
func workspaceHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:40]
}

// pvcName is the name of workspace key's PersistentVolumeClaim.
func pvcName(key string) string { return "tai42-ws-" + workspaceHash(key) }

// encodeSpec is the spec as the Pod's annotation holds it: JSON, without
// env (its values are in the session's Secret; not even the keys are
// written here).
func encodeSpec(spec sandbox.SessionSpec) (string, error) {
	spec.Env = nil
	b, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("kubernetes: encoding the session spec: %w", err)
	}
	return string(b), nil
}

// decodeSpec reads what encodeSpec wrote; its Env is nil.
func decodeSpec(s string) (sandbox.SessionSpec, error) {
	var spec sandbox.SessionSpec
	if err := json.Unmarshal([]byte(s), &spec); err != nil {
		return sandbox.SessionSpec{}, fmt.Errorf("kubernetes: decoding the %s annotation: %w", AnnotationSpec, err)
	}
	spec.Env = nil // an annotation never carries env; never trust one that does
	return spec, nil
}

// recordAnnotations are the annotations that hold r on its Pod.
func recordAnnotations(r kit.Record) (map[string]string, error) {
	spec, err := encodeSpec(r.Spec)
	if err != nil {
		return nil, err
	}
	a := map[string]string{
		AnnotationState:         string(r.State),
		AnnotationSpec:          spec,
		AnnotationCreatedAt:     r.CreatedAt.UTC().Format(time.RFC3339Nano),
		AnnotationExpiresAt:     r.ExpiresAt.UTC().Format(time.RFC3339Nano),
		AnnotationWorkspacePath: r.WorkspacePath,
	}
	if len(r.Handle) > 0 {
		a[AnnotationHandle] = string(r.Handle)
	}
	if r.Spec.WorkspaceKey != "" {
		a[AnnotationWorkspaceKey] = r.Spec.WorkspaceKey
	}
	// The env's names (never its values, which are in the Secret) tell a
	// daemon adopting the session whether there is a Secret to read.
	keys := slices.Sorted(maps.Keys(r.Spec.Env))
	if keys == nil {
		keys = []string{}
	}
	kj, err := json.Marshal(keys)
	if err != nil {
		return nil, err
	}
	a[AnnotationEnvKeys] = string(kj)
	return a, nil
}

// recordLabels are the labels of session r's Pod.
func recordLabels(id string, spec sandbox.SessionSpec) map[string]string {
	l := map[string]string{
		LabelManaged: ManagedBy,
		LabelSession: id,
		LabelNetwork: string(spec.Network),
	}
	if spec.Durability == sandbox.Persistent {
		l[LabelWorkspace] = workspaceHash(spec.WorkspaceKey)
	}
	return l
}

// recordFromPod reads the record a session Pod holds; env is the
// session's env (from its Secret), nil when it has none.
func recordFromPod(pod *corev1.Pod, env map[string]sandbox.Secret) (kit.Record, error) {
	id := pod.Labels[LabelSession]
	if id == "" || pod.Name != podName(id) {
		return kit.Record{}, fmt.Errorf("kubernetes: pod %s is not a session pod (label %s %q)", pod.Name, LabelSession, id)
	}
	a := pod.Annotations
	spec, err := decodeSpec(a[AnnotationSpec])
	if err != nil {
		return kit.Record{}, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	if len(env) > 0 {
		spec.Env = env
	}
	r := kit.Record{
		ID:            id,
		Provider:      Name,
		State:         kit.State(a[AnnotationState]),
		Spec:          spec,
		WorkspacePath: a[AnnotationWorkspacePath],
	}
	if h := a[AnnotationHandle]; h != "" {
		r.Handle = json.RawMessage(h)
	}
	for _, t := range []struct {
		key string
		dst *time.Time
	}{{AnnotationCreatedAt, &r.CreatedAt}, {AnnotationExpiresAt, &r.ExpiresAt}} {
		v, err := time.Parse(time.RFC3339Nano, a[t.key])
		if err != nil {
			return kit.Record{}, fmt.Errorf("kubernetes: pod %s: annotation %s: %w", pod.Name, t.key, err)
		}
		*t.dst = v
	}
	return r, nil
}
