package sandboxtest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func (s *suite) sandboxClauses() []clause {
	return []clause{
		{"Defaults", s.testDefaults},
		{"GetSession", s.testGetSession},
		{"ListSessions", s.testListSessions},
		{"ConcurrentCreate", s.testConcurrentCreate},
		{"DestroySession", s.testDestroySession},
		{"Reap", s.testReap},
		{"ConcurrentReap", s.testConcurrentReap},
		{"ReapNotEarly", s.testReapNotEarly},
		{"BackgroundReaper", s.testBackgroundReaper},
	}
}

func (s *suite) sessionClauses() []clause {
	return []clause{
		{"Info", s.testInfo},
		{"Touch", s.testTouch},
		{"Expiry", s.testExpiry},
		{"Destroy", s.testDestroy},
		{"DestroyEndsExecs", s.testDestroyEndsExecs},
		{"DestroyEndsLeftovers", s.testDestroyEndsLeftovers},
		{"ConcurrentDestroyAndExec", s.testConcurrentDestroyAndExec},
	}
}

func (s *suite) durabilityClauses() []clause {
	return []clause{
		{"EphemeralEmpty", s.testEphemeralEmpty},
		{"EphemeralNotShared", s.testEphemeralNotShared},
		{"EphemeralRemoved", s.testEphemeralRemoved},
		{"Persistent", s.testPersistent},
		{"PersistentConflict", s.testPersistentConflict},
		{"PersistentSurvivesReap", s.testPersistentSurvivesReap},
		{"PersistentExpiredIsNotLive", s.testPersistentExpiredIsNotLive},
	}
}

// exact is the config of clauses that need exact Reap results: no background
// reaper interferes.
var exact = Config{Policy: permissive, ReapInterval: time.Hour}

func ttl(seconds int) func(*sandbox.SessionSpec) {
	return func(sp *sandbox.SessionSpec) { sp.TTLSeconds = seconds }
}

// wantAllGone fails unless every method of sess but ID, WorkspacePath and
// Destroy returns a *SessionNotFoundError; Destroy is idempotent like
// DestroySession and returns nil.
func wantAllGone(t *testing.T, sess sandbox.Session, why string) {
	t.Helper()
	ctx := callContext(t)
	id := sess.ID()
	if id == "" || sess.WorkspacePath() == "" {
		t.Errorf("ID() = %q, WorkspacePath() = %q %s; both keep their values", id, sess.WorkspacePath(), why)
	}
	_, err := sess.Info(ctx)
	wantGone(t, err, id, "Info "+why)
	_, err = sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: execTimeout})
	wantGone(t, err, id, "Exec "+why)
	h, err := sess.ExecStart(ctx, []string{"true"}, sandbox.StartOptions{Timeout: execTimeout})
	wantGone(t, err, id, "ExecStart "+why)
	if h != nil {
		_ = h.Kill(ctx)
	}
	err = sess.PutFile(ctx, "gone.txt", []byte("x"))
	wantGone(t, err, id, "PutFile "+why)
	_, err = sess.GetFile(ctx, "gone.txt")
	wantGone(t, err, id, "GetFile "+why)
	err = sess.Touch(ctx)
	wantGone(t, err, id, "Touch "+why)
	if err := sess.Destroy(ctx); err != nil {
		t.Errorf("Destroy %s: %v; want nil (idempotent on a gone session)", why, err)
	}
}

// wantListed fails unless ListSessions holds exactly the sessions of ids.
func wantListed(t *testing.T, sb sandbox.Sandbox, ids ...string) []sandbox.SessionInfo {
	t.Helper()
	list, err := sb.ListSessions(callContext(t))
	if err != nil {
		t.Fatalf("ListSessions: %v", err)
	}
	var got []string
	for _, info := range list {
		got = append(got, info.ID)
	}
	slices.Sort(got)
	ids = slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, ids) {
		t.Errorf("ListSessions lists %q; want exactly the live sessions %q", got, ids)
	}
	return list
}

// ExecDefaultTimeout is the configured default (> 0) and ReapInterval the
// cadence the sandbox was made with.
func (s *suite) testDefaults(t *testing.T) {
	sb := s.newSandbox(t, exact)
	if d := sb.ExecDefaultTimeout(); d <= 0 {
		t.Errorf("ExecDefaultTimeout() = %v; want the configured default, > 0", d)
	}
	if d := sb.ReapInterval(); d != exact.ReapInterval {
		t.Errorf("ReapInterval() = %v; want %v, the cadence configured", d, exact.ReapInterval)
	}
}

// GetSession returns a live session by id, and *SessionNotFoundError for an
// unknown one.
func (s *suite) testGetSession(t *testing.T) {
	ctx := s.testContext(t)
	sb, sess := s.fresh(t, nil)
	got, err := sb.GetSession(ctx, sess.ID())
	if err != nil {
		t.Fatalf("GetSession(%q) of a live session: %v", sess.ID(), err)
	}
	if got.ID() != sess.ID() || got.WorkspacePath() != sess.WorkspacePath() {
		t.Errorf("GetSession(%q) returned session %q at %q; want the session %q at %q", sess.ID(), got.ID(), got.WorkspacePath(), sess.ID(), sess.WorkspacePath())
	}
	mustPut(t, ctx, sess, "f.txt", []byte("same"))
	if data := mustGet(t, ctx, got, "f.txt"); string(data) != "same" {
		t.Errorf("the session from GetSession reads %q; want \"same\", the file put through the created one", data)
	}
	const unknown = "tai42-no-such-session"
	_, err = sb.GetSession(ctx, unknown)
	wantGone(t, err, unknown, "GetSession of an unknown id")
}

func equalInfo(a, b sandbox.SessionInfo) bool {
	return a.ID == b.ID && a.Image == b.Image && a.WorkspaceKey == b.WorkspaceKey && a.WorkspacePath == b.WorkspacePath &&
		a.Durability == b.Durability && a.CreatedAt.Equal(b.CreatedAt) && a.ExpiresAt.Equal(b.ExpiresAt) && maps.Equal(a.Labels, b.Labels)
}

// ListSessions returns every live session's state, the same as its Info.
func (s *suite) testListSessions(t *testing.T) {
	ctx := s.testContext(t)
	sb := s.newSandbox(t, Config{Policy: permissive})
	var ids []string
	for i := range 3 {
		sess := s.newSession(t, sb, func(sp *sandbox.SessionSpec) { sp.Labels = map[string]string{"n": strconv.Itoa(i), "app/role": "list"} })
		ids = append(ids, sess.ID())
	}
	for _, info := range wantListed(t, sb, ids...) {
		sess, err := sb.GetSession(ctx, info.ID)
		if err != nil {
			t.Fatalf("GetSession(%q) of a listed session: %v", info.ID, err)
		}
		own, err := sess.Info(ctx)
		if err != nil {
			t.Fatalf("Info: %v", err)
		}
		if !equalInfo(info, own) {
			t.Errorf("ListSessions shows %+v; Info shows %+v; want the same state", info, own)
		}
		if info.CreatedAt.After(info.ExpiresAt) || info.Labels["app/role"] != "list" {
			t.Errorf("ListSessions shows %+v; want created_at <= expires_at and the session's labels", info)
		}
	}
	if err := sb.DestroySession(ctx, ids[0]); err != nil {
		t.Fatalf("DestroySession: %v", err)
	}
	wantListed(t, sb, ids[1:]...)
}

// Sessions may be created concurrently; each is its own.
func (s *suite) testConcurrentCreate(t *testing.T) {
	ctx := s.testContext(t)
	sb := s.newSandbox(t, Config{Policy: permissive})
	sessions := make([]sandbox.Session, 8)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			sess, err := sb.CreateSession(ctx, s.spec(nil))
			if err != nil {
				t.Errorf("concurrent CreateSession: %v", err)
				return
			}
			sessions[i] = sess
		})
	}
	wg.Wait()
	ids, paths := map[string]bool{}, map[string]bool{}
	for _, sess := range sessions {
		if sess == nil {
			continue
		}
		destroyAtCleanup(t, sb, sess.ID())
		if ids[sess.ID()] {
			t.Errorf("two sessions share the id %q", sess.ID())
		}
		// Sessions with filesystems of their own may all see their
		// workspace at one path; on a shared filesystem the paths differ.
		if s.opts.AbsoluteOutsideWorkspaceRefused && paths[sess.WorkspacePath()] {
			t.Errorf("two sessions share the workspace %q", sess.WorkspacePath())
		}
		ids[sess.ID()], paths[sess.WorkspacePath()] = true, true
	}
	wantListed(t, sb, slices.Collect(maps.Keys(ids))...)
}

// DestroySession ends a session for good and is idempotent.
func (s *suite) testDestroySession(t *testing.T) {
	ctx := s.testContext(t)
	sb, sess := s.fresh(t, nil)
	for i := range 2 {
		if err := sb.DestroySession(ctx, sess.ID()); err != nil {
			t.Errorf("DestroySession #%d: %v; it is idempotent on a gone session", i+1, err)
		}
	}
	if err := sb.DestroySession(ctx, "tai42-no-such-session"); err != nil {
		t.Errorf("DestroySession of an unknown id: %v; want nil (idempotent on a gone session)", err)
	}
	_, err := sb.GetSession(ctx, sess.ID())
	wantGone(t, err, sess.ID(), "GetSession of a destroyed session")
	wantListed(t, sb)
	wantAllGone(t, sess, "of a session destroyed with DestroySession")
}

// Reap destroys exactly the expired sessions and returns their ids.
func (s *suite) testReap(t *testing.T) {
	ctx := s.testContext(t)
	sb := s.newSandbox(t, exact)
	a, b := s.newSession(t, sb, ttl(1)), s.newSession(t, sb, ttl(1))
	live := s.newSession(t, sb, ttl(3600))
	waitExpired(t, ctx, a, b)
	ids, err := sb.Reap(ctx)
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	slices.Sort(ids)
	if want := slices.Sorted(slices.Values([]string{a.ID(), b.ID()})); !slices.Equal(ids, want) {
		t.Errorf("Reap() = %q; want exactly the expired sessions %q", ids, want)
	}
	if ids, err := sb.Reap(ctx); err != nil || len(ids) != 0 {
		t.Errorf("a second Reap() = %q, %v; want no ids: nothing else has expired", ids, err)
	}
	if _, err := sb.GetSession(ctx, live.ID()); err != nil {
		t.Errorf("GetSession of the unexpired session after Reap: %v", err)
	}
	wantListed(t, sb, live.ID())
}

// Reaps that run at once return each expired id once between them: every
// expired session is destroyed by exactly one of them ("exactly the ids it
// destroyed"), none twice.
func (s *suite) testConcurrentReap(t *testing.T) {
	sb := s.newSandbox(t, exact)
	var expired []sandbox.Session
	var want []string
	for range 6 {
		sess := s.newSession(t, sb, ttl(1))
		expired = append(expired, sess)
		want = append(want, sess.ID())
	}
	live := s.newSession(t, sb, ttl(3600))
	// The clause's deadline bounds the Reaps, not the seven creates before
	// them (each has its own), which on a loaded cluster take most of it.
	ctx := s.testContext(t)
	waitExpired(t, ctx, expired...)
	const reapers = 4
	results := make([][]string, reapers)
	errs := make([]error, reapers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range reapers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = sb.Reap(ctx)
		})
	}
	close(start)
	wg.Wait()
	var got []string
	for i := range reapers {
		if errs[i] != nil {
			t.Errorf("Reap %d of %d at once: %v", i+1, reapers, errs[i])
		}
		got = append(got, results[i]...)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%d Reaps at once returned %q between them; want each expired session once, %q", reapers, results, want)
	}
	wantListed(t, sb, live.ID())
}

// Reap destroys a session only once its expires_at has passed: a Reap
// called over and over from the session's create on returns its id at or
// after expires_at, never before, and until then the session answers.
func (s *suite) testReapNotEarly(t *testing.T) {
	ctx := s.testContext(t)
	sb := s.newSandbox(t, exact)
	sess := s.newSession(t, sb, ttl(1))
	info, err := sess.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	// Beyond the clocks' reading: the host's and, over an API, the
	// daemon's are the same machine's.
	const slack = 20 * time.Millisecond
	deadline := info.ExpiresAt.Add(5 * time.Second)
	for {
		ids, err := sb.Reap(ctx)
		now := time.Now()
		if err != nil {
			t.Fatalf("Reap: %v", err)
		}
		if slices.Contains(ids, sess.ID()) {
			if early := info.ExpiresAt.Sub(now); early > slack {
				t.Errorf("Reap destroyed the session %v before its expires_at %v", early, info.ExpiresAt)
			}
			return
		}
		if now.After(deadline) {
			t.Fatalf("Reap never returned the session, expired since %v", info.ExpiresAt)
		}
		if now.Before(info.ExpiresAt.Add(-100 * time.Millisecond)) {
			if _, err := sb.GetSession(ctx, sess.ID()); err != nil {
				t.Fatalf("GetSession %v before expires_at: %v", info.ExpiresAt.Sub(now), err)
			}
		}
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

// The background reaper destroys expired sessions on its own.
func (s *suite) testBackgroundReaper(t *testing.T) {
	ctx := s.testContext(t)
	cfg := Config{Policy: permissive, ReapInterval: 100 * time.Millisecond}
	sb := s.newSandbox(t, cfg)
	if d := sb.ReapInterval(); d != cfg.ReapInterval {
		t.Errorf("ReapInterval() = %v; want %v, the cadence configured", d, cfg.ReapInterval)
	}
	sess := s.newSession(t, sb, ttl(1))
	waitExpired(t, ctx, sess)
	sleepCtx(ctx, time.Second) // ten sweeps of the reaper
	if s.hostFS() {
		ws := sess.WorkspacePath()
		if !eventually(ctx, 2*time.Second, func() bool { _, err := os.Stat(ws); return errors.Is(err, os.ErrNotExist) }) {
			t.Errorf("the workspace %s of an ephemeral session expired for over a second still exists; the background reaper (every %v) destroys it", ws, cfg.ReapInterval)
		}
	}
	if ids, err := sb.Reap(ctx); err != nil || len(ids) != 0 {
		t.Errorf("Reap() = %q, %v a second after the session expired; want no ids, the background reaper (every %v) having destroyed it already", ids, err, cfg.ReapInterval)
	}
}

// Info reports the session's observable state.
func (s *suite) testInfo(t *testing.T) {
	ctx := s.testContext(t)
	labels := map[string]string{"team": "tai42", "app/role": "info", "empty": ""}
	before := time.Now()
	_, sess := s.fresh(t, func(sp *sandbox.SessionSpec) { sp.Labels, sp.WorkspaceKey, sp.TTLSeconds = labels, "info-key", 600 })
	after := time.Now()
	info, err := sess.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	want := sandbox.SessionInfo{ID: sess.ID(), Image: s.opts.Image, WorkspaceKey: "info-key", WorkspacePath: sess.WorkspacePath(),
		Durability: sandbox.Ephemeral, CreatedAt: info.CreatedAt, ExpiresAt: info.CreatedAt.Add(600 * time.Second), Labels: labels}
	if !equalInfo(info, want) {
		t.Errorf("Info() = %+v; want %+v", info, want)
	}
	if !path.IsAbs(info.WorkspacePath) {
		t.Errorf("Info().WorkspacePath = %q; want an absolute path", info.WorkspacePath)
	}
	if info.CreatedAt.Before(before.Add(-time.Second)) || info.CreatedAt.After(after.Add(time.Second)) {
		t.Errorf("Info().CreatedAt = %v; want the time of the create, between %v and %v", info.CreatedAt, before, after)
	}
}

// Touch extends expires_at to now + ttl (no further) and never shortens it.
func (s *suite) testTouch(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, ttl(3600))
	prev, err := sess.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	for i := range 2 {
		before := time.Now()
		if err := sess.Touch(ctx); err != nil {
			t.Fatalf("Touch: %v", err)
		}
		info, err := sess.Info(ctx)
		if err != nil {
			t.Fatalf("Info: %v", err)
		}
		after := time.Now()
		if least := before.Add(time.Hour); info.ExpiresAt.Before(least) {
			t.Errorf("after Touch #%d expires_at = %v; want at least now + ttl = %v", i+1, info.ExpiresAt, least)
		}
		// A touch counts its ttl from now, not from the old expires_at:
		// touches that added up would keep a session alive long after
		// its client stopped touching it. The second of slack is the
		// precision expires_at is kept at by some doors.
		if most := after.Add(time.Hour + time.Second); info.ExpiresAt.After(most) {
			t.Errorf("after Touch #%d expires_at = %v; want at most now + ttl = %v (touches must not accumulate)", i+1, info.ExpiresAt, most)
		}
		if info.ExpiresAt.Before(prev.ExpiresAt) {
			t.Errorf("Touch #%d moved expires_at back from %v to %v; Touch never shortens a life", i+1, prev.ExpiresAt, info.ExpiresAt)
		}
		if !info.CreatedAt.Equal(prev.CreatedAt) {
			t.Errorf("Touch #%d changed created_at from %v to %v", i+1, prev.CreatedAt, info.CreatedAt)
		}
		prev = info
	}
}

// An expired session is gone for consumers at once, before any reap.
func (s *suite) testExpiry(t *testing.T) {
	ctx := s.testContext(t)
	sb := s.newSandbox(t, exact)
	sess := s.newSession(t, sb, ttl(1))
	waitExpired(t, ctx, sess)
	_, err := sb.GetSession(ctx, sess.ID())
	wantGone(t, err, sess.ID(), "GetSession of an expired session")
	wantListed(t, sb)
	wantAllGone(t, sess, "of an expired session")
}

// Session.Destroy ends the session; every method then reports it gone.
func (s *suite) testDestroy(t *testing.T) {
	ctx := s.testContext(t)
	sb, sess := s.fresh(t, nil)
	if err := sess.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	_, err := sb.GetSession(ctx, sess.ID())
	wantGone(t, err, sess.ID(), "GetSession of a destroyed session")
	if err := sb.DestroySession(ctx, sess.ID()); err != nil {
		t.Errorf("DestroySession of a destroyed session: %v; want nil (idempotent)", err)
	}
	wantAllGone(t, sess, "of a destroyed session")
}

// Destroying a session ends its running execs promptly: a running Exec
// returns *SessionNotFoundError, a handle's stream ends with an error.
func (s *suite) testDestroyEndsExecs(t *testing.T) {
	ctx := s.testContext(t)
	sb, sess := s.fresh(t, nil)
	var execErr error
	var execTook time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, execErr = sess.Exec(ctx, []string{"sleep", "30"}, sandbox.ExecOptions{Timeout: execTimeout})
	}()
	r := start(t, ctx, sess, sandbox.StartOptions{}, "sleep", "30")
	sleepCtx(ctx, 300*time.Millisecond) // let both execs start
	begin := time.Now()
	if err := sb.DestroySession(ctx, sess.ID()); err != nil {
		t.Fatalf("DestroySession: %v", err)
	}
	<-done
	if execTook = time.Since(begin); execTook > prompt {
		t.Errorf("a running Exec returned %v after its session was destroyed; want it ended promptly", execTook)
	}
	wantGone(t, execErr, sess.ID(), "a running Exec of a destroyed session")
	r.drain(ctx, prompt)
	if r.exit != nil {
		t.Errorf("the stream of an exec whose session was destroyed ended with StreamExit %d; want an error", r.exit.ExitCode)
	} else {
		wantKind(t, r.err, sandbox.ErrSandbox, "the stream of an exec whose session was destroyed")
	}
	if err := r.h.Kill(ctx); err != nil {
		t.Errorf("Kill of a handle whose session was destroyed: %v; once the exec has ended Kill never fails", err)
	}
}

// Destroying a session ends the processes its commands left running
// (checked from the host: a heartbeat stops).
func (s *suite) testDestroyEndsLeftovers(t *testing.T) {
	if !s.hostFS() {
		s.destroyEndsLeftoversDurable(t)
		return
	}
	ctx := s.testContext(t)
	sb, sess := s.fresh(t, nil)
	dir := t.TempDir()
	beats := func() int { entries, _ := os.ReadDir(dir); return len(entries) }
	const loop = `i=0; while [ $i -lt 400 ]; do : > "$1/beat.$i"; i=$((i+1)); sleep 0.05; done`
	mustSh(t, ctx, sess, `sh -c "$1" beat "$2" >/dev/null 2>&1 </dev/null & echo $!`, loop, dir)
	if !eventually(ctx, 3*time.Second, func() bool { return beats() > 0 }) {
		t.Skipf("a process of the session could not write to the host directory %s; cannot watch it from the host", dir)
	}
	if err := sb.DestroySession(ctx, sess.ID()); err != nil {
		t.Fatalf("DestroySession: %v", err)
	}
	sleepCtx(ctx, 300*time.Millisecond)
	n := beats()
	sleepCtx(ctx, 500*time.Millisecond)
	if m := beats(); m != n {
		t.Errorf("a process the session's command left running still runs after DestroySession (%d heartbeats, then %d); destroying a session ends its processes", n, m)
	}
}

// destroyEndsLeftoversDurable is DestroyEndsLeftovers for a provider whose
// sessions have filesystems of their own: the heartbeat goes to a
// persistent workspace, and the next session with its key watches it.
func (s *suite) destroyEndsLeftoversDurable(t *testing.T) {
	s.needDurable(t)
	ctx := s.testContext(t)
	sb := s.newSandbox(t, Config{Policy: permissive})
	key := persistent()
	sess := s.newSession(t, sb, key)
	const loop = `i=0; while [ $i -lt 400 ]; do : > "beat.$i"; i=$((i+1)); sleep 0.05; done`
	mustSh(t, ctx, sess, `sh -c "$1" beat >/dev/null 2>&1 </dev/null & echo $!`, loop)
	beats := func(sess sandbox.Session) int {
		n, err := strconv.Atoi(strings.TrimSpace(mustSh(t, ctx, sess, `set -- beat.*; [ -e "$1" ] && echo $# || echo 0`)))
		if err != nil {
			t.Fatalf("counting heartbeats: %v", err)
		}
		return n
	}
	if !eventually(ctx, 3*time.Second, func() bool { return beats(sess) > 0 }) {
		t.Fatal("the session's background heartbeat never wrote to its workspace")
	}
	if err := sb.DestroySession(ctx, sess.ID()); err != nil {
		t.Fatalf("DestroySession: %v", err)
	}
	next := s.newSession(t, sb, key)
	n := beats(next)
	sleepCtx(ctx, 500*time.Millisecond)
	if m := beats(next); m != n {
		t.Errorf("a process the session's command left running still runs after DestroySession (%d heartbeats in its persistent workspace, then %d); destroying a session ends its processes", n, m)
	}
}

// Destroy racing execs: every exec returns a correct result or
// *SessionNotFoundError; none hangs or panics.
func (s *suite) testConcurrentDestroyAndExec(t *testing.T) {
	ctx := s.testContext(t)
	sb := s.newSandbox(t, Config{Policy: permissive})
	for round := range 3 {
		sess := s.newSession(t, sb, nil)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				res, err := sess.Exec(ctx, []string{"echo", "hi"}, sandbox.ExecOptions{Timeout: execTimeout})
				if err != nil {
					wantGone(t, err, sess.ID(), "an Exec racing Destroy")
				} else if res != (sandbox.ExecResult{Stdout: "hi\n"}) {
					t.Errorf("an Exec racing Destroy returned %+v; want the correct result or *SessionNotFoundError", res)
				}
			})
		}
		wg.Go(func() {
			sleepCtx(ctx, time.Duration(round)*5*time.Millisecond)
			if err := sess.Destroy(ctx); err != nil {
				t.Errorf("Destroy racing execs: %v", err)
			}
		})
		wg.Wait()
	}
}

// An ephemeral session starts with an empty workspace.
func (s *suite) testEphemeralEmpty(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	if got := mustSh(t, ctx, sess, "ls -A"); got != "" {
		t.Errorf("ls -A in a new ephemeral workspace = %q; want it empty", got)
	}
}

// Ephemeral sessions with the same workspace_key share nothing.
func (s *suite) testEphemeralNotShared(t *testing.T) {
	ctx := s.testContext(t)
	sb := s.newSandbox(t, Config{Policy: permissive})
	key := func(sp *sandbox.SessionSpec) { sp.WorkspaceKey = "shared-key" }
	a, b := s.newSession(t, sb, key), s.newSession(t, sb, key)
	if s.opts.AbsoluteOutsideWorkspaceRefused && a.WorkspacePath() == b.WorkspacePath() {
		t.Errorf("two live ephemeral sessions share the workspace %s", a.WorkspacePath())
	}
	mustPut(t, ctx, a, "mine.txt", []byte("a"))
	_, err := b.GetFile(ctx, "mine.txt")
	wantKind(t, err, sandbox.ErrFileNotFound, "GetFile in an ephemeral session of a file put in another with the same workspace_key")
	if got := mustSh(t, ctx, b, "ls -A"); got != "" {
		t.Errorf("ls -A in the second ephemeral workspace = %q; want it empty", got)
	}
}

// An ephemeral workspace is removed at destroy (checked from the host).
func (s *suite) testEphemeralRemoved(t *testing.T) {
	s.needHostFS(t)
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustPut(t, ctx, sess, "d/f.txt", []byte("x"))
	ws := sess.WorkspacePath()
	if _, err := os.Stat(ws); err != nil {
		t.Fatalf("the workspace of a live session is not on the host: %v", err)
	}
	if err := sess.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := os.Stat(ws); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ephemeral workspace %s still exists after Destroy (%v); an ephemeral workspace is removed at destroy", ws, err)
	}
}

func (s *suite) needDurable(t *testing.T) {
	t.Helper()
	if !s.opts.Durable {
		t.Skip("Options.Durable is false: the provider has no durable storage")
	}
}

// persistent returns a spec change for a persistent session of a fresh key.
func persistent() func(*sandbox.SessionSpec) {
	key := "sandboxtest-" + rand.Text()
	return func(sp *sandbox.SessionSpec) { sp.Durability, sp.WorkspaceKey = sandbox.Persistent, key }
}

// A persistent workspace survives its session: the next session with the
// same key sees its files.
func (s *suite) testPersistent(t *testing.T) {
	s.needDurable(t)
	ctx := s.testContext(t)
	sb := s.newSandbox(t, Config{Policy: permissive})
	key := persistent()
	first := s.newSession(t, sb, key)
	info, err := first.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if want := s.spec(key); info.Durability != sandbox.Persistent || info.WorkspaceKey != want.WorkspaceKey {
		t.Errorf("Info() of a persistent session shows durability %q, workspace_key %q; want %q, %q", info.Durability, info.WorkspaceKey, sandbox.Persistent, want.WorkspaceKey)
	}
	data := randomBytes(64 << 10)
	mustPut(t, ctx, first, "keep/data.bin", data)
	if err := first.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	second := s.newSession(t, sb, key)
	if got := mustGet(t, ctx, second, "keep/data.bin"); !bytes.Equal(got, data) {
		t.Errorf("a new session with the same persistent workspace_key reads %d bytes (equal: false); want the %d bytes the destroyed one wrote", len(got), len(data))
	}
}

// One live session per persistent key: a second create is rejected,
// naming the live session.
func (s *suite) testPersistentConflict(t *testing.T) {
	s.needDurable(t)
	ctx := s.testContext(t)
	sb := s.newSandbox(t, Config{Policy: permissive})
	key := persistent()
	live := s.newSession(t, sb, key)
	other, err := sb.CreateSession(ctx, s.spec(key))
	if other != nil {
		destroyAtCleanup(t, sb, other.ID())
	}
	wantRejected(t, err, sandbox.ReasonConflict, "", "a second CreateSession with a live persistent workspace_key")
	if err != nil && !strings.Contains(err.Error(), live.ID()) {
		t.Errorf("the conflict error %q does not name the live session %q", err, live.ID())
	}
	wantListed(t, sb, live.ID())
	if err := live.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	s.newSession(t, sb, key)
}

// A persistent workspace survives a reap of its expired session.
func (s *suite) testPersistentSurvivesReap(t *testing.T) {
	s.needDurable(t)
	ctx := s.testContext(t)
	sb := s.newSandbox(t, exact)
	key := persistent()
	old := s.newSession(t, sb, func(sp *sandbox.SessionSpec) { key(sp); sp.TTLSeconds = 1 })
	mustPut(t, ctx, old, "kept.txt", []byte("kept"))
	waitExpired(t, ctx, old)
	if ids, err := sb.Reap(ctx); err != nil || !slices.Equal(ids, []string{old.ID()}) {
		t.Errorf("Reap() = %q, %v; want [%q]", ids, err, old.ID())
	}
	next := s.newSession(t, sb, key)
	if got := mustGet(t, ctx, next, "kept.txt"); string(got) != "kept" {
		t.Errorf("after a reap the persistent workspace reads %q; want \"kept\"", got)
	}
}

// An expired session is no longer live: its persistent key is free at once,
// and the later reap leaves the workspace to its new session.
func (s *suite) testPersistentExpiredIsNotLive(t *testing.T) {
	s.needDurable(t)
	ctx := s.testContext(t)
	sb := s.newSandbox(t, exact)
	key := persistent()
	old := s.newSession(t, sb, func(sp *sandbox.SessionSpec) { key(sp); sp.TTLSeconds = 1 })
	mustPut(t, ctx, old, "kept.txt", []byte("kept"))
	waitExpired(t, ctx, old)
	next, err := sb.CreateSession(ctx, s.spec(key))
	if err != nil {
		t.Fatalf("CreateSession with the persistent key of an expired (not yet reaped) session: %v; an expired session is gone, not live", err)
	}
	destroyAtCleanup(t, sb, next.ID())
	if _, err := sb.Reap(ctx); err != nil {
		t.Fatalf("Reap: %v", err)
	}
	if got := mustGet(t, ctx, next, "kept.txt"); string(got) != "kept" {
		t.Errorf("the new session of the persistent key reads %q after the old one was reaped; want \"kept\"", got)
	}
	mustPut(t, ctx, next, "after.txt", []byte("x"))
}
