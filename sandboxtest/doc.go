// Package sandboxtest is the conformance suite of the sandbox contract: every
// provider (and every client that speaks the contract over a wire) runs it to
// prove that its [sandbox.Sandbox], [sandbox.Session] and [sandbox.ExecHandle]
// keep the contract, in the spirit of testing/fstest.TestFS and
// golang.org/x/net/nettest.TestConn.
//
// A provider calls [Run] from one of its own tests with a [Factory], which
// builds a fresh, independent Sandbox for the [Config] the suite asks for and
// registers its teardown with t.Cleanup, and with [Options], which state what
// the provider documents that it honours:
//
//	func TestConformance(t *testing.T) {
//		newSandbox := func(t *testing.T, cfg sandboxtest.Config) sandbox.Sandbox {
//			sb, err := host.New(host.Options{
//				Options:         kit.Options{Policy: cfg.Policy, ReapInterval: cfg.ReapInterval},
//				ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()},
//			})
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { sb.Close(context.Background()) })
//			return sb
//		}
//		sandboxtest.Run(t, newSandbox, sandboxtest.Options{
//			Image:     "host",
//			Isolation: sandbox.IsolationNone,
//			Networks:  []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkEgress},
//			Durable:   true,
//			Caps:      true,
//			AbsoluteOutsideWorkspaceRefused: true,
//			KillStopsLeftovers:              true,
//		})
//	}
//
// Run runs one named subtest per clause of the contract, grouped as
// Sandbox/..., Spec/..., Session/..., Durability/..., Exec/..., ExecStart/...,
// Cancel/..., Files/..., FileStream/..., Workspaces/... (for a sandbox that is a
// [sandbox.WorkspaceManager]), User/... (execs as the user [Options.User]
// names, or their refusal when it names none) and Restart/... (the last needs
// [Options.Restartable]: a persistent workspace survives a restart, and
// live sessions survive the death of the sandbox's process) (for example Exec/Timeout or ExecStart/KillDuringRun), so
// that go test -run selects one clause. Clauses run in parallel, each on its
// own Sandbox from the factory; run the suite under -race. A clause that does
// not apply to the provider's Options is skipped with the reason. The clauses
// are parallel subtests, so they run after the calling test function returns
// and finish before that test completes: release shared resources with
// t.Cleanup, not after Run returns.
//
// CLAUSES.md, beside this package's source, lists every clause with what
// it proves (the doc comment of the function that runs it); a test of this
// package keeps it in step with the source.
//
// A call that gives up because its context ended (Exec, Next, WriteStdin,
// ...) must fail with an error of the contract's family that wraps ctx.Err():
// errors.Is matches both sandbox.ErrSandbox and context.DeadlineExceeded (or
// context.Canceled), never sandbox.ErrExecTimeout; the Cancel clauses check
// it.
//
// Every call the suite makes is bounded by a context deadline. A call that
// does not return within a few seconds of its context ending fails the clause
// instead of hanging the test binary, and a call that panics fails it too.
//
// Sessions must offer a POSIX sh and the usual utilities (cat, echo, printf,
// sleep, head, tail, tr, ls, pwd, ln, mkfifo, chmod, id, kill, env, wc) on
// their PATH, as the host image and a busybox image do.
//
// While it runs, the suite sets the variable TAI42_SUITE_MARKER in the test
// process's own environment and checks that no exec sees it: an exec's
// environment is the session's and the exec's env, never the host's.
package sandboxtest
