package sandboxtest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func (s *suite) specClauses() []clause {
	return []clause{
		{"Invalid", s.testSpecInvalid},
		{"Policy", s.testSpecPolicy},
		{"Unenforceable", s.testSpecUnenforceable},
		{"Accepted", s.testSpecAccepted},
		{"NetworkNone", s.testNetworkNone},
		{"MemoryCap", s.testMemoryCap},
		{"CPUCap", s.testCPUCap},
		{"CPUCapThrottles", s.testCPUCapThrottles},
	}
}

// The tiers in the contract's order, weakest first: isolation none <
// container < vm, network none < internal < egress. The suite ranks by
// these lists, never by the contract package's own rank functions, so
// that ranks swapped there are caught here rather than mirrored.
var (
	isolations = []sandbox.Isolation{sandbox.IsolationNone, sandbox.IsolationContainer, sandbox.IsolationVM}
	networks   = []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress}
)

// strength and openness are the rank of an isolation and a network in the
// lists above.
func strength(i sandbox.Isolation) int { return slices.Index(isolations, i) }
func openness(n sandbox.Network) int   { return slices.Index(networks, n) }

// specCase is one create the suite makes under a policy.
type specCase struct {
	name   string
	policy sandbox.Policy
	mutate func(*sandbox.SessionSpec)
	reason sandbox.RejectReason // "" for a spec that must be accepted
	field  string
}

// runSpecCases creates each case's session on a fresh sandbox with its
// policy: a rejected one must leave no session behind.
func (s *suite) runSpecCases(t *testing.T, cases []specCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := s.testContext(t)
			sb := s.newSandbox(t, Config{Policy: c.policy})
			sess, err := sb.CreateSession(ctx, s.spec(c.mutate))
			if sess != nil {
				destroyAtCleanup(t, sb, sess.ID())
			}
			if c.reason == "" {
				if err != nil {
					t.Errorf("CreateSession with %s under policy %+v: %v; want it accepted", c.name, c.policy, err)
				}
				return
			}
			wantRejected(t, err, c.reason, c.field, fmt.Sprintf("CreateSession with %s under policy %+v", c.name, c.policy))
			wantListed(t, sb)
		})
	}
}

// A malformed spec is rejected as invalid, naming the field.
func (s *suite) testSpecInvalid(t *testing.T) {
	invalid := func(name, field string, mutate func(*sandbox.SessionSpec)) specCase {
		return specCase{name: name, policy: permissive, mutate: mutate, reason: sandbox.ReasonInvalid, field: field}
	}
	s.runSpecCases(t, []specCase{
		invalid("image=empty", "image", func(sp *sandbox.SessionSpec) { sp.Image = "" }),
		invalid("ttl_seconds=0", "ttl_seconds", func(sp *sandbox.SessionSpec) { sp.TTLSeconds = 0 }),
		invalid("ttl_seconds=-5", "ttl_seconds", func(sp *sandbox.SessionSpec) { sp.TTLSeconds = -5 }),
		invalid("cpu=-1", "cpu", func(sp *sandbox.SessionSpec) { sp.CPU = -1 }),
		invalid("memory_mb=-1", "memory_mb", func(sp *sandbox.SessionSpec) { sp.MemoryMB = -1 }),
		invalid("durability=forever", "durability", func(sp *sandbox.SessionSpec) { sp.Durability = "forever" }),
		invalid("network=wide", "network", func(sp *sandbox.SessionSpec) { sp.Network = "wide" }),
		invalid("isolation=chroot", "isolation", func(sp *sandbox.SessionSpec) { sp.Isolation = "chroot" }),
		invalid("persistent_without_workspace_key", "workspace_key", func(sp *sandbox.SessionSpec) { sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "" }),
		invalid("label_key_with_space", "labels", func(sp *sandbox.SessionSpec) { sp.Labels = map[string]string{"has space": "x"} }),
		invalid("env_key_with_equals", "env", func(sp *sandbox.SessionSpec) { sp.Env = sandbox.SecretEnv(map[string]string{"A=B": "v"}) }),
	})
}

// A spec that breaks the operator policy is rejected as a policy violation:
// a network looser than the egress ceiling, an isolation below the floor
// (the provider's own level included), persistent while durable is off.
func (s *suite) testSpecPolicy(t *testing.T) {
	var cases []specCase
	for _, floor := range isolations {
		policy := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: floor, Durable: true}
		for _, iso := range isolations {
			if strength(iso) < strength(floor) {
				cases = append(cases, specCase{name: fmt.Sprintf("isolation=%s_below_floor_%s", iso, floor), policy: policy,
					mutate: func(sp *sandbox.SessionSpec) { sp.Isolation = iso }, reason: sandbox.ReasonPolicy, field: "isolation"})
			}
		}
		if strength(s.opts.Isolation) < strength(floor) {
			cases = append(cases, specCase{name: fmt.Sprintf("isolation=own_%s_below_floor_%s", s.opts.Isolation, floor), policy: policy,
				reason: sandbox.ReasonPolicy, field: "isolation"})
		}
	}
	for _, ceiling := range networks {
		policy := sandbox.Policy{Egress: ceiling, Isolation: sandbox.IsolationNone, Durable: true}
		for _, n := range networks {
			if openness(n) > openness(ceiling) {
				cases = append(cases, specCase{name: fmt.Sprintf("network=%s_above_ceiling_%s", n, ceiling), policy: policy,
					mutate: func(sp *sandbox.SessionSpec) { sp.Network = n }, reason: sandbox.ReasonPolicy, field: "network"})
			}
		}
	}
	cases = append(cases, specCase{name: "persistent_with_durable_off", policy: sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone},
		mutate: persistent(), reason: sandbox.ReasonPolicy, field: "durability"})
	s.runSpecCases(t, cases)
}

// What the provider cannot enforce it rejects as unenforceable, never
// downgrading: a network tier, a stronger isolation, an unknown image, caps,
// persistence.
func (s *suite) testSpecUnenforceable(t *testing.T) {
	unenforceable := func(name, field string, mutate func(*sandbox.SessionSpec)) specCase {
		return specCase{name: name, policy: permissive, mutate: mutate, reason: sandbox.ReasonUnenforceable, field: field}
	}
	cases := []specCase{
		unenforceable("image=tai42-no-such-image", "image", func(sp *sandbox.SessionSpec) { sp.Image = "tai42-no-such-image" }),
	}
	for _, n := range networks {
		if !slices.Contains(s.opts.Networks, n) {
			cases = append(cases, unenforceable("network="+string(n), "network", func(sp *sandbox.SessionSpec) { sp.Network = n }))
		}
	}
	for _, iso := range isolations {
		if strength(iso) > strength(s.opts.Isolation) {
			cases = append(cases, unenforceable("isolation="+string(iso), "isolation", func(sp *sandbox.SessionSpec) { sp.Isolation = iso }))
		}
	}
	if !s.opts.Caps {
		cases = append(cases,
			unenforceable("cpu=1", "cpu", func(sp *sandbox.SessionSpec) { sp.CPU = 1 }),
			unenforceable("memory_mb=64", "memory_mb", func(sp *sandbox.SessionSpec) { sp.MemoryMB = 64 }))
	}
	if !s.opts.Durable {
		cases = append(cases, unenforceable("persistent", "durability", persistent()))
	}
	s.runSpecCases(t, cases)
}

// What the provider honours within the policy is accepted: each honoured
// network (at the ceiling too), the provider's own isolation named or left
// unset at a floor it meets; scrub_transcript is no create-time gate.
func (s *suite) testSpecAccepted(t *testing.T) {
	var cases []specCase
	for _, n := range s.opts.Networks {
		cases = append(cases, specCase{name: "network=" + string(n) + "_at_ceiling", policy: sandbox.Policy{Egress: n, Isolation: sandbox.IsolationNone},
			mutate: func(sp *sandbox.SessionSpec) { sp.Network = n }})
	}
	atFloor := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: s.opts.Isolation}
	cases = append(cases,
		specCase{name: "isolation=own_at_floor", policy: atFloor},
		specCase{name: "isolation=" + string(s.opts.Isolation) + "_at_floor", policy: atFloor, mutate: func(sp *sandbox.SessionSpec) { sp.Isolation = s.opts.Isolation }},
		specCase{name: "scrub_transcript", policy: sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, ScrubTranscript: true}},
	)
	s.runSpecCases(t, cases)
}

// A session on network none sees loopback only (or, where none is a
// fence, the provider's check shows it reaches nothing).
func (s *suite) testNetworkNone(t *testing.T) {
	if !slices.Contains(s.opts.Networks, sandbox.NetworkNone) {
		t.Skip("the provider does not honour network none")
	}
	ctx := s.testContext(t)
	_, sess := s.fresh(t, func(sp *sandbox.SessionSpec) { sp.Network = sandbox.NetworkNone })
	if s.opts.NetworkNoneFenced != nil {
		s.opts.NetworkNoneFenced(t, sess)
		return
	}
	var ifaces []string
	// /proc/net/dev shows the reader's own network namespace, whatever
	// mounted /sys.
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, "cat", "/proc/net/dev"); res.ExitCode == 0 {
		for line := range strings.Lines(res.Stdout) {
			if name, _, ok := strings.Cut(line, ":"); ok {
				ifaces = append(ifaces, strings.TrimSpace(name))
			}
		}
	} else if res := run(t, ctx, sess, sandbox.ExecOptions{}, "ls", "/sys/class/net"); res.ExitCode == 0 {
		ifaces = strings.Fields(res.Stdout)
	} else {
		t.Skip("neither /proc/net/dev nor /sys/class/net is readable in the session")
	}
	for _, name := range ifaces {
		if name != "lo" {
			t.Errorf("a session on network none sees the interfaces %q; want loopback (lo) only", ifaces)
			break
		}
	}
}

// alloc is a shell that holds n bytes in memory, then prints n.
func alloc(n int) []string {
	return shArgv(fmt.Sprintf(`x=$(head -c %d /dev/zero | tr '\0' a); echo ${#x}`, n))
}

// A memory cap is enforced: a command allocating far past it does not
// succeed.
func (s *suite) testMemoryCap(t *testing.T) {
	if !s.opts.Caps {
		t.Skip("Options.Caps is false: the provider enforces no caps")
	}
	ctx := s.testContext(t)
	_, sess := s.fresh(t, func(sp *sandbox.SessionSpec) { sp.MemoryMB = 64 })
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, alloc(1_000_000)...); res.ExitCode != 0 || res.Stdout != "1000000\n" {
		t.Fatalf("holding 1 MB under a 64 MiB cap: %+v; want exit 0 and \"1000000\"", res)
	}
	res, err := sess.Exec(ctx, alloc(200_000_000), sandbox.ExecOptions{Timeout: 30 * time.Second})
	switch {
	case err == nil && res.ExitCode == 0:
		t.Errorf("a command holding 200 MB under memory_mb 64 succeeded (stdout %q); the cap must stop it", res.Stdout)
	case errors.Is(err, sandbox.ErrExecTimeout):
		// A timeout is no sign of a cap: a capped command is stopped
		// within its first 64 MiB, a fraction of a second of work, while
		// an uncapped one on a loaded machine can take 30 s to fill 200 MB.
		t.Errorf("a command holding 200 MB under memory_mb 64 ran into its timeout (%v); the cap must stop it long before", err)
	case err != nil:
		wantKind(t, err, sandbox.ErrSandbox, "an exec past its memory cap")
	}
}

// A fractional CPU cap is accepted and commands run under it.
func (s *suite) testCPUCap(t *testing.T) {
	if !s.opts.Caps {
		t.Skip("Options.Caps is false: the provider enforces no caps")
	}
	ctx := s.testContext(t)
	_, sess := s.fresh(t, func(sp *sandbox.SessionSpec) { sp.CPU = 0.5 })
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, "echo", "ok"); res != (sandbox.ExecResult{Stdout: "ok\n"}) {
		t.Errorf("Exec(echo ok) under cpu 0.5 = %+v; want exit 0 and \"ok\"", res)
	}
}

// spin is a shell that keeps a CPU busy for wall seconds of wall time (read
// from /proc/uptime, in hundredths, with builtins only), then prints the
// CPU time it got, in clock ticks (utime+stime of /proc/self/stat; Linux
// reports them at USER_HZ, 100 a second).
func spin(wall int) []string {
	return shArgv(fmt.Sprintf(`read u _ </proc/uptime; n=${u%%.*}${u#*.}; e=$((n+%d))
while [ "$n" -lt "$e" ]; do
	i=0; while [ $i -lt 200 ]; do i=$((i+1)); done
	read u _ </proc/uptime; n=${u%%.*}${u#*.}
done
read -r st </proc/$$/stat; set -- ${st#*) }; echo $((${12}+${13}))`, wall*100))
}

// cpuCapRounds is how many times testCPUCapThrottles measures before it
// gives up on a machine too loaded to tell.
const cpuCapRounds = 5

// A CPU cap is applied, not only accepted: a command spinning for 1 s of
// wall time under cpu 0.1 gets at most a quarter of a second of CPU, while
// the same command in an uncapped session, run alongside as a control,
// gets more than twice as much. The cap is small so that a loaded machine
// (a CI run's other tests on two cores) still leaves the control enough
// to show it: it needs more than 0.25 s of a core, not more than 0.5 s.
func (s *suite) testCPUCapThrottles(t *testing.T) {
	if !s.opts.Caps {
		t.Skip("Options.Caps is false: the provider enforces no caps")
	}
	ctx := s.testContext(t)
	sb, capped := s.fresh(t, func(sp *sandbox.SessionSpec) { sp.CPU = 0.1 })
	control := s.newSession(t, sb, nil)
	ticks := func(sess sandbox.Session) (int, error) {
		res, err := sess.Exec(ctx, spin(1), sandbox.ExecOptions{Timeout: execTimeout})
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("exit code %d, stderr %q", res.ExitCode, res.Stderr)
		}
		return strconv.Atoi(strings.TrimSpace(res.Stdout))
	}
	// A loaded machine may starve the control too; a few rounds give it
	// its chance to show that the measure works.
	for round := 1; ; round++ {
		var (
			wg           sync.WaitGroup
			cappedTicks  int
			cappedErr    error
			controlTicks int
			controlErr   error
		)
		wg.Go(func() { cappedTicks, cappedErr = ticks(capped) })
		wg.Go(func() { controlTicks, controlErr = ticks(control) })
		wg.Wait()
		if cappedErr != nil || controlErr != nil {
			t.Fatalf("spinning for 1 s: under cpu 0.25: %v; uncapped: %v", cappedErr, controlErr)
		}
		if cappedTicks > 25 {
			t.Fatalf("a command spinning for 1 s of wall time under cpu 0.1 got %.2f s of CPU (uncapped alongside: %.2f s); want at most 0.25 s: the cap is not applied", float64(cappedTicks)/100, float64(controlTicks)/100)
		}
		if controlTicks > 25 && controlTicks > 2*cappedTicks {
			return
		}
		if round == cpuCapRounds {
			t.Skipf("the uncapped control got only %.2f s of CPU in 1 s of wall time (capped: %.2f s), %d times: the machine is too loaded to tell a cap", float64(controlTicks)/100, float64(cappedTicks)/100, cpuCapRounds)
		}
	}
}
