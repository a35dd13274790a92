package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// startFake starts an exec on a fake daemon whose side of the stream is
// serve (after "started").
func startFake(t *testing.T, noReader bool, serve func(p *wsPeer)) sandbox.ExecHandle {
	t.Helper()
	mux := sessionMux()
	execMux(t, mux, noReader, func(p *wsPeer) {
		if err := p.text(api.Frame{Type: api.FrameStarted}); err != nil {
			t.Errorf("fake: started: %v", err)
			return
		}
		serve(p)
	})
	_, c := newFake(t, mux)
	h, err := getSession(t, c).ExecStart(t.Context(), []string{"cat"}, sandbox.StartOptions{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("ExecStart: %v", err)
	}
	// A test that failed midway must not hang its cleanup on a fake
	// blocked writing to a client that stopped reading.
	t.Cleanup(func() { _ = h.(*handle).conn.CloseNow() })
	return h
}

// readAll reads the stream to its end, failing the test after d.
func readAll(t *testing.T, h sandbox.ExecHandle, d time.Duration) (stdout, stderr []byte, exit *sandbox.StreamExit, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	for {
		item, err := h.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("the stream did not end within %v", d)
			}
			if errors.Is(err, io.EOF) {
				if exit == nil {
					t.Errorf("io.EOF before a StreamExit")
				}
				return stdout, stderr, exit, nil
			}
			if exit != nil {
				t.Errorf("Next returned %v after the StreamExit; want io.EOF", err)
			}
			return stdout, stderr, exit, err
		}
		switch it := item.(type) {
		case *sandbox.StreamChunk:
			if exit != nil {
				t.Errorf("a chunk after the StreamExit")
			}
			if it.Stream == sandbox.Stdout {
				stdout = append(stdout, it.Data...)
			} else {
				stderr = append(stderr, it.Data...)
			}
		case *sandbox.StreamExit:
			if exit != nil {
				t.Errorf("a second StreamExit")
			}
			exit = it
		}
	}
}

// kill calls Kill, failing the test unless it returns nil within d.
func kill(t *testing.T, h sandbox.ExecHandle, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	begin := time.Now()
	if err := h.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v after %v", err, time.Since(begin))
	}
}

// waitKill serves frames until a kill arrives, acking stdin and
// close_stdin, and returns the kill's id.
func waitKill(p *wsPeer) (uint64, bool) {
	for {
		f, ok := p.next(10 * time.Second)
		if !ok {
			return 0, false
		}
		switch {
		case f.stdin:
			_ = p.ack(f.id, nil)
		case f.control.Type == api.FrameKill:
			return f.control.ID, true
		default:
			_ = p.ack(f.control.ID, nil)
		}
	}
}

func timeoutFrame(exitCode *int) api.Frame {
	e := api.ErrorFrom(&sandbox.ExecTimeoutError{Timeout: 300 * time.Millisecond, StdoutLen: 5, StderrLen: 2, Note: "a process the command started held the output"})
	return api.Frame{Type: api.FrameError, Error: &e, ExitCode: exitCode}
}

func intp(n int) *int { return &n }

// Without a Kill, a timeout frame is the ExecTimeoutError, every field
// intact, returned again on every later call.
func TestStreamTimeout(t *testing.T) {
	h := startFake(t, false, func(p *wsPeer) {
		_ = p.output(api.TagStdout, []byte("hello"))
		_ = p.output(api.TagStderr, []byte("er"))
		_ = p.text(timeoutFrame(intp(137)))
		p.closeNormally()
	})
	stdout, stderr, exit, err := readAll(t, h, 5*time.Second)
	if string(stdout) != "hello" || string(stderr) != "er" || exit != nil {
		t.Errorf("stream: %q, %q, exit %v; want hello, er and no exit", stdout, stderr, exit)
	}
	var te *sandbox.ExecTimeoutError
	if !errors.As(err, &te) || te.Timeout != 300*time.Millisecond || te.StdoutLen != 5 || te.StderrLen != 2 || te.Note == "" {
		t.Fatalf("the end: %T %+v; want the ExecTimeoutError with its fields", err, err)
	}
	if _, again := h.Next(t.Context()); again != err {
		t.Errorf("Next after the timeout: %v; want the same error again", again)
	}
	kill(t, h, time.Second)
	if _, again := h.Next(t.Context()); again != err {
		t.Errorf("Next after the timeout and a Kill: %v; want the timeout, already returned, again", again)
	}
	if err := h.WriteStdin(t.Context(), []byte("late")); !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("WriteStdin after the end: %v; want a SandboxError", err)
	}
	if err := h.CloseStdin(t.Context()); err != nil {
		t.Errorf("CloseStdin after the end: %v; want nil", err)
	}
}

// Once Kill has returned, a timeout frame carrying the exit status is the
// StreamExit; one without it a SandboxError that is no timeout.
func TestStreamTimeoutAfterKill(t *testing.T) {
	for _, tc := range []struct {
		name string
		code *int
	}{{"WithExitCode", intp(137)}, {"WithoutExitCode", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			sent := make(chan struct{})
			h := startFake(t, false, func(p *wsPeer) {
				_ = p.output(api.TagStdout, []byte("early"))
				id, ok := waitKill(p)
				if !ok {
					t.Error("fake: no kill")
					return
				}
				// The deadline fired as the kill arrived: the timeout
				// frame was already on its way, before the ack.
				_ = p.text(timeoutFrame(tc.code))
				_ = p.ack(id, nil)
				close(sent)
				p.closeNormally()
			})
			kill(t, h, 5*time.Second)
			<-sent
			stdout, _, exit, err := readAll(t, h, 5*time.Second)
			if string(stdout) != "early" {
				t.Errorf("stdout %q; want the output received before the kill", stdout)
			}
			if errors.Is(err, sandbox.ErrExecTimeout) {
				t.Fatalf("after Kill returned the stream ended with a timeout: %v", err)
			}
			if tc.code != nil {
				if err != nil || exit == nil || exit.ExitCode != 137 {
					t.Fatalf("the end: exit %v, error %v; want StreamExit 137", exit, err)
				}
				return
			}
			var se *sandbox.SandboxError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), "timeout fired first") {
				t.Fatalf("the end: %v; want a SandboxError saying the exit status could not be read", err)
			}
			if _, again := h.Next(t.Context()); again != err {
				t.Errorf("Next again: %v; want the same error", again)
			}
		})
	}
}

// A timeout frame that ends the stream while a Kill waits for its ack ends
// that Kill (the exec has ended), and the stream then reports the exit.
func TestStreamTimeoutWhileKillWaits(t *testing.T) {
	release := make(chan struct{})
	h := startFake(t, false, func(p *wsPeer) {
		id, ok := waitKill(p)
		if !ok {
			return
		}
		_ = p.text(timeoutFrame(intp(137)))
		<-release
		_ = p.ack(id, nil)
		p.closeNormally()
	})
	defer close(release)
	kill(t, h, 2*time.Second)
	_, _, exit, err := readAll(t, h, 5*time.Second)
	if err != nil || exit == nil || exit.ExitCode != 137 {
		t.Errorf("the end after Kill returned: %v, %v; want StreamExit 137", exit, err)
	}
}

// Kill returns promptly while the output queue is full and nobody reads:
// the reader reads past the bound once a kill is on its way. The handle,
// then abandoned, frees its goroutine and connection when the stream ends.
func TestKillWhileNobodyReads(t *testing.T) {
	const frame = 32 << 10
	var written atomic.Int64
	stop := make(chan struct{})
	var producer sync.WaitGroup
	serverDone := make(chan struct{})
	h := startFake(t, false, func(p *wsPeer) {
		defer close(serverDone)
		// Output without end, a counter's bytes, until the kill.
		producer.Go(func() {
			buf := make([]byte, frame)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				for i := range buf {
					buf[i] = byte(n*frame + i)
				}
				if p.output(api.TagStdout, buf) != nil {
					return
				}
				written.Add(frame)
			}
		})
		id, ok := waitKill(p)
		if !ok {
			t.Error("fake: no kill")
			return
		}
		close(stop)
		producer.Wait()
		_ = p.ack(id, nil)
		_ = p.exit(137)
		p.closeNormally()
	})
	// Wait until the producer is blocked: the client stopped reading.
	var last int64
	for i := 0; ; i++ {
		time.Sleep(100 * time.Millisecond)
		if n := written.Load(); n == last && n > StreamBuffer {
			break
		} else if i > 100 {
			t.Fatalf("the fake wrote %d bytes and goes on; want the client to stop reading at its bound", n)
		} else {
			last = n
		}
	}
	hh := h.(*handle)
	hh.mu.Lock()
	queued := hh.queued
	hh.mu.Unlock()
	if queued < StreamBuffer || queued > StreamBuffer+frame {
		t.Errorf("the queue holds %d bytes; want the bound, %d", queued, StreamBuffer)
	}
	kill(t, h, 2*time.Second)
	// Abandoned after Kill: the reader ends and the connection closes
	// without any Next.
	select {
	case <-hh.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handle's reader still runs 5s after Kill returned and the stream ended")
	}
	<-serverDone
	stdout, _, exit, err := readAll(t, h, 5*time.Second)
	if err != nil || exit == nil || exit.ExitCode != 137 {
		t.Fatalf("the end: exit %v, error %v; want StreamExit 137", exit, err)
	}
	if int64(len(stdout)) != written.Load() {
		t.Errorf("read %d bytes; the fake wrote %d before the kill: all of it is yielded", len(stdout), written.Load())
	}
	for i, b := range stdout {
		if b != byte(i) {
			t.Fatalf("byte %d is %d; want %d: the output is yielded in order", i, b, byte(i))
		}
	}
}

// A daemon that stops reading (its read side stuck): Kill and WriteStdin
// still return, when their context ends.
func TestDaemonStopsReading(t *testing.T) {
	release := make(chan struct{})
	h := startFake(t, true, func(p *wsPeer) {
		<-release
		_ = p.exit(0)
		p.closeNormally()
	})
	defer close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	// 8 MiB fill the socket buffers: the first frame's write blocks or its
	// ack never comes.
	err := h.WriteStdin(ctx, make([]byte, 8<<20))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("WriteStdin to a daemon that does not read: %v; want a SandboxError matching context.DeadlineExceeded", err)
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	begin := time.Now()
	err = h.Kill(ctx2)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(begin) > 2*time.Second {
		t.Errorf("Kill of a daemon that does not read: %v after %v; want the context's end, promptly", err, time.Since(begin))
	}
	if err := h.WriteStdin(t.Context(), []byte("more")); err == nil || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("WriteStdin after a torn write: %v; want a SandboxError (stdin was closed)", err)
	}
}

// WriteStdin splits a large write into contiguous frames of at most
// MaxStdinFrame, each acked; concurrent calls never interleave; an ack's
// error is returned.
func TestWriteStdinFrames(t *testing.T) {
	type got struct {
		id   uint64
		data []byte
	}
	var mu sync.Mutex
	var frames []got
	closed := make(chan struct{})
	h := startFake(t, false, func(p *wsPeer) {
		for {
			f, ok := p.next(10 * time.Second)
			if !ok {
				return
			}
			switch {
			case f.stdin && bytes.HasPrefix(f.data, []byte("refuse")):
				e := api.ErrorFrom(sandbox.Errorf("write_stdin", "the exec closed its stdin"))
				_ = p.ack(f.id, &e)
			case f.stdin:
				mu.Lock()
				frames = append(frames, got{f.id, f.data})
				mu.Unlock()
				_ = p.ack(f.id, nil)
			case f.control.Type == api.FrameCloseStdin:
				_ = p.ack(f.control.ID, nil)
				close(closed)
			case f.control.Type == api.FrameKill:
				_ = p.ack(f.control.ID, nil)
				_ = p.exit(137)
				p.closeNormally()
				return
			}
		}
	})
	ctx := t.Context()
	big := bytes.Repeat([]byte("a"), 2*api.MaxStdinFrame+api.MaxStdinFrame/2)
	small := bytes.Repeat([]byte("b"), 100)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := h.WriteStdin(ctx, big); err != nil {
			t.Errorf("WriteStdin(big): %v", err)
		}
	})
	wg.Go(func() {
		for range 5 {
			if err := h.WriteStdin(ctx, small); err != nil {
				t.Errorf("WriteStdin(small): %v", err)
			}
		}
	})
	wg.Wait()
	err := h.WriteStdin(ctx, []byte("refuse"))
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || se.Op != "write_stdin" || !strings.Contains(err.Error(), "closed its stdin") {
		t.Errorf("WriteStdin refused by the daemon: %v; want its SandboxError", err)
	}
	if err := h.CloseStdin(ctx); err != nil {
		t.Errorf("CloseStdin: %v", err)
	}
	<-closed
	if err := h.CloseStdin(ctx); err != nil {
		t.Errorf("CloseStdin again: %v; want nil", err)
	}
	kill(t, h, 5*time.Second)
	if _, _, exit, err := readAll(t, h, 5*time.Second); err != nil || exit == nil || exit.ExitCode != 137 {
		t.Errorf("the end: %v, %v; want StreamExit 137", exit, err)
	}

	mu.Lock()
	defer mu.Unlock()
	var all []byte
	bigFrames := 0
	var lastID uint64
	for i, f := range frames {
		if len(f.data) > api.MaxStdinFrame {
			t.Errorf("a frame of %d bytes; want at most %d", len(f.data), api.MaxStdinFrame)
		}
		if f.id <= lastID {
			t.Errorf("frame %d has id %d after %d; want increasing ids", i, f.id, lastID)
		}
		lastID = f.id
		if f.data[0] == 'a' {
			bigFrames++
		}
		all = append(all, f.data...)
	}
	if bigFrames != 3 {
		t.Errorf("the big write came in %d frames; want 3", bigFrames)
	}
	// The big write's bytes are contiguous.
	if i := bytes.IndexByte(all, 'a'); i < 0 || !bytes.Equal(all[i:i+len(big)], big) {
		t.Errorf("the big write is not contiguous in what the daemon received")
	}
	if len(all) != len(big)+5*len(small) {
		t.Errorf("received %d bytes; want %d", len(all), len(big)+5*len(small))
	}
}

// A connection lost before the stream's end is a sticky SandboxError
// (caused by ErrConnectionClosed);
// Kill then returns nil and WriteStdin a SandboxError.
func TestStreamLost(t *testing.T) {
	h := startFake(t, false, func(p *wsPeer) {
		_ = p.output(api.TagStdout, []byte("partial"))
		_ = p.c.CloseNow()
	})
	stdout, _, exit, err := readAll(t, h, 5*time.Second)
	var se *sandbox.SandboxError
	if string(stdout) != "partial" || exit != nil || !errors.As(err, &se) || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("stream: %q, exit %v, error %v; want partial, then a SandboxError saying the stream was lost", stdout, exit, err)
	}
	inFamily(t, "lost", err)
	if !errors.Is(err, ErrConnectionClosed) || errors.Is(err, io.EOF) {
		t.Errorf("stream lost: %v; want ErrConnectionClosed as its cause, never io.EOF", err)
	}
	if _, again := h.Next(t.Context()); again != err {
		t.Errorf("Next again: %v; want the same error", again)
	}
	kill(t, h, time.Second)
	if err := h.WriteStdin(t.Context(), []byte("x")); !errors.As(err, &se) {
		t.Errorf("WriteStdin after the loss: %v; want a SandboxError", err)
	}
}

// An error frame at start is ExecStart's error; a closed stream after the
// exit keeps the exit.
func TestStartError(t *testing.T) {
	mux := sessionMux()
	execMux(t, mux, true, func(p *wsPeer) {
		e := api.ErrorFrom(sandbox.Errorf("exec_start", "cwd %q does not exist", "missing"))
		_ = p.text(api.Frame{Type: api.FrameError, Error: &e})
		p.closeNormally()
	})
	_, c := newFake(t, mux)
	h, err := getSession(t, c).ExecStart(t.Context(), []string{"true"}, sandbox.StartOptions{Cwd: "missing", Timeout: time.Second})
	var se *sandbox.SandboxError
	if h != nil || !errors.As(err, &se) || se.Op != "exec_start" || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("ExecStart refused: %v, %v; want the daemon's SandboxError", h, err)
	}
}

// The start frame carries argv, cwd, env (revealed) and the timeout in
// seconds; the handle outlives ExecStart's context; Kill after the exit
// is nil and the exit status stays the exec's own.
func TestStartFrame(t *testing.T) {
	var start api.ExecRequest
	mux := sessionMux()
	execMux(t, mux, false, func(p *wsPeer) {
		start = p.start
		_ = p.text(api.Frame{Type: api.FrameStarted})
		time.Sleep(100 * time.Millisecond)
		_ = p.output(api.TagStdout, []byte("out"))
		_ = p.exit(3)
		p.closeNormally()
	})
	_, c := newFake(t, mux)
	ctx, cancel := context.WithCancel(t.Context())
	h, err := getSession(t, c).ExecStart(ctx, []string{"sh", "-c", "exit 3"}, sandbox.StartOptions{
		Cwd: "sub", Env: sandbox.SecretEnv(map[string]string{"K": "v"}), Timeout: 1500 * time.Millisecond, User: "1000:1000"})
	cancel() // bounds the start only
	if err != nil {
		t.Fatalf("ExecStart: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // the exec has exited; its exit is unread
	kill(t, h, time.Second)
	stdout, _, exit, err := readAll(t, h, 5*time.Second)
	if string(stdout) != "out" || err != nil || exit == nil || exit.ExitCode != 3 {
		t.Errorf("stream: %q, %v, %v; want out and StreamExit 3 (the exec's own)", stdout, exit, err)
	}
	if len(start.Argv) != 3 || start.Cwd != "sub" || start.Env["K"] != "v" || start.TimeoutSeconds != 1.5 || start.User != "1000:1000" {
		t.Errorf("start frame %+v; want argv, cwd sub, env K=v, timeout 1.5, user 1000:1000", start)
	}
	for range 3 {
		kill(t, h, time.Second)
	}
}

// Concurrent Kills share one request and all return nil.
func TestKillConcurrent(t *testing.T) {
	var kills atomic.Int32
	h := startFake(t, false, func(p *wsPeer) {
		id, ok := waitKill(p)
		if !ok {
			return
		}
		kills.Add(1)
		time.Sleep(50 * time.Millisecond)
		_ = p.ack(id, nil)
		_ = p.exit(137)
		p.closeNormally()
		for f := range p.frames {
			if f.control.Type == api.FrameKill {
				kills.Add(1)
			}
		}
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { kill(t, h, 5*time.Second) })
	}
	wg.Wait()
	if _, _, exit, err := readAll(t, h, 5*time.Second); err != nil || exit == nil || exit.ExitCode != 137 {
		t.Errorf("the end: %v, %v; want StreamExit 137", exit, err)
	}
	if n := kills.Load(); n != 1 {
		t.Errorf("the daemon got %d kill frames; want 1 shared by concurrent Kills", n)
	}
}

// A Next whose context ends returns a *SandboxError matching ctx.Err() and
// leaves the stream where it was.
func TestNextContext(t *testing.T) {
	h := startFake(t, false, func(p *wsPeer) {
		id, ok := waitKill(p)
		if !ok {
			return
		}
		_ = p.output(api.TagStdout, []byte("x"))
		_ = p.ack(id, nil)
		_ = p.exit(137)
		p.closeNormally()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := h.Next(ctx); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("Next past its deadline: %T %v; want a *sandbox.SandboxError matching context.DeadlineExceeded", err, err)
	}
	kill(t, h, 5*time.Second)
	stdout, _, exit, err := readAll(t, h, 5*time.Second)
	if string(stdout) != "x" || err != nil || exit == nil {
		t.Errorf("stream: %q, %v, %v", stdout, exit, err)
	}
}

// A session destroyed through the client lifts its handles' bound, so that
// their readers reach the end and free the connection with nobody reading.
func TestDestroyFreesHandle(t *testing.T) {
	mux := sessionMux()
	mux.HandleFunc("DELETE /v1/sessions/s1", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	execMux(t, mux, false, func(p *wsPeer) {
		_ = p.text(api.Frame{Type: api.FrameStarted})
		buf := make([]byte, 64<<10)
		for i := 0; i < 200; i++ { // 12.5 MiB: more than the bound and the socket buffers
			if p.output(api.TagStdout, buf) != nil {
				return
			}
		}
		e := api.ErrorFrom(&sandbox.SessionNotFoundError{SessionID: "s1", Detail: "it was destroyed"})
		_ = p.text(api.Frame{Type: api.FrameError, Error: &e})
		p.closeNormally()
	})
	_, c := newFake(t, mux)
	sess := getSession(t, c)
	h, err := sess.ExecStart(t.Context(), []string{"yes"}, sandbox.StartOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := sess.Destroy(t.Context()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	select {
	case <-h.(*handle).done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handle of a destroyed session still reads 5s later")
	}
	_, _, _, err = readAll(t, h, 5*time.Second)
	if !errors.Is(err, sandbox.ErrSessionNotFound) {
		t.Errorf("the end: %v; want the SessionNotFoundError", err)
	}
	kill(t, h, time.Second)
}

// Output frames with no data (a tag alone, which the daemon may send) are
// not handed to the caller: every chunk Next returns holds bytes.
func TestEmptyOutputFramesDropped(t *testing.T) {
	h := startFake(t, false, func(p *wsPeer) {
		_ = p.output(api.TagStdout, []byte("a"))
		_ = p.output(api.TagStdout, nil)
		_ = p.output(api.TagStderr, nil)
		_ = p.output(api.TagStderr, []byte("e"))
		_ = p.output(api.TagStdout, []byte{})
		_ = p.output(api.TagStdout, []byte("b"))
		_ = p.exit(0)
		p.closeNormally()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var got []string
	for {
		item, err := h.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v after %q", err, got)
		}
		c, ok := item.(*sandbox.StreamChunk)
		if !ok {
			break
		}
		if len(c.Data) == 0 {
			t.Errorf("an empty %v chunk after %q", c.Stream, got)
		}
		got = append(got, string(c.Stream)+":"+string(c.Data))
	}
	if want := []string{"stdout:a", "stderr:e", "stdout:b"}; !slices.Equal(got, want) {
		t.Errorf("chunks %q, want %q", got, want)
	}
}
