package kit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tai42/sandbox"
)

// session is the kit's side of one session. Its mutable state (expires,
// destroying, res) is guarded by the kit's mutex.
type session struct {
	kit  *Sandbox
	id   string
	spec sandbox.SessionSpec
	res  Resources

	created, expires time.Time
	handle           json.RawMessage // the provider's, for the ledger
	hold             *keyHold        // its workspace_key's hold; nil: ephemeral
	adopted          bool            // made by another sandbox of a SharedLedger (or process)
	destroying       bool
	ledgerMu         sync.Mutex    // orders this session's ledger writes
	gone             chan struct{} // closed when teardown finished
	destroyErr       error
}

var (
	_ sandbox.Session      = (*session)(nil)
	_ sandbox.FileStreamer = (*session)(nil)
)

func (ss *session) ID() string { return ss.id }

func (ss *session) WorkspacePath() string { return ss.res.WorkspacePath() }

func (ss *session) expiredAt(now time.Time) bool { return !now.Before(ss.expires) }

// live returns *SessionNotFoundError once the session is destroyed or
// expired: an expired session is gone for consumers at once, before the
// reaper tears it down. Over a [SharedLedger] it asks the ledger first,
// so that a session another sandbox destroyed or touched is seen so here.
func (ss *session) live(ctx context.Context, op string) error {
	if err := ss.kit.syncShared(ctx, op, ss); err != nil {
		return err
	}
	return ss.liveLocal()
}

// liveLocal is live as this sandbox knows the session.
func (ss *session) liveLocal() error {
	ss.kit.mu.Lock()
	defer ss.kit.mu.Unlock()
	switch {
	case ss.destroying:
		return &sandbox.SessionNotFoundError{SessionID: ss.id, Detail: "it was destroyed"}
	case ss.expiredAt(time.Now()):
		return &sandbox.SessionNotFoundError{SessionID: ss.id, Detail: "it expired"}
	}
	return nil
}

func (ss *session) info(ctx context.Context) (sandbox.SessionInfo, error) {
	if err := ss.live(ctx, "session_info"); err != nil {
		return sandbox.SessionInfo{}, err
	}
	ss.kit.mu.Lock()
	expires := ss.expires // live() and this read may straddle a touch; either value is true
	ss.kit.mu.Unlock()
	labels := maps.Clone(ss.spec.Labels)
	if labels == nil {
		labels = map[string]string{} // a dict, never null, on the wire
	}
	return sandbox.SessionInfo{
		ID:            ss.id,
		Image:         ss.spec.Image,
		WorkspaceKey:  ss.spec.WorkspaceKey,
		WorkspacePath: ss.res.WorkspacePath(),
		Durability:    ss.spec.Durability,
		CreatedAt:     ss.created.UTC(),
		ExpiresAt:     expires.UTC(),
		Labels:        labels,
	}, nil
}

func (ss *session) Info(ctx context.Context) (sandbox.SessionInfo, error) { return ss.info(ctx) }

// Touch extends expires_at to max(expires_at, now+ttl): a keep-alive that
// never shortens a life.
//
// The new expires_at is in the ledger when Touch returns: a restarted
// daemon does not reap a session its client kept alive.
func (ss *session) Touch(ctx context.Context) error {
	if err := ss.kit.syncShared(ctx, "touch", ss); err != nil {
		return err
	}
	ss.kit.mu.Lock()
	now := time.Now()
	if ss.destroying || ss.expiredAt(now) {
		ss.kit.mu.Unlock()
		return &sandbox.SessionNotFoundError{SessionID: ss.id}
	}
	changed := false
	if next := now.Add(ss.spec.TTL()); next.After(ss.expires) {
		ss.expires, changed = next, true
	}
	ss.kit.mu.Unlock()
	if !changed {
		return nil
	}
	if err := ss.putLedger(ctx, StateLive); err != nil {
		// A shared ledger refuses the touch of a session another
		// sandbox destroyed meanwhile: it is not found.
		if serr := ss.kit.syncShared(ctx, "touch", ss); errors.Is(serr, sandbox.ErrSessionNotFound) {
			return serr
		}
		return sandbox.WrapError("touch", "the session ledger could not record the new expires_at", err)
	}
	return nil
}

// record is the session's ledger record in state st, as of now.
func (ss *session) record(st State) Record {
	ss.kit.mu.Lock()
	defer ss.kit.mu.Unlock()
	return Record{ID: ss.id, Provider: ss.kit.prov.Name(), State: st, Spec: ss.spec,
		WorkspacePath: ss.res.WorkspacePath(), CreatedAt: ss.created, ExpiresAt: ss.expires, Handle: ss.handle}
}

// putLedger writes the session's record in state st. Writes of one
// session are ordered, and each reads the state it writes under that
// order, so a slower writer never puts back an older expires_at; once
// the session is destroying, a touch's write is dropped.
func (ss *session) putLedger(ctx context.Context, st State) error {
	ss.ledgerMu.Lock()
	defer ss.ledgerMu.Unlock()
	ss.kit.mu.Lock()
	stale := st == StateLive && ss.destroying
	ss.kit.mu.Unlock()
	if stale {
		return nil
	}
	return ss.kit.ledger.Put(context.WithoutCancel(ctx), ss.record(st))
}

func (ss *session) Destroy(ctx context.Context) error { return ss.kit.destroy(ctx, ss) }

func (ss *session) Exec(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	req, err := ss.execRequest(ctx, "exec", argv, opts.Cwd, opts.Env, opts.Timeout, opts.User)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	req.Stdin = opts.Stdin
	return ss.res.Exec(ctx, req)
}

func (ss *session) ExecStart(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
	req, err := ss.execRequest(ctx, "exec_start", argv, opts.Cwd, opts.Env, opts.Timeout, opts.User)
	if err != nil {
		return nil, err
	}
	return ss.res.ExecStart(ctx, req)
}

func (ss *session) execRequest(ctx context.Context, op string, argv []string, cwd string, env map[string]sandbox.Secret, timeout time.Duration, user string) (ExecRequest, error) {
	ss.kit.active()
	if err := ss.live(ctx, op); err != nil {
		return ExecRequest{}, err
	}
	if timeout <= 0 {
		return ExecRequest{}, sandbox.Errorf(op, "a timeout is required and must be > 0 (got %v); the provider's default is %v", timeout, ss.kit.execTimeout)
	}
	if len(argv) == 0 {
		return ExecRequest{}, sandbox.Errorf(op, "argv is empty: name a command to run")
	}
	if argv[0] == "" {
		return ExecRequest{}, sandbox.Errorf(op, "argv[0] is an empty string: name a command to run")
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return ExecRequest{}, sandbox.Errorf(op, "argv[%d] contains a NUL byte", i)
		}
	}
	for k, v := range env {
		if err := sandbox.ValidEnvKey(k); err != nil {
			return ExecRequest{}, sandbox.Errorf(op, "%v", err)
		}
		if strings.IndexByte(v.Reveal(), 0) >= 0 {
			return ExecRequest{}, sandbox.Errorf(op, "env %q: value contains a NUL byte", k)
		}
	}
	if err := sandbox.ValidUser(user); err != nil {
		return ExecRequest{}, sandbox.Errorf(op, "%v", err)
	}
	if _, ok := ss.kit.prov.(UserRunner); user != "" && !ok {
		return ExecRequest{}, sandbox.Errorf(op, "user %q: the %s provider cannot run an exec as a user of its choosing; leave user unset to run as the session's default user", user, ss.kit.prov.Name())
	}
	p, err := ss.resolve(op, cwd, true)
	if err != nil {
		return ExecRequest{}, err
	}
	merged := maps.Clone(ss.spec.Env)
	if merged == nil {
		merged = make(map[string]sandbox.Secret, len(env))
	}
	maps.Copy(merged, env)
	return ExecRequest{Argv: argv, Cwd: p, Env: merged, Timeout: timeout, User: user}, nil
}

func (ss *session) PutFile(ctx context.Context, path string, data []byte) error {
	if err := ss.live(ctx, "put_file"); err != nil {
		return err
	}
	p, err := ss.resolve("put_file", path, false)
	if err != nil {
		return err
	}
	return ss.res.PutFile(ctx, p, data)
}

func (ss *session) GetFile(ctx context.Context, path string) ([]byte, error) {
	if err := ss.live(ctx, "get_file"); err != nil {
		return nil, err
	}
	p, err := ss.resolve("get_file", path, false)
	if err != nil {
		return nil, err
	}
	return ss.res.GetFile(ctx, p)
}

// PutFileFrom implements [sandbox.FileStreamer]: through the provider's
// [FileStreamer] when it has one, else by reading r whole and PutFile.
func (ss *session) PutFileFrom(ctx context.Context, path string, r io.Reader) error {
	if err := ss.live(ctx, "put_file"); err != nil {
		return err
	}
	p, err := ss.resolve("put_file", path, false)
	if err != nil {
		return err
	}
	if fs, ok := ss.res.(FileStreamer); ok {
		return fs.PutFileFrom(ctx, p, r)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return sandbox.WrapError("put_file", fmt.Sprintf("reading the content of %q failed", path), err)
	}
	return ss.res.PutFile(ctx, p, data)
}

// OpenFile implements [sandbox.FileStreamer]: through the provider's
// [FileStreamer] when it has one, else GetFile's bytes.
func (ss *session) OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	if err := ss.live(ctx, "get_file"); err != nil {
		return nil, 0, err
	}
	p, err := ss.resolve("get_file", path, false)
	if err != nil {
		return nil, 0, err
	}
	if fs, ok := ss.res.(FileStreamer); ok {
		return fs.OpenFile(ctx, p)
	}
	data, err := ss.res.GetFile(ctx, p)
	if err != nil {
		return nil, 0, err
	}
	return io.NopCloser(bytes.NewReader(data)), int64(len(data)), nil
}

func (ss *session) resolve(op, path string, isCwd bool) (Path, error) {
	if op == "put_file" && strings.HasSuffix(path, "/") {
		return Path{}, sandbox.Errorf(op, "%q ends with '/', which names a directory; name a file", path)
	}
	return Resolve(op, ss.res.WorkspacePath(), path, isCwd, ss.kit.prov.SharedFilesystem())
}

// Resolve applies the path rules: a relative path resolves against ws and
// must stay inside it after cleaning; an absolute path inside ws is made
// relative; an absolute path outside ws is refused when the session shares
// the host's filesystem (shared), and otherwise passed on as a path in the
// session's own filesystem. An empty path is the workspace itself for a cwd
// (allowEmpty) and refused otherwise. Refusals are *sandbox.SandboxError
// naming the path. Symlinks are the provider's to refuse (os.Root).
func Resolve(op, ws, path string, allowEmpty, shared bool) (Path, error) {
	refuse := func(why string) (Path, error) {
		return Path{}, sandbox.Errorf(op, "path %q refused: %s", path, why)
	}
	switch {
	case strings.IndexByte(path, 0) >= 0:
		return refuse("it contains a NUL byte")
	case path == "" && allowEmpty:
		return Path{Rel: ".", Abs: ws, Orig: path}, nil
	case path == "":
		return refuse("it is empty; name a file in the workspace")
	}
	if filepath.IsAbs(path) {
		clean := filepath.Clean(path)
		if rel, ok := within(ws, clean); ok {
			return Path{Rel: rel, Abs: clean, Orig: path}, nil
		}
		if shared {
			return refuse(fmt.Sprintf("it is outside the workspace %s and this session shares the host's filesystem", ws))
		}
		return Path{Abs: clean, Orig: path}, nil
	}
	if !filepath.IsLocal(path) {
		return refuse("it climbs out of the workspace")
	}
	rel := filepath.Clean(path)
	return Path{Rel: rel, Abs: filepath.Join(ws, rel), Orig: path}, nil
}

// within reports whether the clean absolute path p is ws or below it, and
// its path relative to ws.
func within(ws, p string) (string, bool) {
	ws = filepath.Clean(ws)
	if p == ws {
		return ".", true
	}
	prefix := ws + string(filepath.Separator)
	if ws == string(filepath.Separator) {
		prefix = ws
	}
	if strings.HasPrefix(p, prefix) {
		return p[len(prefix):], true
	}
	return "", false
}
