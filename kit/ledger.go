package kit

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tai42/sandbox"
)

// State is where a session is in its life, as the ledger records it.
type State string

const (
	// StateCreating: the provider is making the session's resources; it
	// has not been reported created.
	StateCreating State = "creating"
	// StateLive: the session was reported created and is not being
	// destroyed.
	StateLive State = "live"
	// StateDestroying: its teardown has begun.
	StateDestroying State = "destroying"
)

// Record is one session as the ledger holds it: every field of
// [sandbox.SessionInfo] (through Spec, WorkspacePath and the times), the
// provider's handle on its resources, and its state.
type Record struct {
	ID       string
	Provider string
	State    State
	// Spec is the session's spec as the kit resolved it (isolation set),
	// env values included: a recovered session's execs get them as
	// before.
	Spec          sandbox.SessionSpec
	WorkspacePath string
	CreatedAt     time.Time
	ExpiresAt     time.Time
	// Handle is what the provider's [Recoverable] returned at create; nil
	// when it has none.
	Handle json.RawMessage
}

// Ledger is where the kit keeps its sessions. Each method returns once the
// change is as durable as the ledger makes it (a durable ledger: on disk,
// synced), so that a session is never reported created, or destroyed,
// before the ledger says so. Methods are safe for concurrent use.
type Ledger interface {
	// Load returns every record, in no particular order.
	Load(ctx context.Context) ([]Record, error)
	// Put inserts or replaces the record with r.ID.
	Put(ctx context.Context, r Record) error
	// Delete removes the record id; a missing one is not an error.
	Delete(ctx context.Context, id string) error
	// Close releases the ledger; the kit closes it at its own Close.
	Close() error
}

// Recoverable is an optional interface of [Resources]: Handle is the
// provider's reference to the session's resources, recorded in the ledger
// when the session is created and handed back to [Recoverer.Recover] after
// a restart. It is read once, after Create returned.
type Recoverable interface {
	Handle() json.RawMessage
}

// Recoverer is an optional interface of a [Provider] whose sessions can
// outlive the process that made them (a daemon killed with SIGKILL).
//
// The kit calls Recover once, from [New], before any create, with the
// sessions its ledger holds as live and unexpired (none when the ledger is
// in memory, or empty). The provider:
//   - finds everything of its own on the machine (containers, processes,
//     mounts, cgroups, network namespaces, veths, nftables rules, session
//     and ephemeral workspace directories) and removes what no kept session
//     owns: what a session being created, destroyed or expired left, and
//     what a crash left that no ledger entry names;
//   - ends every process that was running an exec of a kept session (the
//     daemon that streamed its output is gone), and says so in its log;
//   - brings each kept session back: the result's Resources serve it from
//     now on, with the same workspace. A session it cannot bring back is
//     reported with Err, and its resources are removed like an unowned
//     session's (a persistent workspace is kept).
//
// Recover returns one result per kept session, in any order. A non-nil
// error means the sweep itself failed; the kit then fails New.
type Recoverer interface {
	Recover(ctx context.Context, keep []Kept) ([]Recovered, error)
}

// Kept is one session the kit asks a [Recoverer] to bring back.
type Kept struct {
	ID     string
	Spec   sandbox.SessionSpec
	Handle json.RawMessage
}

// Recovered is the outcome for one [Kept] session: Res when it is back,
// else Err saying why not.
type Recovered struct {
	ID  string
	Res Resources
	Err error
}

// MemoryLedger is a [Ledger] in memory: nothing survives the process. It
// is what [New] uses when [Options.Ledger] is nil.
type MemoryLedger struct {
	mu      sync.Mutex
	records map[string]Record
}

var _ Ledger = (*MemoryLedger)(nil)

// NewMemoryLedger returns an empty in-memory ledger.
func NewMemoryLedger() *MemoryLedger { return &MemoryLedger{records: map[string]Record{}} }

func (m *MemoryLedger) Load(context.Context) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.records)), nil
}

func (m *MemoryLedger) Put(_ context.Context, r Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records[r.ID] = r
	return nil
}

func (m *MemoryLedger) Delete(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.records, id)
	return nil
}

func (m *MemoryLedger) Close() error { return nil }

// WorkspaceStore is an optional interface of a [Provider] that keeps
// persistent workspaces; the kit's [Sandbox.ListWorkspaces] and
// [Sandbox.RemoveWorkspace] go through it, refusing to remove a workspace
// a session holds.
type WorkspaceStore interface {
	// Workspaces lists the persistent workspaces (InUseBy left empty;
	// the kit fills it in).
	Workspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error)
	// RemoveWorkspace deletes the workspace key and everything in it; a
	// missing one is a *sandbox.WorkspaceNotFoundError. The kit calls it
	// only while no session holds key, and holds key against creates
	// until it returns.
	RemoveWorkspace(ctx context.Context, key string) error
}
