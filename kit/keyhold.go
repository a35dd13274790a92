package kit

import (
	"context"
	"fmt"
	"time"

	"github.com/tai42/sandbox"
)

// holdState is what holds a persistent workspace_key.
type holdState int

const (
	// holdCreating: a session being created, its resources not yet made.
	holdCreating holdState = iota
	// holdSession: a created session. It may have expired or begun its
	// teardown since, and then gives the key up to whoever asks next
	// once torn down.
	holdSession
	// holdRemoving: a removal of the workspace, under way.
	holdRemoving
)

// keyHold is one holder of a workspace_key in s.keys: a session (ss) from
// its create to its teardown, or a removal of the workspace (ss nil). Its
// state is guarded by the kit's mutex.
type keyHold struct {
	state holdState
	ss    *session
}

// inUse reports whether h is a live session: created, not being
// destroyed, not expired at now. Call with s.mu held.
func (h *keyHold) inUse(now time.Time) bool {
	return h.state == holdSession && !h.ss.destroying && now.Before(h.ss.expires)
}

// holdKey puts h in s.keys for key, op naming the caller's operation in
// its errors. A created session holding the key that has expired, or
// whose teardown has begun, is torn down first (its teardown finished):
// it is gone for consumers already. Any other holder is a conflict. Over
// a [SharedLedger], so is a live session of another sandbox.
func (s *Sandbox) holdKey(ctx context.Context, key string, h *keyHold, op string) error {
	if s.shared != nil {
		if err := s.sharedKeyFree(ctx, key, h, op); err != nil {
			return err
		}
	}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return sandbox.Errorf(op, "the sandbox is closed")
		}
		cur := s.keys[key]
		if cur == nil {
			s.keys[key] = h
			s.mu.Unlock()
			return nil
		}
		state, holder, live := cur.state, cur.ss, cur.inUse(time.Now())
		s.mu.Unlock()
		if state != holdSession || live {
			return keyConflict(key, h.state, state, holder)
		}
		if err := s.destroy(ctx, holder); err != nil {
			return sandbox.WrapError(op, fmt.Sprintf("workspace %q: tearing down expired session %s failed", key, holder.id), err)
		}
	}
}

// releaseKey frees key if h holds it still.
func (s *Sandbox) releaseKey(key string, h *keyHold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropHold(key, h)
}

// dropHold frees key if h holds it still. Call with s.mu held.
func (s *Sandbox) dropHold(key string, h *keyHold) {
	if h != nil && s.keys[key] == h {
		delete(s.keys, key)
	}
}

// keyConflict refuses a taker (holdCreating: a create; holdRemoving: a
// removal) the key that a holder in state holds, holder its session if
// any, saying what the caller can do about it.
func keyConflict(key string, taker, holds holdState, holder *session) error {
	var msg string
	switch {
	case holds == holdRemoving && taker == holdRemoving:
		msg = fmt.Sprintf("persistent workspace %q is already being removed by another call", key)
	case holds == holdRemoving:
		msg = fmt.Sprintf("persistent workspace %q is being removed; try again once the removal is done", key)
	case taker != holdRemoving:
		msg = fmt.Sprintf("persistent workspace %q is in use by live session %s; one live session per key", key, holder.id)
	case holds == holdCreating:
		msg = fmt.Sprintf("persistent workspace %q is held by session %s, which is being created; destroy that session first", key, holder.id)
	default:
		msg = fmt.Sprintf("persistent workspace %q is in use by live session %s; destroy that session first", key, holder.id)
	}
	return &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict, Message: msg}
}
