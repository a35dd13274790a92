package api

import (
	"encoding/base64"
	"math"
	"time"
	"unicode/utf8"

	"github.com/tai42/sandbox"
)

// SessionSpec is the wire form of [sandbox.SessionSpec]: env values travel
// in clear (the connection is the consumer's; TLS is available), every other
// field as the contract names it. null cpu, memory_mb and isolation mean
// "none".
type SessionSpec struct {
	Image        string             `json:"image"`
	WorkspaceKey string             `json:"workspace_key,omitempty"`
	Durability   sandbox.Durability `json:"durability"`
	Env          map[string]string  `json:"env,omitempty"`
	Network      sandbox.Network    `json:"network"`
	Isolation    *sandbox.Isolation `json:"isolation"`
	CPU          *float64           `json:"cpu"`
	MemoryMB     *int               `json:"memory_mb"`
	TTLSeconds   int                `json:"ttl_seconds"`
	Labels       map[string]string  `json:"labels,omitempty"`
}

// SpecFrom converts a contract spec to its wire form.
func SpecFrom(s sandbox.SessionSpec) SessionSpec {
	w := SessionSpec{
		Image: s.Image, WorkspaceKey: s.WorkspaceKey, Durability: s.Durability,
		Network: s.Network, TTLSeconds: s.TTLSeconds, Labels: s.Labels,
	}
	if len(s.Env) > 0 {
		w.Env = make(map[string]string, len(s.Env))
		for k, v := range s.Env {
			w.Env[k] = v.Reveal()
		}
	}
	if s.Isolation != "" {
		iso := s.Isolation
		w.Isolation = &iso
	}
	if s.CPU != 0 {
		cpu := s.CPU
		w.CPU = &cpu
	}
	if s.MemoryMB != 0 {
		mem := s.MemoryMB
		w.MemoryMB = &mem
	}
	return w
}

// Spec converts the wire form to the contract's spec.
func (w SessionSpec) Spec() sandbox.SessionSpec {
	s := sandbox.SessionSpec{
		Image: w.Image, WorkspaceKey: w.WorkspaceKey, Durability: w.Durability,
		Network: w.Network, TTLSeconds: w.TTLSeconds, Labels: w.Labels,
	}
	if w.Env != nil {
		s.Env = sandbox.SecretEnv(w.Env)
	}
	if w.Isolation != nil {
		s.Isolation = *w.Isolation
	}
	if w.CPU != nil {
		s.CPU = *w.CPU
	}
	if w.MemoryMB != nil {
		s.MemoryMB = *w.MemoryMB
	}
	return s
}

// SessionList is the body of GET /v1/sessions.
type SessionList struct {
	Sessions []sandbox.SessionInfo `json:"sessions"`
}

// WorkspaceList is the body of GET /v1/workspaces: every persistent
// workspace, sorted by key.
type WorkspaceList struct {
	Workspaces []sandbox.WorkspaceInfo `json:"workspaces"`
}

// PullRequest is the body of POST /v1/images/pull: the reference to pull
// and, for a multi-platform image, the platform ("os/arch[/variant]"; ""
// is the daemon's own).
type PullRequest struct {
	Ref      string `json:"ref"`
	Platform string `json:"platform,omitempty"`
}

// PullEnd is the last line of the answer of POST /v1/images/pull, after
// one [sandbox.PullProgress] line per event: the image pulled, or the
// error the pull ended with. Exactly one of the two is set.
type PullEnd struct {
	Image *sandbox.ImageInfo `json:"image,omitempty"`
	Error *Error             `json:"error,omitempty"`
}

// ImageList is the body of GET /v1/images: every image the daemon holds,
// sorted by name.
type ImageList struct {
	Images []sandbox.ImageInfo `json:"images"`
}

// Reaped is the body of POST /v1/reap.
type Reaped struct {
	Reaped []string `json:"reaped"`
}

// SandboxInfo is the body of GET /v1/sandbox: what a client needs to act as
// the contract's Sandbox.
type SandboxInfo struct {
	Provider                  string         `json:"provider"`
	ExecDefaultTimeoutSeconds float64        `json:"exec_default_timeout_seconds"`
	ReapIntervalSeconds       float64        `json:"reap_interval_seconds"`
	Policy                    sandbox.Policy `json:"policy"`
	MaxBodyBytes              int64          `json:"max_body_bytes"`
	Version                   string         `json:"version"`
}

// PolicyInfo is the body of GET /v1/policy: the contract's policy, and
// what the provider enforces beyond it, where the daemon knows.
type PolicyInfo struct {
	sandbox.Policy
	// EgressFences are the fences on network "egress"; nil when the daemon
	// does not say.
	EgressFences *EgressFences `json:"egress_fences,omitempty"`
	// Disk is the disk cap per session; nil when the daemon does not say.
	Disk *DiskCap `json:"disk,omitempty"`
}

// EgressFences says where sessions with network "egress" may go.
type EgressFences struct {
	// Enforced is false where the provider cannot fence egress (the host
	// runner: isolation "none" shares the host's network); the rest then
	// lists nothing.
	Enforced bool `json:"enforced"`
	// Refused are the destinations always refused: CIDRs, and
	// "host-networks" for every address and subnet of the host's own
	// interfaces.
	Refused []string `json:"refused"`
	// Allow are the operator's exceptions (CIDRs), reachable although
	// Refused or the domain allowlist would refuse them.
	Allow []string `json:"allow"`
	// Deny are the operator's denials (CIDRs).
	Deny []string `json:"deny"`
	// AllowDomains is the domain allowlist: when not empty, sessions reach
	// only the addresses these names resolved to (and Allow).
	AllowDomains []string `json:"allow_domains"`
	// Resolver is the address sessions resolve names through (their
	// /etc/resolv.conf), and Upstreams where it forwards.
	Resolver  string   `json:"resolver"`
	Upstreams []string `json:"upstreams"`
}

// DiskCap is the disk cap per session.
type DiskCap struct {
	// Enforced is false where no cap applies (turned off, or a provider
	// without one); the figures are then zero.
	Enforced bool `json:"enforced"`
	// MB is each session's cap in MiB: its root's writes, /tmp and
	// ephemeral workspace together; a persistent workspace has a cap of
	// this size of its own.
	MB int `json:"mb"`
	// Inodes is the most files a session's disk holds.
	Inodes int64 `json:"inodes"`
	// ReserveMB: creates are refused while the state directory's
	// filesystem has less free.
	ReserveMB int `json:"reserve_mb"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status string `json:"status"`
}

// ExecRequest is the body of POST /v1/sessions/{id}/exec and, with Type
// "start", the first frame of the interactive exec. Stdin is base64 in
// stdin_base64 (the exec to completion only). User is the user the command
// runs as (sandbox.ValidUser's forms); absent is the session's default.
type ExecRequest struct {
	Type           string            `json:"type,omitempty"`
	Argv           []string          `json:"argv"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	StdinBase64    *string           `json:"stdin_base64,omitempty"`
	TimeoutSeconds float64           `json:"timeout_seconds"`
	User           string            `json:"user,omitempty"`
}

// ExecResult is the wire form of [sandbox.ExecResult]. Output that is valid
// UTF-8 travels as a JSON string in stdout/stderr; other output travels in
// stdout_base64/stderr_base64 instead, so no byte is ever replaced.
type ExecResult struct {
	ExitCode     int     `json:"exit_code"`
	Stdout       string  `json:"stdout"`
	Stderr       string  `json:"stderr"`
	StdoutBase64 *string `json:"stdout_base64,omitempty"`
	StderrBase64 *string `json:"stderr_base64,omitempty"`
}

// ResultFrom converts a result to its wire form.
func ResultFrom(r sandbox.ExecResult) ExecResult {
	w := ExecResult{ExitCode: r.ExitCode}
	w.Stdout, w.StdoutBase64 = encodeOutput(r.Stdout)
	w.Stderr, w.StderrBase64 = encodeOutput(r.Stderr)
	return w
}

func encodeOutput(s string) (string, *string) {
	if utf8.ValidString(s) {
		return s, nil
	}
	b := base64.StdEncoding.EncodeToString([]byte(s))
	return "", &b
}

// Result converts the wire form to the contract's result.
func (w ExecResult) Result() (sandbox.ExecResult, error) {
	r := sandbox.ExecResult{ExitCode: w.ExitCode, Stdout: w.Stdout, Stderr: w.Stderr}
	for _, f := range []struct {
		b64 *string
		dst *string
	}{{w.StdoutBase64, &r.Stdout}, {w.StderrBase64, &r.Stderr}} {
		if f.b64 == nil {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(*f.b64)
		if err != nil {
			return sandbox.ExecResult{}, err
		}
		*f.dst = string(b)
	}
	return r, nil
}

// Seconds converts a wire duration in seconds to a Duration, rounded to the
// nanosecond so that 0.3 stays 300ms. NaN, infinities and values beyond a
// Duration's range come back as -1 (invalid).
func Seconds(f float64) time.Duration {
	if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > math.MaxInt64/1e9 {
		return -1
	}
	return time.Duration(math.Round(f * 1e9))
}

// SecondsOf is the inverse of [Seconds].
func SecondsOf(d time.Duration) float64 { return d.Seconds() }
