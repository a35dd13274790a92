package kit_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// recProvider is a fake provider that implements kit.Recoverer and
// kit.Recoverable, and records what it was asked.
type recProvider struct {
	fakeProvider
	mu       sync.Mutex
	kept     []kit.Kept
	called   int
	refuse   map[string]bool // ids Recover reports with Err
	sweepErr error
}

type recRes struct {
	fakeRes
	id string
}

func (r *recRes) Handle() json.RawMessage { return json.RawMessage(`{"id":"` + r.id + `"}`) }

func (f *recProvider) Create(_ context.Context, req kit.CreateRequest) (kit.Resources, error) {
	f.created.Add(1)
	return &recRes{fakeRes: fakeRes{f: &f.fakeProvider, ws: "/ws/" + req.ID}, id: req.ID}, nil
}

func (f *recProvider) Recover(_ context.Context, keep []kit.Kept) ([]kit.Recovered, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called++
	f.kept = append(f.kept, keep...)
	if f.sweepErr != nil {
		return nil, f.sweepErr
	}
	var out []kit.Recovered
	for _, k := range keep {
		if f.refuse[k.ID] {
			out = append(out, kit.Recovered{ID: k.ID, Err: errors.New("its container is not running")})
			continue
		}
		out = append(out, kit.Recovered{ID: k.ID, Res: &recRes{fakeRes: fakeRes{f: &f.fakeProvider, ws: "/ws/" + k.ID}, id: k.ID}})
	}
	return out, nil
}

// logLedger is a MemoryLedger that logs each write, and can fail them.
type logLedger struct {
	*kit.MemoryLedger
	mu     sync.Mutex
	log    []string
	failOn kit.State // Put of a record in this state fails
	closed bool
}

func newLogLedger() *logLedger { return &logLedger{MemoryLedger: kit.NewMemoryLedger()} }

func (l *logLedger) Put(ctx context.Context, r kit.Record) error {
	l.mu.Lock()
	l.log = append(l.log, "put "+r.ID+" "+string(r.State))
	fail := l.failOn != "" && r.State == l.failOn
	l.mu.Unlock()
	if fail {
		return errors.New("disk full")
	}
	return l.MemoryLedger.Put(ctx, r)
}

func (l *logLedger) Delete(ctx context.Context, id string) error {
	l.mu.Lock()
	l.log = append(l.log, "delete "+id)
	l.mu.Unlock()
	return l.MemoryLedger.Delete(ctx, id)
}

func (l *logLedger) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return nil
}

func (l *logLedger) entries() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.log)
}

func (l *logLedger) get(t *testing.T, id string) (kit.Record, bool) {
	t.Helper()
	all, err := l.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.ID == id {
			return r, true
		}
	}
	return kit.Record{}, false
}

// TestLedgerLifecycle: creating before the provider is asked, live (with
// the handle and every SessionInfo field) before the create returns, the
// new expires_at before a touch returns, destroying before the teardown,
// and gone before the destroy returns.
func TestLedgerLifecycle(t *testing.T) {
	l := newLogLedger()
	f := &recProvider{fakeProvider: fakeProvider{iso: "none"}}
	sb, err := kit.New(f, kit.Options{Policy: open, ReapInterval: -1, Ledger: l})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	ctx := context.Background()
	sp := spec()
	sp.Env = sandbox.SecretEnv(map[string]string{"K": "v"})
	sp.Labels = map[string]string{"a": "b"}
	s, err := sb.CreateSession(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	id := s.ID()
	if got := l.entries(); !slices.Equal(got, []string{"put " + id + " creating", "put " + id + " live"}) {
		t.Fatalf("ledger writes at create: %q", got)
	}
	r, ok := l.get(t, id)
	info, _ := s.Info(ctx)
	if !ok || r.State != kit.StateLive || r.Provider != "fake" || string(r.Handle) != `{"id":"`+id+`"}` ||
		r.WorkspacePath != info.WorkspacePath || !r.CreatedAt.Equal(info.CreatedAt) || !r.ExpiresAt.Equal(info.ExpiresAt) ||
		r.Spec.Image != "img" || r.Spec.Labels["a"] != "b" || r.Spec.Env["K"].Reveal() != "v" || r.Spec.Isolation != "none" {
		t.Fatalf("live record %+v does not match the session %+v", r, info)
	}
	time.Sleep(1100 * time.Millisecond) // expires_at has a second's resolution of TTL
	if err := s.Touch(ctx); err != nil {
		t.Fatal(err)
	}
	info2, _ := s.Info(ctx)
	if r, _ := l.get(t, id); !r.ExpiresAt.Equal(info2.ExpiresAt) || !r.ExpiresAt.After(info.ExpiresAt) {
		t.Fatalf("after touch the ledger says %v; the session %v (was %v)", r.ExpiresAt, info2.ExpiresAt, info.ExpiresAt)
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	got := l.entries()
	if want := []string{"put " + id + " destroying", "delete " + id}; !slices.Equal(got[len(got)-2:], want) {
		t.Fatalf("ledger writes at destroy: %q", got)
	}
	if _, ok := l.get(t, id); ok {
		t.Fatal("a destroyed session is still in the ledger")
	}
}

// TestLedgerFailureFailsCreate: a session the ledger cannot record
// (creating or live) is torn down and the create fails; nothing is left in
// the ledger.
func TestLedgerFailureFailsCreate(t *testing.T) {
	for _, st := range []kit.State{kit.StateCreating, kit.StateLive} {
		t.Run(string(st), func(t *testing.T) { ledgerFailureFailsCreate(t, st) })
	}
}

func ledgerFailureFailsCreate(t *testing.T, st kit.State) {
	l := newLogLedger()
	l.failOn = st
	f := &recProvider{fakeProvider: fakeProvider{iso: "none"}}
	sb, err := kit.New(f, kit.Options{Policy: open, ReapInterval: -1, Ledger: l})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	_, err = sb.CreateSession(context.Background(), spec())
	if err == nil || !errors.Is(err, sandbox.ErrSandbox) {
		t.Fatalf("create with a failing ledger: %v", err)
	}
	if f.created.Load() != 1 || f.destroyed.Load() != 1 {
		t.Fatalf("created %d, destroyed %d; want 1, 1", f.created.Load(), f.destroyed.Load())
	}
	if all, _ := l.Load(context.Background()); len(all) != 0 {
		t.Fatalf("ledger keeps %+v", all)
	}
	if list, _ := sb.ListSessions(context.Background()); len(list) != 0 {
		t.Fatalf("listed %+v", list)
	}
}

// TestRecovery: a new kit on a ledger an earlier process left brings back
// the live, unexpired sessions (same id, workspace, times, labels, env),
// reaps the expired, rolls back creating, finishes destroying, drops what
// the provider cannot bring back and another provider's records; every
// dropped record leaves the ledger.
func TestRecovery(t *testing.T) {
	ctx := context.Background()
	l := newLogLedger()
	now := time.Now().UTC().Truncate(time.Millisecond)
	live := func(id string, st kit.State, expires time.Time) kit.Record {
		sp := spec()
		sp.Isolation = "none"
		sp.Env = sandbox.SecretEnv(map[string]string{"K": "v-" + id})
		sp.Labels = map[string]string{"id": id}
		return kit.Record{ID: id, Provider: "fake", State: st, Spec: sp, WorkspacePath: "/ws/" + id,
			CreatedAt: now.Add(-time.Minute), ExpiresAt: expires, Handle: json.RawMessage(`{"id":"` + id + `"}`)}
	}
	pers := live("sb-pers", kit.StateLive, now.Add(time.Hour))
	pers.Spec.Durability, pers.Spec.WorkspaceKey = sandbox.Persistent, "proj"
	other := live("sb-other", kit.StateLive, now.Add(time.Hour))
	other.Provider = "container"
	for _, r := range []kit.Record{
		live("sb-live", kit.StateLive, now.Add(time.Hour)),
		pers,
		live("sb-expired", kit.StateLive, now.Add(-time.Second)),
		live("sb-creating", kit.StateCreating, now.Add(time.Hour)),
		live("sb-destroying", kit.StateDestroying, now.Add(time.Hour)),
		live("sb-lost", kit.StateLive, now.Add(time.Hour)),
		other,
	} {
		if err := l.MemoryLedger.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	f := &recProvider{fakeProvider: fakeProvider{iso: "none"}, refuse: map[string]bool{"sb-lost": true}}
	sb, err := kit.New(f, kit.Options{Policy: open, ReapInterval: -1, Ledger: l})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	var kept []string
	for _, k := range f.kept {
		kept = append(kept, k.ID)
		if string(k.Handle) != `{"id":"`+k.ID+`"}` || k.Spec.Env["K"].Reveal() != "v-"+k.ID {
			t.Errorf("kept %s with handle %s", k.ID, k.Handle)
		}
	}
	slices.Sort(kept)
	if f.called != 1 || !slices.Equal(kept, []string{"sb-live", "sb-lost", "sb-pers"}) {
		t.Fatalf("Recover called %d times with %q; want once with sb-live, sb-lost, sb-pers", f.called, kept)
	}
	list, err := sb.ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range list {
		ids = append(ids, in.ID)
		if in.WorkspacePath != "/ws/"+in.ID || !in.CreatedAt.Equal(now.Add(-time.Minute)) || !in.ExpiresAt.Equal(now.Add(time.Hour)) || in.Labels["id"] != in.ID {
			t.Errorf("recovered %+v", in)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"sb-live", "sb-pers"}) {
		t.Fatalf("listed %q; want sb-live, sb-pers", ids)
	}
	all, _ := l.Load(ctx)
	var left []string
	for _, r := range all {
		left = append(left, r.ID)
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"sb-live", "sb-pers"}) {
		t.Fatalf("the ledger keeps %q; want sb-live, sb-pers", left)
	}
	if sb.ReapedCount() != 1 {
		t.Errorf("reaped count %d; want 1 (the expired session)", sb.ReapedCount())
	}
	// A recovered session works, with its env; its persistent key is held.
	s, err := sb.GetSession(ctx, "sb-live")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	env := f.lastExec.Env["K"].Reveal()
	f.mu.Unlock()
	if env != "v-sb-live" {
		t.Errorf("a recovered session's exec got env K=%q", env)
	}
	sp := spec()
	sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "proj"
	_, err = sb.CreateSession(ctx, sp)
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Reason != sandbox.ReasonConflict {
		t.Fatalf("a create on the recovered session's key: %v; want a conflict", err)
	}
	// Destroying it goes through the ledger as any other.
	if err := sb.DestroySession(ctx, "sb-pers"); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.get(t, "sb-pers"); ok {
		t.Fatal("a destroyed recovered session is still in the ledger")
	}
}

// TestRecoveryAlwaysSweeps: with an empty (in-memory) ledger the provider
// is still asked, with nothing to keep: its sweep of what a crash left
// runs at every start.
func TestRecoveryAlwaysSweeps(t *testing.T) {
	f := &recProvider{fakeProvider: fakeProvider{iso: "none"}}
	sb, err := kit.New(f, kit.Options{Policy: open, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	if f.called != 1 || len(f.kept) != 0 {
		t.Fatalf("Recover called %d times with %d kept; want once with none", f.called, len(f.kept))
	}
}

type closingProvider struct {
	recProvider
	closed bool
}

func (c *closingProvider) Close() error { c.closed = true; return nil }

// TestRecoveryFailureFailsNew: a sweep that fails fails New, which closes
// the ledger and the provider.
func TestRecoveryFailureFailsNew(t *testing.T) {
	l := newLogLedger()
	f := &closingProvider{recProvider: recProvider{fakeProvider: fakeProvider{iso: "none"}, sweepErr: errors.New("cannot unmount")}}
	if _, err := kit.New(f, kit.Options{Policy: open, ReapInterval: -1, Ledger: l}); err == nil {
		t.Fatal("New succeeded with a failing sweep")
	}
	if !l.closed || !f.closed {
		t.Fatalf("ledger closed %v, provider closed %v; want both", l.closed, f.closed)
	}
}

type abandonProvider struct {
	recProvider
	abandoned bool
}

func (a *abandonProvider) Abandon() { a.abandoned = true }

// TestAbandon: as a SIGKILL would leave it: nothing destroyed, the
// provider told to let go, the ledger closed with the session still live
// in it; a later Close does nothing.
func TestAbandon(t *testing.T) {
	l := newLogLedger()
	f := &abandonProvider{recProvider: recProvider{fakeProvider: fakeProvider{iso: "none"}}}
	sb, err := kit.New(f, kit.Options{Policy: open, ReapInterval: 10 * time.Millisecond, Ledger: l})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sb.CreateSession(context.Background(), spec())
	if err != nil {
		t.Fatal(err)
	}
	sb.Abandon()
	if err := sb.Close(context.Background()); err != nil {
		t.Fatalf("Close after Abandon: %v", err)
	}
	if f.destroyed.Load() != 0 || !f.abandoned || !l.closed {
		t.Fatalf("destroyed %d, provider abandoned %v, ledger closed %v; want 0, true, true", f.destroyed.Load(), f.abandoned, l.closed)
	}
	if r, ok := l.get(t, s.ID()); !ok || r.State != kit.StateLive {
		t.Fatalf("the abandoned session's record: %+v %v; want it live", r, ok)
	}
	if _, err := sb.CreateSession(context.Background(), spec()); err == nil {
		t.Fatal("a create on an abandoned sandbox succeeded")
	}
}
