package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/provider/kubernetes"
)

// cleanupTimeout bounds the teardown (kill, destroy, close) of one run.
const cleanupTimeout = 30 * time.Second

// stdinChunk is the most one WriteStdin carries.
const stdinChunk = 32 << 10

// localFile is a --put file read from the local disk.
type localFile struct {
	remote string
	data   []byte
}

// runPlan runs a validated plan and returns the exit code: on the daemon
// of rem when it is non-nil, else on the embedded provider. The session is
// destroyed (and an embedded sandbox closed) before it returns, whatever
// happened.
func (c *cli) runPlan(p plan, rem *remote) int {
	files, err := readPuts(p.puts)
	if err != nil {
		return c.fail(err)
	}
	ctx, in, stop := c.interruptible()
	defer stop()

	if rem != nil {
		cl, err := c.dial(*rem)
		if err != nil {
			return c.fail(err)
		}
		defer cl.Close()
		return c.execute(ctx, in, cl, p, files)
	}

	stateDir, err := resolveStateDir(p.stateDir, c.lookupEnv)
	if err != nil {
		return c.fail(usagef(err))
	}
	if err := ensureStateDir(stateDir); err != nil {
		return c.fail(err)
	}
	if p.provider == host.Name && len(p.imageFlags) > 0 {
		c.warn(fmt.Errorf("the host runner pulls no images (its one image is %q): %s have no effect", sandbox.HostImage, strings.Join(p.imageFlags, ", ")))
	}
	if p.provider == kubernetes.Name && len(p.imageFlags) > 0 {
		c.warn(fmt.Errorf("the kubernetes provider's images are pulled by the cluster: %s have no effect", strings.Join(p.imageFlags, ", ")))
	}
	sb, closeSB, err := openProvider(p.provider, providerConfig{stateDir: stateDir, policy: p.policy, reapInterval: cliReapInterval, images: p.images, kube: p.kube})
	if err != nil {
		return c.fail(err)
	}
	defer func() {
		cctx, done := cleanupContext(ctx)
		defer done()
		if err := closeSB(cctx); err != nil {
			c.warn(err)
		}
	}()
	// The kit's ledger keeps one live session per persistent key within
	// this process; the lock keeps it across tai42 processes.
	if p.spec.Durability == sandbox.Persistent && p.policy.Durable {
		lock, err := lockWorkspaceKey(stateDir, p.spec.WorkspaceKey)
		if err != nil {
			return c.fail(err)
		}
		defer lock.Close()
	}
	return c.execute(ctx, in, sb, p, files)
}

// execute runs a plan on sb: it creates the session, copies the files in,
// runs the command interactively and destroys the session, whatever
// happened. A signal (which cancels ctx) ends it with 128+sig.
func (c *cli) execute(ctx context.Context, in *interruption, sb sandbox.Sandbox, p plan, files []localFile) int {
	sess, err := sb.CreateSession(ctx, p.spec)
	if err != nil {
		if code, ok := in.code(); ok {
			return code
		}
		return c.fail(err)
	}
	defer func() {
		cctx, done := cleanupContext(ctx)
		defer done()
		if err := sess.Destroy(cctx); err != nil {
			c.warn(c.explain(err))
		}
	}()
	if code, ok := in.code(); ok {
		return code
	}

	for _, f := range files {
		if err := sess.PutFile(ctx, f.remote, f.data); err != nil {
			if code, ok := in.code(); ok {
				return code
			}
			return c.fail(err)
		}
	}

	timeout := p.timeout
	if timeout <= 0 {
		timeout = sb.ExecDefaultTimeout()
	}
	if timeout <= 0 {
		// A client that could not learn its daemon's default.
		timeout = kit.DefaultExecTimeout
	}
	return c.interact(ctx, in, sess, p.argv, sandbox.StartOptions{Cwd: p.cwd, Timeout: timeout, User: p.user}, p.noStdin)
}

// interact runs argv in sess as an interactive exec: c's stdin streamed to
// it (unless noStdin), its stdout and stderr streamed back. It returns the
// command's exit code, 124 on its timeout, 128+sig when a signal cancelled
// ctx (the command is then killed and the output it wrote before the kill
// still flushed), or the code of another error, printed. The exec is killed
// before it returns, ending what the command left running.
func (c *cli) interact(ctx context.Context, in *interruption, sess sandbox.Session, argv []string, opts sandbox.StartOptions, noStdin bool) int {
	h, err := sess.ExecStart(ctx, argv, opts)
	if err != nil {
		if code, ok := in.code(); ok {
			return code
		}
		return c.fail(err)
	}
	// A consumer done with a handle kills it: after the command's exit this
	// ends what it left running in its process group.
	defer func() {
		cctx, done := cleanupContext(ctx)
		defer done()
		_ = h.Kill(cctx)
	}()

	if noStdin || c.stdin == nil {
		_ = h.CloseStdin(ctx)
	} else {
		// Not waited for: it may stay blocked reading a terminal or a pipe
		// that never closes, and the command's exit must still end the run.
		// ctx's cancel (the caller's) unblocks a write in progress.
		go pumpStdin(ctx, c.stdin, h)
	}

	code, err := c.stream(ctx, h)
	if err != nil {
		if code, ok := in.code(); ok {
			// Kill, then flush what the command wrote before the kill.
			cctx, done := cleanupContext(ctx)
			defer done()
			_ = h.Kill(cctx)
			c.drain(cctx, h)
			return code
		}
		return c.fail(err)
	}
	return code
}

// stream copies the exec's output to stdout and stderr as it comes and
// returns the command's exit code. A write error ends the run: 141 (as if
// killed by SIGPIPE) for a closed pipe, else 1 with the error printed.
func (c *cli) stream(ctx context.Context, h sandbox.ExecHandle) (int, error) {
	for {
		it, err := h.Next(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the command's output ended without an exit status")
			}
			return 0, err
		}
		switch v := it.(type) {
		case *sandbox.StreamChunk:
			w := c.stdout
			if v.Stream == sandbox.Stderr {
				w = c.stderr
			}
			if _, err := w.Write(v.Data); err != nil {
				if errors.Is(err, syscall.EPIPE) {
					return signalExit(syscall.SIGPIPE), nil
				}
				return c.fail(fmt.Errorf("writing the command's %s: %w", v.Stream, err)), nil
			}
		case *sandbox.StreamExit:
			return v.ExitCode, nil
		}
	}
}

// drain writes what is left of a killed exec's output, best effort.
func (c *cli) drain(ctx context.Context, h sandbox.ExecHandle) {
	for {
		it, err := h.Next(ctx)
		if err != nil {
			return
		}
		v, ok := it.(*sandbox.StreamChunk)
		if !ok {
			return
		}
		w := c.stdout
		if v.Stream == sandbox.Stderr {
			w = c.stderr
		}
		if _, err := w.Write(v.Data); err != nil {
			return
		}
	}
}

// pumpStdin streams r to the exec's stdin, one WriteStdin per read, and
// closes it at r's end (or at a read error). It stops when the exec no
// longer takes input.
func pumpStdin(ctx context.Context, r io.Reader, h sandbox.ExecHandle) {
	buf := make([]byte, stdinChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := h.WriteStdin(ctx, buf[:n]); werr != nil {
				return // the command exited or closed its stdin
			}
		}
		if err != nil {
			_ = h.CloseStdin(ctx)
			return
		}
	}
}

// readPuts reads the --put files from the local disk, before any session
// exists; a file that cannot be read is a usage error.
func readPuts(puts []putSpec) ([]localFile, error) {
	out := make([]localFile, 0, len(puts))
	for _, p := range puts {
		data, err := os.ReadFile(p.local)
		if err != nil {
			return nil, usagef(fmt.Errorf("--put: %w", err))
		}
		out = append(out, localFile{remote: p.remote, data: data})
	}
	return out, nil
}

// fail prints err on stderr and returns its exit code. A timeout's message
// carries the partial output's lengths, never its content.
func (c *cli) fail(err error) int {
	err = c.explain(err)
	fmt.Fprintf(c.stderr, "tai42: %v\n", err)
	return errorExitCode(err)
}

// warn reports a teardown failure; it does not change the exit code.
func (c *cli) warn(err error) {
	fmt.Fprintf(c.stderr, "tai42: warning: %v\n", err)
}
