package kit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tai42/sandbox"
)

// recover reconciles the ledger with the machine, once, from New: the
// sessions recorded live and unexpired are handed to the provider to bring
// back; every other record (a create or a destroy a crash interrupted, an
// expired session, a session the provider could not bring back, another
// provider's session) is dropped, and the provider's sweep removes its
// resources. A provider without [Recoverer] gets nothing back and its
// records are dropped with a warning.
func (s *Sandbox) recover(ctx context.Context) error {
	records, err := s.ledger.Load(ctx)
	if err != nil {
		return fmt.Errorf("kit: reading the session ledger: %w", err)
	}
	now := time.Now()
	byID := make(map[string]Record, len(records))
	var keep []Kept
	var drop []string
	for _, r := range records {
		switch {
		case r.Provider != s.prov.Name():
			s.log.Warn("recovery: the ledger holds a session of another provider; forgetting it (its resources are that provider's to sweep)",
				"id", r.ID, "recorded_provider", r.Provider)
		case r.State == StateCreating:
			s.log.Info("recovery: rolling back a session whose create was interrupted", "id", r.ID)
		case r.State == StateDestroying:
			s.log.Info("recovery: finishing the teardown of a session whose destroy was interrupted", "id", r.ID)
		case r.State != StateLive:
			s.log.Warn("recovery: the ledger holds a session in an unknown state; removing it", "id", r.ID, "state", r.State)
		case !now.Before(r.ExpiresAt):
			s.log.Info("recovery: reaping a session that expired", "id", r.ID, "expired_at", r.ExpiresAt.UTC())
			s.reaped.Add(1)
		default:
			byID[r.ID] = r
			keep = append(keep, Kept{ID: r.ID, Spec: r.Spec, Handle: r.Handle})
			continue
		}
		drop = append(drop, r.ID)
	}

	var results []Recovered
	rc, ok := s.prov.(Recoverer)
	switch {
	case ok:
		results, err = rc.Recover(ctx, keep)
		if err != nil {
			return fmt.Errorf("kit: provider %s could not recover its sessions: %w", s.prov.Name(), err)
		}
	case len(keep) > 0:
		s.log.Warn("recovery: the provider cannot bring sessions back; forgetting them", "count", len(keep))
	}
	got := make(map[string]bool, len(results))
	var errs []error
	for _, res := range results {
		r, known := byID[res.ID]
		if !known || got[res.ID] {
			if res.Res != nil {
				_ = res.Res.Destroy(ctx)
			}
			errs = append(errs, fmt.Errorf("kit: provider %s returned session %q, which was not asked for (or twice)", s.prov.Name(), res.ID))
			continue
		}
		got[res.ID] = true
		if res.Err != nil || res.Res == nil {
			s.log.Warn("recovery: a live session could not be brought back; it is gone", "id", res.ID, "err", res.Err)
			drop = append(drop, res.ID)
			continue
		}
		ss := &session{kit: s, id: r.ID, spec: r.Spec, res: res.Res, handle: r.Handle,
			created: r.CreatedAt, expires: r.ExpiresAt, gone: make(chan struct{})}
		if h, ok := res.Res.(Recoverable); ok {
			ss.handle = h.Handle()
		}
		s.sessions[r.ID] = ss
		if r.Spec.Durability == sandbox.Persistent {
			ss.hold = &keyHold{state: holdSession, ss: ss}
			s.keys[r.Spec.WorkspaceKey] = ss.hold
		}
		if ws := res.Res.WorkspacePath(); ws != r.WorkspacePath {
			s.log.Warn("recovery: a session's workspace path changed", "id", r.ID, "was", r.WorkspacePath, "now", ws)
		}
		s.log.Info("recovery: session is back; execs that were running when the previous process stopped are gone",
			"id", r.ID, "expires_at", r.ExpiresAt.UTC())
	}
	for _, k := range keep {
		if !got[k.ID] {
			if ok {
				s.log.Warn("recovery: the provider did not report on a live session; it is gone", "id", k.ID)
			}
			drop = append(drop, k.ID)
		}
	}
	for _, id := range drop {
		if err := s.ledger.Delete(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		for _, ss := range s.sessions {
			_ = ss.res.Destroy(ctx)
		}
		return fmt.Errorf("kit: recovery: %w", err)
	}
	if len(records) > 0 {
		s.log.Info("recovery done", "recovered", len(s.sessions), "dropped", len(drop))
	}
	return nil
}
