package sandboxtest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/unixuser/unixusertest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/provider/host/hosttest"
	"github.com/tai42/sandbox/sandboxtest"
)

// A mutant is the host runner with exactly one bug injected by a wrapper at
// the contract's interfaces (sandbox.Sandbox, Session, ExecHandle), or by
// the Config its factory is given, and the clauses of the suite that must
// fail on it. TestMutants runs each mutant's clauses in a child process and
// fails for every mutant they let through: a suite that passes a broken
// provider proves nothing about a correct one.
type mutant struct {
	name string
	// bug says what the mutant does wrong.
	bug string
	// clauses are the clauses that must kill it, each "Group/Clause"; Clause
	// may be an alternation, "(A|B)".
	clauses []string
	// wrap injects the bug around a fresh host runner; nil leaves it as is.
	wrap func(sandbox.Sandbox) sandbox.Sandbox
	// config changes the Config the host runner is made with; nil keeps it.
	config func(sandboxtest.Config) sandboxtest.Config
}

// asNobody are the mutants whose clauses run as unixusertest.Nobody, in a
// child of their own and against a control of their own: root reads a
// file of mode 000, so as root (CI) Files/PermissionDenied skips.
var asNobody = map[string]bool{"permission-not-found": true}

// withoutUsers are the mutants whose clauses run on the host runner with
// its user support hidden (the kit then refuses every exec with a user)
// and Options.User nil, as the suite checks a provider that runs none,
// against a control of their own.
var withoutUsers = map[string]bool{"user-unsupported-runs": true}

// withoutUsersEnv tells a child to run on the host runner withoutUsers
// describes.
const withoutUsersEnv = "TAI42_MUTANT_WITHOUT_USERS"

// variant is how a mutant's child runs: as root on the host runner, as
// Nobody, or without user support.
type variant struct{ nobody, noUsers bool }

func variantOf(name string) variant { return variant{asNobody[name], withoutUsers[name]} }

// wrapCfg are the wraps, by mutant name, of bugs that need the Config the
// host runner was made with (its Logger); such a mutant has no wrap.
var wrapCfg = map[string]func(sandbox.Sandbox, sandboxtest.Config) sandbox.Sandbox{
	"secret-in-log": func(sb sandbox.Sandbox, cfg sandboxtest.Config) sandbox.Sandbox {
		log := cfg.Logger
		if log == nil {
			log = slog.Default()
		}
		return sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				for k, v := range opts.Env {
					log.Debug("exec", "env", k+"="+v.Reveal())
				}
				return s.Exec(ctx, argv, opts)
			}}
		})(sb)
	},
}

// mutants must each be killed by the clauses they name.
var mutants = []mutant{
	// Exec results.
	{"exec-exit-code", "Exec reports every non-zero exit code as 1", []string{"Exec/ExitCode"},
		execResult(func(r sandbox.ExecResult) sandbox.ExecResult {
			if r.ExitCode != 0 {
				r.ExitCode = 1
			}
			return r
		}), nil},
	{"exec-streams-swapped", "Exec returns stdout as stderr and stderr as stdout", []string{"Exec/ExitCode"},
		execResult(func(r sandbox.ExecResult) sandbox.ExecResult { r.Stdout, r.Stderr = r.Stderr, r.Stdout; return r }), nil},
	{"exec-signal-code", "a command killed by SIGKILL reports 9, not 128+9", []string{"Exec/Signal"},
		execResult(func(r sandbox.ExecResult) sandbox.ExecResult {
			if r.ExitCode == 137 {
				r.ExitCode = 9
			}
			return r
		}), nil},
	{"exec-not-found-code", "a command that cannot be found reports 1, not 127", []string{"Exec/NotFound"},
		execResult(func(r sandbox.ExecResult) sandbox.ExecResult {
			if r.ExitCode == 127 {
				r.ExitCode = 1
			}
			return r
		}), nil},
	{"exec-not-executable-code", "a command that cannot be executed reports 127, not 126", []string{"Exec/NotExecutable"},
		execResult(func(r sandbox.ExecResult) sandbox.ExecResult {
			if r.ExitCode == 126 {
				r.ExitCode = 127
			}
			return r
		}), nil},
	{"exec-timeout-stdout-len", "ExecTimeoutError.StdoutLen is one more than the bytes produced", []string{"Exec/Timeout"},
		execErr(func(err error) error {
			if te, ok := errors.AsType[*sandbox.ExecTimeoutError](err); ok {
				c := *te
				c.StdoutLen++
				return &c
			}
			return err
		}), nil},
	{"exec-output-limit-truncated", "an output past the limit is returned truncated with no error, not an OutputLimitError", []string{"Exec/OutputLimit"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				res, err := s.Exec(ctx, argv, opts)
				if ol, ok := errors.AsType[*sandbox.OutputLimitError](err); ok {
					return sandbox.ExecResult{Stdout: strings.Repeat("\x00", int(ol.Limit))}, nil
				}
				return res, err
			}}
		}), nil},
	{"exec-output-limit-stdout-len", "OutputLimitError.StdoutLen is one less than the bytes received", []string{"Exec/OutputLimit"},
		execErr(func(err error) error {
			if ol, ok := errors.AsType[*sandbox.OutputLimitError](err); ok {
				c := *ol
				c.StdoutLen--
				return &c
			}
			return err
		}), nil},
	{"exec-output-limit-stderr-len", "OutputLimitError.StderrLen is one more than the bytes received", []string{"Exec/OutputLimit"},
		execErr(func(err error) error {
			if ol, ok := errors.AsType[*sandbox.OutputLimitError](err); ok {
				c := *ol
				c.StderrLen++
				return &c
			}
			return err
		}), nil},
	{"exec-bad-timeout-defaulted", "a timeout of 0 or less is taken as 20s, not refused", []string{"Exec/BadTimeout"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s,
				exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
					if opts.Timeout <= 0 {
						opts.Timeout = 20 * time.Second
					}
					return s.Exec(ctx, argv, opts)
				},
				execStart: func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
					if opts.Timeout <= 0 {
						opts.Timeout = 20 * time.Second
					}
					return s.ExecStart(ctx, argv, opts)
				}}
		}), nil},
	{"exec-empty-argv-runs-true", "an empty argv runs true instead of being refused", []string{"Exec/EmptyArgv"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				if len(argv) == 0 {
					argv = []string{"true"}
				}
				return s.Exec(ctx, argv, opts)
			}}
		}), nil},
	{"exec-stdin-dropped", "Exec gives the command an empty stdin, whatever Stdin holds", []string{"Exec/Stdin"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				opts.Stdin = nil
				return s.Exec(ctx, argv, opts)
			}}
		}), nil},
	{"cwd-ignored", "an exec's cwd is ignored: it runs in the workspace", []string{"Exec/Cwd", "ExecStart/CwdAndEnv"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s,
				exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
					opts.Cwd = ""
					return s.Exec(ctx, argv, opts)
				},
				execStart: func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
					opts.Cwd = ""
					return s.ExecStart(ctx, argv, opts)
				}}
		}), nil},
	{"env-precedence-reversed", "the spec's env wins over the exec's on a collision", []string{"Exec/Env", "ExecStart/CwdAndEnv"},
		specSessions(func(spec sandbox.SessionSpec, s sandbox.Session) sandbox.Session {
			overlay := func(env map[string]sandbox.Secret) map[string]sandbox.Secret {
				out := map[string]sandbox.Secret{}
				for k, v := range env {
					out[k] = v
				}
				for k, v := range spec.Env {
					out[k] = v
				}
				return out
			}
			return &hookedSession{Session: s,
				exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
					opts.Env = overlay(opts.Env)
					return s.Exec(ctx, argv, opts)
				},
				execStart: func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
					opts.Env = overlay(opts.Env)
					return s.ExecStart(ctx, argv, opts)
				}}
		}), nil},
	{"host-env-leaks", "an exec inherits the host's environment (TAI42_SUITE_MARKER among it) under its own", []string{"Exec/Env"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				env := map[string]sandbox.Secret{}
				for _, kv := range os.Environ() {
					if k, v, ok := strings.Cut(kv, "="); ok && sandbox.ValidEnvKey(k) == nil {
						env[k] = sandbox.NewSecret(v)
					}
				}
				for k, v := range opts.Env {
					env[k] = v
				}
				opts.Env = env
				return s.Exec(ctx, argv, opts)
			}}
		}), nil},
	{"secret-in-error", "an exec's error text quotes the session's and the exec's env values", []string{"Exec/SecretsNotInErrors"},
		specSessions(func(spec sandbox.SessionSpec, s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				res, err := s.Exec(ctx, argv, opts)
				if err != nil {
					var vals []string
					for _, env := range []map[string]sandbox.Secret{spec.Env, opts.Env} {
						for k, v := range env {
							vals = append(vals, k+"="+v.Reveal())
						}
					}
					err = &sandbox.SandboxError{Op: "exec", Message: fmt.Sprintf("%v (env %s)", err, strings.Join(vals, " ")), Err: err}
				}
				return res, err
			}}
		}), nil},

	// Interactive execs.
	{"stream-exit-code", "the StreamExit carries the exit code plus one", []string{"ExecStart/ExitCode"},
		streamExit(func(code int) int {
			if code != 0 {
				code++
			}
			return code
		}), nil},
	{"stream-killed-status", "a killed exec's StreamExit carries 1, not 128+9", []string{"ExecStart/(KillBeforeRead|KillTwice|KillConcurrent|KillDuringRun)"},
		streamExit(func(code int) int {
			if code == 137 {
				code = 1
			}
			return code
		}), nil},
	{"stream-not-found-code", "a command that cannot be found ends its stream with 1, not 127", []string{"ExecStart/NotFound"},
		streamExit(func(code int) int {
			if code == 127 {
				code = 1
			}
			return code
		}), nil},
	{"stream-exit-twice", "the StreamExit is yielded twice before io.EOF", []string{"ExecStart/(Interleaved|ExitCode)"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			var again sandbox.StreamItem
			var mu sync.Mutex
			return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
				mu.Lock()
				defer mu.Unlock()
				if again != nil {
					it := again
					again = nil
					return it, nil
				}
				it, err := h.Next(ctx)
				if _, ok := it.(*sandbox.StreamExit); ok {
					again = it
				}
				return it, err
			}}
		}), nil},
	{"stream-exit-never", "the stream ends with io.EOF, never yielding its StreamExit", []string{"ExecStart/(Interleaved|ExitCode)"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
				it, err := h.Next(ctx)
				if _, ok := it.(*sandbox.StreamExit); ok {
					return nil, io.EOF
				}
				return it, err
			}}
		}), nil},
	{"stream-chunks-reordered", "each pair of consecutive chunks is yielded in reverse order", []string{"ExecStart/Interleaved"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			var held sandbox.StreamItem
			var heldErr error
			var holding bool
			var mu sync.Mutex
			return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
				mu.Lock()
				defer mu.Unlock()
				if holding {
					holding = false
					return held, heldErr
				}
				it, err := h.Next(ctx)
				if _, ok := it.(*sandbox.StreamChunk); !ok || err != nil {
					return it, err
				}
				it2, err2 := h.Next(ctx)
				if _, ok := it2.(*sandbox.StreamChunk); ok && err2 == nil {
					held, heldErr, holding = it, nil, true
					return it2, nil
				}
				held, heldErr, holding = it2, err2, true
				return it, nil
			}}
		}), nil},
	{"stream-streams-swapped", "stdout chunks are labelled stderr and stderr chunks stdout", []string{"ExecStart/Interleaved"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
				it, err := h.Next(ctx)
				if c, ok := it.(*sandbox.StreamChunk); ok {
					s := sandbox.Stdout
					if c.Stream == sandbox.Stdout {
						s = sandbox.Stderr
					}
					return &sandbox.StreamChunk{Stream: s, Data: c.Data}, err
				}
				return it, err
			}}
		}), nil},
	{"stream-timeout-stderr-len", "the stream's ExecTimeoutError.StderrLen is one less than the bytes produced", []string{"ExecStart/Timeout"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
				it, err := h.Next(ctx)
				if te, ok := errors.AsType[*sandbox.ExecTimeoutError](err); ok {
					c := *te
					c.StderrLen--
					return it, &c
				}
				return it, err
			}}
		}), nil},
	{"stream-timeout-not-sticky", "after the ExecTimeoutError, Next returns io.EOF instead of the error again", []string{"ExecStart/Timeout"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			var timedOut atomic.Bool
			return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
				if timedOut.Load() {
					return nil, io.EOF
				}
				it, err := h.Next(ctx)
				if errors.Is(err, sandbox.ErrExecTimeout) {
					timedOut.Store(true)
				}
				return it, err
			}}
		}), nil},
	{"kill-noop", "Kill returns nil and does nothing", []string{"ExecStart/(KillBeforeRead|KillDuringRun|KillPastDeadline|KillTwice|KillConcurrent|KillKeepsReceivedOutput)"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, kill: func(context.Context) error { return nil }}
		}), nil},
	{"kill-after-exit-fails", "Kill of an exec that has exited returns an error", []string{"ExecStart/(KillAfterExit|WriteAfterExit)"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, kill: func(ctx context.Context) error {
				if w, ok := h.(sandbox.ExitWatcher); ok {
					select {
					case <-w.Exited():
						return sandbox.Errorf("kill", "the exec has already exited")
					default:
					}
				}
				return h.Kill(ctx)
			}}
		}), nil},
	{"kill-drops-output", "once Kill is called the output not yet read is dropped", []string{"ExecStart/(KillKeepsReceivedOutput|KillPastDeadline)"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			var killed atomic.Bool
			return &hookedHandle{ExecHandle: h,
				kill: func(ctx context.Context) error { killed.Store(true); return h.Kill(ctx) },
				next: func(ctx context.Context) (sandbox.StreamItem, error) {
					for {
						it, err := h.Next(ctx)
						if _, ok := it.(*sandbox.StreamChunk); ok && err == nil && killed.Load() {
							continue
						}
						return it, err
					}
				}}
		}), nil},
	{"kill-reports-timeout", "a stream killed before its deadline but read past it ends with an ExecTimeoutError", []string{"ExecStart/(KillDuringRun|KillPastDeadline)"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, execStart: func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
				h, err := s.ExecStart(ctx, argv, opts)
				if err != nil {
					return h, err
				}
				deadline := time.Now().Add(opts.Timeout)
				return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
					it, err := h.Next(ctx)
					if _, ok := it.(*sandbox.StreamExit); ok && time.Now().After(deadline) {
						return nil, &sandbox.ExecTimeoutError{Timeout: opts.Timeout}
					}
					return it, err
				}}, nil
			}}
		}), nil},
	{"write-after-exit-nil", "WriteStdin to an exec that has exited returns nil", []string{"ExecStart/WriteAfterExit"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, writeStdin: func(ctx context.Context, data []byte) error {
				if err := h.WriteStdin(ctx, data); err != nil && !strings.Contains(err.Error(), "exited") {
					return err
				}
				return nil
			}}
		}), nil},
	{"write-after-close-nil", "WriteStdin after CloseStdin returns nil, the input silently dropped", []string{"ExecStart/WriteAfterClose"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			var closed atomic.Bool
			return &hookedHandle{ExecHandle: h,
				closeStdin: func(ctx context.Context) error { closed.Store(true); return h.CloseStdin(ctx) },
				writeStdin: func(ctx context.Context, data []byte) error {
					if closed.Load() {
						return nil
					}
					return h.WriteStdin(ctx, data)
				}}
		}), nil},
	{"write-stdin-dropped", "WriteStdin returns nil without delivering anything", []string{"ExecStart/(StdinConcurrent|StdinLargeWrite)"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, writeStdin: func(context.Context, []byte) error { return nil }}
		}), nil},
	{"close-stdin-noop", "CloseStdin returns nil without closing stdin", []string{"ExecStart/CloseStdin"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, closeStdin: func(context.Context) error { return nil }}
		}), nil},
	{"exited-at-once", "the handle's Exited channel is closed from the start", []string{"ExecStart/ExitWatcher"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle { return earlyExited{h} }), nil},

	// Files.
	{"file-not-found-raw", "a FileNotFoundError is replaced by errors.New with the same text", []string{"Files/NotFound"},
		getFileErr(func(_ string, err error) error {
			if errors.Is(err, sandbox.ErrFileNotFound) {
				return errors.New(err.Error())
			}
			return err
		}), nil},
	{"file-missing-plain-error", "a missing file is a plain SandboxError, not a FileNotFoundError", []string{"Files/NotFound"},
		getFileErr(func(p string, err error) error {
			if errors.Is(err, sandbox.ErrFileNotFound) {
				return sandbox.Errorf("get_file", "cannot read %q", p)
			}
			return err
		}), nil},
	{"file-directory-not-found", "GetFile of a directory (or any plain failure) is a FileNotFoundError", []string{"Files/Directory"},
		getFileErr(func(p string, err error) error {
			if err != nil && !errors.Is(err, sandbox.ErrFileNotFound) && !errors.Is(err, sandbox.ErrSessionNotFound) {
				return &sandbox.FileNotFoundError{Path: p}
			}
			return err
		}), nil},
	{"file-errors-empty", "GetFile of something that cannot be read as a file returns no bytes and no error", []string{"Files/(Directory|Unreadable)"},
		getFileErr(func(_ string, err error) error {
			if err != nil && !errors.Is(err, sandbox.ErrFileNotFound) && !errors.Is(err, sandbox.ErrSessionNotFound) {
				return nil
			}
			return err
		}), nil},
	{"file-truncated", "GetFile returns the file without its last byte", []string{"Files/RoundTrip"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, getFile: func(ctx context.Context, p string) ([]byte, error) {
				data, err := s.GetFile(ctx, p)
				if len(data) > 0 {
					data = data[:len(data)-1]
				}
				return data, err
			}}
		}), nil},
	{"file-no-parents", "PutFile fails when the parent directory does not exist", []string{"Files/Parents"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, putFile: func(ctx context.Context, p string, data []byte) error {
				if dir := path.Dir(p); dir != "." && dir != "/" {
					if _, err := s.GetFile(ctx, dir); errors.Is(err, sandbox.ErrFileNotFound) {
						return sandbox.Errorf("put_file", "%q: no such directory", dir)
					}
				}
				return s.PutFile(ctx, p, data)
			}}
		}), nil},
	{"file-overwrite-keeps-tail", "PutFile over a longer file keeps the old file's tail", []string{"Files/Overwrite"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, putFile: func(ctx context.Context, p string, data []byte) error {
				if old, err := s.GetFile(ctx, p); err == nil && len(old) > len(data) {
					data = append(slices.Clone(data), old[len(data):]...)
				}
				return s.PutFile(ctx, p, data)
			}}
		}), nil},
	{"file-absolute-refused", "an absolute path inside the workspace is refused", []string{"Files/AbsoluteInside"},
		sessions(func(s sandbox.Session) sandbox.Session {
			refuse := func(p string) error {
				if path.IsAbs(p) {
					return sandbox.Errorf("file", "%q: absolute paths are refused", p)
				}
				return nil
			}
			return &hookedSession{Session: s,
				putFile: func(ctx context.Context, p string, data []byte) error {
					if err := refuse(p); err != nil {
						return err
					}
					return s.PutFile(ctx, p, data)
				},
				getFile: func(ctx context.Context, p string) ([]byte, error) {
					if err := refuse(p); err != nil {
						return nil, err
					}
					return s.GetFile(ctx, p)
				}}
		}), nil},
	{"file-nul-stripped", "a path holding a NUL byte is used without it instead of being refused", []string{"Files/BadPaths"},
		sessions(func(s sandbox.Session) sandbox.Session {
			strip := func(p string) string { return strings.ReplaceAll(p, "\x00", "") }
			return &hookedSession{Session: s,
				putFile: func(ctx context.Context, p string, data []byte) error { return s.PutFile(ctx, strip(p), data) },
				getFile: func(ctx context.Context, p string) ([]byte, error) { return s.GetFile(ctx, strip(p)) }}
		}), nil},
	{"file-escape-accepted", "a relative path that climbs out of the workspace is read and written on the host", []string{"Files/Escapes"},
		sessions(func(s sandbox.Session) sandbox.Session {
			outside := func(p string) (string, bool) {
				if path.IsAbs(p) {
					return "", false
				}
				ws := s.WorkspacePath()
				full := filepath.Join(ws, p)
				return full, !strings.HasPrefix(full, ws+"/") && full != ws
			}
			return &hookedSession{Session: s,
				putFile: func(ctx context.Context, p string, data []byte) error {
					if full, ok := outside(p); ok {
						return os.WriteFile(full, data, 0o644)
					}
					return s.PutFile(ctx, p, data)
				},
				getFile: func(ctx context.Context, p string) ([]byte, error) {
					if full, ok := outside(p); ok {
						return os.ReadFile(full)
					}
					return s.GetFile(ctx, p)
				}}
		}), nil},

	// Sessions and the sandbox.
	{"session-not-found-raw", "GetSession's SessionNotFoundError is replaced by errors.New with the same text", []string{"Sandbox/(GetSession|DestroySession)"},
		getSessionErr(func(_ string, err error) error {
			if errors.Is(err, sandbox.ErrSessionNotFound) {
				return errors.New(err.Error())
			}
			return err
		}), nil},
	{"session-not-found-no-id", "GetSession's SessionNotFoundError names no session", []string{"Sandbox/GetSession"},
		getSessionErr(func(_ string, err error) error {
			if errors.Is(err, sandbox.ErrSessionNotFound) {
				return &sandbox.SessionNotFoundError{}
			}
			return err
		}), nil},
	{"destroy-not-idempotent", "DestroySession of a gone id returns a SessionNotFoundError", []string{"Sandbox/DestroySession", "Session/Destroy"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, destroy: func(ctx context.Context, id string) error {
				if _, err := sb.GetSession(ctx, id); err != nil {
					return err
				}
				return sb.DestroySession(ctx, id)
			}}
		}, nil},
	{"list-drops-one", "ListSessions leaves out one live session", []string{"Sandbox/(ListSessions|ConcurrentCreate)"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, list: func(ctx context.Context) ([]sandbox.SessionInfo, error) {
				list, err := sb.ListSessions(ctx)
				if len(list) > 0 {
					list = list[1:]
				}
				return list, err
			}}
		}, nil},
	{"labels-dropped", "a session's labels are dropped at create", []string{"Session/Info", "Sandbox/ListSessions"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, create: func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
				spec.Labels = nil
				return sb.CreateSession(ctx, spec)
			}}
		}, nil},
	{"info-workspace-path", "Info reports the workspace's parent as workspace_path", []string{"Session/Info", "Sandbox/ListSessions"},
		infoMut(func(i sandbox.SessionInfo) sandbox.SessionInfo { i.WorkspacePath = path.Dir(i.WorkspacePath); return i }), nil},
	{"info-expires-at", "Info reports expires_at a second late", []string{"Session/Info"},
		infoMut(func(i sandbox.SessionInfo) sandbox.SessionInfo { i.ExpiresAt = i.ExpiresAt.Add(time.Second); return i }), nil},
	{"touch-noop", "Touch returns nil and extends nothing", []string{"Session/Touch"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, touch: func(context.Context) error { return nil }}
		}), nil},
	{"touch-shortens", "Touch leaves expires_at a minute short of now + ttl, before the old one", []string{"Session/Touch"},
		sessions(func(s sandbox.Session) sandbox.Session {
			var touched atomic.Bool
			return &hookedSession{Session: s,
				touch: func(ctx context.Context) error { touched.Store(true); return s.Touch(ctx) },
				info: func(ctx context.Context) (sandbox.SessionInfo, error) {
					info, err := s.Info(ctx)
					if touched.Load() {
						info.ExpiresAt = info.ExpiresAt.Add(-time.Minute)
					}
					return info, err
				}}
		}), nil},
	{"touch-accumulates", "Touch adds the ttl to the old expires_at, not to now: touches accumulate", []string{"Session/Touch"},
		specSessions(func(spec sandbox.SessionSpec, s sandbox.Session) sandbox.Session {
			var touches atomic.Int64
			return &hookedSession{Session: s,
				touch: func(ctx context.Context) error { touches.Add(1); return s.Touch(ctx) },
				info: func(ctx context.Context) (sandbox.SessionInfo, error) {
					info, err := s.Info(ctx)
					info.ExpiresAt = info.ExpiresAt.Add(time.Duration(touches.Load()) * spec.TTL())
					return info, err
				}}
		}), nil},
	{"expired-listed", "ListSessions also lists the expired sessions the sandbox made that were not destroyed through it", []string{"Session/Expiry"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			t := newTracker(sb)
			return &hookedSandbox{Sandbox: sb, create: t.create, destroy: t.destroy, reap: t.reap,
				list: func(ctx context.Context) ([]sandbox.SessionInfo, error) {
					list, err := sb.ListSessions(ctx)
					for _, e := range t.expired() {
						if !slices.ContainsFunc(list, func(i sandbox.SessionInfo) bool { return i.ID == e.info.ID }) {
							list = append(list, e.info)
						}
					}
					return list, err
				}}
		}, nil},
	{"expired-returned", "GetSession returns an expired session the sandbox made", []string{"Session/Expiry"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			t := newTracker(sb)
			return &hookedSandbox{Sandbox: sb, create: t.create, destroy: t.destroy, reap: t.reap,
				get: func(ctx context.Context, id string) (sandbox.Session, error) {
					sess, err := sb.GetSession(ctx, id)
					if errors.Is(err, sandbox.ErrSessionNotFound) {
						for _, e := range t.expired() {
							if e.info.ID == id {
								return e.sess, nil
							}
						}
					}
					return sess, err
				}}
		}, nil},
	{"reap-extra-id", "Reap also returns the id of the last session made, which it did not destroy", []string{"Sandbox/Reap"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			t := newTracker(sb)
			return &hookedSandbox{Sandbox: sb, create: t.create, reap: func(ctx context.Context) ([]string, error) {
				ids, err := sb.Reap(ctx)
				if last := t.last(); len(ids) > 0 && last != "" && !slices.Contains(ids, last) {
					ids = append(ids, last)
				}
				return ids, err
			}}
		}, nil},
	{"reap-destroys-live", "Reap also destroys the live sessions (returning only the expired ids)", []string{"Sandbox/(Reap|ConcurrentReap)"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			t := newTracker(sb)
			return &hookedSandbox{Sandbox: sb, create: t.create, reap: func(ctx context.Context) ([]string, error) {
				ids, err := sb.Reap(ctx)
				for _, e := range t.all() {
					_ = sb.DestroySession(ctx, e.info.ID)
				}
				return ids, err
			}}
		}, nil},
	{"reap-returns-all-seen", "every Reap returns all the expired sessions it sees, though another Reap destroyed them", []string{"Sandbox/ConcurrentReap"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			t := newTracker(sb)
			return &hookedSandbox{Sandbox: sb, create: t.create, reap: func(ctx context.Context) ([]string, error) {
				var seen []string
				for _, e := range t.expired() {
					seen = append(seen, e.info.ID)
				}
				_, err := sb.Reap(ctx)
				t.forget(seen...)
				return seen, err
			}}
		}, nil},
	{"reap-early", "Reap also destroys the sessions due to expire within 300ms", []string{"Sandbox/ReapNotEarly"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			t := newTracker(sb)
			return &hookedSandbox{Sandbox: sb, create: t.create, reap: func(ctx context.Context) ([]string, error) {
				ids, err := sb.Reap(ctx)
				for _, e := range t.all() {
					if time.Until(e.info.ExpiresAt) < 300*time.Millisecond && !slices.Contains(ids, e.info.ID) {
						if sb.DestroySession(ctx, e.info.ID) == nil {
							ids = append(ids, e.info.ID)
						}
					}
				}
				t.forget(ids...)
				return ids, err
			}}
		}, nil},
	{"reap-interval-wrong", "ReapInterval reports twice the cadence configured", []string{"Sandbox/(Defaults|BackgroundReaper)"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, reapInterval: func() time.Duration { return 2 * sb.ReapInterval() }}
		}, nil},
	{"exec-default-timeout-zero", "ExecDefaultTimeout reports 0", []string{"Sandbox/Defaults"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, execDefault: func() time.Duration { return 0 }}
		}, nil},

	// Specs and policy.
	{"policy-floor-skipped", "the isolation floor of the policy is not enforced", []string{"Spec/Policy"},
		nil, func(c sandboxtest.Config) sandboxtest.Config { c.Policy.Isolation = sandbox.IsolationNone; return c }},
	{"policy-ceiling-skipped", "a network above the policy's egress ceiling is accepted", []string{"Spec/Policy"},
		nil, func(c sandboxtest.Config) sandboxtest.Config { c.Policy.Egress = sandbox.NetworkEgress; return c }},
	{"policy-durable-skipped", "a persistent session is accepted while the policy's durable is off", []string{"Spec/Policy"},
		nil, func(c sandboxtest.Config) sandboxtest.Config { c.Policy.Durable = true; return c }},
	{"isolation-downgraded", "a stronger isolation than the provider's is silently downgraded to its own, not rejected", []string{"Spec/Unenforceable"},
		retryCreate(func(spec sandbox.SessionSpec, err error) (sandbox.SessionSpec, bool) {
			if re, ok := errors.AsType[*sandbox.SpecRejectedError](err); ok && re.Field == "isolation" {
				spec.Isolation = ""
				return spec, true
			}
			return spec, false
		}), nil},
	{"conflict-downgraded", "a persistent spec whose key is held is silently made ephemeral, not rejected", []string{"Durability/PersistentConflict"},
		retryCreate(func(spec sandbox.SessionSpec, err error) (sandbox.SessionSpec, bool) {
			if re, ok := errors.AsType[*sandbox.SpecRejectedError](err); ok && re.Reason == sandbox.ReasonConflict {
				spec.Durability = sandbox.Ephemeral
				return spec, true
			}
			return spec, false
		}), nil},
	{"persistent-downgraded", "a persistent session is made ephemeral", []string{"Durability/Persistent"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, create: func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
				spec.Durability = sandbox.Ephemeral
				return sb.CreateSession(ctx, spec)
			}}
		}, nil},
	{"ephemeral-not-empty", "a new ephemeral workspace holds a file", []string{"Durability/EphemeralEmpty"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, create: func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
				sess, err := sb.CreateSession(ctx, spec)
				if err == nil {
					err = sess.PutFile(ctx, ".leftover", []byte("x"))
				}
				return sess, err
			}}
		}, nil},
	{"caps-stripped", "cpu and memory_mb are dropped from the spec: the caps are not applied", []string{"Spec/MemoryCap"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, create: func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
				spec.CPU, spec.MemoryMB = 0, 0
				return sb.CreateSession(ctx, spec)
			}}
		}, nil},
	// Killed by the clauses of issue 12's gaps.
	{"write-stdin-split", "WriteStdin delivers its data in two writes, so concurrent writes interleave", []string{"ExecStart/WritersAtomic"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, writeStdin: func(ctx context.Context, data []byte) error {
				half := len(data) / 2
				if err := h.WriteStdin(ctx, data[:half]); err != nil {
					return err
				}
				runtime.Gosched()
				return h.WriteStdin(ctx, data[half:])
			}}
		}), nil},
	{"write-into-exited-raw", "a write the exec's stdin refuses returns a raw *os.PathError, not the contract's error", []string{"ExecStart/WriteRacingExit"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, writeStdin: func(ctx context.Context, data []byte) error {
				err := h.WriteStdin(ctx, data)
				if err != nil && errors.Is(err, sandbox.ErrSandbox) {
					return &os.PathError{Op: "write", Path: "|1", Err: errors.New("broken pipe")}
				}
				return err
			}}
		}), nil},
	{"timeout-lengths-undrained", "the ExecTimeoutError lengths count only the output read before the deadline", []string{"ExecStart/TimeoutLengths"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, execStart: func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
				h, err := s.ExecStart(ctx, argv, opts)
				if err != nil {
					return h, err
				}
				deadline := time.Now().Add(opts.Timeout)
				var lens [2]int64
				return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
					it, err := h.Next(ctx)
					if c, ok := it.(*sandbox.StreamChunk); ok && time.Now().Before(deadline) {
						lens[slices.Index([]sandbox.StreamName{sandbox.Stdout, sandbox.Stderr}, c.Stream)] += int64(len(c.Data))
					}
					if te, ok := errors.AsType[*sandbox.ExecTimeoutError](err); ok {
						c := *te
						c.StdoutLen, c.StderrLen = lens[0], lens[1]
						return it, &c
					}
					return it, err
				}}, nil
			}}
		}), nil},
	{"dangling-symlink-not-found", "GetFile of a dangling symlink is a FileNotFoundError", []string{"Files/DanglingSymlink"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, getFile: func(ctx context.Context, p string) ([]byte, error) {
				data, err := s.GetFile(ctx, p)
				full := p
				if !path.IsAbs(full) {
					full = filepath.Join(s.WorkspacePath(), p)
				}
				if fi, lerr := os.Lstat(full); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
					if _, serr := os.Stat(full); errors.Is(serr, os.ErrNotExist) {
						return nil, &sandbox.FileNotFoundError{Path: p}
					}
				}
				return data, err
			}}
		}), nil},
	{"ctx-deadline-raw", "an Exec whose ctx ends returns the raw ctx.Err()", []string{"Cancel/Exec"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				res, err := s.Exec(ctx, argv, opts)
				if err != nil && ctx.Err() != nil {
					return res, ctx.Err()
				}
				return res, err
			}}
		}), nil},
	{"timeout-note-dropped", "the ExecTimeoutError's Note is dropped", []string{"Exec/TimeoutHeldOutput"},
		execErr(func(err error) error {
			if te, ok := errors.AsType[*sandbox.ExecTimeoutError](err); ok {
				c := *te
				c.Note = ""
				return &c
			}
			return err
		}), nil},
	{"secret-in-log", "every exec logs its env values, on the provider's logger", []string{"Exec/SecretsNotInLogs"}, nil, nil},
	// Run as Nobody (see asNobody): permissions stop root only there.
	{"permission-not-found", "a permission failure is reported as a FileNotFoundError", []string{"Files/PermissionDenied"},
		getFileErr(func(p string, err error) error {
			if errors.Is(err, os.ErrPermission) || (err != nil && strings.Contains(err.Error(), "permission denied")) {
				return &sandbox.FileNotFoundError{Path: p}
			}
			return err
		}), nil},

	// Execs as users.
	{"user-ignored", "an exec's user is dropped: it runs as the session's default user", []string{"User/(Name|ExecStart)"},
		users(func(string) string { return "" }), nil},
	{"user-malformed-default", "a malformed user is taken for the default user instead of refused", []string{"User/Malformed"},
		users(func(u string) string {
			if sandbox.ValidUser(u) != nil {
				return ""
			}
			return u
		}), nil},
	{"user-uid-as-default", "an exec as a uid or uid:gid runs as the default user", []string{"User/UID"},
		users(func(u string) string {
			if strings.Trim(u, "0123456789:") == "" {
				return ""
			}
			return u
		}), nil},
	{"user-not-found-plain", "a UserNotFoundError is a plain SandboxError with the same text", []string{"User/Unknown"},
		execErr(func(err error) error {
			if errors.Is(err, sandbox.ErrUserNotFound) {
				return sandbox.Errorf("exec", "%s", err.Error())
			}
			return err
		}), nil},
	{"user-home-root", "an exec as a user keeps root's HOME", []string{"User/Home"},
		sessions(func(s sandbox.Session) sandbox.Session {
			return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				if _, ok := opts.Env["HOME"]; opts.User != "" && !ok {
					opts.Env = maps.Clone(opts.Env)
					if opts.Env == nil {
						opts.Env = map[string]sandbox.Secret{}
					}
					opts.Env["HOME"] = sandbox.NewSecret("/root")
				}
				return s.Exec(ctx, argv, opts)
			}}
		}), nil},
	// Run on a provider that runs no user (see withoutUsers).
	{"user-unsupported-runs", "a provider that runs no exec as a user runs one as its default user", []string{"User/Refused"},
		users(func(string) string { return "" }), nil},
}

// pendingMutants are bugs TestMutants does not run, each with the reason:
// the clause that would kill it cannot run here, or cannot tell reliably.
var pendingMutants = []mutant{
	// Spec/CPUCapThrottles kills it on a quiet machine, but skips as too
	// loaded to tell when two children spin beside it on two cores: a kill
	// that depends on the load would make this test flaky.
	{"cpu-cap-stripped", "cpu is dropped from the spec: the cap is not applied", []string{"Spec/CPUCapThrottles"},
		func(sb sandbox.Sandbox) sandbox.Sandbox {
			return &hookedSandbox{Sandbox: sb, create: func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
				spec.CPU = 0
				return sb.CreateSession(ctx, spec)
			}}
		}, nil},
	// No clause can make the host runner fail to read an exit status: the
	// kit's and the output buffers' side of it is proved by fault injection
	// (TestKitNeverInventsExitStatus in fault_test.go).
	{"exit-status-invented", "a stream whose exit status cannot be read ends with an invented StreamExit 0", []string{"ExecStart/ExitStatusUnreadable"},
		handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
			return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
				it, err := h.Next(ctx)
				if err != nil && strings.Contains(err.Error(), "exit status") {
					return &sandbox.StreamExit{}, nil
				}
				return it, err
			}}
		}), nil},
}

// The child: TestMutants run with mutantEnv set runs the suite against one
// mutant (or, for controlName, the host runner itself), its -test.run
// selecting the clauses.
const (
	mutantEnv   = "TAI42_MUTANT"
	controlName = "control"
)

// TestMutants runs the host runner's clauses against every mutant, each in a
// child process (this test binary again, with mutantEnv naming the mutant
// and -test.run its clauses), and fails for each mutant that passes them
// all. A control child runs every clause used on the real host runner: a
// clause that fails there cannot kill anything.
func TestMutants(t *testing.T) {
	if name, ok := os.LookupEnv(mutantEnv); ok {
		runChild(t, name)
		return
	}
	if _, err := os.Stat(os.Args[0]); err != nil {
		t.Fatalf("cannot re-run the test binary %s for the mutants: %v", os.Args[0], err)
	}
	if os.Geteuid() != 0 {
		// Already unprivileged: the clauses of asNobody run as this user.
		clear(asNobody)
	}
	variants := []variant{{}, {nobody: true}, {noUsers: true}}
	clauses := map[variant][]string{} // each variant's control runs them all
	for _, m := range mutants {
		if len(m.clauses) == 0 || (m.wrap == nil && m.config == nil && wrapCfg[m.name] == nil) {
			t.Fatalf("mutant %s: it needs clauses and a wrap or config", m.name)
		}
		v := variantOf(m.name)
		for _, c := range m.clauses {
			if !slices.Contains(clauses[v], c) {
				clauses[v] = append(clauses[v], c)
			}
		}
	}
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	type job struct {
		name    string
		clauses []string
		v       variant
		res     childResult
	}
	var jobs []*job
	for _, v := range variants {
		jobs = append(jobs, &job{name: controlName, clauses: clauses[v], v: v})
	}
	for _, m := range mutants {
		jobs = append(jobs, &job{name: m.name, clauses: m.clauses, v: variantOf(m.name)})
	}
	begin := time.Now()
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if len(j.clauses) > 0 {
				j.res = runMutantChild(t, ctx, j.name, j.clauses, j.v)
			}
		})
	}
	wg.Wait()
	total := time.Since(begin)

	controls := map[variant]childResult{}
	for i, v := range variants {
		controls[v] = jobs[i].res
	}
	for v, control := range controls {
		if control.err != nil && len(control.failed()) == 0 {
			t.Fatalf("the control run (the real host runner; %+v) could not run: %v\n%s", v, control.err, control.tail())
		}
		for _, c := range control.failed() {
			t.Errorf("the clause %s fails on the real host runner (the control run; %+v); it cannot kill a mutant:\n%s", c, v, control.tail())
		}
	}
	control := controls[variant{}]
	var summary strings.Builder
	fmt.Fprintf(&summary, "%-28s %-8s %7s  %s\n", "MUTANT", "RESULT", "TIME", "CLAUSES (killed by)")
	killed := 0
	for _, j := range jobs[len(variants):] {
		var by []string
		for _, c := range j.res.failed() {
			if controls[j.v].status[c] == "PASS" {
				by = append(by, c)
			}
		}
		result := "killed"
		switch {
		case len(by) > 0:
			killed++
		case j.res.err != nil:
			result = "error"
			t.Errorf("mutant %s: its child run failed without failing a clause (%v):\n%s", j.name, j.res.err, j.res.tail())
		default:
			result = "SURVIVED"
			t.Errorf("mutant %s (%s) survived its clauses %s: they passed (%s); the suite misses this bug",
				j.name, mutantBug(j.name), strings.Join(j.clauses, " "), j.res.ran())
		}
		fmt.Fprintf(&summary, "%-28s %-8s %6.1fs  %s (%s)\n", j.name, result, j.res.took.Seconds(), strings.Join(j.clauses, " "), strings.Join(by, " "))
	}
	fmt.Fprintf(&summary, "%d of %d mutants killed; control %.1fs; %d pending (not run); total %v on %d workers",
		killed, len(mutants), control.took.Seconds(), len(pendingMutants), total.Round(time.Second), cap(sem))
	t.Log("\n" + summary.String())
}

func mutantBug(name string) string {
	for _, m := range mutants {
		if m.name == name {
			return m.bug
		}
	}
	return ""
}

// childResult is what a child run reported: each clause's status (PASS,
// FAIL, SKIP) by its name, Group/Clause.
type childResult struct {
	status map[string]string
	out    []byte
	err    error
	took   time.Duration
}

func (r childResult) failed() []string {
	var out []string
	for c, s := range r.status {
		if s == "FAIL" {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

func (r childResult) ran() string {
	var out []string
	for c, s := range r.status {
		out = append(out, c+" "+s)
	}
	slices.Sort(out)
	if len(out) == 0 {
		return "no clause ran"
	}
	return strings.Join(out, ", ")
}

// tail is the end of the child's output, for a failure message.
func (r childResult) tail() string {
	const n = 6000
	if len(r.out) > n {
		return "...\n" + string(r.out[len(r.out)-n:])
	}
	return string(r.out)
}

// resultLine is go test -v's verdict on one clause: TestMutants/Group/Clause,
// not a subtest of a clause.
var resultLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): TestMutants/([^/\s]+/[^/\s]+) \(`)

// runMutantChild runs this test binary again on the clauses with mutantEnv
// set to name, as its variant v says.
func runMutantChild(t *testing.T, ctx context.Context, name string, clauses []string, v variant) childResult {
	var alts []string
	for _, c := range clauses {
		group, clause, _ := strings.Cut(c, "/")
		alts = append(alts, "^TestMutants$/^"+group+"$/^"+clause+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(alts, "|"), "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), mutantEnv+"="+name)
	if v.noUsers {
		cmd.Env = append(cmd.Env, withoutUsersEnv+"=1")
	}
	if v.nobody {
		unixusertest.AsNobody(t, cmd)
	}
	cmd.WaitDelay = 10 * time.Second
	begin := time.Now()
	out, err := unixusertest.CombinedOutput(ctx, cmd)
	r := childResult{status: map[string]string{}, out: out, err: err, took: time.Since(begin)}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := resultLine.FindStringSubmatch(sc.Text()); m != nil {
			r.status[m[2]] = m[1]
		}
	}
	return r
}

// runChild runs the suite, as provider/host's TestConformance does, against
// the mutant name (the host runner itself for controlName).
func runChild(t *testing.T, name string) {
	var m mutant
	if name != controlName {
		i := slices.IndexFunc(mutants, func(m mutant) bool { return m.name == name })
		if i < 0 {
			t.Fatalf("%s=%q names no mutant", mutantEnv, name)
		}
		m = mutants[i]
	}
	opts, newHost := hosttest.Options(t), func(t *testing.T, cfg sandboxtest.Config) sandbox.Sandbox { return hosttest.New(t, cfg) }
	if os.Getenv(withoutUsersEnv) == "1" {
		opts.User, newHost = nil, hostWithoutUsers
	}
	sandboxtest.Run(t, func(t *testing.T, cfg sandboxtest.Config) sandbox.Sandbox {
		if m.config != nil {
			cfg = m.config(cfg)
		}
		sb := newHost(t, cfg)
		if m.wrap != nil {
			sb = m.wrap(sb)
		}
		if w := wrapCfg[m.name]; w != nil {
			sb = w(sb, cfg)
		}
		return sb
	}, opts)
}

// noUsers is a provider with its user support hidden: no kit.UserRunner.
type noUsers struct{ kit.Provider }

// hostWithoutUsers is a host runner whose kit refuses every exec with a
// user, as a provider that runs none would have it: its provider wrapped
// in noUsers. Its state is in memory; it is closed at the end of t.
func hostWithoutUsers(t *testing.T, cfg sandboxtest.Config) sandbox.Sandbox {
	p, err := host.NewProvider(host.Options{ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := kit.New(noUsers{p}, kit.Options{Policy: cfg.Policy, ReapInterval: cfg.ReapInterval, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the host sandbox: %v", err)
		}
	})
	return sb
}

// hookedSandbox is a sandbox whose set hooks replace its methods.
type hookedSandbox struct {
	sandbox.Sandbox
	create       func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error)
	get          func(ctx context.Context, id string) (sandbox.Session, error)
	list         func(ctx context.Context) ([]sandbox.SessionInfo, error)
	destroy      func(ctx context.Context, id string) error
	reap         func(ctx context.Context) ([]string, error)
	reapInterval func() time.Duration
	execDefault  func() time.Duration
}

func (s *hookedSandbox) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	if s.create != nil {
		return s.create(ctx, spec)
	}
	return s.Sandbox.CreateSession(ctx, spec)
}

func (s *hookedSandbox) GetSession(ctx context.Context, id string) (sandbox.Session, error) {
	if s.get != nil {
		return s.get(ctx, id)
	}
	return s.Sandbox.GetSession(ctx, id)
}

func (s *hookedSandbox) ListSessions(ctx context.Context) ([]sandbox.SessionInfo, error) {
	if s.list != nil {
		return s.list(ctx)
	}
	return s.Sandbox.ListSessions(ctx)
}

func (s *hookedSandbox) DestroySession(ctx context.Context, id string) error {
	if s.destroy != nil {
		return s.destroy(ctx, id)
	}
	return s.Sandbox.DestroySession(ctx, id)
}

func (s *hookedSandbox) Reap(ctx context.Context) ([]string, error) {
	if s.reap != nil {
		return s.reap(ctx)
	}
	return s.Sandbox.Reap(ctx)
}

func (s *hookedSandbox) ReapInterval() time.Duration {
	if s.reapInterval != nil {
		return s.reapInterval()
	}
	return s.Sandbox.ReapInterval()
}

func (s *hookedSandbox) ExecDefaultTimeout() time.Duration {
	if s.execDefault != nil {
		return s.execDefault()
	}
	return s.Sandbox.ExecDefaultTimeout()
}

// hookedSession is a session whose set hooks replace its methods.
type hookedSession struct {
	sandbox.Session
	info      func(ctx context.Context) (sandbox.SessionInfo, error)
	exec      func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error)
	execStart func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error)
	putFile   func(ctx context.Context, p string, data []byte) error
	getFile   func(ctx context.Context, p string) ([]byte, error)
	touch     func(ctx context.Context) error
}

func (s *hookedSession) Info(ctx context.Context) (sandbox.SessionInfo, error) {
	if s.info != nil {
		return s.info(ctx)
	}
	return s.Session.Info(ctx)
}

func (s *hookedSession) Exec(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if s.exec != nil {
		return s.exec(ctx, argv, opts)
	}
	return s.Session.Exec(ctx, argv, opts)
}

func (s *hookedSession) ExecStart(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
	if s.execStart != nil {
		return s.execStart(ctx, argv, opts)
	}
	return s.Session.ExecStart(ctx, argv, opts)
}

func (s *hookedSession) PutFile(ctx context.Context, p string, data []byte) error {
	if s.putFile != nil {
		return s.putFile(ctx, p, data)
	}
	return s.Session.PutFile(ctx, p, data)
}

func (s *hookedSession) GetFile(ctx context.Context, p string) ([]byte, error) {
	if s.getFile != nil {
		return s.getFile(ctx, p)
	}
	return s.Session.GetFile(ctx, p)
}

func (s *hookedSession) Touch(ctx context.Context) error {
	if s.touch != nil {
		return s.touch(ctx)
	}
	return s.Session.Touch(ctx)
}

// hookedHandle is an exec handle whose set hooks replace its methods.
type hookedHandle struct {
	sandbox.ExecHandle
	writeStdin func(ctx context.Context, data []byte) error
	closeStdin func(ctx context.Context) error
	next       func(ctx context.Context) (sandbox.StreamItem, error)
	kill       func(ctx context.Context) error
}

func (h *hookedHandle) WriteStdin(ctx context.Context, data []byte) error {
	if h.writeStdin != nil {
		return h.writeStdin(ctx, data)
	}
	return h.ExecHandle.WriteStdin(ctx, data)
}

func (h *hookedHandle) CloseStdin(ctx context.Context) error {
	if h.closeStdin != nil {
		return h.closeStdin(ctx)
	}
	return h.ExecHandle.CloseStdin(ctx)
}

func (h *hookedHandle) Next(ctx context.Context) (sandbox.StreamItem, error) {
	if h.next != nil {
		return h.next(ctx)
	}
	return h.ExecHandle.Next(ctx)
}

func (h *hookedHandle) Kill(ctx context.Context) error {
	if h.kill != nil {
		return h.kill(ctx)
	}
	return h.ExecHandle.Kill(ctx)
}

// earlyExited is a handle whose sandbox.ExitWatcher says it has exited
// from the start.
type earlyExited struct{ sandbox.ExecHandle }

func (earlyExited) Exited() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// specSessions wraps every session the sandbox hands out (made or looked
// up) with wrap, given the spec it was made from (zero for a looked-up one).
func specSessions(wrap func(spec sandbox.SessionSpec, s sandbox.Session) sandbox.Session) func(sandbox.Sandbox) sandbox.Sandbox {
	return func(sb sandbox.Sandbox) sandbox.Sandbox {
		return &hookedSandbox{Sandbox: sb,
			create: func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
				sess, err := sb.CreateSession(ctx, spec)
				if sess == nil {
					return nil, err
				}
				return wrap(spec, sess), err
			},
			get: func(ctx context.Context, id string) (sandbox.Session, error) {
				sess, err := sb.GetSession(ctx, id)
				if sess == nil {
					return nil, err
				}
				return wrap(sandbox.SessionSpec{}, sess), err
			}}
	}
}

// sessions wraps every session the sandbox hands out with wrap.
func sessions(wrap func(sandbox.Session) sandbox.Session) func(sandbox.Sandbox) sandbox.Sandbox {
	return specSessions(func(_ sandbox.SessionSpec, s sandbox.Session) sandbox.Session { return wrap(s) })
}

// handles wraps every exec handle the sandbox's sessions start with wrap.
func handles(wrap func(sandbox.ExecHandle) sandbox.ExecHandle) func(sandbox.Sandbox) sandbox.Sandbox {
	return sessions(func(s sandbox.Session) sandbox.Session {
		return &hookedSession{Session: s, execStart: func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
			h, err := s.ExecStart(ctx, argv, opts)
			if h == nil {
				return nil, err
			}
			return wrap(h), err
		}}
	})
}

// execResult rewrites the result of every Exec that returns one.
func execResult(f func(sandbox.ExecResult) sandbox.ExecResult) func(sandbox.Sandbox) sandbox.Sandbox {
	return sessions(func(s sandbox.Session) sandbox.Session {
		return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
			res, err := s.Exec(ctx, argv, opts)
			if err == nil {
				res = f(res)
			}
			return res, err
		}}
	})
}

// users rewrites the user of every exec and interactive exec with f.
func users(f func(string) string) func(sandbox.Sandbox) sandbox.Sandbox {
	return sessions(func(s sandbox.Session) sandbox.Session {
		return &hookedSession{Session: s,
			exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
				opts.User = f(opts.User)
				return s.Exec(ctx, argv, opts)
			},
			execStart: func(ctx context.Context, argv []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
				opts.User = f(opts.User)
				return s.ExecStart(ctx, argv, opts)
			}}
	})
}

// execErr rewrites the error of every Exec that fails.
func execErr(f func(error) error) func(sandbox.Sandbox) sandbox.Sandbox {
	return sessions(func(s sandbox.Session) sandbox.Session {
		return &hookedSession{Session: s, exec: func(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
			res, err := s.Exec(ctx, argv, opts)
			if err != nil {
				err = f(err)
			}
			return res, err
		}}
	})
}

// streamExit rewrites the exit code of every StreamExit.
func streamExit(f func(int) int) func(sandbox.Sandbox) sandbox.Sandbox {
	return handles(func(h sandbox.ExecHandle) sandbox.ExecHandle {
		return &hookedHandle{ExecHandle: h, next: func(ctx context.Context) (sandbox.StreamItem, error) {
			it, err := h.Next(ctx)
			if e, ok := it.(*sandbox.StreamExit); ok && e != nil {
				return &sandbox.StreamExit{ExitCode: f(e.ExitCode)}, err
			}
			return it, err
		}}
	})
}

// getFileErr rewrites GetFile's errors (f may also clear one).
func getFileErr(f func(p string, err error) error) func(sandbox.Sandbox) sandbox.Sandbox {
	return sessions(func(s sandbox.Session) sandbox.Session {
		return &hookedSession{Session: s, getFile: func(ctx context.Context, p string) ([]byte, error) {
			data, err := s.GetFile(ctx, p)
			return data, f(p, err)
		}}
	})
}

// getSessionErr rewrites GetSession's errors.
func getSessionErr(f func(id string, err error) error) func(sandbox.Sandbox) sandbox.Sandbox {
	return func(sb sandbox.Sandbox) sandbox.Sandbox {
		return &hookedSandbox{Sandbox: sb, get: func(ctx context.Context, id string) (sandbox.Session, error) {
			sess, err := sb.GetSession(ctx, id)
			if err != nil {
				return nil, f(id, err)
			}
			return sess, nil
		}}
	}
}

// infoMut rewrites what Info reports.
func infoMut(f func(sandbox.SessionInfo) sandbox.SessionInfo) func(sandbox.Sandbox) sandbox.Sandbox {
	return sessions(func(s sandbox.Session) sandbox.Session {
		return &hookedSession{Session: s, info: func(ctx context.Context) (sandbox.SessionInfo, error) {
			info, err := s.Info(ctx)
			if err == nil {
				info = f(info)
			}
			return info, err
		}}
	})
}

// retryCreate retries a rejected create with the spec retry returns, when
// it says to: a silent downgrade.
func retryCreate(retry func(sandbox.SessionSpec, error) (sandbox.SessionSpec, bool)) func(sandbox.Sandbox) sandbox.Sandbox {
	return func(sb sandbox.Sandbox) sandbox.Sandbox {
		return &hookedSandbox{Sandbox: sb, create: func(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
			sess, err := sb.CreateSession(ctx, spec)
			if err != nil {
				if again, ok := retry(spec, err); ok {
					return sb.CreateSession(ctx, again)
				}
			}
			return sess, err
		}}
	}
}

// tracker remembers the sessions a wrapper made, with their state at
// create, until they are destroyed or reaped through it: what a buggy kit's
// own table would hold.
type tracker struct {
	sb   sandbox.Sandbox
	mu   sync.Mutex
	made []tracked
}

type tracked struct {
	info sandbox.SessionInfo
	sess sandbox.Session
}

func newTracker(sb sandbox.Sandbox) *tracker { return &tracker{sb: sb} }

func (t *tracker) create(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	sess, err := t.sb.CreateSession(ctx, spec)
	if err != nil {
		return sess, err
	}
	info, err := sess.Info(ctx)
	if err != nil {
		return sess, err
	}
	t.mu.Lock()
	t.made = append(t.made, tracked{info, sess})
	t.mu.Unlock()
	return sess, nil
}

func (t *tracker) forget(ids ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.made = slices.DeleteFunc(t.made, func(e tracked) bool { return slices.Contains(ids, e.info.ID) })
}

func (t *tracker) destroy(ctx context.Context, id string) error {
	t.forget(id)
	return t.sb.DestroySession(ctx, id)
}

func (t *tracker) reap(ctx context.Context) ([]string, error) {
	ids, err := t.sb.Reap(ctx)
	t.forget(ids...)
	return ids, err
}

func (t *tracker) all() []tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.made)
}

func (t *tracker) expired() []tracked {
	return slices.DeleteFunc(t.all(), func(e tracked) bool { return time.Now().Before(e.info.ExpiresAt) })
}

func (t *tracker) last() string {
	all := t.all()
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1].info.ID
}
