package sandboxtest

import (
	"bytes"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func (s *suite) restartClauses() []clause {
	return []clause{
		{"PersistentSurvivesRestart", s.testPersistentSurvivesRestart},
		{"SessionsSurviveCrash", s.testSessionsSurviveCrash},
	}
}

// restart makes a sandbox with cfg, hands it to use (guarded), then
// restarts it through Options.Restartable and returns the new one, guarded.
//
// Sessions use makes with create are destroyed at cleanup through the new
// sandbox (the old one may be unreachable by then); should the clause end
// before the restart, closing the old sandbox destroys them.
func (s *suite) restart(t *testing.T, cfg Config, crash bool, use func(sb sandbox.Sandbox, create func(func(*sandbox.SessionSpec)) sandbox.Session)) sandbox.Sandbox {
	t.Helper()
	if s.opts.Restartable == nil {
		t.Skip("Options.Restartable is nil: the provider under test gives no way to start it again on the same state")
	}
	if cfg.Logger == nil {
		cfg.Logger = clauseLog(t).logger
	}
	raw, again := s.opts.Restartable(t, cfg)
	if raw == nil || again == nil {
		t.Fatal("Options.Restartable returned a nil Sandbox or restart function")
	}
	sb := &guardedSandbox{g: guard{t}, sb: raw}
	var ids []string
	use(sb, func(mutate func(*sandbox.SessionSpec)) sandbox.Session {
		t.Helper()
		sess, err := sb.CreateSession(s.testContext(t), s.spec(mutate))
		if err != nil {
			t.Fatalf("CreateSession: %v", err)
		}
		ids = append(ids, sess.ID())
		return sess
	})
	next := again(crash)
	if next == nil {
		t.Fatal("the restart function returned a nil Sandbox")
	}
	g := &guardedSandbox{g: guard{t}, sb: next}
	for _, id := range ids {
		destroyAtCleanup(t, g, id)
	}
	return g
}

// A persistent workspace survives the sandbox's close and a new start on
// the same state: the next session with its key reads what was written.
// The closed sandbox's sessions are not listed by the new one.
func (s *suite) testPersistentSurvivesRestart(t *testing.T) {
	s.needDurable(t)
	ctx := s.testContext(t)
	key := persistent()
	data := randomBytes(32 << 10)
	var id string
	sb := s.restart(t, Config{Policy: permissive}, false, func(_ sandbox.Sandbox, create func(func(*sandbox.SessionSpec)) sandbox.Session) {
		sess := create(key)
		id = sess.ID()
		mustPut(t, ctx, sess, "kept/data.bin", data)
	})
	if list, err := sb.ListSessions(ctx); err != nil {
		t.Fatalf("ListSessions after the restart: %v", err)
	} else {
		for _, in := range list {
			if in.ID == id {
				t.Errorf("session %s, destroyed by the close, is listed after the restart", id)
			}
		}
	}
	next := s.newSession(t, sb, key)
	if got := mustGet(t, ctx, next, "kept/data.bin"); !bytes.Equal(got, data) {
		t.Errorf("after a restart, the persistent workspace reads %d bytes (equal: false); want the %d written before", len(got), len(data))
	}
}

// Sessions survive the death of the sandbox's process: a new sandbox on
// the same state lists the live ones with every field as it was, their
// execs work with the spec's env, their files read back, a touch is kept,
// they can be destroyed; one that expired meanwhile is gone, and its
// persistent key is free.
func (s *suite) testSessionsSurviveCrash(t *testing.T) {
	ctx := s.testContext(t)
	secret := secretValue("crash")
	envSpec := func(sp *sandbox.SessionSpec) {
		sp.Env = map[string]sandbox.Secret{"TAI42_SUITE_SECRET": sandbox.NewSecret(secret)}
		sp.Labels = map[string]string{"suite": "sandboxtest", "clause": "crash"}
	}
	data := randomBytes(16 << 10)
	var live, short sandbox.SessionInfo
	var pers string
	sb := s.restart(t, Config{Policy: permissive, ReapInterval: time.Hour}, true, func(_ sandbox.Sandbox, create func(func(*sandbox.SessionSpec)) sandbox.Session) {
		sess := create(envSpec)
		mustPut(t, ctx, sess, "data.bin", data)
		time.Sleep(1100 * time.Millisecond) // a touch moves expires_at by whole seconds of ttl
		if err := sess.Touch(ctx); err != nil {
			t.Fatalf("Touch: %v", err)
		}
		var err error
		if live, err = sess.Info(ctx); err != nil {
			t.Fatalf("Info: %v", err)
		}
		mutate := ttl(1)
		if s.opts.Durable {
			pk := persistent()
			mutate = func(sp *sandbox.SessionSpec) { pk(sp); sp.TTLSeconds = 1 }
			pers = s.spec(mutate).WorkspaceKey
		}
		gone := create(mutate)
		if short, err = gone.Info(ctx); err != nil {
			t.Fatalf("Info: %v", err)
		}
		waitExpired(t, ctx, gone)
	})
	list := wantListed(t, sb, live.ID)
	for _, in := range list {
		switch in.ID {
		case live.ID:
			if in.Image != live.Image || in.WorkspaceKey != live.WorkspaceKey || in.WorkspacePath != live.WorkspacePath ||
				in.Durability != live.Durability || !in.CreatedAt.Equal(live.CreatedAt) || !in.ExpiresAt.Equal(live.ExpiresAt) ||
				in.Labels["clause"] != "crash" {
				t.Errorf("after the crash the session is listed as %+v; before it, it was %+v", in, live)
			}
		case short.ID:
			t.Errorf("session %s expired before the restart and is listed after it", short.ID)
		}
	}
	sess, err := sb.GetSession(ctx, live.ID)
	if err != nil {
		t.Fatalf("GetSession(%s) after the crash: %v", live.ID, err)
	}
	if got := mustSh(t, ctx, sess, `printf %s "$TAI42_SUITE_SECRET"`); got != secret {
		t.Errorf("after the crash an exec sees the spec's env value of %d bytes (equal: false); want the %d-byte value", len(got), len(secret))
	}
	if got := mustGet(t, ctx, sess, "data.bin"); !bytes.Equal(got, data) {
		t.Errorf("after the crash the session's file reads %d bytes (equal: false); want the %d written", len(got), len(data))
	}
	if _, err := sb.GetSession(ctx, short.ID); err == nil {
		t.Errorf("GetSession(%s), expired before the restart, succeeded", short.ID)
	}
	if pers != "" {
		again := s.newSession(t, sb, func(sp *sandbox.SessionSpec) {
			sp.Durability, sp.WorkspaceKey = sandbox.Persistent, pers
		})
		if again.ID() == short.ID {
			t.Errorf("a new session on the expired session's key has its id %s", short.ID)
		}
	}
	if err := sess.Destroy(ctx); err != nil {
		t.Fatalf("Destroy of a session brought back: %v", err)
	}
	wantGone(t, mustErr(sb.GetSession(ctx, live.ID)), live.ID, "GetSession after destroying a session brought back")
}

func mustErr(_ sandbox.Session, err error) error { return err }
