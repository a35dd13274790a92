package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/unixuser"
)

// waitResult is a reaped command's status.
type waitResult struct {
	ws  syscall.WaitStatus
	err error
}

// execProc is one exec on the agent's side: a process group, its pipes,
// the goroutines that read and write them, and its control connection.
//
// Goroutines: the connection's handler reads the control connection
// (control); supervise reaps the command and sends the exited and exit
// frames; two readers copy the output pipes to the output connection (the
// control connection when not interactive) once attached; stdinWriter
// writes stdin data frames into the pipe.
type execProc struct {
	s           *server
	id          uint64
	pid         int // also the process group id
	interactive bool
	grace       time.Duration
	ctl         *frameConn
	stdin       *os.File // the parent's end of the stdin pipe; nil: /dev/null
	outs        [2]*os.File
	status      chan waitResult // ReapAll: from the reaper

	exited      atomic.Bool   // the command was reaped
	ended       atomic.Bool   // reaped and the output over: the exit frame is next
	done        chan struct{} // the exit frame was sent (or its write failed)
	readersDone chan struct{} // the output is over, or will never be read
	readersOnce sync.Once
	outsOnce    sync.Once
	attachTimer *time.Timer

	mu       sync.Mutex
	killed   bool // a client's kill arrived before the reap
	attached bool // the output is being read, or never will be
	held     bool // a read waited past the grace after the reap

	// stdin writing (interactive)
	jobs        chan stdinJob // capacity 2: one data frame, one close
	writerDone  chan struct{}
	outstanding atomic.Bool // a data frame is with the writer (set by control)
	dataBuf     []byte
	wmu         sync.Mutex
	writing     bool // the writer is in the pipe write
	cancelled   bool // a cancel frame arrived for the outstanding write
}

type stdinJob struct {
	data  []byte
	close bool
}

// handleExec starts an exec and serves its control connection until the
// client closes it.
func (s *server) handleExec(c *frameConn, req *request) {
	var stdinData []byte
	if req.StdinLen > 0 {
		if req.Interactive {
			s.protocolFailure(c, "an interactive exec takes its stdin in data frames after the start, not stdin_len")
			return
		}
		if req.StdinLen > maxStdin {
			s.protocolFailure(c, fmt.Sprintf("stdin_len %d is over the limit of %d", req.StdinLen, maxStdin))
			return
		}
		stdinData = make([]byte, req.StdinLen)
		for got := 0; got < len(stdinData); {
			typ, n, err := c.readHeader()
			if err != nil {
				s.log.Warn("agent: reading an exec's stdin failed", "err", err)
				return
			}
			if typ != frameData || n > len(stdinData)-got {
				s.protocolFailure(c, fmt.Sprintf("expected %d more bytes of stdin in data frames, got a frame of type %q with %d bytes", len(stdinData)-got, typ, n))
				return
			}
			if _, err := c.readPayload(n, stdinData[got:got+n]); err != nil {
				s.log.Warn("agent: reading an exec's stdin failed", "err", err)
				return
			}
			got += n
		}
	}
	e, failed, ef := s.startExec(c, req, stdinData != nil)
	switch {
	case ef != nil:
		_ = c.writeJSON(frameError, ef)
		return
	case failed != nil:
		_ = c.writeJSON(frameReply, failed)
		return
	}
	s.log.Debug("agent: exec started", "id", e.id, "pid", e.pid, "interactive", e.interactive)
	if e.interactive {
		go e.stdinWriter()
	} else if stdinData != nil {
		go func() {
			defer close(e.writerDone)
			// A failed write (the command exited or closed its stdin) is
			// the command's choice; supervise closes the pipe at the end,
			// which unblocks a stuck write.
			_, _ = e.stdin.Write(stdinData)
			e.stdin.Close()
		}()
	}
	if err := c.writeJSON(frameReply, startReply{ID: e.id}); err != nil {
		e.kill(false, false)
	}
	if !e.interactive {
		go func() {
			e.readOutputs(c)
			e.readersEnded()
		}()
	}
	go e.supervise()
	e.control()
	<-e.done
	if e.jobs != nil {
		close(e.jobs)
	}
	if e.writerDone != nil {
		<-e.writerDone
	}
	s.log.Debug("agent: exec ended", "id", e.id)
}

// statDir stats the exec's working directory: through os.Root at the
// request's root when it names one (a symlink leading out is refused),
// else by its absolute path.
func statDir(req *request) (os.FileInfo, error) {
	if req.Root == "" {
		return os.Stat(req.Dir)
	}
	root, err := os.OpenRoot(req.Root)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.Stat(req.Rel)
}

// startExec checks the request and starts its command. It returns the
// started exec, or the reply for a command that could not be started (exit
// 126 or 127), or an error frame.
func (s *server) startExec(c *frameConn, req *request, stdinPipe bool) (*execProc, *startReply, *errorFrame) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, nil, &errorFrame{Kind: kindProtocol, Message: "agent protocol: an exec request needs a non-empty argv"}
	}
	if !filepath.IsAbs(req.Dir) {
		return nil, nil, &errorFrame{Kind: kindProtocol, Message: fmt.Sprintf("agent protocol: the exec's dir %q is not absolute", req.Dir)}
	}
	fi, err := statDir(req)
	switch {
	case err != nil && oscmd.Missing(err):
		return nil, nil, sandboxError("", fmt.Sprintf("cwd %q does not exist in the workspace", req.DirOrig), nil)
	case err != nil:
		return nil, nil, sandboxError("", fmt.Sprintf("cwd %q", req.DirOrig), oscmd.RootErr(err))
	case !fi.IsDir():
		return nil, nil, sandboxError("", fmt.Sprintf("cwd %q is not a directory", req.DirOrig), nil)
	}
	var cred *syscall.Credential
	env := req.Env
	if req.User != "" {
		u, ef := resolveUser(req.User)
		if ef != nil {
			return nil, nil, ef
		}
		cred, env = u.Credential(), withHome(env, u.Home)
	}
	path, code, msg := oscmd.LookPath(req.Argv[0], pathEnv(env), req.Dir)
	if code != 0 {
		return nil, &startReply{Failed: true, ExitCode: code, Message: []byte(msg)}, nil
	}

	e := &execProc{
		s:           s,
		interactive: req.Interactive,
		grace:       time.Duration(req.GraceNS),
		ctl:         c,
		done:        make(chan struct{}),
		readersDone: make(chan struct{}),
	}
	if e.grace <= 0 {
		e.grace = defaultGrace
	}
	if s.opts.ReapAll {
		e.status = make(chan waitResult, 1)
	}
	// The child's ends of the pipes: stdin, stdout, stderr.
	child := [3]int{s.devNull, -1, -1}
	closeChild := func() {
		for i, fd := range child {
			if fd >= 0 && (i > 0 || stdinPipe || req.Interactive) {
				syscall.Close(fd)
			}
		}
	}
	closeParent := func() {
		for _, f := range append(e.outs[:], e.stdin) {
			if f != nil {
				f.Close()
			}
		}
	}
	fail := func(err error) (*execProc, *startReply, *errorFrame) {
		closeChild()
		closeParent()
		return nil, nil, sandboxError("", "cannot create pipes", err)
	}
	if req.Interactive || stdinPipe {
		if e.stdin, child[0], err = newPipe(false); err != nil {
			child[0] = -1
			return fail(err)
		}
	}
	for i := range e.outs {
		if e.outs[i], child[i+1], err = newPipe(true); err != nil {
			return fail(err)
		}
	}
	if req.Interactive {
		e.jobs = make(chan stdinJob, 2)
		e.writerDone = make(chan struct{})
	} else if stdinPipe {
		e.writerDone = make(chan struct{})
	}
	attr := &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   env, // nil: an empty environment
		Files: []uintptr{uintptr(child[0]), uintptr(child[1]), uintptr(child[2])},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	}
	var pid int
	fork := func() (err error) { pid, err = syscall.ForkExec(path, req.Argv, attr); return err }
	if cred != nil {
		attr.Dir = ""
		inDir := fork
		fork = func() error { return s.forkIn(req.Dir, inDir) }
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		err = errors.New("the agent is shutting down")
	} else {
		err = fork()
		if err == nil {
			s.nextID++
			e.id, e.pid = s.nextID, pid
			if e.interactive {
				e.attachTimer = time.AfterFunc(attachTimeout, e.attachExpired)
			}
			if s.opts.ReapAll {
				s.byPid[pid] = e
			}
			s.groups[pid] = e
			s.execs[e.id] = e
		}
		s.mu.Unlock()
	}
	closeChild()
	if err != nil {
		closeParent()
		if pe, ok := errors.AsType[*os.PathError](err); ok && pe.Op == "chdir" {
			return nil, nil, sandboxError("", fmt.Sprintf("cwd %q", req.DirOrig), pe.Err)
		}
		if code, msg := oscmd.StartFailure(req.Argv[0], err); code != 0 {
			return nil, &startReply{Failed: true, ExitCode: code, Message: []byte(msg)}, nil
		}
		return nil, nil, sandboxError("", "cannot start the command", err)
	}
	return e, nil, nil
}

// forkIn runs fork, which forks, with the agent's own working directory at
// dir, so that the child starts in dir before it takes its user's ids:
// Go's fork enters attr.Dir after them, where the user may be refused (the
// workspace is root's, mode 0700), and runc too enters the cwd before it
// switches users. The caller holds s.mu, as every fork does, so no other
// fork sees dir; nothing else in the agent uses a relative path. The agent
// then returns to its directory of before. (A thread of its own, as
// nsthread.InDir makes, would leave the process's directory alone, but
// the session's seccomp profile refuses unshare.)
func (s *server) forkIn(dir string, fork func() error) error {
	if err := unix.Chdir(dir); err != nil {
		return &os.PathError{Op: "chdir", Path: dir, Err: err}
	}
	defer func() {
		if err := unix.Fchdir(s.cwd); err != nil {
			s.log.Warn("agent: cannot return to its working directory after an exec as a user", "err", err)
		}
	}()
	return fork()
}

// resolveUser resolves an exec's user in the agent's own /etc/passwd and
// /etc/group, the session's, and checks that the session's user namespace
// maps its ids; else it returns the error frame to answer.
func resolveUser(spec string) (unixuser.User, *errorFrame) {
	u, err := unixuser.Lookup("/", spec)
	if nf, ok := errors.AsType[*sandbox.UserNotFoundError](err); ok {
		return u, &errorFrame{Kind: kindUserNotFound, User: nf.User, Message: nf.Error()}
	}
	if err != nil {
		return u, sandboxError("", fmt.Sprintf("user %q", spec), err)
	}
	if err := unixuser.CheckMapped(u); err != nil {
		return u, sandboxError("", fmt.Sprintf("user %q cannot run in this session: %v", spec, err), nil)
	}
	return u, nil
}

// withHome is env with HOME=home added, unless env sets HOME.
func withHome(env []string, home string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "HOME=") {
			return env
		}
	}
	return append(slices.Clip(env), "HOME="+home)
}

// newPipe makes a pipe whose child end stays blocking (a command expects
// that) and whose parent end is non-blocking, so that it is pollable: read
// deadlines and a close wake a goroutine blocked on it. parentReads says
// which end is the parent's. Output pipes are grown to 1 MiB where
// allowed: fewer wakeups for a command that writes a lot.
func newPipe(parentReads bool) (*os.File, int, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	pi, ci, name := 1, 0, "|stdin"
	if parentReads {
		pi, ci, name = 0, 1, "|output"
		_, _ = unix.FcntlInt(uintptr(p[pi]), unix.F_SETPIPE_SZ, 1<<20)
	}
	if err := syscall.SetNonblock(p[pi], true); err != nil {
		syscall.Close(p[0])
		syscall.Close(p[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(p[pi]), name), p[ci], nil
}

// pathEnv is the PATH of an environment list: its first PATH= entry, the
// one the command's libc sees (a provider sends each key once).
func pathEnv(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			return v
		}
	}
	return ""
}

// wait reaps the command: from the reaper in ReapAll mode, else by pid.
func (e *execProc) wait() waitResult {
	if e.s.opts.ReapAll {
		return <-e.status
	}
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(e.pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		return waitResult{ws: ws, err: err}
	}
}

// supervise reaps the command, sends the exited frame, lets the output
// end (end-of-file, a kill, or the grace), and sends the exit frame.
func (e *execProc) supervise() {
	wr := e.wait()
	e.mu.Lock()
	e.exited.Store(true)
	e.mu.Unlock()
	deadline := time.Now().Add(e.grace)
	for _, f := range e.outs {
		_ = f.SetReadDeadline(deadline) // wakes a reader blocked on a held pipe
	}
	select {
	case <-e.readersDone: // the exit frame follows at once: it says as much
	default:
		_ = e.ctl.write(frameExited, nil)
		<-e.readersDone
	}
	// From here the control connection's close leaves the group alone:
	// the client may close it as soon as it has the exit frame.
	e.ended.Store(true)
	if e.attachTimer != nil {
		e.attachTimer.Stop()
	}
	e.closeOutputs()
	if e.stdin != nil {
		e.stdin.Close() // unblocks a stuck stdin write
	}
	e.s.unregister(e)

	e.mu.Lock()
	ex := exitFrame{Killed: e.killed, Held: e.held}
	e.mu.Unlock()
	if wr.err != nil {
		ex.Code = -1
		e.s.log.Warn("agent: cannot read an exec's exit status", "id", e.id, "pid", e.pid, "err", wr.err)
	} else {
		ex.Known = true
		ex.Code = exitCode(wr.ws)
	}
	_ = e.ctl.writeJSON(frameExit, ex)
	close(e.done)
}

// exitCode is the exit status, or 128+signal for a command killed by one.
func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// unregister drops an ended exec, and its process group when nothing is
// left running in it.
func (s *server) unregister(e *execProc) {
	left := syscall.Kill(-e.pid, 0) == nil
	s.mu.Lock()
	delete(s.execs, e.id)
	if s.byPid[e.pid] == e { // the pid may be a new exec's by now
		delete(s.byPid, e.pid)
	}
	if !left && s.groups[e.pid] == e {
		delete(s.groups, e.pid)
	}
	s.mu.Unlock()
}

// kill sends SIGKILL to the exec's process group (after the reap: to what
// the command left in it, as long as the group is still the exec's).
// byClient records a client's kill request; drain keeps reading the
// output, else reading stops at once.
func (e *execProc) kill(drain, byClient bool) {
	if byClient {
		e.mu.Lock()
		if !e.exited.Load() {
			e.killed = true
		}
		e.mu.Unlock()
	}
	e.signalGroup()
	if !drain {
		e.stopReading()
	}
}

func (e *execProc) signalGroup() {
	s := e.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[e.pid] == e {
		_ = syscall.Kill(-e.pid, syscall.SIGKILL)
	}
}

// claimAttach marks the output as taken (by an attach, or by a kill that
// means it will never be read); false if it already was.
func (e *execProc) claimAttach() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.attached {
		return false
	}
	e.attached = true
	return true
}

// stopReading ends the output at once: the pipes are closed, which wakes
// the readers.
func (e *execProc) stopReading() {
	if e.interactive && e.claimAttach() {
		e.readersEnded()
	}
	e.closeOutputs()
}

func (e *execProc) attachExpired() {
	if !e.claimAttach() {
		return
	}
	e.s.log.Warn("agent: an interactive exec was not attached in time; killing it", "id", e.id, "timeout", attachTimeout)
	e.readersEnded()
	e.signalGroup()
	e.closeOutputs()
}

func (e *execProc) readersEnded() { e.readersOnce.Do(func() { close(e.readersDone) }) }

func (e *execProc) closeOutputs() {
	e.outsOnce.Do(func() {
		e.outs[0].Close()
		e.outs[1].Close()
	})
}

// readOutputs copies both output pipes to w until each ends.
func (e *execProc) readOutputs(w *frameConn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.readOutput(1, w)
	}()
	e.readOutput(0, w)
	wg.Wait()
}

// readOutput copies one pipe to w until end-of-file, until the pipe is
// closed (a kill), or, once the command was reaped, until a read waits
// longer than the grace (a left process holds the pipe). A left process
// that keeps writing keeps the output going: the exec's timeout, which
// the client enforces, bounds it. A write to w
// that fails (the client is gone) kills the exec.
func (e *execProc) readOutput(i int, w *frameConn) {
	f := e.outs[i]
	typ := frameStdout
	if i == 1 {
		typ = frameStderr
	}
	bp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bp)
	buf := *bp
	for {
		if e.exited.Load() {
			_ = f.SetReadDeadline(time.Now().Add(e.grace))
		}
		n, err := f.Read(buf[headerLen:])
		if n > 0 {
			if werr := w.writeBuf(typ, buf[:headerLen+n]); werr != nil {
				e.s.log.Debug("agent: an exec's output connection failed; killing it", "id", e.id, "err", werr)
				e.kill(false, false)
				return
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				e.mu.Lock()
				e.held = true
				e.mu.Unlock()
			}
			return
		}
	}
}

// control reads the control connection until the client closes it: kill,
// stdin data, cancel and close_stdin frames. Closed before the exec ended
// (the command reaped and its output over), it kills the exec (stop);
// after, it leaves what the command left running alone.
func (e *execProc) control() {
	small := make([]byte, 256)
	for {
		typ, n, err := e.ctl.readHeader()
		if err != nil {
			break
		}
		if typ == frameData {
			if !e.interactive || e.outstanding.Load() {
				e.s.log.Warn("agent: protocol error: a stdin data frame while another is outstanding, or for a non-interactive exec", "id", e.id)
				break
			}
			if e.dataBuf == nil {
				e.dataBuf = make([]byte, maxData)
			}
			p, err := e.ctl.readPayload(n, e.dataBuf)
			if err != nil {
				break
			}
			e.outstanding.Store(true)
			e.jobs <- stdinJob{data: p}
			continue
		}
		p, err := e.ctl.readPayload(n, small)
		if err != nil {
			break
		}
		switch typ {
		case frameKill:
			var k killFrame
			if len(p) > 0 {
				if err := json.Unmarshal(p, &k); err != nil {
					e.s.log.Warn("agent: protocol error: a kill frame does not decode", "id", e.id, "err", err)
				}
			}
			e.kill(k.Drain, true)
			continue
		case frameCancel:
			if e.interactive {
				e.cancelWrite()
				continue
			}
		case frameCloseStdin:
			if e.interactive {
				select {
				case e.jobs <- stdinJob{close: true}:
				default: // a close is already queued
				}
				continue
			}
		}
		e.s.log.Warn("agent: protocol error: an unexpected frame on an exec's control connection", "id", e.id, "type", string(typ))
		break
	}
	if !e.ended.Load() {
		e.kill(false, false)
	}
}

// cancelWrite stops the outstanding stdin write, if there is one; else its
// ack is on its way and the cancel is ignored.
func (e *execProc) cancelWrite() {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if !e.outstanding.Load() {
		return
	}
	e.cancelled = true
	if e.writing {
		_ = e.stdin.SetWriteDeadline(time.Unix(1, 0))
	}
}

// stdinWriter writes stdin data frames into the pipe, one at a time, and
// acks each; it closes stdin on a close job, and after a cancelled write
// that wrote some bytes.
func (e *execProc) stdinWriter() {
	defer close(e.writerDone)
	closed := false
	for job := range e.jobs {
		if job.close {
			if !closed {
				closed = true
				e.stdin.Close()
			}
			continue
		}
		var a ackFrame
		if closed {
			a.Err = ackClosed
			e.wmu.Lock()
			e.cancelled = false
			e.outstanding.Store(false)
			e.wmu.Unlock()
		} else {
			e.wmu.Lock()
			pre := e.cancelled
			e.writing = !pre
			e.wmu.Unlock()
			var n int
			err := os.ErrDeadlineExceeded
			if !pre {
				n, err = e.stdin.Write(job.data)
			}
			e.wmu.Lock()
			e.writing = false
			cancelled := e.cancelled
			e.cancelled = false
			e.outstanding.Store(false)
			e.wmu.Unlock()
			if cancelled {
				_ = e.stdin.SetWriteDeadline(time.Time{})
			}
			a.N = n
			switch {
			case err == nil:
			case cancelled && errors.Is(err, os.ErrDeadlineExceeded):
				a.Err = ackCancelled
				if n > 0 { // no torn message may be followed by another
					closed = true
					e.stdin.Close()
				}
			case errors.Is(err, syscall.EPIPE), errors.Is(err, os.ErrClosed), e.exited.Load():
				a.Err = ackExited
			default:
				a.Err, a.Msg = ackIO, err.Error()
			}
		}
		_ = e.ctl.writeJSON(frameAck, a)
	}
}

// handleAttach serves an interactive exec's output connection.
func (s *server) handleAttach(c *frameConn, req *request) {
	s.mu.Lock()
	e := s.execs[req.ID]
	s.mu.Unlock()
	if e == nil || !e.interactive {
		_ = c.writeJSON(frameError, sandboxError("", fmt.Sprintf("no interactive exec %d is running (it ended, or was never started)", req.ID), nil))
		return
	}
	if !e.claimAttach() {
		_ = c.writeJSON(frameError, sandboxError("", fmt.Sprintf("exec %d is already attached, or was killed before it was", req.ID), nil))
		return
	}
	e.attachTimer.Stop()
	if err := c.writeJSON(frameReply, struct{}{}); err != nil {
		e.kill(false, false)
		e.readersEnded()
		return
	}
	e.readOutputs(c)
	_ = c.write(frameEnd, nil)
	e.readersEnded()
}
