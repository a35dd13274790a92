package kit_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"go.uber.org/goleak"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeProvider records what the kit hands it.
type fakeProvider struct {
	iso       sandbox.Isolation
	shared    bool
	rejectCPU bool
	created   atomic.Int32
	destroyed atomic.Int32
	mu        sync.Mutex
	lastPath  kit.Path
	lastExec  kit.ExecRequest
	lastData  []byte
}

func (f *fakeProvider) Name() string                 { return "fake" }
func (f *fakeProvider) Isolation() sandbox.Isolation { return f.iso }
func (f *fakeProvider) SharedFilesystem() bool       { return f.shared }
func (f *fakeProvider) Check(spec sandbox.SessionSpec) error {
	if f.rejectCPU && spec.CPU > 0 {
		return &sandbox.SpecRejectedError{Field: "cpu", Reason: sandbox.ReasonUnenforceable, Message: "no cgroups"}
	}
	return nil
}
func (f *fakeProvider) Create(_ context.Context, req kit.CreateRequest) (kit.Resources, error) {
	f.created.Add(1)
	return &fakeRes{f: f, ws: "/ws/" + req.ID}, nil
}

type fakeRes struct {
	f  *fakeProvider
	ws string
}

func (r *fakeRes) WorkspacePath() string { return r.ws }
func (r *fakeRes) Exec(_ context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	r.f.mu.Lock()
	r.f.lastExec = req
	r.f.mu.Unlock()
	return sandbox.ExecResult{}, nil
}
func (r *fakeRes) ExecStart(context.Context, kit.ExecRequest) (sandbox.ExecHandle, error) {
	return nil, errors.New("not in the fake")
}
func (r *fakeRes) PutFile(_ context.Context, p kit.Path, data []byte) error {
	r.f.mu.Lock()
	r.f.lastPath = p
	r.f.lastData = data
	r.f.mu.Unlock()
	return nil
}
func (r *fakeRes) GetFile(_ context.Context, p kit.Path) ([]byte, error) {
	r.f.mu.Lock()
	r.f.lastPath = p
	r.f.mu.Unlock()
	return r.f.lastData, nil
}
func (r *fakeRes) Destroy(context.Context) error { r.f.destroyed.Add(1); return nil }

var open = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}

func newKit(t *testing.T, f kit.Provider, p sandbox.Policy, reap time.Duration) *kit.Sandbox {
	t.Helper()
	sb, err := kit.New(f, kit.Options{Policy: p, ReapInterval: reap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb
}

func spec() sandbox.SessionSpec {
	return sandbox.SessionSpec{Image: "img", Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: 60}
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := kit.New(nil, kit.Options{Policy: open}); err == nil {
		t.Error("a nil provider must be refused")
	}
	if _, err := kit.New(&fakeProvider{iso: "none"}, kit.Options{Policy: sandbox.Policy{Egress: "wide", Isolation: "none"}}); err == nil {
		t.Error("an invalid policy must be refused")
	}
	if _, err := kit.New(&fakeProvider{iso: "bogus"}, kit.Options{Policy: open}); err == nil {
		t.Error("a provider with an invalid isolation must be refused")
	}
}

func TestDefaults(t *testing.T) {
	sb := newKit(t, &fakeProvider{iso: "none"}, open, 0)
	if sb.ExecDefaultTimeout() != kit.DefaultExecTimeout || sb.ReapInterval() != kit.DefaultReapInterval {
		t.Errorf("defaults: %v %v", sb.ExecDefaultTimeout(), sb.ReapInterval())
	}
}

// The chokepoint: invalid, then policy, then unenforceable; each says which
// rule, and nothing reaches the provider.
func TestChokepoint(t *testing.T) {
	cases := []struct {
		name   string
		iso    sandbox.Isolation
		policy sandbox.Policy
		mut    func(*sandbox.SessionSpec)
		field  string
		reason sandbox.RejectReason
	}{
		{"invalid ttl", "none", open, func(s *sandbox.SessionSpec) { s.TTLSeconds = 0 }, "ttl_seconds", sandbox.ReasonInvalid},
		{"invalid before policy", "none", sandbox.Policy{Egress: "none", Isolation: "none"}, func(s *sandbox.SessionSpec) { s.Network = "egress"; s.Image = "" }, "image", sandbox.ReasonInvalid},
		{"network over ceiling", "none", sandbox.Policy{Egress: "internal", Isolation: "none"}, func(s *sandbox.SessionSpec) { s.Network = "egress" }, "network", sandbox.ReasonPolicy},
		{"internal over none", "none", sandbox.Policy{Egress: "none", Isolation: "none"}, func(s *sandbox.SessionSpec) { s.Network = "internal" }, "network", sandbox.ReasonPolicy},
		{"isolation below floor", "vm", sandbox.Policy{Egress: "egress", Isolation: "container"}, func(s *sandbox.SessionSpec) { s.Isolation = "none" }, "isolation", sandbox.ReasonPolicy},
		{"provider level below floor", "none", sandbox.Policy{Egress: "egress", Isolation: "container"}, func(_ *sandbox.SessionSpec) {}, "isolation", sandbox.ReasonPolicy},
		{"persistent while not durable", "none", sandbox.Policy{Egress: "egress", Isolation: "none"}, func(s *sandbox.SessionSpec) { s.Durability = "persistent"; s.WorkspaceKey = "k" }, "durability", sandbox.ReasonPolicy},
		{"isolation above provider", "none", open, func(s *sandbox.SessionSpec) { s.Isolation = "vm" }, "isolation", sandbox.ReasonUnenforceable},
		{"provider check", "none", open, func(s *sandbox.SessionSpec) { s.CPU = 1 }, "cpu", sandbox.ReasonUnenforceable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeProvider{iso: c.iso, rejectCPU: true}
			sb := newKit(t, f, c.policy, -1)
			s := spec()
			c.mut(&s)
			_, err := sb.CreateSession(context.Background(), s)
			var rej *sandbox.SpecRejectedError
			if !errors.As(err, &rej) {
				t.Fatalf("want *SpecRejectedError, got %v", err)
			}
			if rej.Field != c.field || rej.Reason != c.reason {
				t.Errorf("got field %q reason %q (%v), want %q %q", rej.Field, rej.Reason, err, c.field, c.reason)
			}
			if f.created.Load() != 0 {
				t.Error("a rejected spec reached the provider")
			}
			if l, _ := sb.ListSessions(context.Background()); len(l) != 0 {
				t.Errorf("a rejected create left %d sessions", len(l))
			}
		})
	}
	// A spec within the policy, asking for less isolation than the
	// provider gives, gets at least what it asked for.
	sb := newKit(t, &fakeProvider{iso: "vm"}, sandbox.Policy{Egress: "egress", Isolation: "none"}, -1)
	s := spec()
	s.Isolation = "container"
	if _, err := sb.CreateSession(context.Background(), s); err != nil {
		t.Errorf("a weaker request on a stronger provider: %v", err)
	}
}

func TestResolve(t *testing.T) {
	const ws = "/state/ws"
	cases := []struct {
		path       string
		allowEmpty bool
		shared     bool
		rel, abs   string
		refused    bool
	}{
		{"", true, true, ".", ws, false},
		{"", false, true, "", "", true},
		{"a/b", false, true, "a/b", ws + "/a/b", false},
		{"./a//b/", false, true, "a/b", ws + "/a/b", false},
		{"a/../b", false, true, "b", ws + "/b", false},
		{"..", false, true, "", "", true},
		{"../x", false, true, "", "", true},
		{"a/../../x", false, true, "", "", true},
		{ws + "/f", false, true, "f", ws + "/f", false},
		{ws, true, true, ".", ws, false},
		{ws + "/../ws2/f", false, true, "", "", true},
		{"/state/wsx/f", false, true, "", "", true},
		{"/etc/passwd", false, true, "", "", true},
		{"/etc/passwd", false, false, "", "/etc/passwd", false},
		{"a\x00b", false, true, "", "", true},
	}
	for _, c := range cases {
		p, err := kit.Resolve("op", ws, c.path, c.allowEmpty, c.shared)
		if c.refused {
			var se *sandbox.SandboxError
			if !errors.As(err, &se) || errors.Is(err, sandbox.ErrFileNotFound) {
				t.Errorf("Resolve(%q): want a plain SandboxError, got %v", c.path, err)
			} else if !strings.Contains(err.Error(), "refused") {
				t.Errorf("Resolve(%q): the message should say it is refused: %v", c.path, err)
			}
			continue
		}
		if err != nil || p.Rel != c.rel || p.Abs != c.abs || p.Orig != c.path {
			t.Errorf("Resolve(%q) = %+v, %v; want rel %q abs %q", c.path, p, err, c.rel, c.abs)
		}
	}
}

func TestExecRequestShaping(t *testing.T) {
	f := &fakeProvider{iso: "none", shared: true}
	sb := newKit(t, f, open, -1)
	s := spec()
	s.Env = sandbox.SecretEnv(map[string]string{"A": "spec", "B": "spec"})
	sess, err := sb.CreateSession(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := sess.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Env: sandbox.SecretEnv(map[string]string{"B": "exec", "C": "exec"}), Timeout: time.Second, Cwd: "sub"}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	req := f.lastExec
	f.mu.Unlock()
	if req.Env["A"].Reveal() != "spec" || req.Env["B"].Reveal() != "exec" || req.Env["C"].Reveal() != "exec" {
		t.Errorf("env overlay: exec keys must win on collision: A=%s B=%s C=%s", req.Env["A"].Reveal(), req.Env["B"].Reveal(), req.Env["C"].Reveal())
	}
	if req.Cwd.Rel != "sub" || req.Timeout != time.Second {
		t.Errorf("cwd/timeout: %+v", req)
	}
	bad := []struct {
		argv []string
		opts sandbox.ExecOptions
	}{
		{[]string{"x"}, sandbox.ExecOptions{}},
		{[]string{"x"}, sandbox.ExecOptions{Timeout: -time.Second}},
		{nil, sandbox.ExecOptions{Timeout: time.Second}},
		{[]string{""}, sandbox.ExecOptions{Timeout: time.Second}},
		{[]string{"x", "a\x00"}, sandbox.ExecOptions{Timeout: time.Second}},
		{[]string{"x"}, sandbox.ExecOptions{Timeout: time.Second, Env: map[string]sandbox.Secret{"A=B": {}}}},
		{[]string{"x"}, sandbox.ExecOptions{Timeout: time.Second, Env: map[string]sandbox.Secret{"A": sandbox.NewSecret("top\x00secret")}}},
		{[]string{"x"}, sandbox.ExecOptions{Timeout: time.Second, Cwd: "../up"}},
		{[]string{"x"}, sandbox.ExecOptions{Timeout: time.Second, Cwd: "/etc"}},
	}
	for _, b := range bad {
		_, err := sess.Exec(ctx, b.argv, b.opts)
		if !errors.Is(err, sandbox.ErrSandbox) || errors.Is(err, sandbox.ErrSessionNotFound) {
			t.Errorf("Exec(%q, %+v): want a SandboxError, got %v", b.argv, b.opts.Cwd, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error shows an env value: %v", err)
		}
	}
	if _, err := sess.ExecStart(ctx, []string{"x"}, sandbox.StartOptions{}); !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("ExecStart without a timeout: %v", err)
	}
}

// userProvider is the fake as a kit.UserRunner.
type userProvider struct{ *fakeProvider }

func (userProvider) RunsExecsAsUsers() {}

// The kit hands a valid user to a provider that runs execs as users,
// refuses a malformed one before the provider sees it, and refuses any
// user on a provider that is no kit.UserRunner rather than let it run the
// exec as its default user.
func TestExecUser(t *testing.T) {
	ctx := context.Background()
	f := &fakeProvider{iso: "none"}
	sess, err := newKit(t, userProvider{f}, open, -1).CreateSession(ctx, spec())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"", "nobody", "65534", "1000:1000"} {
		if _, err := sess.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second, User: u}); err != nil {
			t.Fatalf("Exec as %q: %v", u, err)
		}
		f.mu.Lock()
		got := f.lastExec.User
		f.mu.Unlock()
		if got != u {
			t.Errorf("Exec as %q: the provider got user %q", u, got)
		}
	}
	f.mu.Lock()
	f.lastExec = kit.ExecRequest{}
	f.mu.Unlock()
	for _, u := range []string{"a:b", "ro\x00ot", "-1", "4294967295", strings.Repeat("u", sandbox.MaxUserLen+1)} {
		_, err := sess.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second, User: u})
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != "exec" || errors.Is(err, sandbox.ErrUserNotFound) {
			t.Errorf("Exec as %q: %v; want a plain *SandboxError of op exec", u, err)
		}
		_, err = sess.ExecStart(ctx, []string{"x"}, sandbox.StartOptions{Timeout: time.Second, User: u})
		if !errors.As(err, &se) || se.Op != "exec_start" {
			t.Errorf("ExecStart as %q: %v; want a plain *SandboxError of op exec_start", u, err)
		}
	}
	f.mu.Lock()
	if f.lastExec.Argv != nil {
		t.Errorf("the provider got an exec with a malformed user: %+v", f.lastExec)
	}
	f.mu.Unlock()

	plain := &fakeProvider{iso: "none"}
	other, err := newKit(t, plain, open, -1).CreateSession(ctx, spec())
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second, User: "nobody"})
	if !errors.Is(err, sandbox.ErrSandbox) || !strings.Contains(err.Error(), `"nobody"`) || !strings.Contains(err.Error(), "fake") {
		t.Errorf("Exec as nobody on a provider that runs no user: %v; want a *SandboxError naming the user and the provider", err)
	}
	plain.mu.Lock()
	if plain.lastExec.Argv != nil {
		t.Errorf("a provider that runs no user got an exec with one: %+v", plain.lastExec)
	}
	plain.mu.Unlock()
	if _, err := other.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
		t.Errorf("Exec without a user on a provider that runs no user: %v", err)
	}
}

func TestTouchAndExpiry(t *testing.T) {
	sb := newKit(t, &fakeProvider{iso: "none"}, open, -1)
	ctx := context.Background()
	s := spec()
	s.TTLSeconds = 3600
	long, _ := sb.CreateSession(ctx, s)
	before, _ := long.Info(ctx)
	if err := long.Touch(ctx); err != nil {
		t.Fatal(err)
	}
	after, _ := long.Info(ctx)
	if after.ExpiresAt.Before(before.ExpiresAt) {
		t.Errorf("touch shortened a life: %v -> %v", before.ExpiresAt, after.ExpiresAt)
	}
	if !before.ExpiresAt.Equal(before.CreatedAt.Add(time.Hour)) {
		t.Errorf("expires_at = created_at + ttl: %v vs %v", before.ExpiresAt, before.CreatedAt)
	}

	s.TTLSeconds = 1
	short1, _ := sb.CreateSession(ctx, s)
	short2, _ := sb.CreateSession(ctx, s)
	time.Sleep(1100 * time.Millisecond)
	for _, sess := range []sandbox.Session{short1, short2} {
		if _, err := sb.GetSession(ctx, sess.ID()); !errors.Is(err, sandbox.ErrSessionNotFound) {
			t.Errorf("an expired session must be not found at once: %v", err)
		}
		if err := sess.Touch(ctx); !errors.Is(err, sandbox.ErrSessionNotFound) {
			t.Errorf("touch of an expired session: %v", err)
		}
	}
	if l, _ := sb.ListSessions(ctx); len(l) != 1 || l[0].ID != long.ID() {
		t.Errorf("list shows only the live session: %+v", l)
	}
	ids, err := sb.Reap(ctx)
	want := []string{short1.ID(), short2.ID()}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	if err != nil || len(ids) != 2 || ids[0] != want[0] || ids[1] != want[1] {
		t.Errorf("Reap = %v, %v; want exactly %v", ids, err, want)
	}
	if ids, _ := sb.Reap(ctx); len(ids) != 0 {
		t.Errorf("a second reap found %v", ids)
	}
	if n := sb.ReapedCount(); n != 2 {
		t.Errorf("ReapedCount = %d after reaping 2 sessions; want 2", n)
	}
}

func TestBackgroundReaper(t *testing.T) {
	f := &fakeProvider{iso: "none"}
	sb := newKit(t, f, open, 20*time.Millisecond)
	s := spec()
	s.TTLSeconds = 1
	if _, err := sb.CreateSession(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.destroyed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the background reaper did not destroy an expired session")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPersistentKey(t *testing.T) {
	f := &fakeProvider{iso: "none"}
	sb := newKit(t, f, open, -1)
	ctx := context.Background()
	s := spec()
	s.Durability, s.WorkspaceKey = sandbox.Persistent, "proj"
	first, err := sb.CreateSession(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.CreateSession(ctx, s)
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Reason != sandbox.ReasonConflict || !strings.Contains(err.Error(), first.ID()) {
		t.Fatalf("a second live session on a key: want a conflict naming %s, got %v", first.ID(), err)
	}
	if err := first.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.CreateSession(ctx, s); err != nil {
		t.Fatalf("the key is free after destroy: %v", err)
	}
	// An expired holder frees the key at once.
	s.WorkspaceKey, s.TTLSeconds = "short", 1
	old, _ := sb.CreateSession(ctx, s)
	time.Sleep(1100 * time.Millisecond)
	if _, err := sb.CreateSession(ctx, s); err != nil {
		t.Fatalf("an expired holder must not block its key: %v", err)
	}
	if _, err := sb.GetSession(ctx, old.ID()); !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("the expired holder is gone: %v", err)
	}
}

func TestDestroyIdempotentAndConcurrent(t *testing.T) {
	f := &fakeProvider{iso: "none"}
	sb := newKit(t, f, open, -1)
	ctx := context.Background()
	sess, _ := sb.CreateSession(ctx, spec())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := sb.DestroySession(ctx, sess.ID()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if f.destroyed.Load() != 1 {
		t.Errorf("resources destroyed %d times, want once", f.destroyed.Load())
	}
	if err := sb.DestroySession(ctx, "sb-unknown"); err != nil {
		t.Errorf("destroying an unknown id is a no-op: %v", err)
	}
	if _, err := sess.Info(ctx); !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("info after destroy: %v", err)
	}
	if _, err := sess.GetFile(ctx, "x"); !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("get_file after destroy: %v", err)
	}
}

func TestCloseDestroysAll(t *testing.T) {
	f := &fakeProvider{iso: "none"}
	sb, err := kit.New(f, kit.Options{Policy: open, ReapInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		_, _ = sb.CreateSession(ctx, spec())
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if f.destroyed.Load() != 3 {
		t.Errorf("Close destroyed %d of 3 sessions", f.destroyed.Load())
	}
	if _, err := sb.CreateSession(ctx, spec()); !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("create after Close: %v", err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// A provider without kit.FileStreamer still gets sessions that implement
// sandbox.FileStreamer, through PutFile and GetFile, under the same path
// rules and liveness checks.
func TestFileStreamerFallback(t *testing.T) {
	f := &fakeProvider{iso: "none"}
	sb := newKit(t, f, open, -1)
	ctx := context.Background()
	sess, err := sb.CreateSession(ctx, spec())
	if err != nil {
		t.Fatal(err)
	}
	fs, ok := sess.(sandbox.FileStreamer)
	if !ok {
		t.Fatalf("a kit session (%T) does not implement sandbox.FileStreamer", sess)
	}
	if err := fs.PutFileFrom(ctx, "a/b.txt", strings.NewReader("streamed")); err != nil {
		t.Fatal(err)
	}
	if f.lastPath.Rel != "a/b.txt" || string(f.lastData) != "streamed" {
		t.Errorf("the provider got PutFile(%q, %q); want (a/b.txt, streamed)", f.lastPath.Rel, f.lastData)
	}
	rc, size, err := fs.OpenFile(ctx, "a/b.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if size != 8 || string(got) != "streamed" {
		t.Errorf("OpenFile = %q (size %d); want the provider's bytes", got, size)
	}
	if err := fs.PutFileFrom(ctx, "../out", strings.NewReader("x")); !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("PutFileFrom(../out) = %v; want a refusal", err)
	}
	if err := fs.PutFileFrom(ctx, "x", iotest.ErrReader(errors.New("broken"))); err == nil || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("PutFileFrom with a failing reader = %v; want a *SandboxError", err)
	}
	if err := sess.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fs.OpenFile(ctx, "a/b.txt"); !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("OpenFile after destroy = %v; want SessionNotFoundError", err)
	}
	if err := fs.PutFileFrom(ctx, "a/b.txt", strings.NewReader("x")); !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("PutFileFrom after destroy = %v; want SessionNotFoundError", err)
	}
}
