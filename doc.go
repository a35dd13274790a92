// Package sandbox is the TAI42 sandbox contract in Go: the neutral session
// models, the resolved [Policy], the error family and the three interfaces a
// consumer programs against ([Sandbox], [Session], [ExecHandle]).
//
// Like io/fs, it holds no implementation: validation and ranking only. The
// shared session ledger, TTL/reap bookkeeping, path resolution and the
// create-time policy chokepoint live in package kit, which is the one way to
// build a provider; providers live under provider/; package sandboxtest is
// the conformance suite every provider runs.
//
// # Errors
//
// Every error the contract names is matchable with errors.Is and errors.As,
// both as itself and as a [SandboxError]:
//
//	errors.Is(err, sandbox.ErrSandbox)        // any sandbox failure
//	errors.Is(err, sandbox.ErrExecTimeout)    // this kind in particular
//	var te *sandbox.ExecTimeoutError
//	errors.As(err, &te)                       // its fields
//	var se *sandbox.SandboxError
//	errors.As(err, &se)                       // as the family base
//
// # Secrets
//
// Environment values are [Secret]s end to end. A Secret never shows its value
// in fmt verbs, slog, JSON or error texts; only [Secret.Reveal] reads it.
//
// # Paths
//
// cwd and file paths are workspace-relative by default: a relative path
// resolves against the session's workspace_path and must stay inside it after
// cleaning. See package kit for the exact rules.
package sandbox
