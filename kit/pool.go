package kit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tai42/sandbox"
)

// PoolShape is one kind of session the kit makes ahead of the creates
// ([Options.Pool]): Size ephemeral sessions of Image on Network, at the
// provider's isolation, with no caps, no env and no labels. A create of an
// ephemeral session of the same image, network and isolation takes one,
// which is then given the rest of the create's spec (caps through
// [Claimer]; env, labels and TTL are the kit's); anything else (a
// persistent workspace, another image or tier) is made cold, as without a
// pool.
type PoolShape struct {
	Image   string
	Network sandbox.Network
	Size    int
}

// String is the shape as ParsePoolShape reads it.
func (p PoolShape) String() string {
	return p.Image + ":" + string(p.Network) + "=" + strconv.Itoa(p.Size)
}

// ParsePoolShape reads IMAGE:NETWORK=N ("host:none=8",
// "python:3.12-slim:internal=4"): the image is what comes before the last
// ':' ahead of the '=', so that an image's own tag or registry port stays
// in it.
func ParsePoolShape(s string) (PoolShape, error) {
	bad := func(why string) (PoolShape, error) {
		return PoolShape{}, fmt.Errorf("pool %q: %s (the form is IMAGE:NETWORK=N, e.g. host:none=8)", s, why)
	}
	eq := strings.LastIndexByte(s, '=')
	if eq < 0 {
		return bad("no '=N'")
	}
	head, n := s[:eq], s[eq+1:]
	i := strings.LastIndexByte(head, ':')
	if i <= 0 {
		return bad("no ':NETWORK' after the image")
	}
	shape := PoolShape{Image: head[:i], Network: sandbox.Network(head[i+1:])}
	size, err := strconv.Atoi(n)
	if err != nil || size < 1 {
		return bad(fmt.Sprintf("the size %q is not a whole number ≥ 1", n))
	}
	shape.Size = size
	if !shape.Network.Valid() {
		return bad(fmt.Sprintf("the network %q is none of none, internal, egress", shape.Network))
	}
	return shape, nil
}

// ErrPoolRefused is matched (errors.Is) by New's error when it refuses
// [Options.Pool]: a shape the policy, the provider or the machine's memory
// cannot have, or whose first session cannot be made.
var ErrPoolRefused = errors.New("the pool is refused")

// poolRefused is err as an ErrPoolRefused.
func poolRefused(err error) error { return poolError{err} }

type poolError struct{ err error }

func (e poolError) Error() string   { return "kit: " + e.err.Error() }
func (e poolError) Unwrap() []error { return []error{e.err, ErrPoolRefused} }

// Pooler is an optional interface of a [Provider] whose sessions the kit
// may make ahead for a pool; the kit refuses a pool on any other. Its
// sessions' [Resources] must implement [Claimer].
type Pooler interface {
	// IdleBytes is the memory one idle session of the provider holds (its
	// processes and what the kernel keeps for it): the kit refuses a pool
	// whose members together would take more than half the memory the
	// machine has available.
	IdleBytes() int64
}

// Claimer is an optional interface of [Resources], required of a
// [Pooler]'s: the kit hands a session made ahead to a create through it.
type Claimer interface {
	// Claim readies a session made ahead (for its pool shape's spec: no
	// caps) for spec, which has the same image, network and isolation and
	// is ephemeral: it checks that the session still works (one whose
	// processes died while it waited answers an error, and the kit then
	// destroys it and takes another or makes one cold), applies spec's cpu
	// and memory caps as the create would have, and takes spec for its
	// own. It is called once, before the session is anyone's; on error the
	// kit destroys the session.
	Claim(ctx context.Context, spec sandbox.SessionSpec) error
}

// Pool defaults.
const (
	// DefaultPoolRefills is how many sessions a pool makes at once.
	DefaultPoolRefills = 1
	// poolRefillQuiet and poolRefillMaxDefer: a refill waits until no
	// create (cold, or a take and the first exec after it) has run for
	// poolRefillQuiet, but no longer than poolRefillMaxDefer, so that it
	// does not compete with them.
	poolRefillQuiet    = 20 * time.Millisecond
	poolRefillMaxDefer = time.Second
	// A refill waits while the machine has less than this fraction of
	// its memory available, so that it never takes what live sessions
	// need.
	poolMinAvailable = 0.10
	// After a failed refill, the shape's next one waits from
	// poolRetryFirst, doubling up to poolRetryLongest.
	poolRetryFirst   = 100 * time.Millisecond
	poolRetryLongest = 30 * time.Second
)

// pool keeps [PoolShape]s of sessions made ahead. Its members are in no
// ledger: a crash leaves them to the provider's sweep at the next start,
// as it leaves a create a crash interrupted, so no member outlives the
// process that made it.
type pool struct {
	s       *Sandbox
	refills int
	waits   bool            // Options.PoolWait
	ctx     context.Context // the refills' creates; cancelled at close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the refill workers
	kick    chan struct{}  // a take or a change: look for work
	// busy is when (UnixNano) the sessions were last used (an exec
	// began): the refill waits for a quiet moment.
	busy   atomic.Int64
	memory func() (avail, total int64, ok bool)

	mu         sync.Mutex
	shapes     []*poolShape
	changed    chan struct{} // closed and made anew at each change (wait)
	closed     bool
	abandoned  bool
	creating   int       // cold creates under way, which a refill waits for
	lastCreate time.Time // when the last cold create ended, or the last take began
	lastRefill time.Time // when the refill last made a session (or began)
}

// poolShape is one shape's state, guarded by the pool's mutex.
type poolShape struct {
	PoolShape
	spec   sandbox.SessionSpec
	ready  []member
	making int
	gen    uint64 // bumped by a flush: a member made for an older one is discarded
	paused bool   // its image was removed: no refill until it is pulled again
	failed error  // the last refill's failure, until a refill or a take
	fails  int    // refills failed in a row
	retry  time.Time

	stats sandbox.PoolStats
}

type member struct {
	id  string
	res Resources
	sh  *poolShape
}

// newPool checks the shapes against the policy, the provider and the
// machine's memory; nothing is made yet (see start).
func newPool(s *Sandbox, opts Options) (*pool, error) {
	pl, ok := s.prov.(Pooler)
	switch {
	case !ok:
		return nil, poolRefused(fmt.Errorf("provider %s cannot keep sessions ready ahead (no pool)", s.prov.Name()))
	case s.shared != nil:
		return nil, poolRefused(fmt.Errorf("provider %s shares its ledger with other sandboxes, whose sweeps would take a pool's sessions for leftovers (no pool)", s.prov.Name()))
	}
	p := &pool{s: s, refills: opts.PoolRefills, waits: opts.PoolWait, kick: make(chan struct{}, 1), changed: make(chan struct{}), memory: memInfo}
	if p.refills <= 0 {
		p.refills = DefaultPoolRefills
	}
	total := 0
	for _, sh := range opts.Pool {
		spec := sandbox.SessionSpec{Image: sh.Image, Durability: sandbox.Ephemeral, Network: sh.Network,
			Isolation: s.prov.Isolation(), TTLSeconds: 1}
		why := func(err error) error { return poolRefused(fmt.Errorf("pool %s: %w", sh, err)) }
		switch {
		case sh.Size < 1:
			return nil, why(errors.New("its size must be at least 1"))
		case slices.ContainsFunc(p.shapes, func(x *poolShape) bool { return x.Image == sh.Image && x.Network == sh.Network }):
			return nil, why(errors.New("the shape is given twice"))
		}
		if err := spec.Validate(); err != nil {
			return nil, why(err)
		}
		if err := CheckPolicy(s.policy, spec); err != nil {
			return nil, why(err)
		}
		if err := s.prov.Check(spec); err != nil {
			return nil, why(err)
		}
		total += sh.Size
		p.shapes = append(p.shapes, &poolShape{PoolShape: sh, spec: spec,
			stats: sandbox.PoolStats{Image: sh.Image, Network: sh.Network, Size: sh.Size}})
	}
	if avail, _, ok := p.memory(); ok {
		if need := int64(total) * pl.IdleBytes(); need > avail/2 {
			var names []string
			for _, sh := range p.shapes {
				names = append(names, "pool "+sh.PoolShape.String())
			}
			return nil, poolRefused(fmt.Errorf("%s: %d sessions need about %d MiB (%d MiB each, idle), more than half the %d MiB this machine has available: make the pool smaller",
				strings.Join(names, ", "), total, need>>20, pl.IdleBytes()>>20, avail>>20))
		}
	}
	return p, nil
}

// start makes one member of each shape now, so that a shape that cannot
// be made (an image that cannot be pulled, a network that cannot be set
// up) fails New with the reason, and then starts the refill.
func (p *pool) start() error {
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, sh := range p.shapes {
		id, err := newID()
		if err != nil {
			return err
		}
		res, err := p.s.prov.Create(p.ctx, CreateRequest{ID: id, Spec: sh.spec, Ahead: true})
		if err != nil {
			return poolRefused(fmt.Errorf("pool %s: its first session could not be made: %w", sh.PoolShape, err))
		}
		if _, ok := res.(Claimer); !ok {
			_ = res.Destroy(context.Background())
			return poolRefused(fmt.Errorf("pool %s: provider %s's sessions cannot be handed out once made (no Claimer)", sh.PoolShape, p.s.prov.Name()))
		}
		sh.ready = append(sh.ready, member{id: id, res: res, sh: sh})
		sh.stats.Refills++
	}
	p.lastRefill = time.Now()
	for range p.refills {
		p.wg.Add(1)
		go p.worker()
	}
	return nil
}

// shapeFor is the shape a create of spec (validated, isolation resolved)
// takes from, or nil.
func (p *pool) shapeFor(spec sandbox.SessionSpec) *poolShape {
	if spec.Durability != sandbox.Ephemeral || spec.Isolation != p.s.prov.Isolation() {
		return nil
	}
	for _, sh := range p.shapes {
		if sh.Image == spec.Image && sh.Network == spec.Network {
			return sh
		}
	}
	return nil
}

// take hands a member of spec's shape to a create, claimed for spec: nil
// when spec is not pooled or none is ready (a miss). A member that cannot
// be claimed is destroyed and the next one tried.
func (p *pool) take(ctx context.Context, spec sandbox.SessionSpec) (*member, error) {
	sh := p.shapeFor(spec)
	if sh == nil {
		return nil, nil
	}
	for {
		p.mu.Lock()
		if p.waits && !p.closed && len(sh.ready) == 0 && !sh.paused && sh.failed == nil {
			changed := p.changed
			p.mu.Unlock()
			p.wake()
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, sandbox.WrapError("create_session", "cancelled while waiting for the pool", ctx.Err())
			}
		}
		if p.closed || len(sh.ready) == 0 {
			sh.stats.Misses++
			p.mu.Unlock()
			p.wake()
			return nil, nil
		}
		// The oldest first: none waits so long that it is the one that
		// went stale.
		m := sh.ready[0]
		sh.ready = sh.ready[1:]
		sh.failed = nil
		// The refill waits for this create too, and its first exec.
		p.lastCreate = time.Now()
		p.notify()
		p.mu.Unlock()
		p.wake()
		err := m.res.(Claimer).Claim(ctx, spec)
		if err == nil {
			p.mu.Lock()
			sh.stats.Hits++
			p.mu.Unlock()
			return &m, nil
		}
		p.discard(m, "it could not be claimed", err)
		if ctx.Err() != nil {
			return nil, sandbox.WrapError("create_session", "cancelled while a pooled session was claimed", ctx.Err())
		}
	}
}

// discard destroys a member no create gets.
func (p *pool) discard(m member, why string, err error) {
	p.mu.Lock()
	m.sh.stats.Discarded++
	p.mu.Unlock()
	p.s.log.Warn("pool: a session made ahead is destroyed: "+why, "pool", m.sh.PoolShape.String(), "id", m.id, "err", err)
	if derr := m.res.Destroy(context.Background()); derr != nil {
		p.s.log.Error("pool: cannot destroy a session made ahead; the next start sweeps it", "id", m.id, "err", derr)
	}
}

// begin and end bracket a cold create, which the refill waits for.
func (p *pool) begin() {
	p.mu.Lock()
	p.creating++
	p.mu.Unlock()
}

func (p *pool) end() {
	p.mu.Lock()
	p.creating--
	p.lastCreate = time.Now()
	p.mu.Unlock()
}

func (p *pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// notify wakes the waiters of a change; p.mu must be held.
func (p *pool) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// worker makes members until the pool closes, one at a time, at the
// lowest CPU priority the thread can have (the runtimes it starts inherit
// it): a refill must not slow the sessions in use.
func (p *pool) worker() {
	defer p.wg.Done()
	lowerThreadPriority()
	for {
		sh, gen, wait := p.next()
		if sh == nil {
			timer := time.NewTimer(wait)
			select {
			case <-p.ctx.Done():
				timer.Stop()
				return
			case <-p.kick:
			case <-timer.C:
			}
			timer.Stop()
			continue
		}
		p.refill(sh, gen)
	}
}

// next picks the shape furthest below its size that may be refilled now
// and counts a member as in the making; nil and how long to wait when
// none may.
func (p *pool) next() (*poolShape, uint64, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	wait := time.Minute
	var best *poolShape
	for _, sh := range p.shapes {
		short := sh.Size - len(sh.ready) - sh.making
		switch {
		case p.closed || sh.paused || short <= 0:
			continue
		case now.Before(sh.retry):
			wait = min(wait, sh.retry.Sub(now))
			continue
		}
		if best == nil || short > best.Size-len(best.ready)-best.making {
			best = sh
		}
	}
	if best == nil {
		return nil, 0, wait
	}
	if w := p.busyFor(now); w > 0 {
		return nil, 0, w
	}
	if avail, total, ok := p.memory(); ok && float64(avail) < poolMinAvailable*float64(total) {
		return nil, 0, time.Second
	}
	best.making++
	return best, best.gen, 0
}

// busyFor is how long a refill should still wait for the sessions in
// use: until nothing (a create, a take, an exec) has happened for
// poolRefillQuiet, but no longer than poolRefillMaxDefer after the last
// refill, so that under a steady load the pool is still refilled, one
// session a poolRefillMaxDefer; p.mu must be held.
func (p *pool) busyFor(now time.Time) time.Duration {
	last := p.lastCreate
	if used := time.Unix(0, p.busy.Load()); used.After(last) {
		last = used
	}
	if p.creating == 0 && now.Sub(last) >= poolRefillQuiet {
		return 0
	}
	deadline := p.lastRefill.Add(poolRefillMaxDefer)
	if !now.Before(deadline) {
		return 0
	}
	return min(poolRefillQuiet, deadline.Sub(now))
}

// refill makes one member of sh (counted in the making by next).
func (p *pool) refill(sh *poolShape, gen uint64) {
	id, err := newID()
	var res Resources
	t0 := time.Now()
	if err == nil {
		res, err = p.s.prov.Create(p.ctx, CreateRequest{ID: id, Spec: sh.spec, Ahead: true})
	}
	took := time.Since(t0)
	p.mu.Lock()
	sh.making--
	p.lastRefill = time.Now()
	switch {
	case err != nil:
		sh.stats.RefillFailures++
		sh.fails++
		sh.failed = err
		sh.retry = time.Now().Add(min(poolRetryLongest, poolRetryFirst<<min(sh.fails-1, 16)))
		p.notify()
		closed := p.closed
		p.mu.Unlock()
		if !closed {
			p.s.log.Warn("pool: cannot make a session ahead; creates of the shape are made cold meanwhile", "pool", sh.PoolShape.String(), "err", err)
		}
		return
	case p.abandoned:
		p.mu.Unlock() // left as the process's death would leave it
		return
	case p.closed || gen != sh.gen:
		p.mu.Unlock()
		p.discard(member{id: id, res: res, sh: sh}, "the pool closed or its image changed while it was made", nil)
		return
	}
	sh.ready = append(sh.ready, member{id: id, res: res, sh: sh})
	sh.fails, sh.failed = 0, nil
	sh.stats.Refills++
	sh.stats.RefillSeconds += took.Seconds()
	p.notify()
	p.mu.Unlock()
}

// flush destroys the ready members of image's shapes and discards those in
// the making; with pause, the shapes are not refilled until resume (the
// image was removed: a refill would pull it back).
func (p *pool) flush(image string, pause bool) {
	var gone []member
	p.mu.Lock()
	for _, sh := range p.shapes {
		if sh.Image != image {
			continue
		}
		sh.gen++
		sh.paused = pause
		gone = append(gone, sh.ready...)
		sh.ready = nil
	}
	p.notify()
	p.mu.Unlock()
	for _, m := range gone {
		p.discard(m, "its image was removed or replaced", nil)
	}
	p.wake()
}

// resume lets image's shapes be refilled again.
func (p *pool) resume(image string) {
	p.mu.Lock()
	for _, sh := range p.shapes {
		if sh.Image == image && sh.paused {
			sh.paused = false
			sh.retry = time.Time{}
		}
	}
	p.notify()
	p.mu.Unlock()
	p.wake()
}

// stats returns each shape's figures.
func (p *pool) stats() []sandbox.PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]sandbox.PoolStats, len(p.shapes))
	for i, sh := range p.shapes {
		out[i] = sh.stats
		out[i].Ready = len(sh.ready)
	}
	return out
}

// wait waits until every shape not paused holds its size ready; it fails
// with a shape's refill error, when the pool closes, or when ctx ends.
func (p *pool) wait(ctx context.Context) error {
	for {
		p.mu.Lock()
		changed, closed := p.changed, p.closed
		var short []string
		var failed error
		for _, sh := range p.shapes {
			if sh.paused || len(sh.ready) >= sh.Size {
				continue
			}
			short = append(short, fmt.Sprintf("%s (%d ready)", sh.PoolShape, len(sh.ready)))
			if sh.failed != nil && failed == nil {
				failed = fmt.Errorf("pool %s: %w", sh.PoolShape, sh.failed)
			}
		}
		p.mu.Unlock()
		switch {
		case closed:
			return errors.New("kit: the pool is closed")
		case len(short) == 0:
			return nil
		case failed != nil:
			return fmt.Errorf("kit: a refill failed: %w", failed)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("kit: waiting for the pool to fill (%s): %w", strings.Join(short, ", "), ctx.Err())
		}
	}
}

// close stops the refill and destroys the ready members; abandon stops it
// and leaves them, as the process's death would, to the next start's sweep.
func (p *pool) close(abandon bool) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed, p.abandoned = true, abandon
	var gone []member
	for _, sh := range p.shapes {
		gone = append(gone, sh.ready...)
		sh.ready = nil
	}
	p.notify()
	p.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	if abandon {
		return
	}
	var wg sync.WaitGroup
	for _, m := range gone {
		wg.Go(func() {
			if err := m.res.Destroy(context.Background()); err != nil {
				p.s.log.Error("pool: cannot destroy a session made ahead; the next start sweeps it", "pool", m.sh.PoolShape.String(), "id", m.id, "err", err)
			}
		})
	}
	wg.Wait()
}

// active notes that a session is in use, which a refill waits for.
func (s *Sandbox) active() {
	if s.pool != nil {
		s.pool.busy.Store(time.Now().UnixNano())
	}
}

// PoolStats implements [sandbox.PoolReporter]: nil without a pool.
func (s *Sandbox) PoolStats() []sandbox.PoolStats {
	if s.pool == nil {
		return nil
	}
	return s.pool.stats()
}

// WaitPool waits until the pool ([Options.Pool]) holds every shape's
// size ready, so that the next creates of those shapes take from it:
// benchmarks and tests use it to see a sandbox at rest. It returns at
// once without a pool, and fails when a refill failed since the last
// take, the sandbox is closed, or ctx ends. A shape whose image was
// removed is not waited for.
func (s *Sandbox) WaitPool(ctx context.Context) error {
	if s.pool == nil {
		return nil
	}
	return s.pool.wait(ctx)
}
