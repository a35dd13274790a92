package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tai42/sandbox"
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

// execute runs a validated plan and returns the exit code. The session is
// destroyed and the sandbox closed before it returns, whatever happened.
func (c *cli) execute(p plan) int {
	files, err := readPuts(p.puts)
	if err != nil {
		return c.fail(err)
	}
	stateDir, err := resolveStateDir(p.stateDir, c.lookupEnv)
	if err != nil {
		return c.fail(usagef(err))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A signal cancels ctx; caught records which, so the run ends 128+sig.
	var caught atomic.Int32
	if c.signals != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case s := <-c.signals:
				if sig, ok := s.(syscall.Signal); ok {
					caught.Store(int32(sig))
				} else {
					caught.Store(int32(syscall.SIGTERM))
				}
				cancel()
			case <-stop:
			}
		}()
	}
	interrupted := func() (int, bool) {
		if sig := caught.Load(); sig != 0 {
			return signalExit(syscall.Signal(sig)), true
		}
		return 0, false
	}
	// Teardown runs under its own bounded context, never the cancelled one.
	cleanupCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	}

	sb, closeSB, err := openProvider(p.provider, providerConfig{stateDir: stateDir, policy: p.policy, reapInterval: cliReapInterval})
	if err != nil {
		return c.fail(err)
	}
	defer func() {
		cctx, done := cleanupCtx()
		defer done()
		if err := closeSB(cctx); err != nil {
			c.warn(err)
		}
	}()

	if p.spec.Durability == sandbox.Persistent && p.policy.Durable {
		lock, err := lockWorkspaceKey(stateDir, p.spec.WorkspaceKey)
		if err != nil {
			return c.fail(err)
		}
		defer lock.Close()
	}

	sess, err := sb.CreateSession(ctx, p.spec)
	if err != nil {
		if code, ok := interrupted(); ok {
			return code
		}
		return c.fail(err)
	}
	defer func() {
		cctx, done := cleanupCtx()
		defer done()
		if err := sess.Destroy(cctx); err != nil {
			c.warn(err)
		}
	}()
	if code, ok := interrupted(); ok {
		return code
	}

	for _, f := range files {
		if err := sess.PutFile(ctx, f.remote, f.data); err != nil {
			return c.fail(err)
		}
		if code, ok := interrupted(); ok {
			return code
		}
	}

	timeout := p.timeout
	if timeout <= 0 {
		timeout = sb.ExecDefaultTimeout()
	}
	h, err := sess.ExecStart(ctx, p.argv, sandbox.StartOptions{Cwd: p.cwd, Timeout: timeout})
	if err != nil {
		return c.fail(err)
	}
	// A consumer done with a handle kills it: after the command's exit this
	// ends what it left running in its process group.
	defer func() {
		cctx, done := cleanupCtx()
		defer done()
		_ = h.Kill(cctx)
	}()

	if p.noStdin || c.stdin == nil {
		_ = h.CloseStdin(ctx)
	} else {
		// Not waited for: it may stay blocked reading a terminal or a pipe
		// that never closes, and the command's exit must still end the run.
		// ctx's cancel (deferred) unblocks a write in progress.
		go pumpStdin(ctx, c.stdin, h)
	}

	code, err := c.stream(ctx, h)
	if err != nil {
		if code, ok := interrupted(); ok {
			// Kill, then flush what the command wrote before the kill.
			cctx, done := cleanupCtx()
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
	fmt.Fprintf(c.stderr, "tai42: %v\n", err)
	return errorExitCode(err)
}

// warn reports a teardown failure; it does not change the exit code.
func (c *cli) warn(err error) {
	fmt.Fprintf(c.stderr, "tai42: warning: %v\n", err)
}
