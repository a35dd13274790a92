//go:build crash

// The crash test: "tai42 serve" under a load from many goroutines is killed
// with SIGKILL at a random moment, restarted on the same state directory,
// and checked against what the client saw (see TestCrash). It builds with
// the tag crash only, so that "go test ./..." does not run it:
//
//	go test -tags crash -run TestCrash -count=1 ./cmd/tai42/                  # quick: 5 rounds per provider
//	go test -tags crash -run TestCrash -count=1 ./cmd/tai42/ -crash.rounds 50 # full
//	go test -tags crash -run TestCrash/container -count=1 ./cmd/tai42/ -crash.seed 42
//
// crash_load_test.go holds the client's view (the model) and the load,
// crash_probe_test.go what is looked for on the machine.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/host"
)

var (
	crashRounds    = flag.Int("crash.rounds", 5, "crash test: rounds (kill and restart) per provider; 50 is the full mode")
	crashProviders = flag.String("crash.providers", "host,container", "crash test: the providers to run, comma-separated (host, container)")
	crashSeed      = flag.Uint64("crash.seed", 0, "crash test: the seed of its random choices (load length, ops, specs, contents); 0 draws one, which the test prints")
	crashWorkers   = flag.Int("crash.workers", 8, "crash test: goroutines driving the load")
	crashBin       = flag.String("crash.bin", "", "crash test: a tai42 binary to test instead of building this tree's")
	crashKeepGoing = flag.Bool("crash.keepgoing", false, "crash test: go on with the next rounds after a round failed (by default the run stops there, cleans up and reports)")
)

// Tunables of the crash test.
const (
	crashMinLoad     = 300 * time.Millisecond
	crashMaxLoad     = 3 * time.Second
	crashReap        = 500 * time.Millisecond // the daemon's --reap-interval
	crashReapWait    = 3 * crashReap          // for expired sessions to be reaped
	crashStartWait   = 60 * time.Second       // for a daemon's listening line
	crashWorkersWait = 60 * time.Second       // for the load's calls to return after the kill
	crashExecsWait   = 15 * time.Second       // for the streamed execs to end after the kill
	crashProcsWait   = 3 * time.Second        // for killed processes to go after a restart
	crashMaxErrors   = 80                     // failures reported per provider; the rest are counted
	// crashNetPrefix is the container daemon's network prefix
	// (--net-prefix), the crash test's own.
	crashNetPrefix = "tcrsh"
)

// TestCrash kills "tai42 serve" with SIGKILL under load and checks what a
// restart on the same state directory brings back. For each provider
// (subtests host and container; container skips without root or runc) one
// state directory and one daemon at a time go through -crash.rounds rounds:
// a load from -crash.workers goroutines for 0.3 to 3 s (creates of
// ephemeral and persistent sessions on a few workspace keys, some with a
// 2 s ttl; execs, execs with stdin, streamed execs; puts and gets of files
// up to 1 MiB; touches, lists, destroys), SIGKILL with calls in flight, a
// restart, and the checks:
//   - every session created and not destroyed (nor its destroy in flight)
//     and not expired is listed with the same id, image, workspace key,
//     durability, labels, workspace_path, created_at and an expires_at the
//     client's touches allow, fetches, runs an exec, and holds the files
//     put into it; an expired one is not listed; one whose create or
//     destroy was in flight is either, and works if listed;
//   - every file of a persistent workspace reads back as the last put the
//     client saw succeed, or, for a put in flight at the kill, as the old or
//     the new content, never another (through the session holding the key,
//     or a new one on it); no other file is in the workspace;
//   - an exec or streamed exec in flight at the kill failed on the client
//     (a result must be the command's own; a streamed exec nothing ended
//     must not report an exit);
//   - nothing is left that no listed session owns: no exec process, no
//     ephemeral workspace or temp directory, runtime state, cgroup, mount,
//     network namespace, veth, bridge or nftables table (see leftovers).
//
// Sessions carry over from round to round. At the end every session is
// destroyed through the client, the daemon stopped with SIGTERM, and the
// machine must hold nothing of the test but its persistent workspaces,
// whose files are checked once more. A failure names the provider, the
// round and the seed; -crash.seed replays the choices (not the timing).
func TestCrash(t *testing.T) {
	seed := *crashSeed
	if seed == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		seed = uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
			uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
		seed &= 1<<53 - 1 // printable without loss by anything that reads it back
	}
	if *crashRounds < 1 || *crashWorkers < 1 {
		t.Fatalf("-crash.rounds %d and -crash.workers %d must be at least 1", *crashRounds, *crashWorkers)
	}
	var providers []string
	for p := range strings.SplitSeq(*crashProviders, ",") {
		switch p = strings.TrimSpace(p); p {
		case host.Name, container.Name:
			providers = append(providers, p)
		case "":
		default:
			t.Fatalf("-crash.providers: unknown provider %q (want host, container)", p)
		}
	}
	t.Logf("crash test: seed %d (replay its choices with -crash.seed %d), %d rounds per provider, %d load goroutines",
		seed, seed, *crashRounds, *crashWorkers)
	bin := *crashBin
	if bin == "" {
		bin = buildBinary(t)
	} else if _, err := os.Stat(bin); err != nil {
		t.Fatalf("-crash.bin: %v", err)
	}
	for _, p := range providers {
		t.Run(p, func(t *testing.T) {
			if p == container.Name {
				requireContainer(t)
			}
			runCrash(t, bin, p, seed)
		})
	}
}

// crashRun is one provider's run of the crash test: its state directory,
// the daemon of the moment, the client's view (model) and what was seen on
// the machine. Its fields but the model are used by the test's goroutine
// only, unless noted.
type crashRun struct {
	t        *testing.T
	bin      string
	provider string
	seed     uint64
	state    string // the state directory, absolute
	runID    string // unique to this run: in labels, file headers and exec markers

	bg     context.Context // ends at the run's cleanup
	cancel context.CancelFunc

	// round (1..rounds; 0 before the first, rounds+1 at the end) and
	// phase (what the run does) name the moment in failure messages. The
	// test's goroutine sets them under whereMu; others read them under it.
	whereMu sync.Mutex
	round   int
	phase   string

	d      *daemonProc
	cl     *client.Client
	token  string
	logs   strings.Builder // the stderr of every daemon of the run before d
	starts int

	m *model

	// seen is every session id the run has seen: the client's, and those
	// found in the state directory. Resources on the machine named by
	// other ids (another test's) are not this run's business.
	seen map[string]bool

	nets     []sandbox.Network // the networks sessions get
	caps     bool              // the provider takes memory_mb
	maxLive  int               // sessions the load keeps at most
	ownNet   bool              // nothing of crashNetPrefix existed before the run
	finished bool              // the final checks ran

	reported   map[string]bool // leftovers already reported (they persist across rounds)
	failures   atomic.Int64    // safe for concurrent use
	suppressed atomic.Int64

	workers sync.WaitGroup // the load's goroutines
	closing atomic.Bool    // the cleanup runs: failures of goroutines still running are dropped
}

// runCrash runs the crash test for one provider.
func runCrash(t *testing.T, bin, provider string, seed uint64) {
	state, err := filepath.Abs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id := make([]byte, 4)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	c := &crashRun{
		t: t, bin: bin, provider: provider, seed: seed, state: state,
		runID: hex.EncodeToString(id), m: newModel(),
		seen: map[string]bool{}, reported: map[string]bool{},
	}
	c.nets = []sandbox.Network{sandbox.NetworkEgress}
	c.maxLive = 24
	if provider == container.Name {
		c.nets = []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress}
		c.maxLive = 16
		c.preflightNet()
	} else if os.Geteuid() == 0 {
		// Network "none" on the host runner needs a new network namespace.
		c.nets = append(c.nets, sandbox.NetworkNone)
	}
	c.bg, c.cancel = context.WithCancel(context.Background())
	t.Cleanup(c.cleanup)

	c.setPhase("first start")
	if err := c.start(); err != nil {
		c.fatalf("%v", err)
	}
	c.probeCaps()
	for round := 1; round <= *crashRounds; round++ {
		c.setRound(round)
		before := c.failures.Load()
		c.runRound()
		if c.failures.Load() > before && !*crashKeepGoing {
			t.Logf("%s: stopping after round %d, which failed (-crash.keepgoing goes on)", provider, round)
			break
		}
	}
	c.setRound(*crashRounds + 1)
	c.finish()
	if n := c.suppressed.Load(); n > 0 {
		t.Errorf("%s: %d more failures not shown (only the first %d are)", provider, n, crashMaxErrors)
	}
}

// where names the moment for a failure message: provider, round, seed.
// Safe for concurrent use.
func (c *crashRun) where() string {
	c.whereMu.Lock()
	defer c.whereMu.Unlock()
	round := fmt.Sprintf("round %d/%d", c.round, *crashRounds)
	if c.round > *crashRounds {
		round = "after the rounds"
	}
	return fmt.Sprintf("[%s %s, %s, seed %d]", c.provider, round, c.phase, c.seed)
}

func (c *crashRun) setPhase(p string) {
	c.whereMu.Lock()
	c.phase = p
	c.whereMu.Unlock()
}

func (c *crashRun) setRound(r int) {
	c.whereMu.Lock()
	c.round = r
	c.whereMu.Unlock()
}

// errorf reports a failure; safe for concurrent use. Past crashMaxErrors
// failures only count.
func (c *crashRun) errorf(format string, args ...any) {
	c.t.Helper()
	if c.closing.Load() {
		return // a load goroutine of a run that failed fatally
	}
	if c.failures.Add(1) > crashMaxErrors {
		c.suppressed.Add(1)
		return
	}
	c.t.Errorf("%s %s", c.where(), fmt.Sprintf(format, args...))
}

// fatalf reports a failure that ends the run (the cleanup still runs).
func (c *crashRun) fatalf(format string, args ...any) {
	c.t.Helper()
	c.failures.Add(1)
	c.t.Fatalf("%s %s", c.where(), fmt.Sprintf(format, args...))
}

// daemonSays returns the daemons' log lines that name id (the last few),
// indented, for a failure message; "" when none does.
func (c *crashRun) daemonSays(id string) string {
	all := c.logs.String()
	if c.d != nil {
		all += c.d.stderr.String()
	}
	var lines []string
	for l := range strings.SplitSeq(all, "\n") {
		if strings.Contains(l, id) {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	if len(lines) > 6 {
		lines = lines[len(lines)-6:]
	}
	return "\n\tthe daemons' log about it:\n\t" + strings.Join(lines, "\n\t")
}

// logTail is the end of the current daemon's stderr.
func (c *crashRun) logTail() string {
	if c.d == nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(c.d.stderr.String()), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "\n\t" + strings.Join(lines, "\n\t")
}

// start starts "tai42 serve" on the run's state directory and a client of
// it. Recovery happens before the daemon listens, so that its listening
// line says the recovery is done. An error says why it did not start,
// with its stderr.
func (c *crashRun) start() error {
	if c.d != nil {
		c.logs.WriteString(c.d.stderr.String())
	}
	c.starts++
	cmd := exec.Command(c.bin, "serve", "--provider", c.provider, "--state-dir", c.state,
		"--listen", "127.0.0.1:0", "--reap-interval", crashReap.String(),
		"--policy-durable=true", "--policy-egress", "egress", "--policy-isolation", "none",
		"--shutdown-grace", "5s", "--log-format", "text", "--net-prefix", crashNetPrefix)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	pr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting tai42 serve: %w", err)
	}
	d := &daemonProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	c.d = d
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			_, _ = d.stderr.Write([]byte(sc.Text() + "\n"))
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		d.err = cmd.Wait()
		close(d.done)
	}()
	select {
	case d.addr = <-addr:
	case <-d.done:
		return fmt.Errorf("tai42 serve (start %d) exited before listening (%v); stderr:%s", c.starts, d.err, c.logTail())
	case <-time.After(crashStartWait):
		return fmt.Errorf("tai42 serve (start %d) did not listen within %v; stderr:%s", c.starts, crashStartWait, c.logTail())
	}
	if c.token == "" {
		b, err := os.ReadFile(filepath.Join(c.state, tokenFileName))
		if err != nil {
			return fmt.Errorf("the daemon's token: %w", err)
		}
		c.token = strings.TrimSpace(string(b))
	}
	if c.cl != nil {
		c.cl.Close()
	}
	c.cl = client.New("http://"+d.addr, c.token)
	if c.starts > 1 {
		c.t.Logf("%s round %d: the daemon restarted in %v", c.provider, c.round, time.Since(began).Round(time.Millisecond))
	}
	return nil
}

// kill sends SIGKILL to the daemon, by the pid it was started with, and
// waits for it to be gone.
func (c *crashRun) kill() {
	c.m.markKilled()
	if err := c.d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.fatalf("SIGKILL to the daemon (pid %d): %v", c.d.cmd.Process.Pid, err)
	}
	select {
	case <-c.d.done:
	case <-time.After(10 * time.Second):
		c.fatalf("the daemon (pid %d) is still there 10s after SIGKILL", c.d.cmd.Process.Pid)
	}
}

// probeCaps finds whether the provider takes memory_mb (the host runner
// needs a writable cgroup tree), so that the load asks for caps only
// where they can be had.
func (c *crashRun) probeCaps() {
	spec := sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress,
		MemoryMB: 256, TTLSeconds: 60, Labels: map[string]string{"crash-run": c.runID, "crash-probe": "caps"}}
	ctx, cancel := context.WithTimeout(c.bg, crashOpTimeout)
	defer cancel()
	s, err := c.cl.CreateSession(ctx, spec)
	var rej *sandbox.SpecRejectedError
	switch {
	case errors.As(err, &rej) && rej.Reason == sandbox.ReasonUnenforceable:
		c.t.Logf("%s: no memory_mb in the load: %v", c.provider, err)
		return
	case err != nil:
		c.fatalf("creating a session with memory_mb: %v", err)
	}
	c.seen[s.ID()] = true
	if err := c.cl.DestroySession(ctx, s.ID()); err != nil {
		c.fatalf("destroying session %s: %v", s.ID(), err)
	}
	c.caps = true
}

// runRound is one round: load, kill, restart, check.
func (c *crashRun) runRound() {
	rng := mrand.New(mrand.NewPCG(c.seed, uint64(c.round)))
	load := crashMinLoad + time.Duration(rng.Int64N(int64(crashMaxLoad-crashMinLoad)))
	c.setPhase("load")
	c.m.beginRound()

	ctx, cancel := context.WithCancel(c.bg)
	defer cancel()
	for w := range *crashWorkers {
		wrng := mrand.New(mrand.NewPCG(c.seed^uint64(c.round)<<32, uint64(w)))
		c.workers.Go(func() { c.worker(ctx, wrng) })
	}
	time.Sleep(load)

	c.setPhase("kill")
	c.kill()
	workersDone := make(chan struct{})
	go func() { c.workers.Wait(); close(workersDone) }()
	select {
	case <-workersDone:
	case <-time.After(crashWorkersWait):
		c.fatalf("client calls are still in flight %v after the daemon was killed: a call to a dead daemon does not fail", crashWorkersWait)
	}
	c.waitExecs()
	c.verifyExecs()
	inflight := c.m.inflightSummary()
	c.scanStateDir()

	c.setPhase("restart")
	if err := c.start(); err != nil {
		c.fatalf("restart after the kill: %v", err)
	}
	c.setPhase("check after the restart")
	listed, adopted := c.check()
	c.t.Logf("%s round %d: load %v, %s; after the restart %d sessions listed (%d whose create was in flight), %d known to the client",
		c.provider, c.round, load.Round(time.Millisecond), inflight, listed, adopted, c.m.liveCount())
}

// waitExecs waits for every streamed exec's reader to end after the kill;
// one that does not is a failure (a dead daemon's stream must end).
func (c *crashRun) waitExecs() {
	deadline := time.After(crashExecsWait)
	for _, e := range c.m.roundExecs() {
		select {
		case <-e.done:
		case <-deadline:
			c.errorf("streamed exec #%d (%s) of session %s has not ended %v after the daemon was killed: the client's stream does not notice a dead daemon",
				e.n, e.kind, e.s.id, crashExecsWait)
			return
		}
	}
}

// scanStateDir adds the session ids found in the state directory (the
// dead daemon's, including sessions whose create was in flight) to seen,
// so that their cgroups and mounts are looked for after the restart.
func (c *crashRun) scanStateDir() {
	for _, dir := range c.sessionDirs() {
		for _, name := range readDirNames(dir) {
			if strings.HasPrefix(name, "sb-") {
				c.seen[name] = true
			}
		}
	}
	c.m.mu.Lock()
	for id := range c.m.everSeen {
		c.seen[id] = true
	}
	c.m.mu.Unlock()
}

// check compares what the restarted daemon lists with the client's view,
// looks for leftovers, then uses every listed session and reads back every
// file. It returns how many sessions were listed and how many of them
// were adopted (their create was in flight at the kill).
func (c *crashRun) check() (listed, adopted int) {
	ctx := c.bg
	ls0 := time.Now()
	infos := c.list(ctx, "after the restart")
	ls1 := time.Now()
	before := map[string]sandbox.SessionInfo{}
	for _, in := range infos {
		before[in.ID] = in
		c.seen[in.ID] = true
	}
	// The machine first, before this check makes anything. A session
	// reaped meanwhile may take its resources along: the counts are
	// bounded by the listing after the probe.
	reportMachine := c.checkMachine(before, func() map[string]sandbox.SessionInfo {
		after := map[string]sandbox.SessionInfo{}
		for _, in := range c.list(ctx, "after the probe") {
			after[in.ID] = in
		}
		return after
	})

	m := c.m
	m.mu.Lock()
	for _, id := range slices.Sorted(maps.Keys(m.sessions)) {
		s := m.sessions[id]
		in, ok := before[id]
		switch {
		case ok:
			c.compareInfo(s, in)
			s.destroy, s.destroyAt = notDestroyed, time.Time{}
			s.expLow, s.expHigh = in.ExpiresAt, in.ExpiresAt
			s.createdLow, s.createdHigh = in.CreatedAt, in.CreatedAt
		case s.destroy != notDestroyed:
			m.forget(s, "destroyed (its destroy was in flight at the kill)")
		case !ls0.Before(s.expHigh):
			m.forget(s, "expired")
		case ls1.Before(s.expLow):
			c.errorf("session %s (%s) is not listed after the restart, though it was created (at %s) and not destroyed, and expires no sooner than %s: lost%s",
				s.id, specText(s.spec), fmtTime(s.createdLow), fmtTime(s.expLow), c.daemonSays(s.id))
			m.forget(s, "lost at a restart")
		default:
			m.forget(s, "expired around the restart")
		}
	}
	for _, id := range slices.Sorted(maps.Keys(before)) {
		in := before[id]
		if _, ok := m.sessions[id]; ok {
			continue
		}
		if why, ok := m.gone[id]; ok {
			c.errorf("session %s is listed after the restart, but it was %s%s", id, why, c.daemonSays(id))
			continue
		}
		n, _ := strconv.Atoi(in.Labels["crash-n"])
		pc := m.pending[n]
		if in.Labels["crash-run"] != c.runID || pc == nil {
			c.errorf("session %s is listed after the restart, but no create of the client's made it (labels %v)%s", id, in.Labels, c.daemonSays(id))
			continue
		}
		if s := m.adopt(pc, in); s != nil {
			if problem := pc.mismatch(in); problem != "" {
				c.errorf("session %s, of create #%d which was in flight at the kill, is listed with %s", id, n, problem)
			}
			adopted++
		}
	}
	m.dropPending()
	live := slices.Collect(maps.Values(m.sessions))
	m.mu.Unlock()
	reportMachine()
	sort.Slice(live, func(i, j int) bool { return live[i].id < live[j].id })

	for _, s := range live {
		c.verifySession(ctx, s)
	}
	c.reopenWorkspaces(ctx)
	c.checkWorkspaceDirs()
	return len(before), adopted
}

// list lists the daemon's sessions; a failure ends the run.
func (c *crashRun) list(ctx context.Context, when string) []sandbox.SessionInfo {
	ctx, cancel := context.WithTimeout(ctx, crashOpTimeout)
	defer cancel()
	infos, err := c.cl.ListSessions(ctx)
	if err != nil {
		c.fatalf("listing the sessions %s: %v", when, err)
	}
	return infos
}

// compareInfo checks a listed session against the client's view of it.
// The model's lock is held.
func (c *crashRun) compareInfo(s *msession, in sandbox.SessionInfo) {
	var bad []string
	if in.Image != s.spec.Image {
		bad = append(bad, fmt.Sprintf("image %q (was %q)", in.Image, s.spec.Image))
	}
	if in.WorkspaceKey != s.spec.WorkspaceKey {
		bad = append(bad, fmt.Sprintf("workspace_key %q (was %q)", in.WorkspaceKey, s.spec.WorkspaceKey))
	}
	if in.Durability != s.spec.Durability {
		bad = append(bad, fmt.Sprintf("durability %q (was %q)", in.Durability, s.spec.Durability))
	}
	if !maps.Equal(in.Labels, s.spec.Labels) {
		bad = append(bad, fmt.Sprintf("labels %v (was %v)", in.Labels, s.spec.Labels))
	}
	if in.WorkspacePath != s.wsPath {
		bad = append(bad, fmt.Sprintf("workspace_path %q (was %q)", in.WorkspacePath, s.wsPath))
	}
	if in.CreatedAt.Before(s.createdLow) || in.CreatedAt.After(s.createdHigh) {
		bad = append(bad, fmt.Sprintf("created_at %s (was %s)", fmtTime(in.CreatedAt), fmtSpan(s.createdLow, s.createdHigh)))
	}
	if in.ExpiresAt.Before(s.expLow) || in.ExpiresAt.After(s.expHigh) {
		what := ""
		if in.ExpiresAt.Before(s.expLow) {
			what = ": earlier than a touch or the create set it"
		}
		bad = append(bad, fmt.Sprintf("expires_at %s (the client's calls allow %s%s)", fmtTime(in.ExpiresAt), fmtSpan(s.expLow, s.expHigh), what))
	}
	if len(bad) > 0 {
		c.errorf("session %s is listed after the restart with %s", s.id, strings.Join(bad, ", "))
	}
}

// verifySession uses a listed session: fetch, exec, network, files. A
// session that expires meanwhile is let go.
func (c *crashRun) verifySession(ctx context.Context, s *msession) {
	ctx, cancel := context.WithTimeout(ctx, 2*crashOpTimeout)
	defer cancel()
	expired := func(err error) bool {
		if errors.Is(err, sandbox.ErrSessionNotFound) && !time.Now().Before(s.expLow) {
			c.m.mu.Lock()
			c.m.forget(s, "expired during the check")
			c.m.mu.Unlock()
			return true
		}
		return false
	}
	sess, err := c.cl.GetSession(ctx, s.id)
	if err != nil {
		if !expired(err) {
			c.errorf("session %s is listed after the restart but cannot be fetched: %v%s", s.id, err, c.daemonSays(s.id))
		}
		return
	}
	if sess.WorkspacePath() != s.wsPath {
		c.errorf("session %s: workspace_path %q after the restart, %q before", s.id, sess.WorkspacePath(), s.wsPath)
	}
	res, err := sess.Exec(ctx, []string{"echo", "ok"}, sandbox.ExecOptions{Timeout: crashExecTimeout})
	if err != nil {
		if !expired(err) {
			c.errorf("session %s (%s) is listed after the restart, but exec echo ok fails: %v%s", s.id, specText(s.spec), err, c.daemonSays(s.id))
		}
		return
	}
	if res.ExitCode != 0 || res.Stdout != "ok\n" {
		c.errorf("session %s (%s), after the restart: exec echo ok gave exit %d, stdout %q, stderr %q", s.id, specText(s.spec), res.ExitCode, res.Stdout, res.Stderr)
		return
	}
	if c.provider == container.Name && s.spec.Network != sandbox.NetworkNone {
		// The session's end of its veth is up: its network came back.
		res, err := sess.Exec(ctx, []string{"cat", "/sys/class/net/eth0/operstate"}, sandbox.ExecOptions{Timeout: crashExecTimeout})
		if err != nil && expired(err) {
			return
		}
		if err != nil || res.ExitCode != 0 || res.Stdout != "up\n" {
			c.errorf("session %s (network %s), after the restart: eth0 is not up: exit %d, stdout %q, stderr %q, %v",
				s.id, s.spec.Network, res.ExitCode, res.Stdout, res.Stderr, err)
		}
	}
	c.m.mu.Lock()
	s.sess = sess
	c.m.mu.Unlock()
	for _, path := range crashPaths {
		if !c.verifyFile(ctx, s, sess, path) {
			return
		}
	}
}

// verifyFile reads path back through sess and checks it against what the
// client's puts allow; true when the session is still there to go on.
func (c *crashRun) verifyFile(ctx context.Context, s *msession, sess sandbox.Session, path string) bool {
	f := s.ws.files[path]
	data, err := sess.GetFile(ctx, path)
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case errors.Is(err, sandbox.ErrFileNotFound):
		if v, ok := f.absent(); ok {
			f.accept = []fileVersion{v}
			return true
		}
		c.errorf("%s: file %s is gone after the restart; it holds %s", s.where(), path, f.want())
		f.accept = []fileVersion{{absent: true}}
		return true
	case errors.Is(err, sandbox.ErrSessionNotFound) && !time.Now().Before(s.expLow):
		m.forget(s, "expired during the check")
		return false
	case err != nil:
		c.errorf("%s: reading %s after the restart: %v", s.where(), path, err)
		return false
	}
	v, ok := f.match(data)
	if !ok {
		c.errorf("%s: file %s after the restart is %d bytes %s, which is none of the contents the client's puts allow: %s",
			s.where(), path, len(data), headerOf(data), f.want())
		v = versionOf(data, -1)
	}
	f.accept = []fileVersion{v}
	return true
}

// reopenWorkspaces checks the files of every persistent workspace no
// listed session holds, through a new session on its key, kept for the
// rounds to come.
func (c *crashRun) reopenWorkspaces(ctx context.Context) {
	m := c.m
	m.mu.Lock()
	var keys []*mkey
	for _, k := range m.keys {
		if k.holder == nil && !k.pending && k.ws.written() {
			keys = append(keys, k)
		}
	}
	m.mu.Unlock()
	for _, k := range keys {
		spec := sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Persistent, WorkspaceKey: k.name,
			Network: sandbox.NetworkEgress, TTLSeconds: crashLongTTL}
		m.mu.Lock()
		n := m.next()
		spec.Labels = map[string]string{"crash-run": c.runID, "crash-n": strconv.Itoa(n)}
		m.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, crashOpTimeout)
		start := time.Now()
		sess, err := c.cl.CreateSession(cctx, spec)
		end := time.Now()
		cancel()
		if err != nil {
			c.errorf("a session on persistent workspace %q, to read its files after the restart: %v", k.name, err)
			continue
		}
		m.mu.Lock()
		s := m.added(n, spec, sess, k, start, end)
		m.mu.Unlock()
		c.seen[s.id] = true
		for _, path := range crashPaths {
			if !c.verifyFile(ctx, s, sess, path) {
				break
			}
		}
	}
}

// finish destroys every session through the client, stops the daemon
// with SIGTERM, and checks that nothing of the test is left but its
// persistent workspaces, whose files it reads once more from the disk.
func (c *crashRun) finish() {
	c.setPhase("final teardown")
	ctx, cancel := context.WithTimeout(c.bg, 2*time.Minute)
	defer cancel()
	for _, in := range c.list(ctx, "at the end") {
		c.seen[in.ID] = true
		if err := c.cl.DestroySession(ctx, in.ID); err != nil {
			c.errorf("destroying session %s at the end: %v", in.ID, err)
		}
	}
	if left := c.list(ctx, "after destroying every session"); len(left) > 0 {
		c.errorf("%d sessions are still listed after each was destroyed: %v", len(left), infoIDs(left))
	}
	c.logs.WriteString(c.d.stderr.String())
	code, took := c.d.stop(c.t)
	if code != 0 {
		c.errorf("the daemon exited %d after SIGTERM (took %v); stderr:%s", code, took, c.logTail())
	}
	c.d = nil
	c.cl.Close()
	c.cl = nil
	c.scanStateDir()
	c.setPhase("after the final SIGTERM")
	none := map[string]sandbox.SessionInfo{}
	c.checkMachine(none, func() map[string]sandbox.SessionInfo { return none })()
	c.checkWorkspaceDirs()
	c.checkWorkspaceFilesOnDisk()
	c.finished = true
}

// checkWorkspaceFilesOnDisk reads every persistent workspace's files
// from the state directory (the daemon stopped) and checks them.
func (c *crashRun) checkWorkspaceFilesOnDisk() {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range m.keys {
		err := c.withWorkspace(k.name, func(dir string) {
			for _, path := range crashPaths {
				f := k.ws.files[path]
				data, err := os.ReadFile(filepath.Join(dir, path))
				switch {
				case errors.Is(err, os.ErrNotExist):
					if _, ok := f.absent(); !ok {
						c.errorf("persistent workspace %q: file %s is gone after the daemon stopped; it held %s", k.name, path, f.want())
					}
				case err != nil:
					c.errorf("persistent workspace %q: %v", k.name, err)
				default:
					if _, ok := f.match(data); !ok {
						c.errorf("persistent workspace %q: file %s after the daemon stopped is %d bytes %s, none of %s", k.name, path, len(data), headerOf(data), f.want())
					}
				}
			}
		})
		if err != nil {
			c.errorf("persistent workspace %q: %v", k.name, err)
		}
	}
}

// withWorkspace runs fn on the directory of persistent workspace key, at
// a moment when no create can begin on it: the container provider's image
// of it (workspaces/KEY.img, its workspace the directory ws in it) as the
// daemon mounted it for the session holding the key (through the mount
// namespace it is in), or, held by none, mounted read-only here for fn's
// time, unmounted and off its loop device before withWorkspace returns;
// else the key's plain directory.
func (c *crashRun) withWorkspace(key string, fn func(dir string)) error {
	root := filepath.Join(c.state, c.provider, "workspaces")
	img := filepath.Join(root, key+".img")
	if _, err := os.Stat(img); err != nil {
		fn(filepath.Join(root, key))
		return nil
	}
	held := filepath.Join(root, "+mnt", key)
	if view, ok := c.mountedAt(held); ok {
		fn(view + filepath.Join(held, "ws"))
		return nil
	}
	mnt, err := os.MkdirTemp("", "tai42-crash-ws-")
	if err != nil {
		return err
	}
	defer os.Remove(mnt)
	// noload: no journal replay, nothing written to the image.
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "ro,loop,noload", img, mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("mounting its image %s: %v: %s", img, err, out)
	}
	fn(filepath.Join(mnt, "ws"))
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("unmounting its image %s: %v: %s", img, err, out)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		loops, err := loopsOn(root)
		if err != nil || !slices.Contains(slices.Collect(maps.Values(loops)), img) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its image %s is still on a loop device 5s after its unmount", img)
		}
	}
}

// mountedAt says whether something is mounted at mount point mp, in this
// process's mount namespace (view "") or in one of the daemon's threads'
// (view /proc/PID/task/TID/root, from where a path resolves in that
// namespace).
func (c *crashRun) mountedAt(mp string) (view string, ok bool) {
	views := []string{""}
	files := []string{"/proc/self/mountinfo"}
	if c.d != nil {
		pid := c.d.cmd.Process.Pid
		for _, tid := range readDirNames(fmt.Sprintf("/proc/%d/task", pid)) {
			views = append(views, fmt.Sprintf("/proc/%d/task/%s/root", pid, tid))
			files = append(files, fmt.Sprintf("/proc/%d/task/%s/mountinfo", pid, tid))
		}
	}
	for i, f := range files {
		mounts, _ := readMountinfoFile(f)
		if slices.ContainsFunc(mounts, func(m mountEntry) bool { return m.point == mp }) {
			return views[i], true
		}
	}
	return "", false
}

// checkWorkspaceDirs looks for files in the persistent workspaces that no
// put of the client's wrote (a put's temporary file left by the kill).
func (c *crashRun) checkWorkspaceDirs() {
	want := map[string]bool{}
	for _, p := range crashPaths {
		want[p] = true
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			want[d+"/"] = true
		}
	}
	root := filepath.Join(c.state, c.provider, "workspaces")
	keys := map[string]bool{}
	for _, name := range readDirNames(root) {
		// A key's image or its plain directory; the image mounts'
		// directory is strayDisks's.
		if key := strings.TrimSuffix(name, ".img"); name != "+mnt" && !strings.HasSuffix(name, ".img.new") {
			keys[key] = true
		}
	}
	for _, key := range slices.Sorted(maps.Keys(keys)) {
		err := c.withWorkspace(key, func(dir string) { c.checkWorkspaceDir(key, dir, want) })
		if err != nil {
			c.errorf("persistent workspace %q: %v", key, err)
		}
	}
}

// checkWorkspaceDir reports what is in dir, persistent workspace key's,
// that want does not name.
func (c *crashRun) checkWorkspaceDir(key, dir string, want map[string]bool) {
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			rel += "/"
		}
		if !want[rel] {
			detail := ""
			if fi, err := d.Info(); err == nil {
				detail = fmt.Sprintf(", %d bytes, modified %s", fi.Size(), fmtTime(fi.ModTime()))
				if kill := c.m.lastKill(); !kill.IsZero() {
					detail += " (the last kill: " + fmtTime(kill) + ")"
				}
			}
			c.leftover("workspace "+key+"/"+rel, fmt.Sprintf("%s in persistent workspace %q%s, which no put of the client's wrote (a put's temporary file?); %s",
				rel, key, detail, c.m.keyHistory(key)))
		}
		return nil
	})
}

// leftover reports something left on the machine, once per run (it stays
// from round to round): key names it, what describes it.
func (c *crashRun) leftover(key, what string) {
	if c.reported[key] {
		return
	}
	c.reported[key] = true
	c.errorf("left behind: %s", what)
}

// cleanup leaves the machine as the run found it, even when the run
// failed: it kills the daemon, then lets one more daemon start (its
// recovery) and stop (SIGTERM destroys every session), then removes by
// hand whatever is still there, and says so.
func (c *crashRun) cleanup() {
	c.closing.Store(true)
	if c.d != nil {
		_ = c.d.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-c.d.done:
		case <-time.After(10 * time.Second):
			c.t.Errorf("cleanup: the daemon (pid %d) is still there 10s after SIGKILL", c.d.cmd.Process.Pid)
		}
	}
	// A run that failed fatally may have left the load running: its
	// calls fail now, and the end of bg ends its streams.
	c.cancel()
	workersDone := make(chan struct{})
	go func() { c.workers.Wait(); close(workersDone) }()
	select {
	case <-workersDone:
	case <-time.After(crashWorkersWait):
		c.t.Errorf("cleanup: the load's goroutines are still running %v after the daemon was killed", crashWorkersWait)
	}
	if !c.finished && c.starts > 0 {
		if err := c.start(); err != nil {
			c.t.Logf("cleanup: a last daemon to tear the sessions down did not start: %v", err)
			if c.d != nil {
				_ = c.d.cmd.Process.Signal(syscall.SIGKILL)
				<-c.d.done
			}
		} else {
			for _, in := range func() []sandbox.SessionInfo {
				ctx, cancel := context.WithTimeout(context.Background(), crashOpTimeout)
				defer cancel()
				l, _ := c.cl.ListSessions(ctx)
				return l
			}() {
				c.seen[in.ID] = true
			}
			_ = c.d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.d.done:
			case <-time.After(time.Minute):
				_ = c.d.cmd.Process.Signal(syscall.SIGKILL)
				<-c.d.done
			}
		}
		c.d = nil
	}
	if c.cl != nil {
		c.cl.Close()
	}
	c.scanStateDir()
	if removed := c.removeLeftovers(); len(removed) > 0 {
		c.t.Logf("cleanup removed what the daemons left:\n\t%s", strings.Join(removed, "\n\t"))
	}
}

// specText describes a spec for a failure message (never env values).
func specText(s sandbox.SessionSpec) string {
	t := fmt.Sprintf("%s, network %s, ttl %ds", s.Durability, s.Network, s.TTLSeconds)
	if s.WorkspaceKey != "" {
		t += ", key " + s.WorkspaceKey
	}
	if s.MemoryMB > 0 {
		t += fmt.Sprintf(", memory_mb %d", s.MemoryMB)
	}
	return t
}

func fmtTime(t time.Time) string { return t.UTC().Format("15:04:05.000000") }

func fmtSpan(lo, hi time.Time) string {
	if lo.Equal(hi) {
		return fmtTime(lo)
	}
	return fmtTime(lo) + " to " + fmtTime(hi)
}

func infoIDs(infos []sandbox.SessionInfo) []string {
	ids := make([]string, len(infos))
	for i, in := range infos {
		ids[i] = in.ID
	}
	return ids
}

// readDirNames lists dir's entries; none when it cannot be read.
func readDirNames(dir string) []string {
	entries, _ := os.ReadDir(dir)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}
