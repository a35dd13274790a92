// Package kubernetes is the kubernetes provider: each session is one Pod
// whose PID 1 is the tai42 agent (the container provider's agent and
// protocol), reached through the apiserver over one long-lived SPDY
// port-forward connection per session and one stream pair on it, which
// the agent multiplexes (op "mux"): a yamux stream per agent operation.
//
// The agent binary comes from the operator's agent image: an init
// container copies its /tai42 into an emptyDir mounted read-only at
// /.tai42 in the session's container, whose command is
// /.tai42/tai42 agent --listen 127.0.0.1:7421 (the Pod's own loopback).
//
// Pods follow the restricted Pod Security standard: non-root (PodUser,
// 65532:65532 by default), no privilege escalation, every capability
// dropped, seccomp RuntimeDefault, no service-account token, no service
// links, no host namespaces, restartPolicy Never, grace 0. cpu and
// memory_mb are requests = limits; isolation vm is a RuntimeClass the
// operator names; env values are in a Secret owned by the Pod, never in
// the Pod or its annotations.
//
// The ledger is the apiserver: the Pod's labels and annotations hold the
// session's record (see names.go). A create watches its Pod until its
// agent answers (dialled from the moment the Pod's status says it is
// initialized, before it says Running) and fails at once, with the Pod's own events as the reason, when the Pod
// cannot be scheduled, its image cannot be pulled, its containers cannot
// be created or end; it deletes what it made.
package kubernetes
