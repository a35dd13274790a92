package kit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// world is what several sandboxes over one shared ledger share: the
// ledger's store and the sessions themselves (their files, whether they
// were torn down), as a cluster would hold them.
type world struct {
	store *kit.MemoryLedger

	mu         sync.Mutex
	files      map[string][]byte // id + "\x00" + path -> content
	destroyed  map[string]int    // id -> how many times torn down
	workspaces map[string]bool   // persistent keys
}

func newWorld() *world {
	return &world{store: kit.NewMemoryLedger(), files: map[string][]byte{}, destroyed: map[string]int{}, workspaces: map[string]bool{}}
}

func (w *world) destroys(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.destroyed[id]
}

// view is one sandbox's kit.SharedLedger over the world's store: a
// MemoryLedger read through Get, with a Reaping flag the test sets (the
// Lease). A Put of a live or destroying record the store no longer holds
// fails, as an update of an object another sandbox deleted does.
type view struct {
	w       *world
	reaping atomic.Bool
	failGet atomic.Bool
	gets    atomic.Int32
}

var _ kit.SharedLedger = (*view)(nil)

func (v *view) Load(ctx context.Context) ([]kit.Record, error) { return v.w.store.Load(ctx) }
func (v *view) Delete(ctx context.Context, id string) error    { return v.w.store.Delete(ctx, id) }
func (v *view) Close() error                                   { return nil }
func (v *view) Reaping() bool                                  { return v.reaping.Load() }

func (v *view) Put(ctx context.Context, r kit.Record) error {
	if r.State != kit.StateCreating {
		if _, ok, _ := v.Get(ctx, r.ID); !ok {
			return fmt.Errorf("session %s: no such record", r.ID)
		}
	}
	return v.w.store.Put(ctx, r)
}

func (v *view) Get(ctx context.Context, id string) (kit.Record, bool, error) {
	v.gets.Add(1)
	if v.failGet.Load() {
		return kit.Record{}, false, errors.New("the watch is not synced")
	}
	all, err := v.w.store.Load(ctx)
	if err != nil {
		return kit.Record{}, false, err
	}
	for _, r := range all {
		if r.ID == id {
			return r, true, nil
		}
	}
	return kit.Record{}, false, nil
}

// sharedProvider is the fake provider as a kit.Adopter over a world, its
// Resources kit.Detachers.
type sharedProvider struct {
	fakeProvider
	w          *world
	adopted    atomic.Int32
	detached   atomic.Int32
	adoptDelay time.Duration
	mu         sync.Mutex
	kept       []kit.Kept
}

func (p *sharedProvider) Create(_ context.Context, req kit.CreateRequest) (kit.Resources, error) {
	p.created.Add(1)
	if req.Spec.Durability == sandbox.Persistent {
		p.w.mu.Lock()
		p.w.workspaces[req.Spec.WorkspaceKey] = true
		p.w.mu.Unlock()
	}
	return &sharedRes{fakeRes: fakeRes{f: &p.fakeProvider, ws: "/ws/" + req.ID}, p: p, id: req.ID}, nil
}

func (p *sharedProvider) Adopt(_ context.Context, k kit.Kept) (kit.Resources, error) {
	p.adopted.Add(1)
	p.mu.Lock()
	p.kept = append(p.kept, k)
	p.mu.Unlock()
	time.Sleep(p.adoptDelay)
	return &sharedRes{fakeRes: fakeRes{f: &p.fakeProvider, ws: "/ws/" + k.ID}, p: p, id: k.ID}, nil
}

func (p *sharedProvider) Workspaces(context.Context) ([]sandbox.WorkspaceInfo, error) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	var out []sandbox.WorkspaceInfo
	for k := range p.w.workspaces {
		out = append(out, sandbox.WorkspaceInfo{Key: k})
	}
	return out, nil
}

func (p *sharedProvider) RemoveWorkspace(_ context.Context, key string) error {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	if !p.w.workspaces[key] {
		return &sandbox.WorkspaceNotFoundError{Key: key}
	}
	delete(p.w.workspaces, key)
	return nil
}

type sharedRes struct {
	fakeRes
	p  *sharedProvider
	id string
}

func (r *sharedRes) Detach() { r.p.detached.Add(1) }

func (r *sharedRes) Destroy(ctx context.Context) error {
	r.p.w.mu.Lock()
	r.p.w.destroyed[r.id]++
	r.p.w.mu.Unlock()
	return r.fakeRes.Destroy(ctx)
}

func (r *sharedRes) PutFile(_ context.Context, p kit.Path, data []byte) error {
	r.p.w.mu.Lock()
	defer r.p.w.mu.Unlock()
	r.p.w.files[r.id+"\x00"+p.Rel] = slices.Clone(data)
	return nil
}

func (r *sharedRes) GetFile(_ context.Context, p kit.Path) ([]byte, error) {
	r.p.w.mu.Lock()
	defer r.p.w.mu.Unlock()
	data, ok := r.p.w.files[r.id+"\x00"+p.Rel]
	if !ok {
		return nil, &sandbox.FileNotFoundError{Path: p.Orig}
	}
	return data, nil
}

// daemon is one sandbox of a world.
type daemon struct {
	sb   *kit.Sandbox
	prov *sharedProvider
	v    *view
}

func newDaemon(t *testing.T, w *world, reaping bool) *daemon {
	t.Helper()
	d := &daemon{prov: &sharedProvider{fakeProvider: fakeProvider{iso: "none"}, w: w}, v: &view{w: w}}
	d.v.reaping.Store(reaping)
	sb, err := kit.New(d.prov, kit.Options{Policy: open, ReapInterval: -1, Ledger: d.v})
	if err != nil {
		t.Fatal(err)
	}
	d.sb = sb
	t.Cleanup(func() { sb.Close(context.Background()) })
	return d
}

func notFound(err error) bool { return errors.Is(err, sandbox.ErrSessionNotFound) }

// A session created on A is served by B: adopted once from its record
// (env and handle included), even under concurrent lookups, its files
// the same session's.
func TestSharedAdopt(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, false)
	b.prov.adoptDelay = 50 * time.Millisecond
	s := spec()
	s.Env = sandbox.SecretEnv(map[string]string{"TOKEN": "v"})
	s.Labels = map[string]string{"team": "x"}
	onA, err := a.sb.CreateSession(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := onA.PutFile(ctx, "f", []byte("from A")); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	got := make([]sandbox.Session, 20)
	for i := range got {
		wg.Go(func() {
			sess, err := b.sb.GetSession(ctx, onA.ID())
			if err != nil {
				t.Error(err)
			}
			got[i] = sess
		})
	}
	wg.Wait()
	if n := b.prov.adopted.Load(); n != 1 {
		t.Fatalf("20 concurrent lookups adopted %d times; want once", n)
	}
	if a.prov.adopted.Load() != 0 || b.prov.created.Load() != 0 {
		t.Error("A adopted, or B created, a session")
	}
	onB := got[0]
	for _, g := range got {
		if g != onB {
			t.Fatal("concurrent lookups got different sessions")
		}
	}
	b.prov.mu.Lock()
	k := b.prov.kept[0]
	b.prov.mu.Unlock()
	if k.ID != onA.ID() || k.Spec.Env["TOKEN"].Reveal() != "v" || k.Spec.Image != "img" {
		t.Errorf("Adopt got %+v; want the record's id and spec, env included", k)
	}

	data, err := onB.GetFile(ctx, "f")
	if err != nil || string(data) != "from A" {
		t.Errorf("get on B = %q, %v; want A's file", data, err)
	}
	if err := onB.PutFile(ctx, "g", []byte("from B")); err != nil {
		t.Fatal(err)
	}
	if data, err := onA.GetFile(ctx, "g"); err != nil || string(data) != "from B" {
		t.Errorf("get on A = %q, %v; want B's file", data, err)
	}
	if _, err := onB.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	b.prov.mu.Lock()
	env := b.prov.lastExec.Env
	b.prov.mu.Unlock()
	if env["TOKEN"].Reveal() != "v" {
		t.Error("an exec on the adopted session lacks the spec's env")
	}
	ia, _ := onA.Info(ctx)
	ib, err := onB.Info(ctx)
	if err != nil || !ia.CreatedAt.Equal(ib.CreatedAt) || !ia.ExpiresAt.Equal(ib.ExpiresAt) || ib.Labels["team"] != "x" || ib.WorkspacePath != ia.WorkspacePath {
		t.Errorf("info on B %+v (%v); want A's %+v", ib, err, ia)
	}
	if _, err := b.sb.GetSession(ctx, "sb-nosuch"); !notFound(err) {
		t.Errorf("an id no record names: %v", err)
	}
	if b.prov.adopted.Load() != 1 {
		t.Errorf("adopted %d times; want once", b.prov.adopted.Load())
	}
}

// A touch on B is A's expires_at too.
func TestSharedTouch(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, false)
	onA, err := a.sb.CreateSession(ctx, spec())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := onA.Info(ctx)
	time.Sleep(20 * time.Millisecond)
	onB, err := b.sb.GetSession(ctx, onA.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := onB.Touch(ctx); err != nil {
		t.Fatal(err)
	}
	touched, _ := onB.Info(ctx)
	after, err := onA.Info(ctx)
	if err != nil || !after.ExpiresAt.After(before.ExpiresAt) || !after.ExpiresAt.Equal(touched.ExpiresAt) {
		t.Errorf("A's expires_at %v -> %v (%v); want B's touch, %v", before.ExpiresAt, after.ExpiresAt, err, touched.ExpiresAt)
	}
	if l, _ := a.sb.ListSessions(ctx); len(l) != 1 || !l[0].ExpiresAt.Equal(touched.ExpiresAt) {
		t.Errorf("A's list: %+v", l)
	}
}

// A destroy on B is seen by A's held Session value: not found, and A's
// resources detached, not destroyed.
func TestSharedDestroyElsewhere(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, false)
	onA, err := a.sb.CreateSession(ctx, spec())
	if err != nil {
		t.Fatal(err)
	}
	other, _ := a.sb.CreateSession(ctx, spec())
	if err := b.sb.DestroySession(ctx, onA.ID()); err != nil {
		t.Fatal(err)
	}
	if b.prov.adopted.Load() != 1 || w.destroys(onA.ID()) != 1 {
		t.Fatalf("B adopted %d, the session was torn down %d times; want 1 and 1", b.prov.adopted.Load(), w.destroys(onA.ID()))
	}
	if _, err := onA.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second}); !notFound(err) {
		t.Errorf("exec through A's held Session after B's destroy: %v", err)
	}
	if a.prov.detached.Load() != 1 || a.prov.destroyed.Load() != 0 {
		t.Errorf("A detached %d and destroyed %d; want 1 and 0", a.prov.detached.Load(), a.prov.destroyed.Load())
	}
	for name, err := range map[string]error{
		"info":   func() error { _, err := onA.Info(ctx); return err }(),
		"touch":  onA.Touch(ctx),
		"get":    func() error { _, err := onA.GetFile(ctx, "f"); return err }(),
		"put":    onA.PutFile(ctx, "f", nil),
		"lookup": func() error { _, err := a.sb.GetSession(ctx, onA.ID()); return err }(),
		"start": func() error {
			_, err := onA.ExecStart(ctx, []string{"x"}, sandbox.StartOptions{Timeout: time.Second})
			return err
		}(),
		"lookupB": func() error { _, err := b.sb.GetSession(ctx, onA.ID()); return err }(),
	} {
		if !notFound(err) {
			t.Errorf("%s after the destroy elsewhere: %v", name, err)
		}
	}
	if err := onA.Destroy(ctx); err != nil {
		t.Errorf("destroying it again through A: %v", err)
	}
	if err := a.sb.DestroySession(ctx, onA.ID()); err != nil {
		t.Errorf("DestroySession again on A: %v", err)
	}
	if w.destroys(onA.ID()) != 1 || a.prov.detached.Load() != 1 {
		t.Errorf("torn down %d times, detached %d; want once each", w.destroys(onA.ID()), a.prov.detached.Load())
	}

	// A held Session value on A that B destroys by its own held value.
	onB, err := b.sb.GetSession(ctx, other.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := onB.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Touch(ctx); !notFound(err) {
		t.Errorf("touch on A after B destroyed it: %v", err)
	}
	if l, _ := a.sb.ListSessions(ctx); len(l) != 0 {
		t.Errorf("A lists %+v after both were destroyed", l)
	}
}

// A lists every sandbox's sessions, oldest first.
func TestSharedList(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, false)
	var want []string
	for _, d := range []*daemon{a, b, b} {
		s, err := d.sb.CreateSession(ctx, spec())
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, s.ID())
	}
	l, err := a.sb.ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range l {
		ids = append(ids, i.ID)
		if i.Labels == nil || i.WorkspacePath != "/ws/"+i.ID {
			t.Errorf("listed %+v", i)
		}
	}
	if !slices.Equal(ids, want) {
		t.Errorf("A lists %v; want %v", ids, want)
	}
	if a.prov.adopted.Load() != 0 {
		t.Error("listing adopted sessions")
	}
}

// Only the sandbox that reaps destroys an expired session (adopting it);
// the other lets go of its copy.
func TestSharedReap(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, true)
	s := spec()
	s.TTLSeconds = 1
	short, err := a.sb.CreateSession(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	long, _ := a.sb.CreateSession(ctx, spec())
	time.Sleep(1100 * time.Millisecond)
	for _, d := range []*daemon{a, b} {
		if _, err := d.sb.GetSession(ctx, short.ID()); !notFound(err) {
			t.Errorf("an expired session is found: %v", err)
		}
	}
	if ids, err := a.sb.Reap(ctx); len(ids) != 0 || err != nil {
		t.Errorf("A, not reaping, reaped %v, %v", ids, err)
	}
	if w.destroys(short.ID()) != 0 || a.prov.detached.Load() != 1 {
		t.Errorf("A tore it down %d times, detached %d; want 0 and 1", w.destroys(short.ID()), a.prov.detached.Load())
	}
	ids, err := b.sb.Reap(ctx)
	if err != nil || !slices.Equal(ids, []string{short.ID()}) {
		t.Errorf("B reaped %v, %v; want [%s]", ids, err, short.ID())
	}
	if w.destroys(short.ID()) != 1 || b.sb.ReapedCount() != 1 || a.sb.ReapedCount() != 0 {
		t.Errorf("torn down %d times; reaped counts A %d B %d", w.destroys(short.ID()), a.sb.ReapedCount(), b.sb.ReapedCount())
	}
	if _, ok, _ := a.v.Get(ctx, short.ID()); ok {
		t.Error("the reaped session is still in the ledger")
	}
	if ids, _ := b.sb.Reap(ctx); len(ids) != 0 {
		t.Errorf("a second reap found %v", ids)
	}
	if _, err := a.sb.GetSession(ctx, long.ID()); err != nil {
		t.Errorf("the live session: %v", err)
	}
	if b.prov.adopted.Load() != 1 {
		t.Errorf("B adopted %d sessions; want only the expired one", b.prov.adopted.Load())
	}
}

// The background reaper reaps while the sandbox is the one reaping.
func TestSharedBackgroundReaper(t *testing.T) {
	w := newWorld()
	a := newDaemon(t, w, false)
	v := &view{w: w}
	p := &sharedProvider{fakeProvider: fakeProvider{iso: "none"}, w: w}
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: 20 * time.Millisecond, Ledger: v})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	s := spec()
	s.TTLSeconds = 1
	sess, err := a.sb.CreateSession(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	if w.destroys(sess.ID()) != 0 {
		t.Fatal("a sandbox that is not reaping reaped")
	}
	v.reaping.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for w.destroys(sess.ID()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the background reaper did not reap once it was the one reaping")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close destroys the sessions its sandbox created and detaches the
// adopted ones, which live on.
func TestSharedClose(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, false)
	own, _ := a.sb.CreateSession(ctx, spec())
	theirs, _ := b.sb.CreateSession(ctx, spec())
	if _, err := a.sb.GetSession(ctx, theirs.ID()); err != nil {
		t.Fatal(err)
	}
	if err := a.sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if w.destroys(own.ID()) != 1 || w.destroys(theirs.ID()) != 0 || a.prov.detached.Load() != 1 {
		t.Errorf("Close of A: own torn down %d, adopted torn down %d, detached %d; want 1, 0, 1",
			w.destroys(own.ID()), w.destroys(theirs.ID()), a.prov.detached.Load())
	}
	if _, err := b.sb.GetSession(ctx, own.ID()); !notFound(err) {
		t.Errorf("A's own session after A's Close: %v", err)
	}
	if _, err := theirs.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
		t.Errorf("B's session after A's Close: %v", err)
	}
	if _, err := a.sb.GetSession(ctx, theirs.ID()); !notFound(err) {
		t.Errorf("a closed sandbox adopts: %v", err)
	}
}

// A provider that cannot adopt serves only its own sessions; an adopted
// persistent session holds its key against local creates; a ledger that
// cannot answer is an error, not a destroy.
func TestSharedEdges(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, false)

	plain := &fakeProvider{iso: "none"}
	sb, err := kit.New(plain, kit.Options{Policy: open, ReapInterval: -1, Ledger: &view{w: w}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	sess, _ := a.sb.CreateSession(ctx, spec())
	if _, err := sb.GetSession(ctx, sess.ID()); !notFound(err) {
		t.Errorf("a provider without Adopter found another's session: %v", err)
	}
	if err := sb.DestroySession(ctx, sess.ID()); err != nil || w.destroys(sess.ID()) != 0 {
		t.Errorf("a provider without Adopter destroyed another's session: %v", err)
	}

	s := spec()
	s.Durability, s.WorkspaceKey = sandbox.Persistent, "proj"
	p, err := a.sb.CreateSession(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.sb.GetSession(ctx, p.ID()); err != nil {
		t.Fatal(err)
	}
	var rej *sandbox.SpecRejectedError
	if _, err := b.sb.CreateSession(ctx, s); !errors.As(err, &rej) || rej.Reason != sandbox.ReasonConflict {
		t.Errorf("a create of a key an adopted session holds: %v", err)
	}

	a.v.failGet.Store(true)
	_, err = sess.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second})
	if err == nil || notFound(err) || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("exec while the ledger cannot answer: %v; want a *SandboxError, not not-found", err)
	}
	a.v.failGet.Store(false)
	if _, err := sess.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil || a.prov.detached.Load() != 0 {
		t.Errorf("exec once the ledger answers again: %v (detached %d)", err, a.prov.detached.Load())
	}
	if n := a.v.gets.Load(); n == 0 {
		t.Error("the kit never asked the shared ledger")
	}
}

// The workspace API sees every sandbox's holders: a key a live session
// of A holds is in use on B, neither removable nor creatable there, and
// an expired holder of A is torn down by a create of its key on B.
func TestSharedWorkspaces(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, false), newDaemon(t, w, false)
	s := spec()
	s.Durability, s.WorkspaceKey = sandbox.Persistent, "proj"
	holder, err := a.sb.CreateSession(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := b.sb.ListWorkspaces(ctx)
	if err != nil || len(ws) != 1 || ws[0].Key != "proj" || ws[0].InUseBy != holder.ID() {
		t.Errorf("B's ListWorkspaces = %+v, %v; want proj in use by %s", ws, err, holder.ID())
	}
	var rej *sandbox.SpecRejectedError
	if err := b.sb.RemoveWorkspace(ctx, "proj"); !errors.As(err, &rej) || rej.Reason != sandbox.ReasonConflict || !strings.Contains(err.Error(), holder.ID()) {
		t.Errorf("B removes a key A's live session holds: %v", err)
	}
	if _, err := b.sb.CreateSession(ctx, s); !errors.As(err, &rej) || rej.Reason != sandbox.ReasonConflict {
		t.Errorf("B creates a key A's live session holds: %v", err)
	}
	if b.prov.adopted.Load() != 0 || b.prov.created.Load() != 0 {
		t.Error("B adopted or created for a refused key")
	}

	s.WorkspaceKey, s.TTLSeconds = "short", 1
	old, err := a.sb.CreateSession(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := b.sb.CreateSession(ctx, s); err != nil {
		t.Fatalf("an expired holder elsewhere must not block its key: %v", err)
	}
	if w.destroys(old.ID()) != 1 {
		t.Errorf("the expired holder was torn down %d times; want once", w.destroys(old.ID()))
	}
	if err := holder.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.sb.RemoveWorkspace(ctx, "proj"); err != nil {
		t.Errorf("B removes a key no session holds: %v", err)
	}
}

// Two sandboxes using, touching, destroying and reaping the same sessions
// at once (run under -race): every session ends gone on both, torn down
// at least once and detached at most once per sandbox, and nothing hangs.
func TestSharedConcurrent(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	a, b := newDaemon(t, w, true), newDaemon(t, w, false)
	var ids []string
	for i := range 12 {
		d := a
		if i%2 == 1 {
			d = b
		}
		s, err := d.sb.CreateSession(ctx, spec())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID())
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			d, other := a, b
			if g%2 == 1 {
				d, other = b, a
			}
			for i, id := range ids {
				sess, err := d.sb.GetSession(ctx, id)
				if err == nil {
					_, _ = sess.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second})
					_ = sess.Touch(ctx)
					_, _ = sess.Info(ctx)
				} else if !notFound(err) {
					t.Errorf("GetSession: %v", err)
				}
				_, _ = d.sb.ListSessions(ctx)
				if (i+g)%3 == 0 {
					if err := other.sb.DestroySession(ctx, id); err != nil {
						t.Errorf("DestroySession: %v", err)
					}
				}
				if _, err := d.sb.Reap(ctx); err != nil {
					t.Errorf("Reap: %v", err)
				}
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		_ = a.sb.DestroySession(ctx, id)
		for _, d := range []*daemon{a, b} {
			if _, err := d.sb.GetSession(ctx, id); !notFound(err) {
				t.Errorf("%s after its destroy: %v", id, err)
			}
		}
		if w.destroys(id) == 0 {
			t.Errorf("%s was never torn down", id)
		}
	}
	if l, _ := b.sb.ListSessions(ctx); len(l) != 0 {
		t.Errorf("left listed: %+v", l)
	}
	for _, d := range []*daemon{a, b} {
		if n, held := d.prov.detached.Load(), d.prov.created.Load()+d.prov.adopted.Load(); n > held {
			t.Errorf("detached %d of %d sessions held", n, held)
		}
	}
}
