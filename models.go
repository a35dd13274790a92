package sandbox

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ExecResult is the outcome of a completed non-interactive exec. A non-zero
// exit is a result, not an error. A command killed by a signal reports
// 128+signal (137 for SIGKILL), as a shell does; a command that cannot be
// found reports 127 and one that cannot be executed 126, with the reason on
// stderr, in every provider.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// StreamItem is one item of an interactive exec's output stream: a
// *[StreamChunk], or last a *[StreamExit].
type StreamItem interface{ isStreamItem() }

// StreamChunk is one interleaved output frame from an interactive exec.
type StreamChunk struct {
	Stream StreamName `json:"stream"`
	Data   []byte     `json:"data"`
}

// StreamExit is the stream's final item, carrying the exec's exit code.
type StreamExit struct {
	ExitCode int `json:"exit_code"`
}

func (*StreamChunk) isStreamItem() {}
func (*StreamExit) isStreamItem()  {}

// HostImage is the image that is the host's own system: the host runner's
// one image, and the container provider's built-in view of the host's
// system directories. No image store takes the name, with any tag, so an
// imported image can never shadow it.
const HostImage = "host"

// SessionSpec is the requested shape of one sandbox session. The consumer
// declares the session it needs; the provider maps each field onto its
// runtime or rejects with a [SpecRejectedError] what it cannot honour. It
// never silently downgrades a request.
type SessionSpec struct {
	// Image names the session's root filesystem; each provider documents the
	// names it honours (the host runner's one image is [HostImage]).
	Image string `json:"image"`
	// WorkspaceKey owns a persistent workspace. Required for persistent
	// sessions; optional for ephemeral ones. Letters, digits, '.', '_' and
	// '-', 1 to 128 bytes, not "." or "..".
	WorkspaceKey string     `json:"workspace_key"`
	Durability   Durability `json:"durability"`
	// Env is the session's base environment; an exec's env overlays it.
	Env     map[string]Secret `json:"env"`
	Network Network           `json:"network"`
	// Isolation "" (JSON null) means the provider's own level, which must
	// still meet the policy floor.
	Isolation Isolation `json:"isolation"`
	// CPU caps the session at this many CPUs; 0 (JSON null) means no cap.
	CPU float64 `json:"cpu"`
	// MemoryMB caps the session's memory in MiB; 0 (JSON null) means no cap.
	MemoryMB int `json:"memory_mb"`
	// TTLSeconds is the session's life and its keep-alive step; > 0.
	TTLSeconds int `json:"ttl_seconds"`
	// Labels are the consumer's own tags, returned by info and list.
	Labels map[string]string `json:"labels"`
}

// TTL returns TTLSeconds as a Duration.
func (s SessionSpec) TTL() time.Duration { return time.Duration(s.TTLSeconds) * time.Second }

// SessionInfo is the observable state of a live session. It never carries
// env values.
type SessionInfo struct {
	ID            string            `json:"id"`
	Image         string            `json:"image"`
	WorkspaceKey  string            `json:"workspace_key"`
	WorkspacePath string            `json:"workspace_path"`
	Durability    Durability        `json:"durability"`
	CreatedAt     time.Time         `json:"created_at"`
	ExpiresAt     time.Time         `json:"expires_at"`
	Labels        map[string]string `json:"labels"`
}

// Policy is the resolved security policy enforced at session create.
// Egress is the network ceiling (a session's network must be at or tighter);
// Isolation is the strength floor (a session runs at at least this level);
// Durable gates whether a persistent session is permitted at all;
// ScrubTranscript is carried for the consumer to read and applied
// consumer-side, never a create-time gate.
type Policy struct {
	Egress          Network   `json:"egress"`
	Isolation       Isolation `json:"isolation"`
	ScrubTranscript bool      `json:"scrub_transcript"`
	Durable         bool      `json:"durable"`
}

// Validate reports a policy whose tiers are not the contract's.
func (p Policy) Validate() error {
	if !p.Egress.Valid() {
		return fmt.Errorf("policy: egress %q is not one of none, internal, egress", p.Egress)
	}
	if !p.Isolation.Valid() {
		return fmt.Errorf("policy: isolation %q is not one of none, container, vm", p.Isolation)
	}
	return nil
}

// Limits on spec fields, checked by [SessionSpec.Validate].
const (
	MaxLabels        = 64
	MaxLabelKeyLen   = 128
	MaxLabelValueLen = 1024
	MaxWorkspaceKey  = 128
	MaxImageLen      = 512
	MaxEnvKeyLen     = 1024
	// MaxUserLen bounds an exec's user ([ValidUser]).
	MaxUserLen = 256
	// MaxID is the largest uid or gid an exec's user may name: (uid_t)-1
	// means "no change" to the kernel, never an id.
	MaxID = 1<<32 - 2
)

// Validate checks the spec's own shape (not the policy, not what a provider
// can enforce) and returns a *[SpecRejectedError] naming the first bad field.
func (s SessionSpec) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &SpecRejectedError{Field: field, Reason: ReasonInvalid, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case s.Image == "":
		return bad("image", "image is required")
	case len(s.Image) > MaxImageLen || !printable(s.Image):
		return bad("image", "image must be printable text of at most %d bytes", MaxImageLen)
	}
	if !s.Durability.Valid() {
		return bad("durability", "durability %q is not one of ephemeral, persistent", clip(string(s.Durability)))
	}
	if s.Durability == Persistent && s.WorkspaceKey == "" {
		return bad("workspace_key", "a persistent session needs a workspace_key")
	}
	if s.WorkspaceKey != "" {
		if err := ValidWorkspaceKey(s.WorkspaceKey); err != nil {
			return bad("workspace_key", "%v", err)
		}
	}
	for k := range s.Env {
		if err := ValidEnvKey(k); err != nil {
			return bad("env", "%v", err)
		}
		if strings.IndexByte(s.Env[k].Reveal(), 0) >= 0 {
			return bad("env", "env %q: value contains a NUL byte", k) // the value itself is never shown
		}
	}
	if !s.Network.Valid() {
		return bad("network", "network %q is not one of none, internal, egress", clip(string(s.Network)))
	}
	if s.Isolation != "" && !s.Isolation.Valid() {
		return bad("isolation", "isolation %q is not one of none, container, vm (or null for the provider's own)", clip(string(s.Isolation)))
	}
	if s.CPU < 0 || math.IsNaN(s.CPU) || math.IsInf(s.CPU, 0) {
		return bad("cpu", "cpu must be a positive number of CPUs, or 0/null for no cap")
	}
	if s.MemoryMB < 0 {
		return bad("memory_mb", "memory_mb must be a positive number of MiB, or 0/null for no cap")
	}
	if s.TTLSeconds <= 0 {
		return bad("ttl_seconds", "ttl_seconds must be > 0, got %d", s.TTLSeconds)
	}
	if s.TTLSeconds > int(math.MaxInt64/int64(time.Second)) {
		return bad("ttl_seconds", "ttl_seconds %d is too large", s.TTLSeconds)
	}
	if len(s.Labels) > MaxLabels {
		return bad("labels", "at most %d labels, got %d", MaxLabels, len(s.Labels))
	}
	for k, v := range s.Labels {
		if err := validLabel(k, v); err != nil {
			return bad("labels", "%v", err)
		}
	}
	return nil
}

// ValidWorkspaceKey reports whether key can name a workspace: letters,
// digits, '.', '_' and '-', 1 to [MaxWorkspaceKey] bytes, not "." or "..".
func ValidWorkspaceKey(key string) error {
	if key == "" || len(key) > MaxWorkspaceKey {
		return fmt.Errorf("workspace_key must be 1 to %d bytes", MaxWorkspaceKey)
	}
	if key == "." || key == ".." {
		return fmt.Errorf("workspace_key %q is reserved", key)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("workspace_key %q: only letters, digits, '.', '_' and '-' are allowed", clip(key))
		}
	}
	return nil
}

// ValidEnvKey reports whether k can be an environment variable name: not
// empty, no '=' and no NUL.
func ValidEnvKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("env: a variable name is empty")
	case len(k) > MaxEnvKeyLen:
		return fmt.Errorf("env: a variable name is longer than %d bytes", MaxEnvKeyLen)
	case strings.ContainsAny(k, "=\x00"):
		return fmt.Errorf("env: variable name %q contains '=' or NUL", clip(k))
	}
	return nil
}

// ValidUser reports whether u can name the user an exec runs as ("" is
// the session's default user, root). The forms, each resolved in the
// session's own /etc/passwd and /etc/group:
//
//   - a user name: its passwd entry's uid, gid and home directory, and as
//     supplementary groups every /etc/group entry that lists the name; a
//     name with no passwd entry is a *UserNotFoundError;
//   - a decimal uid: the passwd entry of that uid, as for a name, when
//     there is one; else gid 0, no supplementary groups and home "/", as
//     Docker does;
//   - uid:gid, both decimal: exactly those, no supplementary groups; the
//     home directory is the uid's passwd entry's, or "/".
//
// An exec with a user gets HOME set to that home directory unless the
// spec's or the exec's env sets HOME; nothing else in its environment
// changes. Its cwd is entered before it becomes the user, as Docker does,
// so an exec starts in a cwd the user itself cannot enter. Ids are at most
// [MaxID]; u is at most [MaxUserLen] bytes. A user name is printable text
// without spaces or ':', not starting with '-' or '+' (the marks of NIS
// entries in /etc/passwd); a name of digits alone is a uid.
func ValidUser(u string) error {
	switch {
	case u == "":
		return nil
	case len(u) > MaxUserLen:
		return fmt.Errorf("user: longer than %d bytes", MaxUserLen)
	}
	if uid, gid, ok := strings.Cut(u, ":"); ok {
		if !validID(uid) || !validID(gid) {
			return fmt.Errorf("user %q: a user with ':' is uid:gid, two decimal ids of at most %d", clip(u), uint32(MaxID))
		}
		return nil
	}
	if digits(u) {
		if !validID(u) {
			return fmt.Errorf("user %q: a uid is at most %d", clip(u), uint32(MaxID))
		}
		return nil
	}
	if !printable(u) || strings.ContainsAny(u, " :") || u[0] == '-' || u[0] == '+' {
		return fmt.Errorf("user %q: a user name is printable text without spaces or ':', not starting with '-' or '+' (a uid is decimal digits alone)", clip(u))
	}
	return nil
}

// digits reports whether s is one or more decimal digits.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// validID reports whether s is a decimal id of at most MaxID.
func validID(s string) bool {
	if !digits(s) {
		return false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return err == nil && n <= MaxID
}

func validLabel(k, v string) error {
	if k == "" || len(k) > MaxLabelKeyLen {
		return fmt.Errorf("label key %q must be 1 to %d bytes", clip(k), MaxLabelKeyLen)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-/:", c) >= 0) {
			return fmt.Errorf("label key %q: only letters, digits and . _ - / : are allowed", clip(k))
		}
	}
	if len(v) > MaxLabelValueLen {
		return fmt.Errorf("label %q: value longer than %d bytes", k, MaxLabelValueLen)
	}
	if !printable(v) {
		return fmt.Errorf("label %q: value must be printable UTF-8 text", k)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// clip shortens a user-supplied value for an error message.
func clip(s string) string {
	const n = 64
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
