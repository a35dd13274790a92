package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tai42/sandbox"
)

// Kind names an error on the wire. The contract's kinds come first; the rest
// are the transport's own.
type Kind string

const (
	KindSandbox         Kind = "sandbox_error"
	KindExecTimeout     Kind = "exec_timeout"
	KindFileNotFound    Kind = "file_not_found"
	KindSessionNotFound Kind = "session_not_found"
	KindSpecRejected    Kind = "spec_rejected"
	KindUnavailable     Kind = "unavailable"
	KindOutputLimit     Kind = "output_limit"
	// KindWorkspaceNotFound: no persistent workspace has the key
	// (*sandbox.WorkspaceNotFoundError).
	KindWorkspaceNotFound Kind = "workspace_not_found"
	// KindUserNotFound: an exec's user name has no entry in the session's
	// /etc/passwd (*sandbox.UserNotFoundError).
	KindUserNotFound Kind = "user_not_found"
	// KindImageNotFound: the daemon holds no image of the name
	// (*sandbox.ImageNotFoundError).
	KindImageNotFound Kind = "image_not_found"
	// KindImagePull: an image could not be pulled (*sandbox.ImagePullError),
	// reason saying why (sandbox.PullReason).
	KindImagePull Kind = "image_pull"

	// KindBadRequest: the request itself is malformed (bad JSON, an
	// unknown field, a wrong type, a bad frame).
	KindBadRequest Kind = "bad_request"
	// KindUnauthorized: no bearer token, or a wrong one.
	KindUnauthorized Kind = "unauthorized"
	// KindNotFound: no such route.
	KindNotFound Kind = "not_found"
	// KindMethodNotAllowed: the route exists, the method does not.
	KindMethodNotAllowed Kind = "method_not_allowed"
	// KindTooLarge: the request body is over the server's limit.
	KindTooLarge Kind = "too_large"
	// KindInternal: a failure outside the contract's family (a bug).
	KindInternal Kind = "internal"
	// KindShuttingDown: the daemon is stopping.
	KindShuttingDown Kind = "shutting_down"
)

// KindStatus is the HTTP status of each kind: the one table both directions
// use.
var KindStatus = map[Kind]int{
	KindSandbox:           http.StatusBadRequest,
	KindExecTimeout:       http.StatusGatewayTimeout,
	KindFileNotFound:      http.StatusNotFound,
	KindSessionNotFound:   http.StatusNotFound,
	KindSpecRejected:      http.StatusUnprocessableEntity,
	KindUnavailable:       http.StatusServiceUnavailable,
	KindOutputLimit:       http.StatusInsufficientStorage,
	KindWorkspaceNotFound: http.StatusNotFound,
	KindUserNotFound:      http.StatusBadRequest,
	KindImageNotFound:     http.StatusNotFound,
	KindImagePull:         http.StatusBadRequest,
	KindBadRequest:        http.StatusBadRequest,
	KindUnauthorized:      http.StatusUnauthorized,
	KindNotFound:          http.StatusNotFound,
	KindMethodNotAllowed:  http.StatusMethodNotAllowed,
	KindTooLarge:          http.StatusRequestEntityTooLarge,
	KindInternal:          http.StatusInternalServerError,
	KindShuttingDown:      http.StatusServiceUnavailable,
}

// Error is the "error" object of an error body. Only the fields of its kind
// are set. An exec_timeout carries lengths, never output.
type Error struct {
	Kind    Kind   `json:"kind"`
	Message string `json:"message"`
	Op      string `json:"op,omitempty"`

	SessionID    string   `json:"session_id,omitempty"`    // session_not_found
	Detail       string   `json:"detail,omitempty"`        // session_not_found
	Path         string   `json:"path,omitempty"`          // file_not_found
	Field        string   `json:"field,omitempty"`         // spec_rejected
	Reason       string   `json:"reason,omitempty"`        // spec_rejected, image_pull
	Name         string   `json:"name,omitempty"`          // unavailable
	Registered   []string `json:"registered,omitempty"`    // unavailable
	Limit        int64    `json:"limit,omitempty"`         // output_limit
	WorkspaceKey string   `json:"workspace_key,omitempty"` // workspace_not_found
	User         string   `json:"user,omitempty"`          // user_not_found
	Image        string   `json:"image,omitempty"`         // image_not_found
	Ref          string   `json:"ref,omitempty"`           // image_pull
	// exec_timeout and output_limit
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
	StdoutLen      *int64  `json:"stdout_len,omitempty"`
	StderrLen      *int64  `json:"stderr_len,omitempty"`
	Note           string  `json:"note,omitempty"`
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Status returns the HTTP status of the error's kind (500 for a kind this
// table does not know).
func (e Error) Status() int {
	if s, ok := KindStatus[e.Kind]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// ErrorFrom maps an error to its wire form: a kind of the contract's family
// keeps every field of its kind; anything else is KindInternal with its text.
// It is the one server-side direction of the mapping.
func ErrorFrom(err error) Error {
	var (
		to  *sandbox.ExecTimeoutError
		fnf *sandbox.FileNotFoundError
		snf *sandbox.SessionNotFoundError
		rej *sandbox.SpecRejectedError
		una *sandbox.UnavailableError
		lim *sandbox.OutputLimitError
		wnf *sandbox.WorkspaceNotFoundError
		unf *sandbox.UserNotFoundError
		inf *sandbox.ImageNotFoundError
		ipe *sandbox.ImagePullError
		te  *TransportError
		se  *sandbox.SandboxError
	)
	switch {
	case errors.As(err, &te):
		return Error{Kind: te.Kind, Message: te.Message}
	case errors.As(err, &to):
		return Error{Kind: KindExecTimeout, Message: to.Error(), Op: "exec",
			TimeoutSeconds: to.Timeout.Seconds(), StdoutLen: ptr(to.StdoutLen), StderrLen: ptr(to.StderrLen), Note: to.Note}
	case errors.As(err, &lim):
		return Error{Kind: KindOutputLimit, Message: lim.Error(), Op: "exec",
			Limit: lim.Limit, StdoutLen: ptr(lim.StdoutLen), StderrLen: ptr(lim.StderrLen)}
	case errors.As(err, &fnf):
		return Error{Kind: KindFileNotFound, Message: fnf.Error(), Op: "get_file", Path: fnf.Path}
	case errors.As(err, &snf):
		return Error{Kind: KindSessionNotFound, Message: snf.Error(), SessionID: snf.SessionID, Detail: snf.Detail}
	case errors.As(err, &rej):
		return Error{Kind: KindSpecRejected, Message: rej.Error(), Op: "create_session", Field: rej.Field, Reason: string(rej.Reason)}
	case errors.As(err, &una):
		return Error{Kind: KindUnavailable, Message: una.Error(), Name: una.Name, Registered: una.Registered}
	case errors.As(err, &wnf):
		return Error{Kind: KindWorkspaceNotFound, Message: wnf.Error(), Op: "remove_workspace", WorkspaceKey: wnf.Key}
	case errors.As(err, &unf):
		return Error{Kind: KindUserNotFound, Message: unf.Error(), Op: "exec", User: unf.User}
	case errors.As(err, &inf):
		return Error{Kind: KindImageNotFound, Message: inf.Error(), Op: "remove_image", Image: inf.Name}
	case errors.As(err, &ipe):
		return Error{Kind: KindImagePull, Message: ipe.Error(), Op: "pull_image", Ref: ipe.Ref, Reason: string(ipe.Reason)}
	case errors.As(err, &se):
		return Error{Kind: KindSandbox, Message: se.Error(), Op: se.Op}
	}
	return Error{Kind: KindInternal, Message: err.Error()}
}

func ptr(n int64) *int64 { return &n }

// Err maps the wire form back to the contract's error: the other direction.
// A contract kind becomes its own type with every field; a transport kind
// becomes a *sandbox.SandboxError whose cause is a *TransportError, so
// errors.Is(err, sandbox.ErrSandbox) holds for every error a client returns.
func (e Error) Err() error {
	n := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	switch e.Kind {
	case KindExecTimeout:
		return &sandbox.ExecTimeoutError{Timeout: Seconds(e.TimeoutSeconds), StdoutLen: n(e.StdoutLen), StderrLen: n(e.StderrLen), Note: e.Note}
	case KindOutputLimit:
		return &sandbox.OutputLimitError{Limit: e.Limit, StdoutLen: n(e.StdoutLen), StderrLen: n(e.StderrLen)}
	case KindFileNotFound:
		return &sandbox.FileNotFoundError{Path: e.Path}
	case KindSessionNotFound:
		return &sandbox.SessionNotFoundError{SessionID: e.SessionID, Detail: e.Detail}
	case KindSpecRejected:
		return &sandbox.SpecRejectedError{Field: e.Field, Reason: sandbox.RejectReason(e.Reason), Message: rejectMessage(e)}
	case KindUnavailable:
		return &sandbox.UnavailableError{Name: e.Name, Registered: e.Registered}
	case KindWorkspaceNotFound:
		return &sandbox.WorkspaceNotFoundError{Key: e.WorkspaceKey}
	case KindUserNotFound:
		return &sandbox.UserNotFoundError{User: e.User}
	case KindImageNotFound:
		return &sandbox.ImageNotFoundError{Name: e.Image}
	case KindImagePull:
		return &sandbox.ImagePullError{Ref: e.Ref, Reason: sandbox.PullReason(e.Reason), Message: pullMessage(e)}
	case KindSandbox:
		return &sandbox.SandboxError{Op: e.Op, Message: trimPrefix(e.Message, e.Op)}
	}
	kind := e.Kind
	if kind == "" {
		kind = KindInternal
	}
	return &sandbox.SandboxError{Op: "api", Message: e.Message, Err: &TransportError{Kind: kind, Message: e.Message}}
}

// rejectMessage recovers the rule text of a spec rejection from its full
// message, so that the rebuilt error prints as the original did.
func rejectMessage(e Error) string {
	orig := &sandbox.SpecRejectedError{Field: e.Field, Reason: sandbox.RejectReason(e.Reason)}
	return strings.TrimPrefix(e.Message, orig.Error()) // orig ends with ": " and the empty message
}

// pullMessage recovers what the registry (or the store) answered from a
// pull error's full message, as rejectMessage does for a rejection.
func pullMessage(e Error) string {
	orig := &sandbox.ImagePullError{Ref: e.Ref, Reason: sandbox.PullReason(e.Reason)}
	return strings.TrimPrefix(e.Message, orig.Error())
}

// trimPrefix removes the "sandbox: op: " a SandboxError's text starts with,
// so that the rebuilt error prints as the original did.
func trimPrefix(msg, op string) string {
	p := "sandbox: "
	if op != "" {
		p += op + ": "
	}
	return strings.TrimPrefix(msg, p)
}

// TransportError is a failure of the API itself rather than of the sandbox:
// a refused token, a malformed request, a body over the limit. The server
// returns it with its kind; a client returns it as the cause of a
// *sandbox.SandboxError.
type TransportError struct {
	Kind    Kind
	Message string
}

// Error is the message alone: the kind is for programs (errors.As), and a
// *sandbox.SandboxError wrapping it prints the message once.
func (e *TransportError) Error() string { return e.Message }

// Transportf returns a *TransportError of kind with a formatted message.
func Transportf(kind Kind, format string, args ...any) *TransportError {
	return &TransportError{Kind: kind, Message: fmt.Sprintf(format, args...)}
}
