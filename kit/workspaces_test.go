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

// storeProvider is a fakeProvider that keeps persistent workspaces (a
// kit.WorkspaceStore in memory). A persistent create makes the workspace
// of its key. When block is set, RemoveWorkspace signals entered and waits
// for block to close; createBlock does the same for Create, once the
// workspace is made.
type storeProvider struct {
	*fakeProvider
	mu      sync.Mutex
	ws      map[string]sandbox.WorkspaceInfo
	removed []string
	listErr error
	rmErr   error
	entered chan struct{}
	block   chan struct{}

	createEntered, createBlock chan struct{}
}

var _ kit.WorkspaceStore = (*storeProvider)(nil)

func newStoreProvider() *storeProvider {
	return &storeProvider{fakeProvider: &fakeProvider{iso: "none"}, ws: map[string]sandbox.WorkspaceInfo{}}
}

func (p *storeProvider) Create(ctx context.Context, req kit.CreateRequest) (kit.Resources, error) {
	if req.Spec.Durability == sandbox.Persistent {
		p.mu.Lock()
		if _, ok := p.ws[req.Spec.WorkspaceKey]; !ok {
			p.ws[req.Spec.WorkspaceKey] = sandbox.WorkspaceInfo{Key: req.Spec.WorkspaceKey, ModifiedAt: time.Now().UTC()}
		}
		p.mu.Unlock()
	}
	if p.createEntered != nil {
		p.createEntered <- struct{}{}
		<-p.createBlock
	}
	return p.fakeProvider.Create(ctx, req)
}

func (p *storeProvider) Workspaces(context.Context) ([]sandbox.WorkspaceInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listErr != nil {
		return nil, p.listErr
	}
	var out []sandbox.WorkspaceInfo
	for _, w := range p.ws {
		w.InUseBy = "the provider's guess" // the kit's to set
		out = append(out, w)
	}
	return out, nil // in map order: the kit sorts
}

func (p *storeProvider) RemoveWorkspace(_ context.Context, key string) error {
	if p.entered != nil {
		p.entered <- struct{}{}
		<-p.block
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rmErr != nil {
		return p.rmErr
	}
	if _, ok := p.ws[key]; !ok {
		return &sandbox.WorkspaceNotFoundError{Key: key}
	}
	delete(p.ws, key)
	p.removed = append(p.removed, key)
	return nil
}

func (p *storeProvider) removedKeys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.removed...)
}

func persistentSpec(key string, ttl int) sandbox.SessionSpec {
	s := spec()
	s.Durability, s.WorkspaceKey, s.TTLSeconds = sandbox.Persistent, key, ttl
	return s
}

func newStoreKit(t *testing.T, p *storeProvider) *kit.Sandbox {
	t.Helper()
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb
}

func conflict(t *testing.T, what string, err error, mentions string) {
	t.Helper()
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Field != "workspace_key" || rej.Reason != sandbox.ReasonConflict || !strings.Contains(err.Error(), mentions) {
		t.Errorf("%s = %v; want a workspace_key conflict mentioning %q", what, err, mentions)
	}
}

// A provider without a WorkspaceStore keeps no workspace the kit can see.
func TestWorkspacesWithoutStore(t *testing.T) {
	sb := newKit(t, &fakeProvider{iso: "none"}, open, -1)
	ctx := context.Background()
	if _, err := sb.CreateSession(ctx, persistentSpec("k", 60)); err != nil {
		t.Fatal(err)
	}
	list, err := sb.ListWorkspaces(ctx)
	if err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListWorkspaces = %#v, %v; want an empty, non-nil list", list, err)
	}
	var nf *sandbox.WorkspaceNotFoundError
	if err := sb.RemoveWorkspace(ctx, "k"); !errors.As(err, &nf) || nf.Key != "k" {
		t.Errorf("RemoveWorkspace = %v; want *WorkspaceNotFoundError{k}", err)
	}
}

func TestListWorkspacesInUse(t *testing.T) {
	p := newStoreProvider()
	sb := newStoreKit(t, p)
	ctx := context.Background()
	live, err := sb.CreateSession(ctx, persistentSpec("b-live", 60))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.CreateSession(ctx, persistentSpec("c-expired", 1)); err != nil {
		t.Fatal(err)
	}
	gone, err := sb.CreateSession(ctx, persistentSpec("a-destroyed", 60))
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.CreateSession(ctx, spec()); err != nil { // ephemeral: holds no key
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)

	list, err := sb.ListWorkspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []sandbox.WorkspaceInfo{{Key: "a-destroyed"}, {Key: "b-live", InUseBy: live.ID()}, {Key: "c-expired"}}
	if len(list) != len(want) {
		t.Fatalf("ListWorkspaces = %+v; want %d workspaces", list, len(want))
	}
	for i, w := range want {
		if list[i].Key != w.Key || list[i].InUseBy != w.InUseBy {
			t.Errorf("ListWorkspaces[%d] = %q in use by %q; want %q in use by %q", i, list[i].Key, list[i].InUseBy, w.Key, w.InUseBy)
		}
	}

	p.mu.Lock()
	p.listErr = errors.New("disk on fire")
	p.mu.Unlock()
	_, err = sb.ListWorkspaces(ctx)
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || se.Op != "list_workspaces" || !strings.Contains(err.Error(), "disk on fire") || !strings.Contains(err.Error(), "fake") {
		t.Errorf("a failing store: %v; want a list_workspaces SandboxError naming the provider and the cause", err)
	}
}

func TestRemoveWorkspace(t *testing.T) {
	p := newStoreProvider()
	sb := newStoreKit(t, p)
	ctx := context.Background()
	sess, err := sb.CreateSession(ctx, persistentSpec("proj", 60))
	if err != nil {
		t.Fatal(err)
	}
	// Held by a live session: refused, naming it; the provider is not asked.
	conflict(t, "removing a live session's workspace", sb.RemoveWorkspace(ctx, "proj"), sess.ID())
	if got := p.removedKeys(); len(got) != 0 {
		t.Fatalf("the provider removed %v while a live session held it", got)
	}
	if _, err := sess.Info(ctx); err != nil {
		t.Errorf("the refused removal hurt the session: %v", err)
	}
	if err := sess.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.RemoveWorkspace(ctx, "proj"); err != nil {
		t.Fatalf("removing a free workspace: %v", err)
	}
	if got := p.removedKeys(); len(got) != 1 || got[0] != "proj" {
		t.Errorf("the provider removed %v; want [proj]", got)
	}
	var nf *sandbox.WorkspaceNotFoundError
	if err := sb.RemoveWorkspace(ctx, "proj"); !errors.As(err, &nf) || nf.Key != "proj" {
		t.Errorf("removing it again = %v; want *WorkspaceNotFoundError{proj}", err)
	}
	// The key is free again: a create makes a new workspace.
	if _, err := sb.CreateSession(ctx, persistentSpec("proj", 60)); err != nil {
		t.Errorf("a create after the removal: %v", err)
	}

	// Keys that cannot name a workspace never reach the provider.
	for _, key := range []string{"", "..", "../x", "a/b", strings.Repeat("k", sandbox.MaxWorkspaceKey+1)} {
		err := sb.RemoveWorkspace(ctx, key)
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != "remove_workspace" || errors.Is(err, sandbox.ErrWorkspaceNotFound) || errors.Is(err, sandbox.ErrSpecRejected) {
			t.Errorf("RemoveWorkspace(%q) = %v; want a remove_workspace SandboxError", key, err)
		}
	}

	// A failure of the provider that is not of the sandbox family is wrapped.
	p.mu.Lock()
	p.ws["broken"] = sandbox.WorkspaceInfo{Key: "broken"}
	p.rmErr = errors.New("EBUSY")
	p.mu.Unlock()
	err = sb.RemoveWorkspace(ctx, "broken")
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || se.Op != "remove_workspace" || !strings.Contains(err.Error(), "EBUSY") || !strings.Contains(err.Error(), `"broken"`) {
		t.Errorf("a failing removal = %v; want a remove_workspace SandboxError naming the key and the cause", err)
	}
	// ... and the key is released all the same.
	p.mu.Lock()
	p.rmErr = nil
	p.mu.Unlock()
	if _, err := sb.CreateSession(ctx, persistentSpec("broken", 60)); err != nil {
		t.Errorf("the key stayed held after a failed removal: %v", err)
	}
}

// An expired holder is torn down before the removal, as a create would.
func TestRemoveWorkspaceExpiredHolder(t *testing.T) {
	p := newStoreProvider()
	sb := newStoreKit(t, p)
	ctx := context.Background()
	old, err := sb.CreateSession(ctx, persistentSpec("proj", 1))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if err := sb.RemoveWorkspace(ctx, "proj"); err != nil {
		t.Fatalf("removing the workspace of an expired session: %v", err)
	}
	if n := p.destroyed.Load(); n != 1 {
		t.Errorf("the expired holder was destroyed %d times; want once, before the removal", n)
	}
	if _, err := sb.GetSession(ctx, old.ID()); !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("the expired holder: %v", err)
	}
	if ids, err := sb.Reap(ctx); err != nil || len(ids) != 0 {
		t.Errorf("Reap after the removal = %v, %v; nothing should be left to reap", ids, err)
	}
}

// While the provider removes, the key is held: a create of it and a second
// removal are refused as conflicts; once done, the key is free.
func TestRemoveWorkspaceHoldsKey(t *testing.T) {
	p := newStoreProvider()
	p.entered, p.block = make(chan struct{}), make(chan struct{})
	sb := newStoreKit(t, p)
	ctx := context.Background()
	s, err := sb.CreateSession(ctx, persistentSpec("proj", 60))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sb.RemoveWorkspace(ctx, "proj") }()
	<-p.entered
	_, err = sb.CreateSession(ctx, persistentSpec("proj", 60))
	conflict(t, "a create during the removal", err, "proj")
	conflict(t, "a second removal during the first", sb.RemoveWorkspace(ctx, "proj"), "already being removed")
	if list, err := sb.ListWorkspaces(ctx); err != nil || len(list) != 1 || list[0].InUseBy != "" {
		t.Errorf("ListWorkspaces during the removal = %+v, %v; a removal is not a session using it", list, err)
	}
	if _, err := sb.CreateSession(ctx, persistentSpec("other", 60)); err != nil {
		t.Errorf("another key is not held: %v", err)
	}
	close(p.block)
	if err := <-done; err != nil {
		t.Fatalf("the removal: %v", err)
	}
	if _, err := sb.CreateSession(ctx, persistentSpec("proj", 60)); err != nil {
		t.Errorf("a create after the removal: %v", err)
	}
}

func TestRemoveWorkspaceClosed(t *testing.T) {
	p := newStoreProvider()
	sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := sb.CreateSession(ctx, persistentSpec("proj", 60)); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	err = sb.RemoveWorkspace(ctx, "proj")
	if !errors.Is(err, sandbox.ErrSandbox) || !strings.Contains(err.Error(), "closed") {
		t.Errorf("RemoveWorkspace after Close = %v; want a SandboxError saying the sandbox is closed", err)
	}
	if got := p.removedKeys(); len(got) != 0 {
		t.Errorf("a closed sandbox removed %v", got)
	}
}

// While a session of the key is being created, the key is held: a removal
// is refused naming that session, a second create as one live session per
// key, and the workspace is not yet in use by anyone; once created, the
// session holds it live.
func TestKeyHeldDuringCreate(t *testing.T) {
	p := newStoreProvider()
	p.createEntered, p.createBlock = make(chan struct{}), make(chan struct{})
	sb := newStoreKit(t, p)
	ctx := context.Background()
	type created struct {
		s   sandbox.Session
		err error
	}
	done := make(chan created, 1)
	go func() {
		s, err := sb.CreateSession(ctx, persistentSpec("proj", 60))
		done <- created{s, err}
	}()
	<-p.createEntered
	conflict(t, "a removal during the create", sb.RemoveWorkspace(ctx, "proj"), "being created")
	_, err := sb.CreateSession(ctx, persistentSpec("proj", 60))
	conflict(t, "a second create during the first", err, "one live session per key")
	if list, err := sb.ListWorkspaces(ctx); err != nil || len(list) != 1 || list[0].InUseBy != "" {
		t.Errorf("ListWorkspaces during the create = %+v, %v; a session being created is not using it yet", list, err)
	}
	close(p.createBlock)
	c := <-done
	if c.err != nil {
		t.Fatalf("the create: %v", c.err)
	}
	if list, err := sb.ListWorkspaces(ctx); err != nil || len(list) != 1 || list[0].InUseBy != c.s.ID() {
		t.Errorf("ListWorkspaces after the create = %+v, %v; want proj in use by %s", list, err, c.s.ID())
	}
	conflict(t, "a removal after the create", sb.RemoveWorkspace(ctx, "proj"), c.s.ID())
}
