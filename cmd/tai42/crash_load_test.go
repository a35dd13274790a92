//go:build crash

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tai42/sandbox"
)

// What the load does.
const (
	crashKeys          = 5   // persistent workspace keys k0..k4
	crashLongTTL       = 600 // seconds: most sessions outlive the run
	crashShortTTL      = 2   // seconds: some expire across a kill
	crashMaxExecs      = 12  // streamed execs running at once
	crashMaxFile       = 1 << 20
	crashOpTimeout     = 30 * time.Second
	crashExecTimeout   = 20 * time.Second
	crashStreamTimeout = 120 * time.Second
)

// crashPaths are the workspace paths the load writes: few, so that puts
// replace each other.
var crashPaths = []string{"f0.bin", "f1.bin", "sub/f2.bin", "sub/deep/f3.bin"}

// fileVersion is one content a workspace path may hold.
type fileVersion struct {
	absent bool
	put    int // the put that wrote it; -1: none of the client's
	size   int
	sum    [sha256.Size]byte
}

func (v fileVersion) String() string {
	if v.absent {
		return "nothing"
	}
	return fmt.Sprintf("put #%d (%d bytes, sha256 %x)", v.put, v.size, v.sum[:6])
}

// versionOf is the version of data, written by put n.
func versionOf(data []byte, n int) fileVersion {
	return fileVersion{put: n, size: len(data), sum: sha256.Sum256(data)}
}

// mfile is one workspace path as the client knows it: every content its
// calls allow (one, unless a put's outcome is unknown).
type mfile struct {
	accept []fileVersion
	busy   bool // a put or get of it is in flight
}

func (f *mfile) absent() (fileVersion, bool) {
	for _, v := range f.accept {
		if v.absent {
			return v, true
		}
	}
	return fileVersion{}, false
}

func (f *mfile) match(data []byte) (fileVersion, bool) {
	sum := sha256.Sum256(data)
	for _, v := range f.accept {
		if !v.absent && v.sum == sum && v.size == len(data) {
			return v, true
		}
	}
	return fileVersion{}, false
}

func (f *mfile) want() string {
	parts := make([]string, len(f.accept))
	for i, v := range f.accept {
		parts[i] = v.String()
	}
	return strings.Join(parts, " or ")
}

// workspace is the files of an ephemeral session, or of a persistent key.
type workspace struct {
	files map[string]*mfile
}

func newWorkspace() *workspace {
	w := &workspace{files: map[string]*mfile{}}
	for _, p := range crashPaths {
		w.files[p] = &mfile{accept: []fileVersion{{absent: true}}}
	}
	return w
}

// written reports whether a put may have written any of its files.
func (w *workspace) written() bool {
	for _, f := range w.files {
		if _, ok := f.absent(); !ok || len(f.accept) > 1 {
			return true
		}
	}
	return false
}

type destroyState int

const (
	notDestroyed   destroyState = iota
	destroying                  // a destroy is in flight
	destroyUnknown              // its destroy was in flight at the kill
)

// msession is a session the client saw created (or found listed after a
// restart, its create having been in flight at the kill).
type msession struct {
	id     string
	n      int // its create's op number
	spec   sandbox.SessionSpec
	wsPath string
	sess   sandbox.Session // of the current daemon; nil until fetched after a restart (or when it failed to work)
	seenAt time.Time       // when the client learned of it
	key    *mkey           // the persistent key it holds; nil for ephemeral
	ws     *workspace      // its own files, or its key's

	// What the daemon may have set: exact once read, else the bounds of
	// the calls that set it.
	createdLow, createdHigh time.Time
	expLow, expHigh         time.Time

	destroy   destroyState
	destroyAt time.Time // when a destroy began; zero when none did
	touched   bool      // a touch was sent: an info may show what a kill then undid
}

func (s *msession) where() string {
	if s.key != nil {
		return fmt.Sprintf("session %s (persistent workspace %q)", s.id, s.key.name)
	}
	return fmt.Sprintf("session %s (ephemeral)", s.id)
}

// mkey is one persistent workspace key.
type mkey struct {
	name    string
	holder  *msession // the session the client knows holds it
	pending bool      // a create on it is in flight, or its outcome unknown
	ws      *workspace
	holders []string // every session that held it, oldest first
}

// pendingCreate is a create whose outcome the kill made unknown.
type pendingCreate struct {
	n          int
	spec       sandbox.SessionSpec
	key        *mkey
	start, end time.Time
}

// mismatch says how a listed session differs from the create's spec; ""
// when it does not.
func (pc *pendingCreate) mismatch(in sandbox.SessionInfo) string {
	var bad []string
	if in.Image != pc.spec.Image || in.Durability != pc.spec.Durability || in.WorkspaceKey != pc.spec.WorkspaceKey {
		bad = append(bad, fmt.Sprintf("image %q, durability %q, key %q (asked %q, %q, %q)", in.Image, in.Durability, in.WorkspaceKey,
			pc.spec.Image, pc.spec.Durability, pc.spec.WorkspaceKey))
	}
	if in.CreatedAt.Before(pc.start) || in.CreatedAt.After(pc.end) {
		bad = append(bad, fmt.Sprintf("created_at %s, outside the create call (%s)", fmtTime(in.CreatedAt), fmtSpan(pc.start, pc.end)))
	}
	if d := in.ExpiresAt.Sub(in.CreatedAt); d != pc.spec.TTL() {
		bad = append(bad, fmt.Sprintf("expires_at %v after created_at, not the ttl %v (no touch reached it)", d, pc.spec.TTL()))
	}
	return strings.Join(bad, ", ")
}

// crashExec is one streamed exec.
type crashExec struct {
	n     int
	s     *msession
	kind  string // "ticker" (prints x forever) or "echoer" (echoes stdin lines)
	h     sandbox.ExecHandle
	start time.Time
	done  chan struct{} // closed when its reader has ended

	mu      sync.Mutex
	busy    bool     // a stdin, close or kill call is in flight
	lines   []string // lines sent to its stdin, in order (the outcome of the last may be unknown)
	closeAt time.Time
	killAt  time.Time
	out     bytes.Buffer
	endAt   time.Time
	exit    *sandbox.StreamExit
	endErr  error
}

// keyHistory describes who held persistent workspace key, for a failure
// message: the last sessions on it and how each went.
func (m *model) keyHistory(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range m.keys {
		if k.name != key {
			continue
		}
		ids := k.holders
		if len(ids) > 3 {
			ids = ids[len(ids)-3:]
		}
		var parts []string
		for _, id := range ids {
			state := "live"
			if why, ok := m.gone[id]; ok {
				state = why
			}
			parts = append(parts, id+" ("+state+")")
		}
		if len(parts) == 0 {
			return "no session held it"
		}
		return "its last sessions: " + strings.Join(parts, ", ")
	}
	return "not a key of the test's"
}

// lastKill is when the daemon was last killed; zero before any kill.
func (m *model) lastKill() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.killAt
}

// opStat counts one kind of op in a round.
type opStat struct{ issued, ok, excused, inflight int }

// model is the client's view of the daemon: what it saw created,
// destroyed and written. Safe for concurrent use: mu guards everything but
// killed.
type model struct {
	mu        sync.Mutex
	seq       int
	sessions  map[string]*msession
	gone      map[string]string    // id -> how it went (destroyed, expired, lost)
	goneAt    map[string]time.Time // id -> when the client learned it went
	everSeen  map[string]bool
	pending   map[int]*pendingCreate
	keys      []*mkey
	execs     []*crashExec   // this round's
	execNames map[int]string // every streamed exec's description, by number
	execIDs   map[int]string // every streamed exec's session, by number
	killAt    time.Time
	stats     map[string]*opStat

	killed atomic.Bool
}

func newModel() *model {
	m := &model{sessions: map[string]*msession{}, gone: map[string]string{}, goneAt: map[string]time.Time{}, everSeen: map[string]bool{},
		pending: map[int]*pendingCreate{}, execNames: map[int]string{}, execIDs: map[int]string{}}
	for i := range crashKeys {
		m.keys = append(m.keys, &mkey{name: "k" + strconv.Itoa(i), ws: newWorkspace()})
	}
	return m
}

func (m *model) next() int { m.seq++; return m.seq }

func (m *model) beginRound() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.execs = nil
	m.stats = map[string]*opStat{}
	m.killed.Store(false)
}

func (m *model) markKilled() {
	m.mu.Lock()
	m.killAt = time.Now()
	m.mu.Unlock()
	m.killed.Store(true)
}

// count records an op's outcome: ok, excused (an error with a cause), or
// a failure the caller reports; inflight when it ended after the kill.
func (m *model) count(op string, ok, excused bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.countLocked(op, ok, excused)
}

// countLocked is count with mu held.
func (m *model) countLocked(op string, ok, excused bool) {
	st := m.stats[op]
	if st == nil {
		st = &opStat{}
		m.stats[op] = st
	}
	st.issued++
	switch {
	case ok:
		st.ok++
	case excused:
		st.excused++
	}
	if m.killed.Load() {
		st.inflight++
	}
}

func (m *model) inflightSummary() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	total := 0
	var parts []string
	for _, op := range slices.Sorted(func(yield func(string) bool) {
		for k := range m.stats {
			if !yield(k) {
				return
			}
		}
	}) {
		st := m.stats[op]
		total += st.issued
		if st.inflight > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", st.inflight, op))
		}
	}
	running := 0
	for _, e := range m.execs {
		if end := e.ended(); end.IsZero() || !end.Before(m.killAt) {
			running++
		}
	}
	return fmt.Sprintf("%d ops, in flight at the kill: %s; %d streamed execs running", total, strings.Join(parts, ", "), running)
}

func (m *model) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

func (m *model) roundExecs() []*crashExec {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.execs)
}

// forget drops s from the live sessions; why says how it went. mu held.
func (m *model) forget(s *msession, why string) {
	if m.sessions[s.id] != s {
		return
	}
	delete(m.sessions, s.id)
	m.gone[s.id], m.goneAt[s.id] = why, time.Now()
	if s.key != nil && s.key.holder == s {
		s.key.holder = nil
	}
}

// added records a session the client saw created. mu held.
func (m *model) added(n int, spec sandbox.SessionSpec, sess sandbox.Session, key *mkey, start, end time.Time) *msession {
	s := &msession{id: sess.ID(), n: n, spec: spec, wsPath: sess.WorkspacePath(), sess: sess, key: key,
		createdLow: start, createdHigh: end, expLow: start.Add(spec.TTL()), expHigh: end.Add(spec.TTL()), seenAt: end}
	if key != nil {
		key.holder, key.pending, s.ws = s, false, key.ws
		key.holders = append(key.holders, s.id)
	} else {
		s.ws = newWorkspace()
	}
	m.sessions[s.id] = s
	m.everSeen[s.id] = true
	return s
}

// adopt records a listed session of a create that was in flight at the
// kill. mu held.
func (m *model) adopt(pc *pendingCreate, in sandbox.SessionInfo) *msession {
	delete(m.pending, pc.n)
	s := &msession{id: in.ID, n: pc.n, spec: pc.spec, wsPath: in.WorkspacePath, key: pc.key,
		createdLow: in.CreatedAt, createdHigh: in.CreatedAt, expLow: in.ExpiresAt, expHigh: in.ExpiresAt, seenAt: time.Now()}
	if pc.key != nil {
		if pc.key.holder != nil {
			return nil // reported by the caller's checks: two sessions on a key
		}
		pc.key.holder, pc.key.pending, s.ws = s, false, pc.key.ws
		pc.key.holders = append(pc.key.holders, s.id)
	} else {
		s.ws = newWorkspace()
	}
	m.sessions[s.id] = s
	m.everSeen[s.id] = true
	return s
}

// dropPending forgets the creates in flight at the kill that made no
// listed session. mu held.
func (m *model) dropPending() {
	for n, pc := range m.pending {
		if pc.key != nil {
			pc.key.pending = false
		}
		delete(m.pending, n)
	}
}

// pickSession returns a random live session the load may use; nil when
// there is none. mu held.
func (m *model) pickSession(rng *mrand.Rand) *msession {
	var live []*msession
	for _, s := range m.sessions {
		if s.destroy == notDestroyed && s.sess != nil {
			live = append(live, s)
		}
	}
	if len(live) == 0 {
		return nil
	}
	slices.SortFunc(live, func(a, b *msession) int { return strings.Compare(a.id, b.id) })
	return live[rng.IntN(len(live))]
}

// pickFile returns a path of s that no op is on, marked busy; "" when
// every one is. mu held.
func (m *model) pickFile(rng *mrand.Rand, s *msession) (string, *mfile) {
	start := rng.IntN(len(crashPaths))
	for i := range crashPaths {
		p := crashPaths[(start+i)%len(crashPaths)]
		if f := s.ws.files[p]; !f.busy {
			f.busy = true
			return p, f
		}
	}
	return "", nil
}

// excuse says why an op on s that ended at end may fail: the daemon was
// killed, s was being destroyed, or s may have expired; "" when nothing
// excuses a failure. mu held.
func (m *model) excuse(s *msession, end time.Time) string {
	switch {
	case m.killed.Load():
		return "killed"
	case !s.destroyAt.IsZero() && !s.destroyAt.After(end):
		return "destroyed"
	case !end.Before(s.expLow):
		return "expired"
	}
	return ""
}

// A crashOp is one kind of call the load makes.
type crashOp struct {
	name   string
	weight int
	run    func(c *crashRun, ctx context.Context, rng *mrand.Rand)
}

var crashOps = []crashOp{
	{"create", 12, (*crashRun).opCreate},
	{"destroy", 5, (*crashRun).opDestroy},
	{"exec", 10, (*crashRun).opExec},
	{"exec-stdin", 6, (*crashRun).opExecStdin},
	{"exec-start", 6, (*crashRun).opExecStart},
	{"write-stdin", 6, (*crashRun).opWriteStdin},
	{"end-exec", 3, (*crashRun).opEndExec},
	{"put", 16, (*crashRun).opPut},
	{"get", 10, (*crashRun).opGet},
	{"touch", 5, (*crashRun).opTouch},
	{"list", 2, (*crashRun).opList},
}

// worker makes random calls until the daemon is killed.
func (c *crashRun) worker(ctx context.Context, rng *mrand.Rand) {
	total := 0
	for _, op := range crashOps {
		total += op.weight
	}
	for !c.m.killed.Load() && ctx.Err() == nil {
		r := rng.IntN(total)
		for _, op := range crashOps {
			if r < op.weight {
				op.run(c, ctx, rng)
				break
			}
			r -= op.weight
		}
	}
}

func opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, crashOpTimeout)
}

// killedNote marks a failure seen after the kill.
func (c *crashRun) killedNote() string {
	if c.m.killed.Load() {
		return " (after the daemon was killed: a result it cannot have sent)"
	}
	return ""
}

func (c *crashRun) opCreate(ctx context.Context, rng *mrand.Rand) {
	m := c.m
	m.mu.Lock()
	if len(m.sessions) >= c.maxLive {
		m.mu.Unlock()
		c.opDestroy(ctx, rng)
		return
	}
	n := m.next()
	spec := sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: c.nets[rng.IntN(len(c.nets))],
		TTLSeconds: crashLongTTL, Labels: map[string]string{"crash-run": c.runID, "crash-n": strconv.Itoa(n)}}
	if rng.IntN(5) == 0 {
		spec.TTLSeconds = crashShortTTL
	}
	if c.caps && rng.IntN(4) == 0 {
		spec.MemoryMB = 256
	}
	var key *mkey
	if rng.IntN(5) < 2 {
		now := time.Now()
		var free []*mkey
		for _, k := range m.keys {
			// A key whose holder has certainly expired is free: the
			// daemon tears an expired holder down at the next create.
			if !k.pending && (k.holder == nil || k.holder.destroy == notDestroyed && !now.Before(k.holder.expHigh)) {
				free = append(free, k)
			}
		}
		if len(free) > 0 {
			key = free[rng.IntN(len(free))]
			if key.holder != nil {
				m.forget(key.holder, "expired")
			}
			key.pending = true
			spec.Durability, spec.WorkspaceKey = sandbox.Persistent, key.name
		}
	}
	m.mu.Unlock()

	octx, cancel := opContext(ctx)
	defer cancel()
	start := time.Now()
	sess, err := c.cl.CreateSession(octx, spec)
	end := time.Now()
	if err != nil {
		m.mu.Lock()
		killed := m.killed.Load()
		if killed {
			m.pending[n] = &pendingCreate{n: n, spec: spec, key: key, start: start, end: end}
		} else if key != nil {
			key.pending = false
		}
		m.mu.Unlock()
		m.count("create", false, killed)
		if !killed {
			c.errorf("create #%d (%s): %v", n, specText(spec), err)
		}
		return
	}
	m.mu.Lock()
	s := m.added(n, spec, sess, key, start, end)
	m.mu.Unlock()
	m.count("create", true, false)

	// Its times, exactly, for the check after a restart.
	info, err := sess.Info(octx)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err == nil:
		if info.CreatedAt.Before(start) || info.CreatedAt.After(end) {
			c.errorf("session %s: created_at %s is outside its create call (%s)", s.id, fmtTime(info.CreatedAt), fmtSpan(start, end))
		}
		s.createdLow, s.createdHigh = info.CreatedAt, info.CreatedAt
		if !s.touched {
			s.expLow, s.expHigh = info.ExpiresAt, info.ExpiresAt
		}
	case m.excuse(s, time.Now()) == "":
		c.errorf("info of session %s just created: %v", s.id, err)
	}
}

func (c *crashRun) opDestroy(ctx context.Context, rng *mrand.Rand) {
	m := c.m
	m.mu.Lock()
	s := m.pickSession(rng)
	if s == nil {
		m.mu.Unlock()
		return
	}
	s.destroy, s.destroyAt = destroying, time.Now()
	m.mu.Unlock()

	octx, cancel := opContext(ctx)
	defer cancel()
	err := c.cl.DestroySession(octx, s.id)
	m.mu.Lock()
	defer m.mu.Unlock()
	killed := m.killed.Load()
	switch {
	case err == nil:
		m.forget(s, "destroyed by the client (the destroy returned)")
	case killed:
		s.destroy = destroyUnknown
	default:
		s.destroy = destroyUnknown
		c.errorf("destroying %s: %v", s.where(), err)
	}
	m.countLocked("destroy", err == nil, killed)
}

// execOutcome checks a finished exec: its own result, or an error with a
// cause.
func (c *crashRun) execOutcome(what string, s *msession, res sandbox.ExecResult, err error, wantOut string) {
	end := time.Now()
	if err == nil && res.ExitCode == 0 && res.Stdout == wantOut && res.Stderr == "" {
		c.m.count(what, true, false)
		return
	}
	c.m.mu.Lock()
	why := c.m.excuse(s, end)
	c.m.mu.Unlock()
	c.m.count(what, false, why != "")
	switch {
	case err != nil && why != "":
	case err != nil:
		c.errorf("%s in %s: %v", what, s.where(), err)
	case (why == "destroyed" || why == "expired") && res.ExitCode == 137:
		// Ended by its session's teardown.
	default:
		c.errorf("%s in %s returned exit %d, %d bytes of stdout (%q...), stderr %q; want exit 0 and %d bytes%s",
			what, s.where(), res.ExitCode, len(res.Stdout), clipText(res.Stdout), clipText(res.Stderr), len(wantOut), c.killedNote())
	}
}

func clipText(s string) string {
	if len(s) > 60 {
		return s[:60]
	}
	return s
}

func (c *crashRun) opExec(ctx context.Context, rng *mrand.Rand) {
	c.m.mu.Lock()
	s := c.m.pickSession(rng)
	n := c.m.next()
	c.m.mu.Unlock()
	if s == nil {
		return
	}
	octx, cancel := opContext(ctx)
	defer cancel()
	word := fmt.Sprintf("crash-%s-echo-%d", c.runID, n)
	res, err := s.sess.Exec(octx, []string{"echo", word}, sandbox.ExecOptions{Timeout: crashExecTimeout})
	c.execOutcome("exec", s, res, err, word+"\n")
}

func (c *crashRun) opExecStdin(ctx context.Context, rng *mrand.Rand) {
	c.m.mu.Lock()
	s := c.m.pickSession(rng)
	c.m.mu.Unlock()
	if s == nil {
		return
	}
	in := make([]byte, rng.IntN(32<<10))
	for i := range in {
		in[i] = byte(rng.Uint32())
	}
	octx, cancel := opContext(ctx)
	defer cancel()
	res, err := s.sess.Exec(octx, []string{"cat"}, sandbox.ExecOptions{Stdin: in, Timeout: crashExecTimeout})
	c.execOutcome("exec-stdin", s, res, err, string(in))
}

// execScripts are the streamed execs' commands; $0 is the exec's marker,
// so that its process is found on the machine by its command line.
var execScripts = map[string]string{
	// The ticker ignores SIGPIPE so that it outlives the daemon that reads
	// its output, like a server an exec started: after a kill only the
	// provider's recovery can end it.
	"ticker": `trap "" PIPE; while :; do echo x 2>/dev/null; sleep 0.05; done`,
	"echoer": `while IFS= read -r l; do echo "got $l"; done`,
}

// execMarker marks the process of streamed exec n of this run.
func (c *crashRun) execMarker(n int) string { return fmt.Sprintf("crashmark-%s-%d", c.runID, n) }

func (c *crashRun) opExecStart(ctx context.Context, rng *mrand.Rand) {
	m := c.m
	m.mu.Lock()
	running := 0
	for _, e := range m.execs {
		if e.ended().IsZero() {
			running++
		}
	}
	if running >= crashMaxExecs {
		m.mu.Unlock()
		c.opEndExec(ctx, rng)
		return
	}
	s := m.pickSession(rng)
	n := m.next()
	m.mu.Unlock()
	if s == nil {
		return
	}
	kind := "ticker"
	if rng.IntN(2) == 0 {
		kind = "echoer"
	}
	octx, cancel := opContext(ctx)
	defer cancel()
	start := time.Now()
	h, err := s.sess.ExecStart(octx, []string{"sh", "-c", execScripts[kind], c.execMarker(n)}, sandbox.StartOptions{Timeout: crashStreamTimeout})
	if err != nil {
		m.mu.Lock()
		why := m.excuse(s, time.Now())
		m.mu.Unlock()
		m.count("exec-start", false, why != "")
		if why == "" {
			c.errorf("streamed exec #%d (%s) in %s: %v", n, kind, s.where(), err)
		}
		return
	}
	m.count("exec-start", true, false)
	e := &crashExec{n: n, s: s, kind: kind, h: h, start: start, done: make(chan struct{})}
	m.mu.Lock()
	m.execs = append(m.execs, e)
	m.execNames[n] = fmt.Sprintf("streamed exec #%d (%s, started %s)", n, kind, fmtTime(start))
	m.execIDs[n] = s.id
	m.mu.Unlock()
	go c.readExec(e)
}

// ended is when e's stream ended; zero while it runs. Safe for
// concurrent use.
func (e *crashExec) ended() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.endAt
}

// readExec reads e's stream to its end.
func (c *crashRun) readExec(e *crashExec) {
	defer close(e.done)
	for {
		item, err := e.h.Next(c.bg)
		e.mu.Lock()
		if err != nil {
			e.endAt, e.endErr = time.Now(), err
			e.mu.Unlock()
			return
		}
		switch it := item.(type) {
		case *sandbox.StreamChunk:
			e.out.Write(it.Data)
		case *sandbox.StreamExit:
			e.endAt, e.exit = time.Now(), it
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
	}
}

// pickExec returns a running streamed exec no call is on, marked busy.
func (c *crashRun) pickExec(rng *mrand.Rand, kind string) *crashExec {
	execs := c.m.roundExecs()
	start := rng.IntN(len(execs) + 1)
	for i := range execs {
		e := execs[(start+i)%len(execs)]
		e.mu.Lock()
		if !e.busy && e.endAt.IsZero() && e.killAt.IsZero() && e.closeAt.IsZero() && (kind == "" || e.kind == kind) {
			e.busy = true
			e.mu.Unlock()
			return e
		}
		e.mu.Unlock()
	}
	return nil
}

func (c *crashRun) opWriteStdin(ctx context.Context, rng *mrand.Rand) {
	e := c.pickExec(rng, "echoer")
	if e == nil {
		return
	}
	e.mu.Lock()
	line := fmt.Sprintf("line-%d-%d", e.n, len(e.lines))
	e.lines = append(e.lines, line)
	e.mu.Unlock()
	octx, cancel := opContext(ctx)
	defer cancel()
	err := e.h.WriteStdin(octx, []byte(line+"\n"))
	c.execCallDone(e, "write-stdin", err)
}

// opEndExec ends a streamed exec: closes an echoer's stdin, or kills it.
func (c *crashRun) opEndExec(ctx context.Context, rng *mrand.Rand) {
	e := c.pickExec(rng, "")
	if e == nil {
		return
	}
	octx, cancel := opContext(ctx)
	defer cancel()
	if e.kind == "echoer" && rng.IntN(2) == 0 {
		e.mu.Lock()
		e.closeAt = time.Now()
		e.mu.Unlock()
		c.execCallDone(e, "close-stdin", e.h.CloseStdin(octx))
		return
	}
	e.mu.Lock()
	e.killAt = time.Now()
	e.mu.Unlock()
	c.execCallDone(e, "kill-exec", e.h.Kill(octx))
}

// execCallDone records the outcome of a call on a streamed exec.
func (c *crashRun) execCallDone(e *crashExec, op string, err error) {
	end := time.Now()
	e.mu.Lock()
	e.busy = false
	ended := !e.endAt.IsZero()
	e.mu.Unlock()
	c.m.mu.Lock()
	why := c.m.excuse(e.s, end)
	c.m.mu.Unlock()
	if why == "" && ended && err != nil {
		why = "ended" // its stream ended meanwhile: checked by verifyExecs
	}
	c.m.count(op, err == nil, why != "")
	if err != nil && why == "" {
		c.errorf("%s on streamed exec #%d (%s) of %s: %v", op, e.n, e.kind, e.s.where(), err)
	}
}

// verifyExecs checks how each streamed exec of the round ended: one that
// nothing ended (no kill, stdin close, destroy or expiry of its session
// before its end) must not report an exit; its output is its command's.
func (c *crashRun) verifyExecs() {
	m := c.m
	m.mu.Lock()
	killAt := m.killAt
	m.mu.Unlock()
	for _, e := range c.m.roundExecs() {
		e.mu.Lock()
		end, exit, endErr := e.endAt, e.exit, e.endErr
		out := e.out.String()
		causes := map[string]time.Time{"kill": e.killAt, "close_stdin": e.closeAt}
		lines := slices.Clone(e.lines)
		e.mu.Unlock()
		m.mu.Lock()
		causes["its session's destroy"] = e.s.destroyAt
		if !end.IsZero() && !end.Before(e.s.expLow) {
			causes["its session's expiry"] = e.s.expLow
		}
		m.mu.Unlock()
		var why []string
		for name, at := range causes {
			if !at.IsZero() && (end.IsZero() || !at.After(end)) {
				why = append(why, name)
			}
		}
		what := fmt.Sprintf("streamed exec #%d (%s) of %s", e.n, e.kind, e.s.where())
		after := end.IsZero() || !end.Before(killAt)
		switch {
		case end.IsZero():
			// Reported by waitExecs.
		case exit != nil && len(why) == 0 && after:
			c.errorf("%s reported exit %d %v after the daemon was killed, though nothing ended it: a fake exit", what, exit.ExitCode, end.Sub(killAt).Round(time.Millisecond))
		case exit != nil && len(why) == 0:
			c.errorf("%s reported exit %d while the daemon was up, though nothing ended it", what, exit.ExitCode)
		case exit != nil && len(why) == 1 && why[0] == "kill" && exit.ExitCode != 137:
			c.errorf("%s, killed, reported exit %d; want 137 (SIGKILL)", what, exit.ExitCode)
		case exit != nil && len(why) == 1 && why[0] == "close_stdin" && exit.ExitCode != 0:
			c.errorf("%s reported exit %d after its stdin was closed; want 0", what, exit.ExitCode)
		case endErr != nil && len(why) == 0 && !after:
			c.errorf("%s failed while the daemon was up, though nothing ended it: %v", what, endErr)
		}
		c.checkExecOutput(what, e.kind, out, lines)
	}
}

// checkExecOutput checks a streamed exec's output is its command's: x
// lines, or "got LINE" for the lines sent, in order (the last ones may be
// missing: the exec ended first).
func (c *crashRun) checkExecOutput(what, kind, out string, sent []string) {
	lines := strings.SplitAfter(out, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	for i, l := range lines {
		want := "x\n"
		if kind == "echoer" {
			if i >= len(sent) {
				c.errorf("%s printed %q as line %d, but only %d lines were sent to it", what, clipText(l), i+1, len(sent))
				return
			}
			want = "got " + sent[i] + "\n"
		}
		if l != want {
			c.errorf("%s printed %q as line %d; want %q", what, clipText(l), i+1, want)
			return
		}
	}
}

func (c *crashRun) opPut(ctx context.Context, rng *mrand.Rand) {
	m := c.m
	m.mu.Lock()
	s := m.pickSession(rng)
	var path string
	var f *mfile
	if s != nil {
		path, f = m.pickFile(rng, s)
	}
	n := m.next()
	m.mu.Unlock()
	if f == nil {
		return
	}
	data := c.content(n, rng)
	v := versionOf(data, n)
	octx, cancel := opContext(ctx)
	defer cancel()
	err := s.sess.PutFile(octx, path, data)
	end := time.Now()
	m.mu.Lock()
	f.busy = false
	why := ""
	if err == nil {
		f.accept = []fileVersion{v}
	} else {
		// Unknown outcome: the old content or the new.
		f.accept = append(f.accept, v)
		why = m.excuse(s, end)
	}
	m.mu.Unlock()
	m.count("put", err == nil, why != "")
	if err != nil && why == "" {
		c.errorf("put #%d of %s (%d bytes) in %s: %v", n, path, len(data), s.where(), err)
	}
}

// content is put n's content: a header naming it, then random bytes; up to
// crashMaxFile bytes.
func (c *crashRun) content(n int, rng *mrand.Rand) []byte {
	size := rng.IntN(4 << 10)
	if rng.IntN(2) == 0 {
		size = rng.IntN(crashMaxFile)
	}
	hdr := fmt.Sprintf("tai42 crash test %s put #%d\n", c.runID, n)
	data := make([]byte, len(hdr)+size)
	copy(data, hdr)
	body := data[len(hdr):]
	for len(body) >= 8 {
		u := rng.Uint64()
		for i := range 8 {
			body[i] = byte(u >> (8 * i))
		}
		body = body[8:]
	}
	for i := range body {
		body[i] = byte(rng.Uint32())
	}
	return data
}

// headerOf is a file's first line, for a failure message.
func headerOf(data []byte) string {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	if len(line) > 80 {
		line = line[:80]
	}
	return strconv.Quote(string(line))
}

func (c *crashRun) opGet(ctx context.Context, rng *mrand.Rand) {
	m := c.m
	m.mu.Lock()
	s := m.pickSession(rng)
	var path string
	var f *mfile
	if s != nil {
		path, f = m.pickFile(rng, s)
	}
	m.mu.Unlock()
	if f == nil {
		return
	}
	octx, cancel := opContext(ctx)
	defer cancel()
	data, err := s.sess.GetFile(octx, path)
	end := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	f.busy = false
	ok, why := false, ""
	switch {
	case errors.Is(err, sandbox.ErrFileNotFound):
		if v, has := f.absent(); has {
			f.accept, ok = []fileVersion{v}, true
		} else if why = m.excuse(s, end); why == "" {
			c.errorf("get of %s in %s: not found; it holds %s", path, s.where(), f.want())
		}
	case err != nil:
		if why = m.excuse(s, end); why == "" {
			c.errorf("get of %s in %s: %v", path, s.where(), err)
		}
	default:
		if v, has := f.match(data); has {
			f.accept, ok = []fileVersion{v}, true
		} else {
			c.errorf("get of %s in %s: %d bytes %s, none of %s%s", path, s.where(), len(data), headerOf(data), f.want(), c.killedNote())
		}
	}
	m.countLocked("get", ok, why != "")
}

func (c *crashRun) opTouch(ctx context.Context, rng *mrand.Rand) {
	m := c.m
	m.mu.Lock()
	s := m.pickSession(rng)
	if s != nil {
		s.touched = true
	}
	m.mu.Unlock()
	if s == nil {
		return
	}
	octx, cancel := opContext(ctx)
	defer cancel()
	start := time.Now()
	err := s.sess.Touch(octx)
	end := time.Now()
	m.mu.Lock()
	ttl := s.spec.TTL()
	why := ""
	if err == nil {
		// Touch sets max(expires_at, now+ttl), now within the call.
		s.expLow = later(s.expLow, start.Add(ttl))
		s.expHigh = later(s.expHigh, end.Add(ttl))
	} else if why = m.excuse(s, end); why == "killed" {
		s.expHigh = later(s.expHigh, end.Add(ttl))
	}
	m.mu.Unlock()
	m.count("touch", err == nil, why != "")
	if err != nil && why == "" {
		c.errorf("touch of %s: %v", s.where(), err)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// opList checks the daemon's list against the client's view: every
// session certainly live over the call is listed; none the client
// destroyed is.
func (c *crashRun) opList(ctx context.Context, _ *mrand.Rand) {
	octx, cancel := opContext(ctx)
	defer cancel()
	t0 := time.Now()
	infos, err := c.cl.ListSessions(octx)
	t1 := time.Now()
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	killed := m.killed.Load()
	m.countLocked("list", err == nil, killed)
	if err != nil {
		if !killed {
			c.errorf("list: %v", err)
		}
		return
	}
	listed := map[string]bool{}
	for _, in := range infos {
		listed[in.ID] = true
		if why, ok := m.gone[in.ID]; ok && strings.HasPrefix(why, "destroyed by the client") && m.goneAt[in.ID].Before(t0) {
			c.errorf("list shows session %s, which was %s", in.ID, why)
		}
	}
	for _, s := range m.sessions {
		if !listed[s.id] && s.seenAt.Before(t0) && s.destroyAt.IsZero() && t1.Before(s.expLow) {
			c.errorf("list does not show %s, created (%s) and not destroyed, expiring no sooner than %s", s.where(), fmtSpan(s.createdLow, s.createdHigh), fmtTime(s.expLow))
		}
	}
}
