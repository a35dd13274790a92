package kit

import (
	"context"
	"io"
	"time"

	"github.com/tai42/sandbox"
)

// Defaults for [ProviderOptions].
const (
	DefaultMaxOutputBytes = 64 << 20
	DefaultExitGrace      = 200 * time.Millisecond
	DefaultStreamBuffer   = 4 << 20
)

// ProviderOptions are what every provider built on the kit takes besides
// the kit's own [Options]: where it keeps its state and how it bounds an
// exec's output. A provider's Options embed both, so that each field is
// declared once and its New passes the [Options] on to [New] as they are.
type ProviderOptions struct {
	// StateDir holds the provider's state, in a directory of the
	// provider's name (<StateDir>/host, <StateDir>/container). Required.
	StateDir string
	// MaxOutputBytes bounds each of stdout and stderr held in memory by a
	// non-interactive exec; past it the exec is killed with
	// *sandbox.OutputLimitError. 0 means [DefaultMaxOutputBytes].
	MaxOutputBytes int64
	// StreamBuffer bounds the output an interactive exec queues before it
	// stops reading (back-pressure). 0 means [DefaultStreamBuffer].
	StreamBuffer int
	// ExitGrace is how long an exec's output may go on after its command
	// exited (or was killed by its timeout) while a process it left running
	// still holds the pipes. 0 means [DefaultExitGrace].
	ExitGrace time.Duration
}

// WithDefaults returns o with each bound that is 0 (or negative) at its
// default.
func (o ProviderOptions) WithDefaults() ProviderOptions {
	if o.MaxOutputBytes <= 0 {
		o.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if o.StreamBuffer <= 0 {
		o.StreamBuffer = DefaultStreamBuffer
	}
	if o.ExitGrace <= 0 {
		o.ExitGrace = DefaultExitGrace
	}
	return o
}

// Provider is the runtime I/O a provider implements. The kit calls it only
// with validated, policy-checked input: a provider never sees a request the
// kit has not seen first, so it cannot bypass the policy chokepoint, the
// ledger or the path rules. A provider that holds resources of its own
// implements io.Closer; the kit closes it last, after every session is
// destroyed.
type Provider interface {
	// Name is the provider's registered name ("host", "container", ...).
	Name() string
	// Isolation is the level the provider runs every session at; a spec
	// with isolation "" gets it, and a spec asking for more is rejected.
	Isolation() sandbox.Isolation
	// SharedFilesystem reports that a session sees the host's filesystem, so
	// an absolute path outside its workspace is refused rather than handed
	// to the provider as a path in the session's own filesystem.
	SharedFilesystem() bool
	// Check rejects a spec the provider cannot enforce (an image it does not
	// honour, a network tier, a cap, persistence) with a
	// *sandbox.SpecRejectedError of Reason ReasonUnenforceable that names
	// the field and says why. The spec has passed validation and policy.
	Check(spec sandbox.SessionSpec) error
	// Create makes one session's resources: its workspace and whatever the
	// runtime needs. On error it leaves nothing behind.
	Create(ctx context.Context, req CreateRequest) (Resources, error)
}

// CreateRequest is what a provider gets to create one session.
type CreateRequest struct {
	// ID is the kit-assigned session id.
	ID string
	// Spec is validated and policy-checked; Spec.Isolation is resolved
	// (never "").
	Spec sandbox.SessionSpec
	// Ahead says the session is made ahead for a pool ([Options.Pool]),
	// in the background: the provider may spend time now to make its
	// take and first exec faster (warm its agent), and must still leave
	// it as a cold create would.
	Ahead bool
}

// Resources is one live session's runtime side.
//
// Every method may be called concurrently with the others. Destroy ends
// every exec still running (a running Exec returns, a handle's stream ends)
// with a *sandbox.SessionNotFoundError, and any exec started after Destroy
// began fails the same way.
type Resources interface {
	// WorkspacePath is the absolute root of the session's workspace as the
	// session sees it.
	WorkspacePath() string
	Exec(ctx context.Context, req ExecRequest) (sandbox.ExecResult, error)
	ExecStart(ctx context.Context, req ExecRequest) (sandbox.ExecHandle, error)
	PutFile(ctx context.Context, p Path, data []byte) error
	GetFile(ctx context.Context, p Path) ([]byte, error)
	// Destroy ends every process of the session and removes its resources;
	// an ephemeral workspace is removed, a persistent one is kept. It runs
	// under a context without cancellation.
	Destroy(ctx context.Context) error
}

// FileStreamer is an optional interface of [Resources]: a provider that
// implements it moves files without holding them whole in memory, and the
// kit's sessions then implement [sandbox.FileStreamer] through it. Its rules
// and errors are PutFile's and GetFile's.
type FileStreamer interface {
	PutFileFrom(ctx context.Context, p Path, r io.Reader) error
	OpenFile(ctx context.Context, p Path) (io.ReadCloser, int64, error)
}

// Path is a caller's path resolved by the kit.
type Path struct {
	// Rel is the clean workspace-relative path ("." for the workspace
	// itself, never climbing out), or "" when the path is absolute outside
	// the workspace.
	Rel string
	// Abs is the absolute path in the session's filesystem.
	Abs string
	// Orig is the caller's path, for messages.
	Orig string
}

// InWorkspace reports whether the path is inside the workspace.
func (p Path) InWorkspace() bool { return p.Rel != "" }

// ExecRequest is one exec as the provider gets it.
type ExecRequest struct {
	// Argv is non-empty, argv[0] is not empty, and no element holds a NUL.
	Argv []string
	// Cwd is resolved; Cwd.Rel is "." when the caller gave none.
	Cwd Path
	// Env is the spec's env overlaid by the exec's (exec wins). Keys are
	// valid names; values hold no NUL.
	Env map[string]sandbox.Secret
	// Stdin is the whole input of a non-interactive exec; nil for
	// ExecStart.
	Stdin []byte
	// Timeout is > 0.
	Timeout time.Duration
	// User is the user the command runs as, valid by sandbox.ValidUser;
	// "" is the session's default user. Only a [UserRunner] gets one.
	User string
}

// UserRunner is an optional interface of a [Provider] that runs an exec as
// the user [ExecRequest.User] names, resolved in the session's own
// /etc/passwd and /etc/group (a name it does not find is a
// *sandbox.UserNotFoundError), and refuses with a *sandbox.SandboxError a
// user it cannot run as. The kit refuses an exec with a user on a provider
// that does not implement it, so no provider runs one as its default user
// for not knowing the field.
type UserRunner interface {
	// RunsExecsAsUsers marks the provider; the kit never calls it.
	RunsExecsAsUsers()
}
