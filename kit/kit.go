// Package kit is what every provider shares, and the one way to build one: a
// provider implements the narrow runtime I/O of [Provider] and [Resources],
// and [New] wraps it into a [sandbox.Sandbox] that owns the session ledger,
// info/list/get, touch and TTL bookkeeping, reap and the background reaper,
// the default exec timeout, workspace-relative path resolution, the form
// of an exec's user (run only by a [UserRunner]) and the create-time
// policy chokepoint.
//
// # Shared ledgers
//
// A ledger is usually the sandbox's own (in memory, or a file only its
// process opens). A [SharedLedger] is one several sandboxes use at once,
// each a daemon in its own process, maybe on its own machine, and each
// serving every session the ledger holds: the kubernetes provider's
// ledger is the apiserver (the session Pods' annotations), and several
// daemons serve one cluster, so that a session outlives the daemon that
// created it and any of them can serve a client. Over a SharedLedger the
// ledger, not this process, says which sessions exist and until when:
// New recovers nothing (the provider sweeps on its own); every use of a
// session asks the ledger's watched view first, so that one destroyed or
// touched by another sandbox is seen so here at once (a held copy of a
// session destroyed elsewhere is let go, [Detacher]); a session another
// sandbox made is adopted at its first use ([Adopter]); list shows every
// sandbox's sessions; only the sandbox that [SharedLedger.Reaping] reaps,
// and then every sandbox's expired sessions; Close destroys the sessions
// its sandbox created and lets go of the adopted ones. With any other
// ledger none of this applies.
package kit

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/tai42/sandbox"
)

// Defaults for [Options].
const (
	DefaultExecTimeout  = 60 * time.Second
	DefaultReapInterval = 30 * time.Second
)

// Options configure a kit-built sandbox.
type Options struct {
	// Policy is enforced at every create. It must be valid.
	Policy sandbox.Policy
	// ExecDefaultTimeout is reported by ExecDefaultTimeout; exec still
	// requires an explicit timeout. 0 means [DefaultExecTimeout].
	ExecDefaultTimeout time.Duration
	// ReapInterval is the background reaper's cadence. 0 means
	// [DefaultReapInterval]; negative turns the background reaper off.
	ReapInterval time.Duration
	// Logger receives lifecycle events (never env values). nil discards.
	Logger *slog.Logger
	// Ledger records the sessions: nil means a [MemoryLedger], which
	// forgets them with the process. With a durable ledger, New brings
	// back the sessions an earlier process left live (see [Recoverer]);
	// the kit closes the ledger at Close. A [SharedLedger] makes the
	// sandbox one of several serving its sessions (see the package doc).
	Ledger Ledger
	// Pool are the shapes of session made ahead of the creates (see
	// [PoolShape]): New checks each against the policy, the provider
	// (a [Pooler]) and the machine's memory, and makes one of each before
	// it returns, so that a shape that cannot be made fails New with the
	// reason; the rest are made in the background. Not with a
	// [SharedLedger].
	Pool []PoolShape
	// PoolRefills is how many pool sessions are made at once. 0 means
	// [DefaultPoolRefills].
	PoolRefills int
	// PoolWait makes a create of a pooled shape that finds none ready wait
	// for the refill rather than be made cold (unless the shape's refill
	// is failing or paused): for tests and benchmarks that need every such
	// create served from the pool.
	PoolWait bool
}

// Sandbox is a kit-built [sandbox.Sandbox]. Close it when done: it stops the
// reaper and destroys every live session.
type Sandbox struct {
	prov         Provider
	policy       sandbox.Policy
	execTimeout  time.Duration
	reapInterval time.Duration
	log          *slog.Logger
	ledger       Ledger
	shared       SharedLedger // ledger as a SharedLedger; nil when it is not one
	pool         *pool        // sessions made ahead; nil: none

	adopting singleflight.Group // adoptions under way, by id
	adopts   sync.WaitGroup     // Adopt calls under way; Close waits for them

	mu       sync.Mutex
	sessions map[string]*session
	keys     map[string]*keyHold // persistent workspace_key -> what holds it (see holdKey)
	closed   bool

	closeOnce sync.Once

	stopReaper context.CancelFunc
	reaped     atomic.Uint64
	reaperDone chan struct{}
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// New wraps prov into a sandbox enforcing opts.Policy, recovers what the
// ledger holds (see [Recoverer]) and starts its reaper. The sandbox owns
// prov and opts.Ledger from here on: when New fails it closes both (prov
// if it is an io.Closer), so a provider's constructor can return New's
// result as it is.
func New(prov Provider, opts Options) (_ *Sandbox, err error) {
	if prov == nil {
		return nil, errors.New("kit: a provider is required")
	}
	defer func() {
		if err == nil {
			return
		}
		if c, ok := prov.(io.Closer); ok {
			c.Close()
		}
		if opts.Ledger != nil {
			opts.Ledger.Close()
		}
	}()
	if err := opts.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("kit: %w", err)
	}
	if !prov.Isolation().Valid() {
		return nil, fmt.Errorf("kit: provider %q reports isolation %q", prov.Name(), prov.Isolation())
	}
	s := &Sandbox{
		prov:         prov,
		policy:       opts.Policy,
		execTimeout:  opts.ExecDefaultTimeout,
		reapInterval: opts.ReapInterval,
		log:          opts.Logger,
		ledger:       opts.Ledger,
		sessions:     make(map[string]*session),
		keys:         make(map[string]*keyHold),
	}
	if s.execTimeout <= 0 {
		s.execTimeout = DefaultExecTimeout
	}
	if s.reapInterval == 0 {
		s.reapInterval = DefaultReapInterval
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("provider", prov.Name())
	if s.ledger == nil {
		s.ledger = NewMemoryLedger()
	}
	if sl, ok := s.ledger.(SharedLedger); ok {
		// Nothing to recover: every session is adopted at its first use.
		s.shared = sl
	}
	if len(opts.Pool) > 0 {
		if s.pool, err = newPool(s, opts); err != nil {
			return nil, err
		}
	}
	if s.shared == nil {
		if err := s.recover(context.Background()); err != nil {
			return nil, err
		}
	}
	if s.pool != nil {
		// After the recovery: the provider's sweep must not take the
		// pool's sessions for leftovers. A failure leaves the recovered
		// sessions to the next start, as a crash would.
		if err := s.pool.start(); err != nil {
			s.pool.close(false)
			return nil, err
		}
	}
	if s.reapInterval > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopReaper, s.reaperDone = cancel, make(chan struct{})
		go s.reaper(ctx)
	}
	return s, nil
}

// Provider returns the wrapped provider.
func (s *Sandbox) Provider() Provider { return s.prov }

// Policy returns the policy the sandbox enforces.
func (s *Sandbox) Policy() sandbox.Policy { return s.policy }

// ExecDefaultTimeout implements [sandbox.Sandbox].
func (s *Sandbox) ExecDefaultTimeout() time.Duration { return s.execTimeout }

// ReapInterval implements [sandbox.Sandbox]; negative when the background
// reaper is off.
func (s *Sandbox) ReapInterval() time.Duration { return s.reapInterval }

func (s *Sandbox) reaper(ctx context.Context) {
	defer close(s.reaperDone)
	t := time.NewTicker(s.reapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			ids, err := s.Reap(ctx)
			if len(ids) > 0 {
				s.log.Info("reaped expired sessions", "count", len(ids), "ids", ids)
			}
			if err != nil && ctx.Err() == nil {
				s.log.Error("reap failed", "err", err)
			}
		}
	}
}

// Close stops the background reaper, destroys every session (persistent
// workspaces are kept) and then closes the provider if it is an io.Closer.
// Later creates fail. It is safe to call twice. Over a [SharedLedger],
// the sessions it destroys are those this sandbox created; those it
// adopted are detached ([Detacher]) and live on for the other sandboxes.
func (s *Sandbox) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	all := slices.Collect(maps.Values(s.sessions))
	s.mu.Unlock()
	if s.stopReaper != nil {
		s.stopReaper()
		<-s.reaperDone
	}
	if s.pool != nil {
		s.pool.close(false)
	}
	var errs []error
	if s.shared != nil {
		errs = s.closeShared(ctx, all)
	} else {
		for _, ss := range all {
			if err := s.destroy(ctx, ss); err != nil {
				errs = append(errs, err)
			}
		}
	}
	s.closeOnce.Do(func() {
		if c, ok := s.prov.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
		errs = append(errs, s.ledger.Close())
	})
	return errors.Join(errs...)
}

// Abandoner is an optional interface of a [Provider]: Abandon lets go of
// what the provider holds in this process (locks, handles, threads) as
// the process's death would, and touches no session. See [Sandbox.Abandon].
type Abandoner interface {
	Abandon()
}

// Abandon leaves the sandbox as a process killed with SIGKILL would: the
// reaper stops, the provider lets go of what it holds in this process
// ([Abandoner]), the ledger is closed, and no session is destroyed: its
// resources stay on the machine for a sandbox made next on the same state
// to bring back. It is for tests of recovery in one process; the sandbox
// must not be used afterwards (Close is then a no-op).
func (s *Sandbox) Abandon() {
	s.mu.Lock()
	s.closed = true
	clear(s.sessions)
	clear(s.keys)
	s.mu.Unlock()
	if s.stopReaper != nil {
		s.stopReaper()
		<-s.reaperDone
		s.stopReaper = nil
	}
	if s.pool != nil {
		s.pool.close(true)
	}
	s.adopts.Wait()
	s.closeOnce.Do(func() {
		if a, ok := s.prov.(Abandoner); ok {
			a.Abandon()
		}
		_ = s.ledger.Close()
	})
}

// CreateSession implements [sandbox.Sandbox]: validation, then the policy
// rules, then what the provider can enforce, then the persistent key.
func (s *Sandbox) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Isolation == "" {
		spec.Isolation = s.prov.Isolation()
	}
	if err := CheckPolicy(s.policy, spec); err != nil {
		return nil, err
	}
	if sandbox.IsolationStrength(spec.Isolation) > sandbox.IsolationStrength(s.prov.Isolation()) {
		return nil, &sandbox.SpecRejectedError{Field: "isolation", Reason: sandbox.ReasonUnenforceable,
			Message: fmt.Sprintf("isolation %q is stronger than provider %q gives (%q)", spec.Isolation, s.prov.Name(), s.prov.Isolation())}
	}
	if err := s.prov.Check(spec); err != nil {
		return nil, err
	}
	spec.Env = maps.Clone(spec.Env)
	spec.Labels = maps.Clone(spec.Labels)

	ss := &session{kit: s, spec: spec, gone: make(chan struct{})}
	if s.pool != nil {
		m, err := s.pool.take(ctx, spec)
		if err != nil {
			return nil, err
		}
		if m != nil {
			// Made ahead, in no ledger: a crash before its live record
			// is on disk leaves it to the sweep, as a create's.
			ss.id = m.id
			forget := func() {
				if err := s.ledger.Delete(context.WithoutCancel(ctx), ss.id); err != nil {
					s.log.Error("cannot remove a failed create from the ledger; the next start rolls it back", "id", ss.id, "err", err)
				}
			}
			if err := s.claim(ctx, ss); err != nil {
				_ = m.res.Destroy(context.WithoutCancel(ctx))
				return nil, err
			}
			return s.admit(ctx, ss, m.res, forget, true)
		}
	}
	id, err := newID()
	if err != nil {
		return nil, sandbox.WrapError("create_session", "cannot make a session id", err)
	}
	ss.id = id
	if err := s.claim(ctx, ss); err != nil {
		return nil, err
	}
	return s.createCold(ctx, ss)
}

// createCold has the provider make ss's resources now.
func (s *Sandbox) createCold(ctx context.Context, ss *session) (sandbox.Session, error) {
	if s.pool != nil {
		s.pool.begin()
		defer s.pool.end()
	}
	id := ss.id
	// The ledger learns of the session while the provider makes its
	// resources (the write's fsync then costs a create nothing where the
	// provider is slower): a crash before the record is on disk leaves
	// resources no record names, which the next start's sweep removes
	// all the same; after, the record says to roll them back. The live
	// record follows this one, never overtakes it.
	creating := make(chan error, 1)
	go func() {
		creating <- s.ledger.Put(context.WithoutCancel(ctx), Record{ID: id, Provider: s.prov.Name(), State: StateCreating, Spec: ss.spec})
	}()
	forget := func() {
		s.release(ss)
		if err := s.ledger.Delete(context.WithoutCancel(ctx), id); err != nil {
			s.log.Error("cannot remove a failed create from the ledger; the next start rolls it back", "id", id, "err", err)
		}
	}
	res, err := s.prov.Create(ctx, CreateRequest{ID: id, Spec: ss.spec})
	lerr := <-creating
	if err == nil && lerr != nil {
		_ = res.Destroy(context.WithoutCancel(ctx))
		forget()
		return nil, sandbox.WrapError("create_session", "the session ledger refused the new session; it was torn down", lerr)
	}
	if err != nil {
		forget()
		return nil, sandbox.WrapForeign("create_session", "provider "+s.prov.Name()+" could not create the session", err)
	}
	if s.pool != nil {
		// A pooled shape's image is back (pulled by this create).
		s.pool.resume(ss.spec.Image)
	}
	return s.admit(ctx, ss, res, forget, false)
}

// admit records ss, whose resources res are made, live in the ledger and
// serves it; on failure it destroys res and calls forget.
func (s *Sandbox) admit(ctx context.Context, ss *session, res Resources, forget func(), pooled bool) (sandbox.Session, error) {
	id, spec := ss.id, ss.spec
	if h, ok := res.(Recoverable); ok {
		ss.handle = h.Handle()
	}
	now := time.Now()
	rec := Record{ID: id, Provider: s.prov.Name(), State: StateLive, Spec: spec, WorkspacePath: res.WorkspacePath(),
		CreatedAt: now, ExpiresAt: now.Add(spec.TTL()), Handle: ss.handle}
	// Live in the ledger before it is reported created.
	if err := s.ledger.Put(ctx, rec); err != nil {
		_ = res.Destroy(context.WithoutCancel(ctx))
		forget()
		return nil, sandbox.WrapError("create_session", "the session ledger could not record the new session; it was torn down", err)
	}
	s.mu.Lock()
	ss.res = res
	ss.created, ss.expires = rec.CreatedAt, rec.ExpiresAt
	if ss.hold != nil {
		ss.hold.state = holdSession
	}
	if s.closed {
		s.mu.Unlock()
		_ = res.Destroy(context.WithoutCancel(ctx))
		forget()
		return nil, sandbox.Errorf("create_session", "the sandbox is closed")
	}
	// Over a shared ledger, a lookup between the live record and here
	// may have adopted the session (listed, then looked up): this one
	// serves it, and the adopted copy lets go.
	adopted := s.sessions[id]
	s.sessions[id] = ss
	s.mu.Unlock()
	if adopted != nil {
		s.detach(adopted, "adopted while its create was finishing here")
	}
	s.log.Info("session created", "id", id, "image", spec.Image, "durability", spec.Durability,
		"network", spec.Network, "ttl_seconds", spec.TTLSeconds, "pooled", pooled)
	return ss, nil
}

// claim admits a create unless the sandbox is closed, and has a
// persistent session hold its workspace_key (see holdKey).
func (s *Sandbox) claim(ctx context.Context, ss *session) error {
	if ss.spec.Durability != sandbox.Persistent {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return sandbox.Errorf("create_session", "the sandbox is closed")
		}
		return nil
	}
	ss.hold = &keyHold{state: holdCreating, ss: ss}
	return s.holdKey(ctx, ss.spec.WorkspaceKey, ss.hold, "create_session")
}

// release frees the workspace_key of a session whose create failed.
func (s *Sandbox) release(ss *session) { s.releaseKey(ss.spec.WorkspaceKey, ss.hold) }

// CheckPolicy applies the operator policy to a spec whose isolation is
// resolved, returning a *sandbox.SpecRejectedError of Reason ReasonPolicy
// that names the rule.
func CheckPolicy(p sandbox.Policy, spec sandbox.SessionSpec) error {
	if sandbox.NetworkOpenness(spec.Network) > sandbox.NetworkOpenness(p.Egress) {
		return &sandbox.SpecRejectedError{Field: "network", Reason: sandbox.ReasonPolicy,
			Message: fmt.Sprintf("network %q is looser than the policy's egress ceiling %q", spec.Network, p.Egress)}
	}
	if sandbox.IsolationStrength(spec.Isolation) < sandbox.IsolationStrength(p.Isolation) {
		return &sandbox.SpecRejectedError{Field: "isolation", Reason: sandbox.ReasonPolicy,
			Message: fmt.Sprintf("isolation %q is below the policy's isolation floor %q", spec.Isolation, p.Isolation)}
	}
	if spec.Durability == sandbox.Persistent && !p.Durable {
		return &sandbox.SpecRejectedError{Field: "durability", Reason: sandbox.ReasonPolicy,
			Message: "persistent sessions are not permitted: the policy has durable off"}
	}
	return nil
}

// GetSession implements [sandbox.Sandbox].
func (s *Sandbox) GetSession(ctx context.Context, id string) (sandbox.Session, error) {
	ss, err := s.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	return ss, nil
}

func (s *Sandbox) lookup(ctx context.Context, id string) (*session, error) {
	var ss *session
	if s.shared != nil {
		var err error
		if ss, err = s.lookupShared(ctx, "get_session", id, false); err != nil {
			return nil, err
		}
	} else {
		s.mu.Lock()
		ss = s.sessions[id]
		s.mu.Unlock()
	}
	if ss == nil {
		return nil, &sandbox.SessionNotFoundError{SessionID: id}
	}
	if err := ss.liveLocal(); err != nil {
		return nil, err
	}
	return ss, nil
}

// ListSessions implements [sandbox.Sandbox]: every live, unexpired session,
// oldest first. Over a [SharedLedger], every sandbox's.
func (s *Sandbox) ListSessions(ctx context.Context) ([]sandbox.SessionInfo, error) {
	if s.shared != nil {
		return s.listShared(ctx)
	}
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.sessions))
	s.mu.Unlock()
	out := make([]sandbox.SessionInfo, 0, len(all))
	for _, ss := range all {
		if info, err := ss.info(ctx); err == nil {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b sandbox.SessionInfo) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out, nil
}

// DestroySession implements [sandbox.Sandbox]; idempotent. Over a
// [SharedLedger], a session another sandbox made is adopted, then
// destroyed.
func (s *Sandbox) DestroySession(ctx context.Context, id string) error {
	if s.shared != nil {
		return s.destroyShared(ctx, id)
	}
	s.mu.Lock()
	ss := s.sessions[id]
	s.mu.Unlock()
	if ss == nil {
		return nil
	}
	return s.destroy(ctx, ss)
}

// Reap implements [sandbox.Sandbox]: it destroys every session past its
// expires_at and returns exactly the ids it destroyed. A session whose
// teardown fails is not listed; the failure is returned. Over a
// [SharedLedger] it destroys the expired sessions of every sandbox, and
// only while [SharedLedger.Reaping]; else none.
func (s *Sandbox) Reap(ctx context.Context) ([]string, error) {
	if s.shared != nil {
		return s.reapShared(ctx)
	}
	now := time.Now()
	s.mu.Lock()
	var expired []*session
	for _, ss := range s.sessions {
		if ss.expiredAt(now) {
			expired = append(expired, ss)
		}
	}
	s.mu.Unlock()
	var ids []string
	var errs []error
	for _, ss := range expired {
		first, err := s.destroyOnce(ctx, ss)
		if err != nil {
			errs = append(errs, err)
		} else if first {
			ids = append(ids, ss.id)
		}
	}
	slices.Sort(ids)
	s.reaped.Add(uint64(len(ids)))
	return ids, errors.Join(errs...)
}

// ReapedCount returns how many sessions Reap and the background reaper have
// destroyed since New (for metrics).
func (s *Sandbox) ReapedCount() uint64 { return s.reaped.Load() }

func (s *Sandbox) destroy(ctx context.Context, ss *session) error {
	// Over a shared ledger, a session destroyed elsewhere is detached
	// here, and destroyOnce then returns at once.
	if err := s.syncShared(ctx, "destroy_session", ss); err != nil && !errors.Is(err, sandbox.ErrSessionNotFound) {
		return err
	}
	_, err := s.destroyOnce(ctx, ss)
	return err
}

// destroyOnce tears ss down once; a concurrent or later call waits for that
// teardown and reports its outcome. first reports whether this call did it.
func (s *Sandbox) destroyOnce(ctx context.Context, ss *session) (first bool, err error) {
	s.mu.Lock()
	if ss.destroying {
		s.mu.Unlock()
		select {
		case <-ss.gone:
			return false, ss.destroyErr
		case <-ctx.Done():
			return false, sandbox.WrapError("destroy_session", "gave up waiting for the destroy already under way", ctx.Err())
		}
	}
	ss.destroying = true
	s.mu.Unlock()

	ctx = context.WithoutCancel(ctx)
	var lerr error
	if err := ss.putLedger(ctx, StateDestroying); err != nil {
		// Tear down all the same: the next start finishes what is left.
		s.log.Error("cannot mark a session destroying in the ledger", "id", ss.id, "err", err)
	}
	err = ss.res.Destroy(ctx)
	if err == nil {
		// Gone from the ledger before the destroy is reported done. A
		// failed teardown stays "destroying": the next start finishes it.
		if lerr = s.ledger.Delete(ctx, ss.id); lerr != nil {
			lerr = sandbox.WrapError("destroy_session", "session "+ss.id+" was torn down but the ledger could not forget it; the next start will", lerr)
		}
	}
	s.mu.Lock()
	if s.sessions[ss.id] == ss {
		delete(s.sessions, ss.id)
	}
	s.dropHold(ss.spec.WorkspaceKey, ss.hold)
	if err != nil {
		err = sandbox.WrapError("destroy_session", "tearing down session "+ss.id+" failed", err)
	} else {
		err = lerr
	}
	ss.destroyErr = err
	s.mu.Unlock()
	close(ss.gone)
	if err != nil {
		s.log.Error("session teardown failed", "id", ss.id, "err", err)
	} else {
		s.log.Info("session destroyed", "id", ss.id)
	}
	return true, err
}

func newID() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "sb-" + hex.EncodeToString(b[:]), nil
}
