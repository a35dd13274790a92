package sandboxtest

import (
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// Config is what the suite asks of the factory for one fresh sandbox.
type Config struct {
	// Policy is the policy the sandbox enforces.
	Policy sandbox.Policy
	// ReapInterval is the background reaper's cadence; 0 means the
	// provider's default. The suite asks for a long one (1h) where Reap
	// results must be exact, and a short one (100ms) to test the reaper.
	ReapInterval time.Duration
	// Logger is the logger the sandbox logs through (at every level, debug
	// included); the factory passes it to the provider's constructor. The
	// suite reads what it receives to check that no env value reaches a
	// log line.
	Logger *slog.Logger
}

// Factory returns a fresh sandbox for cfg. It registers its own cleanup with
// t.Cleanup (closing the sandbox, removing its state) and fails t if it
// cannot build one.
type Factory func(t *testing.T, cfg Config) sandbox.Sandbox

// Options state what the provider under test documents that it honours.
type Options struct {
	// Image is an image the provider honours, e.g. "host".
	Image string
	// Isolation is the provider's own level, e.g. "none".
	Isolation sandbox.Isolation
	// Networks are the tiers it honours; every other tier must be rejected
	// with a *SpecRejectedError of Reason ReasonUnenforceable.
	Networks []sandbox.Network
	// NetworkNoneFenced, when set, is how a provider whose network none is
	// a fence around an interface rather than a network namespace of
	// loopback only (a Pod under a deny-all NetworkPolicy keeps its eth0)
	// shows that the session reaches nothing: the NetworkNone clause calls
	// it with a fresh none session in place of its loopback-only check.
	NetworkNoneFenced func(t *testing.T, sess sandbox.Session)
	// Durable: the provider has durable storage, so persistent sessions
	// work; otherwise a persistent spec must be rejected as unenforceable.
	Durable bool
	// Caps: cpu and memory_mb caps are enforced; otherwise a spec with
	// either must be rejected as unenforceable.
	Caps bool
	// AbsoluteOutsideWorkspaceRefused is true for providers whose sessions
	// share the host's filesystem (isolation none): an absolute path outside
	// workspace_path is refused with a plain *SandboxError. The suite then
	// also checks the host side (nothing written, workspaces removed), and
	// that sessions' workspace paths differ (a provider whose sessions have
	// filesystems of their own may show every workspace at one path).
	AbsoluteOutsideWorkspaceRefused bool
	// KillStopsLeftovers is the documented behaviour that Kill on a handle
	// whose command already exited also ends the processes it left running.
	KillStopsLeftovers bool
	// User, when set, names a user the provider runs an exec as (see
	// [UserOptions]): the User clauses run execs as it. nil: the provider
	// runs no exec as a user, and must refuse one with a *SandboxError.
	User *UserOptions
	// Logs: the factories pass Config.Logger to the provider, whose every
	// log line goes through it; the suite then checks those lines for
	// secrets. Otherwise that clause skips.
	Logs bool
	// CreateTimeout is how long one create may take on the provider when
	// that can be more than a clause's 40 s: a Kubernetes Pod's start on a
	// loaded node (the provider's own CreateTimeout). Every clause's
	// deadline, and each create's, grows by it. 0: a clause's calls, its
	// creates among them, share 40 s.
	CreateTimeout time.Duration
	// Restartable, when set, makes a fresh sandbox for cfg as the Factory
	// does, and a function that starts it again on the same state, as a
	// daemon started again would see it: after the sandbox was closed
	// (crash false), or after its process died without closing it (crash
	// true: the sandbox is abandoned, e.g. with kit.Sandbox.Abandon, and
	// its live sessions must come back). Both register their sandboxes'
	// cleanup. nil: the restart clauses skip.
	Restartable func(t *testing.T, cfg Config) (sb sandbox.Sandbox, restart func(crash bool) sandbox.Sandbox)
}

// permissive is the policy of every clause but the policy-rule ones.
var permissive = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}

type suite struct {
	factory Factory
	opts    Options
}

// clause is one subtest: one clause of the contract.
type clause struct {
	name string
	run  func(t *testing.T)
}

// Run runs the conformance suite against the sandboxes newSandbox makes: one
// named subtest per clause of the contract, each on a fresh sandbox, in
// parallel, each bounded by a deadline.
func Run(t *testing.T, newSandbox Factory, opts Options) {
	t.Helper()
	switch {
	case newSandbox == nil:
		t.Fatal("sandboxtest.Run: the Factory is nil")
	case opts.Image == "":
		t.Fatal("sandboxtest.Run: Options.Image must name an image the provider honours")
	case !opts.Isolation.Valid():
		t.Fatalf("sandboxtest.Run: Options.Isolation %q is not one of none, container, vm", opts.Isolation)
	case len(opts.Networks) == 0:
		t.Fatal("sandboxtest.Run: Options.Networks must list the tiers the provider honours")
	}
	for _, n := range opts.Networks {
		if !n.Valid() {
			t.Fatalf("sandboxtest.Run: Options.Networks holds %q, not one of none, internal, egress", n)
		}
	}
	if u := opts.User; u != nil && (u.Name == "" || sandbox.ValidUser(u.Name) != nil || u.UID < 0 || u.GID < 0 || u.Home == "") {
		t.Fatalf("sandboxtest.Run: Options.User %+v must name a user (a name, its uid and gid, its home)", *u)
	}
	markHostEnv(t)

	s := &suite{factory: newSandbox, opts: opts}
	groups := []struct {
		name    string
		clauses []clause
	}{
		{"Sandbox", s.sandboxClauses()},
		{"Spec", s.specClauses()},
		{"Session", s.sessionClauses()},
		{"Durability", s.durabilityClauses()},
		{"Exec", s.execClauses()},
		{"ExecStart", s.streamClauses()},
		{"Cancel", s.cancelClauses()},
		{"Files", s.fileClauses()},
		{"FileStream", s.fileStreamClauses()},
		{"Restart", s.restartClauses()},
		{"Workspaces", s.workspaceClauses()},
		{"User", s.userClauses()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.clauses {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t)
				})
			}
		})
	}
}

// markerVar is set in the test process while suites run; no exec may see it.
const markerVar = "TAI42_SUITE_MARKER"

var marker struct {
	sync.Mutex
	users int
}

// markHostEnv sets markerVar until the last running suite is done.
func markHostEnv(t *testing.T) {
	marker.Lock()
	defer marker.Unlock()
	if marker.users == 0 {
		os.Setenv(markerVar, "host-environment-leaked")
	}
	marker.users++
	t.Cleanup(func() {
		marker.Lock()
		defer marker.Unlock()
		if marker.users--; marker.users == 0 {
			os.Unsetenv(markerVar)
		}
	})
}
