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
// in memory, or empty); never over a [SharedLedger], whose sessions are
// adopted one by one ([Adopter]). The provider:
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

// SharedLedger is a [Ledger] several sandboxes use at once: each one, in
// its own process and maybe on its own machine, serves every session the
// ledger holds, whichever of them created it (see the package doc). With a
// SharedLedger, [New] does not call [Recoverer.Recover]: a session is
// adopted ([Adopter]) by the first use of its id in a sandbox that does
// not hold it, and the provider sweeps what no record owns on its own,
// while it is the one [SharedLedger.Reaping].
//
// Besides the [Ledger] rules, a SharedLedger:
//   - answers Get and Load from a local view it keeps current (a watch),
//     not with a round trip: the kit calls Get on every use of a session.
//     A Get of an id the view does not hold may confirm the miss with one
//     round trip, so that a session another sandbox created a moment ago
//     is found here before the watch delivers it (a miss is rare: an
//     unknown id, or a session just created elsewhere);
//   - reads its own writes: once a Put or Delete of this process returned,
//     Get and Load answer with it (or with a later write of any sandbox),
//     so that a session this sandbox just created, touched or destroyed is
//     never seen in an older state here; another sandbox's write reaches
//     the view when the watch delivers it;
//   - keeps env values in what Get and Load return (an adopted session's
//     execs get them as before), as [Record.Spec] says.
//
// An error of Get or Load means the view cannot answer (not yet synced,
// the ledger gone); the kit passes it on as a *sandbox.SandboxError and
// takes it for neither a destroy nor an expiry. Methods are safe for
// concurrent use.
type SharedLedger interface {
	Ledger
	// Get returns the record id as the ledger holds it now; ok false
	// when it holds none.
	// Called on every use of a session: answer from a watched local view,
	// not a round trip.
	Get(ctx context.Context, id string) (r Record, ok bool, err error)
	// Reaping reports whether this sandbox is the one that reaps now (one
	// per ledger: a Lease). While it is, the kit's [Sandbox.Reap] destroys
	// every expired live session of the ledger; while it is not, Reap
	// destroys none. It must be cheap (a field read).
	Reaping() bool
}

// Adopter is an optional interface of a [Provider] whose sessions a
// [SharedLedger] shares: Adopt serves from this process a session another
// sandbox made (or an earlier process of this one), from its record, and
// touches nothing of the session itself (no restart, no sweep). The kit
// calls it at most once at a time per id, with a record it saw live and
// unexpired; the Resources it returns serve the session from then on,
// and their Destroy tears it down as if this sandbox had made it. A
// session that is no longer there is an error (a *sandbox.SessionNotFoundError
// reaches the caller as it is). A provider without Adopter serves only the
// sessions its own sandbox created: others are not found.
type Adopter interface {
	Adopt(ctx context.Context, k Kept) (Resources, error)
}

// Detacher is an optional interface of [Resources]: Detach lets go of what
// this process holds for the session (connections, goroutines) without
// touching the session itself, which another sandbox serves, or has
// destroyed. The kit calls it, once, instead of Destroy when it drops a
// session it holds but does not destroy: one destroyed elsewhere, one it
// adopted when it closes, an expired one while another sandbox reaps.
// An exec still running on the Resources may then fail. Resources without
// Detacher are dropped as they are.
type Detacher interface {
	Detach()
}
