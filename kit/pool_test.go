package kit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

func TestParsePoolShape(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want kit.PoolShape
		err  string
	}{
		{in: "host:none=8", want: kit.PoolShape{Image: "host", Network: sandbox.NetworkNone, Size: 8}},
		{in: "python:3.12-slim:internal=4", want: kit.PoolShape{Image: "python:3.12-slim", Network: sandbox.NetworkInternal, Size: 4}},
		{in: "127.0.0.1:5000/r:t:egress=1", want: kit.PoolShape{Image: "127.0.0.1:5000/r:t", Network: sandbox.NetworkEgress, Size: 1}},
		{in: "host:none", err: "no '=N'"},
		{in: "host=8", err: "no ':NETWORK'"},
		{in: ":none=8", err: "no ':NETWORK'"},
		{in: "host:none=0", err: "not a whole number ≥ 1"},
		{in: "host:none=x", err: "not a whole number ≥ 1"},
		{in: "host:wide=2", err: `the network "wide"`},
	} {
		got, err := kit.ParsePoolShape(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("ParsePoolShape(%q) = %v, %v; want an error naming it and saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParsePoolShape(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if got.String() != tc.in {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
}

// poolProvider is a fakeProvider whose sessions can be pooled: it records
// every session it made, what each was claimed for, and lets a test hold
// its creates, fail them, or kill a session.
type poolProvider struct {
	*fakeProvider
	idle     int64
	noClaim  bool // its sessions are not Claimers
	gate     chan struct{}
	mu       sync.Mutex
	made     []*poolRes
	failWith error
	removed  []string // RemoveImage's names, with the members of the image then live
	liveAt   []int
	// aheadGate holds the creates of sessions made ahead (the pool's),
	// not the cold ones; each such create sends its id on entered first.
	aheadGate chan struct{}
	entered   chan string
}

func newPoolProvider() *poolProvider {
	return &poolProvider{fakeProvider: &fakeProvider{iso: sandbox.IsolationNone}, idle: 1 << 20}
}

func (p *poolProvider) IdleBytes() int64 { return p.idle }

func (p *poolProvider) Create(ctx context.Context, req kit.CreateRequest) (kit.Resources, error) {
	p.mu.Lock()
	gate, fail := p.gate, p.failWith
	if req.Ahead && p.aheadGate != nil {
		gate = p.aheadGate
		p.entered <- req.ID
	}
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	p.created.Add(1)
	r := &poolRes{fakeRes: fakeRes{f: p.fakeProvider, ws: "/ws/" + req.ID}, id: req.ID, made: req.Spec}
	p.mu.Lock()
	p.made = append(p.made, r)
	p.mu.Unlock()
	if p.noClaim {
		return &r.fakeRes, nil
	}
	return r, nil
}

// live is how many sessions of image are made and not destroyed.
func (p *poolProvider) live(image string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.made {
		if r.made.Image == image && !r.isDestroyed() {
			n++
		}
	}
	return n
}

func (p *poolProvider) byID(id string) *poolRes {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.made {
		if r.id == id {
			return r
		}
	}
	return nil
}

func (p *poolProvider) PullImage(_ context.Context, ref string, _ sandbox.PullOptions) (sandbox.ImageInfo, error) {
	return sandbox.ImageInfo{Name: ref}, nil
}
func (p *poolProvider) ListImages(context.Context) ([]sandbox.ImageInfo, error) { return nil, nil }
func (p *poolProvider) RemoveImage(_ context.Context, name string) error {
	n := p.live(name)
	p.mu.Lock()
	p.removed, p.liveAt = append(p.removed, name), append(p.liveAt, n)
	p.mu.Unlock()
	return nil
}
func (p *poolProvider) PruneImages(context.Context) (sandbox.PruneResult, error) {
	return sandbox.PruneResult{}, nil
}

type poolRes struct {
	fakeRes
	id        string
	made      sandbox.SessionSpec
	mu        sync.Mutex
	claimed   *sandbox.SessionSpec
	dead      bool
	destroyed bool
}

func (r *poolRes) Claim(_ context.Context, spec sandbox.SessionSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead {
		return errors.New("its agent does not answer")
	}
	r.claimed = &spec
	return nil
}

func (r *poolRes) Destroy(ctx context.Context) error {
	r.mu.Lock()
	r.destroyed = true
	r.mu.Unlock()
	return r.fakeRes.Destroy(ctx)
}

func (r *poolRes) isDestroyed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.destroyed
}

func newPoolKit(t *testing.T, p kit.Provider, shapes ...kit.PoolShape) *kit.Sandbox {
	t.Helper()
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1, Pool: shapes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb
}

func waitPool(t *testing.T, sb *kit.Sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := sb.WaitPool(ctx); err != nil {
		t.Fatal(err)
	}
}

var imgNone = kit.PoolShape{Image: "img", Network: sandbox.NetworkNone, Size: 2}

func TestPoolServesCreates(t *testing.T) {
	p := newPoolProvider()
	sb := newPoolKit(t, p, imgNone)
	waitPool(t, sb)
	if n := p.created.Load(); n != 2 {
		t.Fatalf("the pool made %d sessions, want its size 2", n)
	}
	ctx := t.Context()
	want := spec()
	want.CPU, want.MemoryMB = 0.5, 64
	want.Labels = map[string]string{"who": "test"}
	want.Env = map[string]sandbox.Secret{"K": sandbox.NewSecret("v")}
	want.TTLSeconds = 123
	before := time.Now()
	s, err := sb.CreateSession(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	r := p.byID(s.ID())
	if r == nil {
		t.Fatalf("session %s is none the provider made ahead", s.ID())
	}
	if r.made.CPU != 0 || r.made.MemoryMB != 0 || r.made.Labels != nil || r.made.Env != nil {
		t.Errorf("the session was made ahead with %+v; want no caps, labels or env", r.made)
	}
	r.mu.Lock()
	claimed := r.claimed
	r.mu.Unlock()
	if claimed == nil || claimed.CPU != 0.5 || claimed.MemoryMB != 64 || claimed.TTLSeconds != 123 || claimed.Labels["who"] != "test" {
		t.Errorf("the session was claimed for %+v; want the create's spec", claimed)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.CreatedAt.Before(before) || info.ExpiresAt.Sub(info.CreatedAt) != 123*time.Second || info.Labels["who"] != "test" {
		t.Errorf("info %+v: want created at the take, the create's TTL and labels", info)
	}
	if _, err := s.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	env := p.lastExec.Env
	p.mu.Unlock()
	if env["K"].Reveal() != "v" {
		t.Errorf("the exec got env %v; want the create's", env)
	}
	// Refilled to its size after the take.
	waitPool(t, sb)
	if n := p.created.Load(); n != 3 {
		t.Errorf("after one take the provider made %d sessions, want 3", n)
	}
	// Other shapes, and persistent sessions, are made cold, and are no
	// miss.
	for _, mut := range []func(*sandbox.SessionSpec){
		func(sp *sandbox.SessionSpec) { sp.Network = sandbox.NetworkInternal },
		func(sp *sandbox.SessionSpec) { sp.Image = "other" },
		func(sp *sandbox.SessionSpec) { sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "k" },
	} {
		sp := spec()
		mut(&sp)
		s, err := sb.CreateSession(ctx, sp)
		if err != nil {
			t.Fatal(err)
		}
		if r := p.byID(s.ID()); r == nil || r.made.Image != sp.Image || r.made.Network != sp.Network || r.made.Durability != sp.Durability {
			t.Errorf("a create of %+v got a session made for %+v", sp, r)
		}
	}
	st := sb.PoolStats()
	if len(st) != 1 || st[0].Hits != 1 || st[0].Misses != 0 || st[0].Size != 2 || st[0].Ready != 2 || st[0].Refills != 3 || st[0].Image != "img" {
		t.Errorf("PoolStats = %+v; want 1 hit, no miss, 2 of 2 ready, 3 refills", st)
	}
}

func TestPoolMiss(t *testing.T) {
	p := newPoolProvider()
	sb := newPoolKit(t, p, kit.PoolShape{Image: "img", Network: sandbox.NetworkNone, Size: 1})
	waitPool(t, sb)
	// Hold the refills: the second create finds none ready and is made
	// cold (its create is held too, then let go).
	gate := make(chan struct{})
	p.mu.Lock()
	p.gate = gate
	p.mu.Unlock()
	ctx := t.Context()
	if _, err := sb.CreateSession(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sb.CreateSession(ctx, spec())
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := sb.PoolStats(); st[0].Hits != 1 || st[0].Misses != 1 {
		t.Errorf("PoolStats = %+v; want 1 hit and 1 miss", st)
	}
}

func TestPoolDeadMemberNeverHandedOut(t *testing.T) {
	p := newPoolProvider()
	sb := newPoolKit(t, p, imgNone)
	waitPool(t, sb)
	p.mu.Lock()
	dead := p.made[0]
	p.mu.Unlock()
	dead.mu.Lock()
	dead.dead = true
	dead.mu.Unlock()
	s, err := sb.CreateSession(t.Context(), spec())
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() == dead.id {
		t.Fatalf("the dead session %s was handed out", dead.id)
	}
	if !dead.isDestroyed() {
		t.Error("the dead session was not destroyed")
	}
	waitPool(t, sb)
	if st := sb.PoolStats(); st[0].Hits != 1 || st[0].Discarded != 1 || st[0].Ready != 2 {
		t.Errorf("PoolStats = %+v; want 1 hit, 1 discarded, refilled to 2", st)
	}
}

func TestPoolRefused(t *testing.T) {
	noCheck := newPoolProvider()
	tooBig := newPoolProvider()
	tooBig.idle = 1 << 50
	noClaim := newPoolProvider()
	noClaim.noClaim = true
	failing := newPoolProvider()
	failing.failWith = errors.New("image not found in any registry")
	for _, tc := range []struct {
		name   string
		prov   kit.Provider
		policy sandbox.Policy
		shapes []kit.PoolShape
		want   string
	}{
		{"not a Pooler", &fakeProvider{iso: sandbox.IsolationNone}, open, []kit.PoolShape{imgNone}, "cannot keep sessions ready ahead"},
		{"policy", noCheck, sandbox.Policy{Egress: sandbox.NetworkNone, Isolation: sandbox.IsolationNone},
			[]kit.PoolShape{{Image: "img", Network: sandbox.NetworkEgress, Size: 1}}, `network "egress" is looser than the policy's egress ceiling "none"`},
		{"no image", noCheck, open,
			[]kit.PoolShape{{Image: "", Network: sandbox.NetworkNone, Size: 1}}, "pool :none=1"},
		{"twice", noCheck, open, []kit.PoolShape{imgNone, imgNone}, "given twice"},
		{"size", noCheck, open, []kit.PoolShape{{Image: "img", Network: sandbox.NetworkNone}}, "at least 1"},
		{"memory", tooBig, open, []kit.PoolShape{imgNone}, "more than half"},
		{"no Claimer", noClaim, open, []kit.PoolShape{imgNone}, "cannot be handed out"},
		{"first create fails", failing, open, []kit.PoolShape{imgNone}, "its first session could not be made: image not found in any registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := kit.New(tc.prov, kit.Options{Policy: tc.policy, ReapInterval: -1, Pool: tc.shapes})
			if err == nil {
				sb.Close(context.Background())
				t.Fatalf("New made a sandbox; want it refused with %q", tc.want)
			}
			if !errors.Is(err, kit.ErrPoolRefused) {
				t.Errorf("New: %v; want it to match kit.ErrPoolRefused", err)
			}
			if !strings.Contains(err.Error(), tc.want) || (tc.name != "not a Pooler" && !strings.Contains(err.Error(), "pool "+tc.shapes[0].String())) {
				t.Errorf("New: %v; want it to name the shape and say %q", err, tc.want)
			}
		})
	}
	if n, d := noClaim.created.Load(), noClaim.destroyed.Load(); n != d {
		t.Errorf("a refused pool left %d of its %d sessions", n-d, n)
	}
}

func TestPoolCloseDestroysMembers(t *testing.T) {
	p := newPoolProvider()
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1, Pool: []kit.PoolShape{imgNone}})
	if err != nil {
		t.Fatal(err)
	}
	waitPool(t, sb)
	if err := sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, d := p.created.Load(), p.destroyed.Load(); n != 2 || d != 2 {
		t.Errorf("after Close the provider made %d sessions and destroyed %d; want 2 and 2", n, d)
	}
	if _, err := sb.CreateSession(t.Context(), spec()); err == nil {
		t.Error("a create after Close succeeded")
	}
}

func TestPoolAbandonLeavesMembers(t *testing.T) {
	p := newPoolProvider()
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1, Pool: []kit.PoolShape{imgNone}})
	if err != nil {
		t.Fatal(err)
	}
	waitPool(t, sb)
	sb.Abandon()
	if d := p.destroyed.Load(); d != 0 {
		t.Errorf("Abandon destroyed %d sessions made ahead; the next start's sweep is theirs", d)
	}
}

func TestPoolImageRemovedOrPulled(t *testing.T) {
	p := newPoolProvider()
	other := kit.PoolShape{Image: "keep", Network: sandbox.NetworkNone, Size: 1}
	sb := newPoolKit(t, p, imgNone, other)
	waitPool(t, sb)
	ctx := t.Context()
	if err := sb.RemoveImage(ctx, "img"); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	removed, liveAt := p.removed, p.liveAt
	p.mu.Unlock()
	if len(removed) != 1 || liveAt[0] != 0 {
		t.Fatalf("RemoveImage reached the provider with %v sessions of the image still made ahead", liveAt)
	}
	// No refill pulls it back, and a create of it is made cold.
	waitPool(t, sb)
	time.Sleep(100 * time.Millisecond)
	if n := p.live("img"); n != 0 {
		t.Errorf("%d sessions of the removed image were made ahead again", n)
	}
	if n := p.live("keep"); n != 1 {
		t.Errorf("the other shape holds %d sessions, want its 1", n)
	}
	if _, err := sb.CreateSession(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	// That create brought the image back: the shape is refilled. A pull
	// then replaces the sessions made ahead with new ones.
	waitPool(t, sb)
	made := p.created.Load()
	if _, err := sb.PullImage(ctx, "img", sandbox.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, sb)
	if n := p.created.Load() - made; n != 2 {
		t.Errorf("after the pull the pool made %d sessions of the image, want 2", n)
	}
	st := sb.PoolStats()
	if st[0].Discarded < 2 {
		t.Errorf("PoolStats = %+v; want the 2 flushed sessions discarded", st)
	}
}

func TestPoolWait(t *testing.T) {
	p := newPoolProvider()
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1, PoolWait: true,
		Pool: []kit.PoolShape{{Image: "img", Network: sandbox.NetworkNone, Size: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	waitPool(t, sb)
	gate := make(chan struct{})
	p.mu.Lock()
	p.gate = gate
	p.mu.Unlock()
	ctx := t.Context()
	if _, err := sb.CreateSession(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	// The next create waits for the held refill, and is served by it.
	done := make(chan error, 1)
	go func() {
		_, err := sb.CreateSession(ctx, spec())
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the create did not wait for the pool: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	// The refill after this one is held for good.
	p.mu.Lock()
	p.gate = make(chan struct{})
	p.mu.Unlock()
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := sb.PoolStats(); st[0].Hits != 2 || st[0].Misses != 0 {
		t.Errorf("PoolStats = %+v; want 2 hits and no miss", st)
	}
	// A create whose context ends while it waits fails with it.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := sb.CreateSession(cctx, spec()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a create that waited out its context: %v; want context.DeadlineExceeded", err)
	}
}

// TestPoolRefillWaitsForLoad: while the sessions are in use (execs) the
// refill waits, but no longer than a second after its last session; once
// they are idle it refills at once.
func TestPoolRefillWaitsForLoad(t *testing.T) {
	p := newPoolProvider()
	sb := newPoolKit(t, p, kit.PoolShape{Image: "img", Network: sandbox.NetworkNone, Size: 1})
	waitPool(t, sb)
	ctx := t.Context()
	s, err := sb.CreateSession(ctx, spec())
	if err != nil {
		t.Fatal(err)
	}
	made := p.created.Load()
	load := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := s.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
				t.Fatal(err)
			}
		}
	}
	load(300 * time.Millisecond)
	if n := p.created.Load() - made; n != 0 {
		t.Errorf("the pool made %d sessions while execs ran, within a second of its last", n)
	}
	load(time.Second)
	if n := p.created.Load() - made; n != 1 {
		t.Errorf("after 1.3s of execs the pool made %d sessions, want its 1 (a refill defers a second at most)", n)
	}
	// Idle: a take is refilled within the quiet period.
	if _, err := sb.CreateSession(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if st := sb.PoolStats(); st[0].Ready != 1 || st[0].Hits != 2 {
		t.Errorf("PoolStats = %+v; want the second take refilled at once", st)
	}
}

// holdAhead holds the pool's creates from now on (the cold ones go
// through); the returned func lets them go.
func (p *poolProvider) holdAhead() (release func()) {
	gate := make(chan struct{})
	p.mu.Lock()
	p.aheadGate, p.entered = gate, make(chan string, 64)
	p.mu.Unlock()
	return func() { close(gate) }
}

// nextEntered is the id of the next create of a session made ahead to
// reach the provider, or "" when none does within d.
func (p *poolProvider) nextEntered(d time.Duration) string {
	p.mu.Lock()
	entered := p.entered
	p.mu.Unlock()
	select {
	case id := <-entered:
		return id
	case <-time.After(d):
		return ""
	}
}

// TestPoolRefillAfterFlushDiscarded: a refill under way when its image is
// pulled anew (the name may now be another image) lands after the flush;
// it was made of the old image and must never be handed out.
func TestPoolRefillAfterFlushDiscarded(t *testing.T) {
	p := newPoolProvider()
	sb := newPoolKit(t, p, kit.PoolShape{Image: "img", Network: sandbox.NetworkNone, Size: 1})
	waitPool(t, sb)
	release := p.holdAhead()
	ctx := t.Context()
	if _, err := sb.CreateSession(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	stale := p.nextEntered(10 * time.Second)
	if stale == "" {
		t.Fatal("the take was not refilled")
	}
	if _, err := sb.PullImage(ctx, "img", sandbox.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	release()
	waitPool(t, sb)
	s, err := sb.CreateSession(ctx, spec())
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() == stale {
		t.Fatalf("session %s, made while its image was pulled anew, was handed out", stale)
	}
	if r := p.byID(stale); r == nil || !r.isDestroyed() {
		t.Errorf("session %s, made while its image was pulled anew, was kept", stale)
	}
}

// TestPoolRefillsCountTheMaking: with several refill workers, one that
// finds a shape's missing session already being made by another makes
// none: the pool never holds more than its size.
func TestPoolRefillsCountTheMaking(t *testing.T) {
	p := newPoolProvider()
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1, PoolRefills: 3,
		Pool: []kit.PoolShape{{Image: "img", Network: sandbox.NetworkNone, Size: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	waitPool(t, sb)
	release := p.holdAhead()
	ctx := t.Context()
	if _, err := sb.CreateSession(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	if p.nextEntered(10*time.Second) == "" {
		t.Fatal("the take was not refilled")
	}
	// A miss wakes another worker while the refill is held: it must find
	// nothing to do. A worker that would refill does so once the 20 ms
	// quiet period after the (cold) create has passed; 300 ms is ample.
	if _, err := sb.CreateSession(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	if id := p.nextEntered(300 * time.Millisecond); id != "" {
		t.Errorf("a second refill (%s) began for a pool of 1 whose one missing session was being made", id)
	}
	release()
	waitPool(t, sb)
	if st := sb.PoolStats(); st[0].Ready != 1 || st[0].Refills != 2 {
		t.Errorf("PoolStats = %+v; want 1 ready of 1, 2 refills (the first and the take's)", st)
	}
}
