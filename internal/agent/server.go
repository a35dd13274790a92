package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Options configure [Serve].
type Options struct {
	// ReapAll is set when the agent is PID 1: it then reaps every child
	// with wait4(-1) on SIGCHLD, including orphans reparented to it, and
	// hands each status to its exec. Unset (tests), it waits only for the
	// processes it started, by pid, so other children of the process are
	// not stolen.
	ReapAll bool
	// Logger receives protocol failures and lifecycle events; never argv
	// or env values. nil discards.
	Logger *slog.Logger
}

// attachTimeout bounds how long an interactive exec waits for its output
// connection; then it is killed. A variable for tests.
var attachTimeout = 30 * time.Second

// defaultGrace is the grace of an exec whose request gives none.
const defaultGrace = 200 * time.Millisecond

// maxStdin bounds a non-interactive exec's whole stdin.
const maxStdin = 1 << 30

type server struct {
	opts    Options
	log     *slog.Logger
	devNull int // stdin of an exec given none
	cwd     int // the agent's working directory, to return to (see forkIn)

	// mu is held across fork and register, and across wait4 and dispatch
	// in ReapAll mode, so a fast exit is never lost and a reaped pid
	// cannot be reused by a new exec before its status is dispatched.
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	byPid  map[int]*execProc    // ReapAll: started, not yet reaped
	execs  map[uint64]*execProc // not yet ended, by id
	groups map[int]*execProc    // process group → its exec, while it may have members
	nextID uint64

	handlers sync.WaitGroup
}

// Serve serves the agent protocol (see the package doc) on ln until ctx is
// done (it then returns nil) or ln fails (it returns the error). It closes
// ln. While it forks an exec that runs as a user it moves the process's
// working directory to the exec's cwd, and back: a process that serves the
// agent resolves no relative path meanwhile (the agent's own code uses
// none). On return every exec has been killed (its process group, and every
// group a finished exec left processes in, got SIGKILL) and reaped, every
// connection is closed, and every goroutine it started has ended.
func Serve(ctx context.Context, ln net.Listener, opts Options) error {
	s := &server{
		opts:   opts,
		log:    opts.Logger,
		conns:  make(map[net.Conn]struct{}),
		byPid:  make(map[int]*execProc),
		execs:  make(map[uint64]*execProc),
		groups: make(map[int]*execProc),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		ln.Close()
		return fmt.Errorf("agent: open %s: %w", os.DevNull, err)
	}
	s.devNull = fd
	defer syscall.Close(s.devNull)
	if s.cwd, err = unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		ln.Close()
		return fmt.Errorf("agent: open its working directory: %w", err)
	}
	defer unix.Close(s.cwd)

	var stopReaper func()
	if opts.ReapAll {
		stopReaper = s.startReaper()
	}
	stopOnCancel := context.AfterFunc(ctx, func() { ln.Close() })
	err = s.accept(ctx, ln)
	stopOnCancel()
	ln.Close()
	s.shutdown()
	s.handlers.Wait()
	if stopReaper != nil {
		stopReaper()
	}
	return err
}

// accept runs the accept loop; it returns nil once ctx is done.
func (s *server) accept(ctx context.Context, ln net.Listener) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if temporaryAcceptError(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("agent: accept failed; retrying", "err", err, "in", backoff)
				select {
				case <-time.After(backoff):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			return fmt.Errorf("agent: accept: %w", err)
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		s.conns[nc] = struct{}{}
		s.handlers.Add(1)
		s.mu.Unlock()
		go s.handle(nc)
	}
}

func temporaryAcceptError(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// shutdown refuses new execs, kills every exec and every process group a
// finished exec left, and closes every connection.
func (s *server) shutdown() {
	s.mu.Lock()
	s.closed = true
	execs := make([]*execProc, 0, len(s.execs))
	for _, e := range s.execs {
		execs = append(execs, e)
	}
	groups := make([]int, 0, len(s.groups))
	for pg := range s.groups {
		groups = append(groups, pg)
	}
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, e := range execs {
		e.kill(false, false)
	}
	for _, pg := range groups {
		_ = syscall.Kill(-pg, syscall.SIGKILL)
	}
	for _, c := range conns {
		c.Close()
	}
}

// startReaper reaps every child on SIGCHLD (PID 1 mode) and returns the
// function that stops it.
func (s *server) startReaper() func() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			s.reapAll()
			select {
			case <-sigs:
			case <-stop:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(stop)
		<-done
	}
}

// reapAll reaps every child that has exited and hands each status to its
// exec; an orphan's status is dropped.
func (s *server) reapAll() {
	for {
		var ws syscall.WaitStatus
		s.mu.Lock()
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		var e *execProc
		if err == nil && pid > 0 {
			e = s.byPid[pid]
			delete(s.byPid, pid)
		}
		s.mu.Unlock()
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil || pid <= 0: // ECHILD: no children; 0: none exited
			return
		case e != nil:
			e.status <- waitResult{ws: ws} // buffered: one status per exec
		default:
			s.log.Debug("agent: reaped an orphan", "pid", pid)
		}
	}
}

// handle serves one connection: its request names the operation.
func (s *server) handle(nc net.Conn) {
	defer s.handlers.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, nc)
		s.mu.Unlock()
		nc.Close()
	}()
	c := newFrameConn(nc)
	typ, p, err := c.read(nil)
	if err != nil {
		if err != io.EOF {
			s.log.Warn("agent: reading a request failed", "err", err)
		}
		return
	}
	if typ != frameRequest {
		s.protocolFailure(c, fmt.Sprintf("the first frame is of type %q, not a request", typ))
		return
	}
	var req request
	if err := json.Unmarshal(p, &req); err != nil {
		var v struct {
			V int `json:"v"`
		}
		if json.Unmarshal(p, &v) == nil && (v.V < minVersion || v.V > Version) {
			s.versionMismatch(c, v.V)
			return
		}
		s.protocolFailure(c, fmt.Sprintf("the request does not decode: %v", err))
		return
	}
	if req.V < minVersion || req.V > Version {
		s.versionMismatch(c, req.V)
		return
	}
	if err := req.decodeBytes(); err != nil {
		s.protocolFailure(c, err.Error())
		return
	}
	if req.User != "" && req.V < userVersion {
		s.protocolFailure(c, fmt.Sprintf("an exec's user needs a request of version %d, not %d", userVersion, req.V))
		return
	}
	switch req.Op {
	case "ping":
		_ = c.writeJSON(frameReply, pingReply{V: req.V})
	case "exec":
		s.handleExec(c, &req)
	case "attach":
		s.handleAttach(c, &req)
	case "put":
		s.handlePut(c, &req)
	case "get":
		s.handleGet(c, &req)
	case "mux":
		s.handleMux(nc, c, &req)
	default:
		s.protocolFailure(c, fmt.Sprintf("unknown operation %q", req.Op))
	}
}

func (s *server) versionMismatch(c *frameConn, v int) {
	msg := fmt.Sprintf("protocol version mismatch: the client speaks version %d, the agent speaks versions %d to %d", v, minVersion, Version)
	s.log.Warn("agent: " + msg)
	_ = c.writeJSON(frameError, errorFrame{Kind: kindVersion, Message: msg})
}

// protocolFailure logs msg and tells the peer.
func (s *server) protocolFailure(c *frameConn, msg string) {
	s.log.Warn("agent: protocol error", "err", msg)
	_ = c.writeJSON(frameError, errorFrame{Kind: kindProtocol, Message: "agent protocol: " + msg})
}

// sandboxError is an error frame the client turns into a
// *sandbox.SandboxError{Op: op, Message: message, Err: cause}.
func sandboxError(op, message string, cause error) *errorFrame {
	ef := &errorFrame{Kind: kindSandbox, Op: op, Message: message}
	if cause != nil {
		ef.Cause = cause.Error()
	}
	return ef
}
