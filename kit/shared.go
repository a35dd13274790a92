package kit

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/tai42/sandbox"
)

// This file is the kit over a [SharedLedger]: the ledger, not this
// process's map, says which sessions exist and until when. s.sessions
// holds only the sessions this sandbox serves now (created here, or
// adopted); every use of one checks its record first.

// usable reports whether r is a session of this provider that was
// reported created and is not being destroyed.
func (s *Sandbox) usable(r Record) bool {
	return r.State == StateLive && r.Provider == s.prov.Name()
}

// getShared asks the shared ledger for id's record, op naming the
// caller's operation in the error.
func (s *Sandbox) getShared(ctx context.Context, op, id string) (Record, bool, error) {
	r, ok, err := s.shared.Get(ctx, id)
	if err != nil {
		return Record{}, false, sandbox.WrapError(op, "the session ledger cannot say whether session "+id+" is live", err)
	}
	return r, ok, nil
}

// apply brings the held ss in line with its record (ok false: none): a
// record gone, or no longer live, means another sandbox destroyed the
// session (or is destroying it), and ss is detached; a later expires_at
// (a touch elsewhere) is taken. It returns *sandbox.SessionNotFoundError
// when the session is gone.
func (s *Sandbox) apply(ss *session, r Record, ok bool) error {
	if !ok || !s.usable(r) {
		s.detach(ss, "its record is gone from the shared ledger: another sandbox destroyed it")
		return &sandbox.SessionNotFoundError{SessionID: ss.id, Detail: "it was destroyed"}
	}
	s.mu.Lock()
	if r.ExpiresAt.After(ss.expires) {
		ss.expires = r.ExpiresAt
	}
	s.mu.Unlock()
	return nil
}

// syncShared is apply with the record as the ledger holds it now; a no-op
// without a shared ledger.
func (s *Sandbox) syncShared(ctx context.Context, op string, ss *session) error {
	if s.shared == nil {
		return nil
	}
	s.mu.Lock()
	gone := ss.destroying // its own teardown (or detach) says the rest
	s.mu.Unlock()
	if gone {
		return nil
	}
	r, ok, err := s.getShared(ctx, op, ss.id)
	if err != nil {
		return err
	}
	return s.apply(ss, r, ok)
}

// detach drops ss without destroying it: it is gone for every holder of
// it here (as a destroyed session is), and its Resources let go of what
// they hold ([Detacher]). A session whose teardown this sandbox began is
// left to that teardown.
func (s *Sandbox) detach(ss *session, why string) {
	s.mu.Lock()
	if ss.destroying {
		s.mu.Unlock()
		return
	}
	ss.destroying = true
	if s.sessions[ss.id] == ss {
		delete(s.sessions, ss.id)
	}
	s.dropHold(ss.spec.WorkspaceKey, ss.hold)
	s.mu.Unlock()
	close(ss.gone)
	if d, ok := ss.res.(Detacher); ok {
		d.Detach()
	}
	s.log.Info("session detached", "id", ss.id, "why", why)
}

// lookupShared finds id through the shared ledger: the held session, in
// line with its record, or the session adopted from its record. A record
// missing, not live or (unless expiredToo) expired is
// *sandbox.SessionNotFoundError, as is a session this provider cannot
// adopt.
func (s *Sandbox) lookupShared(ctx context.Context, op, id string, expiredToo bool) (*session, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed { // it serves nothing more, as a sandbox over its own ledger
		return nil, &sandbox.SessionNotFoundError{SessionID: id, Detail: "the sandbox is closed"}
	}
	r, ok, err := s.getShared(ctx, op, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	ss := s.sessions[id]
	s.mu.Unlock()
	if ss != nil {
		if err := s.apply(ss, r, ok); err != nil {
			return nil, err
		}
		return ss, nil
	}
	switch {
	case !ok || !s.usable(r):
		return nil, &sandbox.SessionNotFoundError{SessionID: id}
	case !expiredToo && !time.Now().Before(r.ExpiresAt):
		return nil, &sandbox.SessionNotFoundError{SessionID: id, Detail: "it expired"}
	}
	return s.adopt(ctx, op, r)
}

// adopt serves the session of record r from this sandbox ([Adopter]).
// Concurrent adoptions of one id make one Adopt call; a caller whose ctx
// ends stops waiting, and the adoption goes on for the next.
func (s *Sandbox) adopt(ctx context.Context, op string, r Record) (*session, error) {
	ad, ok := s.prov.(Adopter)
	if !ok {
		return nil, &sandbox.SessionNotFoundError{SessionID: r.ID,
			Detail: "another sandbox serves it, and provider " + s.prov.Name() + " cannot adopt a session"}
	}
	ch := s.adopting.DoChan(r.ID, func() (any, error) { return s.adoptOnce(op, r, ad) })
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(*session), nil
	case <-ctx.Done():
		return nil, sandbox.WrapError(op, "gave up waiting for session "+r.ID+" to be adopted", ctx.Err())
	}
}

func (s *Sandbox) adoptOnce(op string, r Record, ad Adopter) (*session, error) {
	s.mu.Lock()
	if ss := s.sessions[r.ID]; ss != nil { // adopted by the flight before this one
		s.mu.Unlock()
		return ss, nil
	}
	if s.closed {
		s.mu.Unlock()
		return nil, &sandbox.SessionNotFoundError{SessionID: r.ID, Detail: "the sandbox is closed"}
	}
	s.adopts.Add(1) // Close waits for it before closing the provider
	s.mu.Unlock()
	defer s.adopts.Done()

	// Not the caller's context: the adoption serves every caller waiting
	// for it; the provider bounds it.
	res, err := ad.Adopt(context.Background(), Kept{ID: r.ID, Spec: r.Spec, Handle: r.Handle})
	if err != nil {
		s.log.Warn("cannot adopt a session of the shared ledger", "id", r.ID, "err", err)
		return nil, sandbox.WrapForeign(op, "provider "+s.prov.Name()+" could not adopt session "+r.ID, err)
	}
	ss := &session{kit: s, id: r.ID, spec: r.Spec, res: res, handle: r.Handle, adopted: true,
		created: r.CreatedAt, expires: r.ExpiresAt, gone: make(chan struct{})}
	if h, ok := res.(Recoverable); ok {
		ss.handle = h.Handle()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if d, ok := res.(Detacher); ok {
			d.Detach()
		}
		return nil, &sandbox.SessionNotFoundError{SessionID: r.ID, Detail: "the sandbox is closed"}
	}
	s.sessions[r.ID] = ss
	// The local hold guards this sandbox's own creates of the key; that
	// no two sandboxes hold one key is the provider's to enforce.
	if r.Spec.Durability == sandbox.Persistent && s.keys[r.Spec.WorkspaceKey] == nil {
		ss.hold = &keyHold{state: holdSession, ss: ss}
		s.keys[r.Spec.WorkspaceKey] = ss.hold
	}
	s.mu.Unlock()
	s.log.Info("session adopted", "id", r.ID, "image", r.Spec.Image, "expires_at", r.ExpiresAt.UTC())
	return ss, nil
}

// destroyShared is DestroySession over a shared ledger: a session another
// sandbox made is adopted, then destroyed as usual; one the ledger does
// not hold live is destroyed already.
func (s *Sandbox) destroyShared(ctx context.Context, id string) error {
	ss, err := s.lookupShared(ctx, "destroy_session", id, true)
	if errors.Is(err, sandbox.ErrSessionNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.destroy(ctx, ss)
}

// listShared is ListSessions over a shared ledger: every sandbox's live,
// unexpired sessions.
func (s *Sandbox) listShared(ctx context.Context) ([]sandbox.SessionInfo, error) {
	records, err := s.shared.Load(ctx)
	if err != nil {
		return nil, sandbox.WrapError("list_sessions", "the session ledger cannot list the sessions", err)
	}
	now := time.Now()
	out := make([]sandbox.SessionInfo, 0, len(records))
	for _, r := range records {
		if !s.usable(r) || !now.Before(r.ExpiresAt) {
			continue
		}
		labels := maps.Clone(r.Spec.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		out = append(out, sandbox.SessionInfo{ID: r.ID, Image: r.Spec.Image, WorkspaceKey: r.Spec.WorkspaceKey,
			WorkspacePath: r.WorkspacePath, Durability: r.Spec.Durability,
			CreatedAt: r.CreatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(), Labels: labels})
	}
	slices.SortFunc(out, func(a, b sandbox.SessionInfo) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out, nil
}

// reapShared is Reap over a shared ledger. Every pass first brings the
// held sessions in line with their records (detaching those destroyed
// elsewhere). While this sandbox is the one reaping, it then destroys
// every expired live session of the ledger, adopting those it does not
// hold; while it is not, it destroys none, and lets go of the expired
// sessions it holds (they are not found already; the reaping sandbox
// destroys them).
func (s *Sandbox) reapShared(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	held := slices.Collect(maps.Values(s.sessions))
	s.mu.Unlock()
	var errs []error
	for _, ss := range held {
		if err := s.syncShared(ctx, "reap", ss); err != nil && !errors.Is(err, sandbox.ErrSessionNotFound) {
			errs = append(errs, err)
		}
	}
	reaping := s.shared.Reaping()
	if !reaping {
		now := time.Now()
		for _, ss := range held {
			s.mu.Lock()
			expired := ss.expiredAt(now)
			s.mu.Unlock()
			if expired {
				s.detach(ss, "it expired; the sandbox that reaps destroys it")
			}
		}
		return nil, errors.Join(errs...)
	}
	records, err := s.shared.Load(ctx)
	if err != nil {
		return nil, errors.Join(append(errs, sandbox.WrapError("reap", "the session ledger cannot list the sessions", err))...)
	}
	now := time.Now()
	var ids []string
	for _, r := range records {
		if !s.usable(r) || now.Before(r.ExpiresAt) {
			continue
		}
		ss, err := s.lookupShared(ctx, "reap", r.ID, true)
		if errors.Is(err, sandbox.ErrSessionNotFound) {
			continue // gone since Load
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.mu.Lock()
		expired := ss.expiredAt(now)
		s.mu.Unlock()
		if !expired { // touched since Load
			continue
		}
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

// closeShared ends what Close ends over a shared ledger: the sessions this
// sandbox created are destroyed (unless destroyed elsewhere already), the
// adopted ones are detached: they live on for the other sandboxes.
func (s *Sandbox) closeShared(ctx context.Context, all []*session) []error {
	var errs []error
	for _, ss := range all {
		if ss.adopted {
			s.detach(ss, "the sandbox is closing; the session lives on for the others")
		} else if err := s.syncShared(ctx, "destroy_session", ss); err != nil && !errors.Is(err, sandbox.ErrSessionNotFound) {
			// The ledger cannot say: tear it down all the same.
			s.log.Warn("closing: the session ledger cannot say whether a session is live; destroying it", "id", ss.id, "err", err)
		}
		// A detached session returns at once; one whose teardown is under
		// way is waited for.
		if _, err := s.destroyOnce(ctx, ss); err != nil {
			errs = append(errs, err)
		}
	}
	s.adopts.Wait()
	return errs
}

// sharedKeyFree refuses h the persistent key when a live, unexpired
// session of the shared ledger holds it (whichever sandbox serves it),
// and tears down an expired holder first, as holdKey does for a local
// one. That two sandboxes racing to create one key get one session is
// still the provider's to enforce: a create under way elsewhere is not
// in the ledger as live yet.
func (s *Sandbox) sharedKeyFree(ctx context.Context, key string, h *keyHold, op string) error {
	records, err := s.shared.Load(ctx)
	if err != nil {
		return sandbox.WrapError(op, "the session ledger cannot list the sessions holding workspace keys", err)
	}
	now := time.Now()
	for _, r := range records {
		if !s.usable(r) || r.Spec.Durability != sandbox.Persistent || r.Spec.WorkspaceKey != key || (h.ss != nil && r.ID == h.ss.id) {
			continue
		}
		if now.Before(r.ExpiresAt) {
			return keyConflict(key, h.state, holdSession, &session{id: r.ID})
		}
		ss, err := s.lookupShared(ctx, op, r.ID, true)
		if errors.Is(err, sandbox.ErrSessionNotFound) {
			continue
		}
		if err == nil {
			err = s.destroy(ctx, ss)
		}
		if err != nil {
			return sandbox.WrapError(op, "workspace "+key+": tearing down expired session "+r.ID+" failed", err)
		}
	}
	return nil
}

// sharedKeysInUse maps each persistent key a live, unexpired session of
// the shared ledger holds to that session's id.
func (s *Sandbox) sharedKeysInUse(ctx context.Context) (map[string]string, error) {
	records, err := s.shared.Load(ctx)
	if err != nil {
		return nil, sandbox.WrapError("list_workspaces", "the session ledger cannot list the sessions holding workspace keys", err)
	}
	now := time.Now()
	out := map[string]string{}
	for _, r := range records {
		if s.usable(r) && r.Spec.Durability == sandbox.Persistent && now.Before(r.ExpiresAt) {
			out[r.Spec.WorkspaceKey] = r.ID
		}
	}
	return out, nil
}
