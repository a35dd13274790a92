package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinels: errors.Is(err, ErrX) matches every error of that kind, and
// errors.Is(err, ErrSandbox) matches every error of the family.
var (
	ErrSandbox         = errors.New("sandbox error")
	ErrExecTimeout     = errors.New("sandbox: exec timed out")
	ErrFileNotFound    = errors.New("sandbox: file not found")
	ErrSessionNotFound = errors.New("sandbox: session not found")
	ErrSpecRejected    = errors.New("sandbox: spec rejected")
	ErrUnavailable     = errors.New("sandbox: no provider")
	ErrOutputLimit     = errors.New("sandbox: output limit exceeded")
	// ErrWorkspaceNotFound matches *WorkspaceNotFoundError.
	ErrWorkspaceNotFound = errors.New("sandbox: workspace not found")
	// ErrUserNotFound matches *UserNotFoundError.
	ErrUserNotFound = errors.New("sandbox: user not found")
)

// SandboxError is the base of every sandbox failure, and the error itself for
// failures that have no kind of their own (an I/O or permission error, an
// unreadable non-file, a refused path, a call on a finished exec). Every
// other error of the family converts to it with errors.As.
type SandboxError struct {
	// Op is the operation that failed ("exec", "get_file", ...); may be empty.
	Op string
	// Message says what went wrong, for a person.
	Message string
	// Err is the underlying cause, if any.
	Err error
}

// Errorf returns a *SandboxError for op with a formatted message.
func Errorf(op, format string, args ...any) *SandboxError {
	return &SandboxError{Op: op, Message: fmt.Sprintf(format, args...)}
}

// WrapError returns a *SandboxError for op whose cause is err.
func WrapError(op, message string, err error) *SandboxError {
	return &SandboxError{Op: op, Message: message, Err: err}
}

// WrapForeign returns err as it is when it is of the family already (it
// converts to *SandboxError with errors.As: any kind, wrapped or not), so
// that its kind and message reach the caller; any other err is wrapped as
// WrapError(op, message, err). A nil err stays nil. It is for a layer
// passing on what the one below returned, which may be either.
func WrapForeign(op, message string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*SandboxError](err); ok {
		return err
	}
	return WrapError(op, message, err)
}

func (e *SandboxError) Error() string {
	var b strings.Builder
	b.WriteString("sandbox: ")
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	if e.Err != nil && (e.Message == "" || !strings.Contains(e.Message, e.Err.Error())) {
		if e.Message != "" {
			b.WriteString(": ")
		}
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *SandboxError) Unwrap() error        { return e.Err }
func (e *SandboxError) Is(target error) bool { return target == ErrSandbox }

// asBase fills target when it is a **SandboxError; the shared half of every
// kind's As method.
func asBase(target any, op string, err error) bool {
	p, ok := target.(**SandboxError)
	if ok {
		*p = &SandboxError{Op: op, Message: err.Error(), Err: err}
	}
	return ok
}

// ExecTimeoutError reports that an exec or exec_start exceeded its timeout
// and was killed. It carries the partial output's lengths, never its content.
// When the exec's output ended with the kill the lengths count every byte the
// exec produced; when a process the command started still held the output
// after the kill they count the output received up to the stop, and Note says
// so.
type ExecTimeoutError struct {
	Timeout   time.Duration
	StdoutLen int64
	StderrLen int64
	Note      string
}

func (e *ExecTimeoutError) Error() string {
	s := fmt.Sprintf("sandbox: exec timed out after %v and was killed (partial output: stdout %d bytes, stderr %d bytes)",
		e.Timeout, e.StdoutLen, e.StderrLen)
	if e.Note != "" {
		s += "; " + e.Note
	}
	return s
}
func (e *ExecTimeoutError) Is(t error) bool { return t == ErrSandbox || t == ErrExecTimeout }
func (e *ExecTimeoutError) As(t any) bool   { return asBase(t, "exec", e) }

// FileNotFoundError reports that no file exists at Path in the session's
// workspace. get_file returns it only for a path that does not exist; every
// other read failure is a plain *SandboxError.
type FileNotFoundError struct {
	Path string
}

func (e *FileNotFoundError) Error() string {
	return fmt.Sprintf("sandbox: get_file %q: no such file in the workspace", e.Path)
}
func (e *FileNotFoundError) Is(t error) bool { return t == ErrSandbox || t == ErrFileNotFound }
func (e *FileNotFoundError) As(t any) bool   { return asBase(t, "get_file", e) }

// SessionNotFoundError reports that no live session has SessionID: it never
// existed, was destroyed, or has expired.
type SessionNotFoundError struct {
	SessionID string
	// Detail says more when there is more to say (e.g. destroyed while an
	// exec ran); may be empty.
	Detail string
}

func (e *SessionNotFoundError) Error() string {
	s := fmt.Sprintf("sandbox: no live session %q", e.SessionID)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}
func (e *SessionNotFoundError) Is(t error) bool { return t == ErrSandbox || t == ErrSessionNotFound }
func (e *SessionNotFoundError) As(t any) bool   { return asBase(t, "", e) }

// WorkspaceNotFoundError reports that no persistent workspace has Key
// (see [WorkspaceManager]).
type WorkspaceNotFoundError struct {
	Key string
}

func (e *WorkspaceNotFoundError) Error() string {
	return fmt.Sprintf("sandbox: no persistent workspace %q", e.Key)
}
func (e *WorkspaceNotFoundError) Is(t error) bool {
	return t == ErrSandbox || t == ErrWorkspaceNotFound
}
func (e *WorkspaceNotFoundError) As(t any) bool { return asBase(t, "remove_workspace", e) }

// UserNotFoundError reports that an exec's user (a user name: see
// [ValidUser]) has no entry in the session's /etc/passwd. Nothing ran.
type UserNotFoundError struct {
	User string
}

func (e *UserNotFoundError) Error() string {
	return fmt.Sprintf("sandbox: exec: user %q is not known in the session: its /etc/passwd has no entry of that name", e.User)
}
func (e *UserNotFoundError) Is(t error) bool { return t == ErrSandbox || t == ErrUserNotFound }
func (e *UserNotFoundError) As(t any) bool   { return asBase(t, "exec", e) }

// RejectReason says why a spec was rejected.
type RejectReason string

const (
	// ReasonInvalid: the spec is malformed (a bad field value).
	ReasonInvalid RejectReason = "invalid"
	// ReasonPolicy: the spec breaks the operator's policy.
	ReasonPolicy RejectReason = "policy"
	// ReasonUnenforceable: the provider cannot enforce the spec.
	ReasonUnenforceable RejectReason = "unenforceable"
	// ReasonConflict: the spec conflicts with a live session (a persistent
	// workspace_key already in use).
	ReasonConflict RejectReason = "conflict"
)

// SpecRejectedError reports a [SessionSpec] that cannot be honoured. Reason
// says whether the provider cannot enforce it or it breaks the policy (or is
// malformed, or conflicts with a live session); Field names the field and
// Message says which rule. A rejected spec is never silently downgraded.
type SpecRejectedError struct {
	Field   string
	Reason  RejectReason
	Message string
}

func (e *SpecRejectedError) Error() string {
	var why string
	switch e.Reason {
	case ReasonPolicy:
		why = "violates the operator policy"
	case ReasonUnenforceable:
		why = "the provider cannot enforce it"
	case ReasonConflict:
		why = "conflicts with a live session"
	default:
		why = "invalid"
	}
	return fmt.Sprintf("sandbox: spec rejected (%s: %s): %s", e.Field, why, e.Message)
}
func (e *SpecRejectedError) Is(t error) bool { return t == ErrSandbox || t == ErrSpecRejected }
func (e *SpecRejectedError) As(t any) bool   { return asBase(t, "create_session", e) }

// UnavailableError reports that no sandbox provider is registered (or not the
// one asked for).
type UnavailableError struct {
	// Name is the provider asked for; empty for "any".
	Name string
	// Registered lists the names that are registered.
	Registered []string
}

func (e *UnavailableError) Error() string {
	if e.Name == "" {
		return "sandbox: no sandbox provider is registered"
	}
	if len(e.Registered) == 0 {
		return fmt.Sprintf("sandbox: no sandbox provider %q is registered (none is)", e.Name)
	}
	return fmt.Sprintf("sandbox: no sandbox provider %q is registered (registered: %s)", e.Name, strings.Join(e.Registered, ", "))
}
func (e *UnavailableError) Is(t error) bool { return t == ErrSandbox || t == ErrUnavailable }
func (e *UnavailableError) As(t any) bool   { return asBase(t, "require", e) }

// OutputLimitError reports that an exec's output exceeded the limit a
// provider holds in memory. The exec was killed; output is never silently
// truncated. It carries the lengths received, never the content.
type OutputLimitError struct {
	Limit     int64
	StdoutLen int64
	StderrLen int64
}

func (e *OutputLimitError) Error() string {
	return fmt.Sprintf("sandbox: exec output exceeded the limit of %d bytes per stream and the exec was killed (stdout %d bytes, stderr %d bytes); use exec_start to stream large output",
		e.Limit, e.StdoutLen, e.StderrLen)
}
func (e *OutputLimitError) Is(t error) bool { return t == ErrSandbox || t == ErrOutputLimit }
func (e *OutputLimitError) As(t any) bool   { return asBase(t, "exec", e) }
