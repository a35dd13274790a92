package sandbox

import (
	"context"
	"io"
	"time"
)

// Sandbox is a provider: it creates and destroys disposable sessions and
// reaps expired ones. The app core depends only on this interface.
//
// All methods are safe for concurrent use. ctx bounds each call, never a
// session's life. A call of this package's interfaces that gives up because
// its ctx ended (an exec is then killed) returns a *SandboxError that wraps
// ctx.Err(): errors.Is matches both ErrSandbox and context.Canceled or
// context.DeadlineExceeded, and never ErrExecTimeout, which is the exec's
// own timeout.
type Sandbox interface {
	// CreateSession creates a session from spec, or rejects it with a
	// *SpecRejectedError that names the field and the rule.
	CreateSession(ctx context.Context, spec SessionSpec) (Session, error)
	// GetSession fetches a live session; *SessionNotFoundError if there is
	// none with that id (never created, destroyed, or expired).
	GetSession(ctx context.Context, id string) (Session, error)
	// ListSessions returns the observable state of every live session.
	ListSessions(ctx context.Context) ([]SessionInfo, error)
	// DestroySession tears a session down. It is idempotent: an unknown or
	// already-gone id returns nil.
	DestroySession(ctx context.Context, id string) error
	// Reap destroys every session past its expires_at and returns exactly
	// the destroyed ids.
	Reap(ctx context.Context) ([]string, error)
	// ExecDefaultTimeout is the configured default for one short exec; exec
	// itself still requires an explicit timeout.
	ExecDefaultTimeout() time.Duration
	// ReapInterval is the configured reap sweep cadence.
	ReapInterval() time.Duration
}

// ExecOptions are the options of [Session.Exec].
type ExecOptions struct {
	// Cwd is workspace-relative by default; "" is the workspace itself.
	Cwd string
	// Env overlays the session's spec.Env; per-exec keys win on collision.
	Env map[string]Secret
	// Stdin is the exec's whole standard input; nil gives it an empty one.
	Stdin []byte
	// Timeout is required and must be > 0; on expiry the exec is killed and
	// Exec returns an *ExecTimeoutError.
	Timeout time.Duration
	// User is the user the command runs as; "" is the session's default
	// user (root). See [ValidUser] for its forms and how each resolves.
	User string
}

// StartOptions are the options of [Session.ExecStart]: those of
// [ExecOptions] but Stdin, which the handle's WriteStdin delivers.
type StartOptions struct {
	Cwd     string
	Env     map[string]Secret
	Timeout time.Duration
	User    string
}

// Session is one live sandbox session, the unit a consumer runs code in.
//
// Every method but ID, WorkspacePath and Destroy returns
// *SessionNotFoundError once the session is destroyed or expired. All
// methods are safe for concurrent use.
type Session interface {
	// ID is the provider-assigned id.
	ID() string
	// WorkspacePath is the provider's absolute root path of this session's
	// workspace, the anchor of workspace-relative cwd and paths.
	WorkspacePath() string
	// Info returns this session's observable state.
	Info(ctx context.Context) (SessionInfo, error)
	// Exec runs argv to completion. A non-zero exit is a result. On timeout
	// the exec is killed and *ExecTimeoutError returned; output larger than
	// the provider holds in memory kills the exec with *OutputLimitError.
	Exec(ctx context.Context, argv []string, opts ExecOptions) (ExecResult, error)
	// ExecStart starts argv as an interactive exec. On timeout the exec is
	// killed and the handle's Next returns *ExecTimeoutError.
	ExecStart(ctx context.Context, argv []string, opts StartOptions) (ExecHandle, error)
	// PutFile writes data to path (workspace-relative by default), creating
	// missing parents and replacing an existing file atomically.
	PutFile(ctx context.Context, path string, data []byte) error
	// GetFile reads path. *FileNotFoundError only when nothing exists there;
	// every other failure (a directory, an unreadable or non-regular file, a
	// path that escapes the workspace) is a plain *SandboxError.
	GetFile(ctx context.Context, path string) ([]byte, error)
	// Touch extends expires_at to at least now + ttl; it never shortens it.
	Touch(ctx context.Context) error
	// Destroy tears this session down; it ends every exec still running.
	// Like Sandbox.DestroySession it is idempotent: nil on a session that is
	// already gone (an expired one is torn down now).
	Destroy(ctx context.Context) error
}

// FileStreamer is an optional interface of a [Session] that moves a file
// without holding it whole in memory, as the HTTP server and client do for
// large files. Its rules and errors are PutFile's and GetFile's.
type FileStreamer interface {
	// PutFileFrom writes everything r yields to path, atomically like
	// PutFile: when r or the write fails, the old content (or nothing)
	// stays at path and the error is returned.
	PutFileFrom(ctx context.Context, path string, r io.Reader) error
	// OpenFile opens path for reading under GetFile's rules and errors
	// (*FileNotFoundError only for a path where nothing exists). size is
	// the file's length when opened. The caller closes the reader; reads
	// after the session is destroyed may fail.
	OpenFile(ctx context.Context, path string) (rc io.ReadCloser, size int64, err error)
}

// ExitWatcher is an optional interface of an [ExecHandle]. Exited is
// closed once the exec's own command has exited, whether or not its output
// has been read (its output may still be on its way). A relay that enforces
// an exec's deadline itself, as the HTTP server does, uses it to tell at the
// deadline a timeout from an exec that exited in time, as the provider's
// own timer would.
type ExitWatcher interface {
	Exited() <-chan struct{}
}

// ExecHandle is a live interactive exec started by [Session.ExecStart].
//
// Concurrency: WriteStdin and CloseStdin are safe to call concurrently with
// Next. One WriteStdin call delivers its bytes intact and in order; the
// provider does no framing. Next is for one reader at a time.
//
// Lifetime: Kill may be called at any time, more than once, from any
// goroutine. Once the exec has exited it is idempotent and never fails, and
// the exit status Next reports stays the exec's own; WriteStdin then fails
// with a *SandboxError. A handle may keep provider resources until Kill has
// returned or its session is destroyed: a consumer done with a handle calls
// Kill.
type ExecHandle interface {
	// WriteStdin delivers data to the exec's stdin, intact and in order.
	WriteStdin(ctx context.Context, data []byte) error
	// CloseStdin signals end-of-input.
	CloseStdin(ctx context.Context) error
	// Next returns the next item of the interleaved stdout/stderr stream: a
	// *StreamChunk, or last exactly one *StreamExit, after which it returns
	// io.EOF. On timeout it returns *ExecTimeoutError instead of the exit
	// item; a failure of the exec itself (such as stdin input accepted that
	// the exec never got) ends it with a *SandboxError. Once the stream has
	// ended with an error, Next returns that error again. A done ctx returns
	// a *SandboxError that wraps ctx.Err() (errors.Is matches both
	// ErrSandbox and the context's error) and leaves the stream where it
	// was.
	Next(ctx context.Context) (StreamItem, error)
	// Kill terminates the exec. Once it returns, Next ends promptly and
	// reports no timeout, even past the deadline: the output the provider
	// received before the kill, read or not, is still yielded in order, then
	// exactly one *StreamExit with the exec's exit status (or a
	// *SandboxError when the status cannot be read; it is never invented).
	Kill(ctx context.Context) error
}

// WorkspaceManager is an optional interface of a [Sandbox] that keeps
// persistent workspaces: it lists them and removes one by its key. The kit's
// sandboxes implement it, and the daemon's client.
type WorkspaceManager interface {
	// ListWorkspaces returns every persistent workspace, sorted by key.
	ListWorkspaces(ctx context.Context) ([]WorkspaceInfo, error)
	// RemoveWorkspace deletes the persistent workspace key and its files.
	// A key a live session holds is refused with a *SpecRejectedError of
	// Reason ReasonConflict naming the session; a key with no workspace is
	// a *WorkspaceNotFoundError.
	RemoveWorkspace(ctx context.Context, key string) error
}

// WorkspaceInfo describes one persistent workspace.
type WorkspaceInfo struct {
	// Key is the workspace_key sessions name it by.
	Key string `json:"key"`
	// SizeBytes is the total size of its regular files.
	SizeBytes int64 `json:"size_bytes"`
	// ModifiedAt is the last change to its top directory.
	ModifiedAt time.Time `json:"modified_at"`
	// InUseBy is the id of the live session holding it, or "".
	InUseBy string `json:"in_use_by,omitempty"`
}
