package client

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// produce writes output frames of size bytes from its own goroutine until
// total bytes (0: until stop is closed) or the connection fails, counting
// what it wrote; done is closed when it ends.
func produce(p *wsPeer, size, total int, stop <-chan struct{}, written *atomic.Int64) (done <-chan struct{}) {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		buf := make([]byte, size)
		for total == 0 || written.Load() < int64(total) {
			select {
			case <-stop:
				return
			default:
			}
			if p.output(api.TagStdout, buf) != nil {
				return
			}
			written.Add(int64(size))
		}
	}()
	return ch
}

// waitStalled waits until written stops growing above floor with h's
// queue at floor: the client stopped reading at its bound. (A pause of
// the writer alone, on a loaded machine, is not the client's stop.)
func waitStalled(t *testing.T, h sandbox.ExecHandle, written *atomic.Int64, floor int64) {
	t.Helper()
	var last int64
	for i := 0; ; i++ {
		time.Sleep(100 * time.Millisecond)
		n := written.Load()
		if n == last && n > floor && int64(queued(h)) >= floor {
			return
		}
		if i > 100 {
			t.Fatalf("the fake wrote %d bytes (growing: %v), the client queues %d; want the client to stop reading with %d queued", n, n != last, queued(h), floor)
		}
		last = n
	}
}

func queued(h sandbox.ExecHandle) int {
	hh := h.(*handle)
	hh.mu.Lock()
	defer hh.mu.Unlock()
	return hh.queued
}

// The exec has exited with more output than the bound unread: the ack of
// a later stdin frame comes behind that output, and WriteStdin gets it
// promptly with nobody calling Next, as the contract wants (a typed
// error); CloseStdin then returns at once, and every byte is still yielded.
func TestWriteStdinAckBehindOutput(t *testing.T) {
	const total = StreamBuffer + 8<<20 // more than the bound and the socket buffers
	var written atomic.Int64
	h := startFake(t, false, func(p *wsPeer) {
		done := produce(p, 64<<10, total, nil, &written)
		f, ok := p.next(10 * time.Second)
		<-done
		if !ok || !f.stdin {
			t.Errorf("fake: got %+v, %v; want a stdin frame", f, ok)
			return
		}
		e := api.ErrorFrom(sandbox.Errorf("write_stdin", "the exec has exited"))
		_ = p.ack(f.id, &e)
		_ = p.exit(0)
		p.closeNormally()
	})
	waitStalled(t, h, &written, StreamBuffer)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	err := h.WriteStdin(ctx, []byte("late"))
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WriteStdin after the exit, output unread: %v; want the daemon's SandboxError, promptly", err)
	}
	if err := h.CloseStdin(ctx); err != nil {
		t.Errorf("CloseStdin after the end: %v; want nil", err)
	}
	stdout, _, exit, err := readAll(t, h, 5*time.Second)
	if err != nil || exit == nil || exit.ExitCode != 0 || len(stdout) != total {
		t.Errorf("the stream: %d bytes, %v, %v; want %d bytes and StreamExit 0", len(stdout), exit, err, total)
	}
}

// A stdin ack that never comes (an exec that does not read its stdin while
// its output flows) raises the bound to ackBound, no further: the client's
// memory stays bounded. A Kill then lifts it and ends the stream, with
// every byte received yielded.
func TestStdinAckBoundCapped(t *testing.T) {
	const frame = 64 << 10
	var written atomic.Int64
	stop := make(chan struct{})
	h := startFake(t, false, func(p *wsPeer) {
		done := produce(p, frame, 0, stop, &written)
		for {
			f, ok := p.next(10 * time.Second)
			if ok && f.control.Type != api.FrameKill {
				continue // a stdin frame is never acked
			}
			close(stop)
			<-done
			if !ok {
				t.Error("fake: no kill")
				return
			}
			_ = p.ack(f.control.ID, nil)
			_ = p.exit(137)
			p.closeNormally()
			return
		}
	})
	waitStalled(t, h, &written, StreamBuffer)
	if n := queued(h); n < StreamBuffer || n > StreamBuffer+frame {
		t.Errorf("the queue holds %d bytes with no ack awaited; want the bound, %d", n, StreamBuffer)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if err := h.WriteStdin(ctx, []byte("x")); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("WriteStdin never acked: %v; want a SandboxError matching context.DeadlineExceeded", err)
	}
	// The ack is still awaited (for the next call): the bound stays raised.
	waitStalled(t, h, &written, ackBound)
	if n := queued(h); n < ackBound || n > ackBound+frame {
		t.Errorf("the queue holds %d bytes while a stdin ack is awaited; want the raised bound, %d", n, ackBound)
	}
	kill(t, h, 5*time.Second)
	stdout, _, exit, err := readAll(t, h, 10*time.Second)
	if err != nil || exit == nil || exit.ExitCode != 137 || int64(len(stdout)) != written.Load() {
		t.Errorf("the stream: %d bytes, %v, %v; want the %d written and StreamExit 137", len(stdout), exit, err, written.Load())
	}
}

// Frame ids of stdin, close_stdin and kill start at 1 and increase (the
// daemon refuses 0), a cancelled write's torn close included; and at most
// one stdin frame is ever unacknowledged: the next is sent only after the
// ack of the one before, even after a call was cancelled while its frame
// waited for its ack.
func TestFrameIDs(t *testing.T) {
	type sent struct {
		kind string
		id   uint64
	}
	var mu sync.Mutex
	var frames []sent
	closed := make(chan struct{})
	h := startFake(t, false, func(p *wsPeer) {
		var ackedAt time.Time // when the last stdin ack was sent
		stdinN := 0
		for {
			f, ok := p.next(10 * time.Second)
			if !ok {
				t.Error("fake: no kill")
				return
			}
			kind := f.control.Type
			id := f.control.ID
			if f.stdin {
				kind, id = "stdin", f.id
				stdinN++
				if stdinN > 1 && f.at.Before(ackedAt) {
					t.Errorf("fake: stdin frame %d came before the ack of the one before: two stdin frames unacknowledged", f.id)
				}
			}
			mu.Lock()
			frames = append(frames, sent{kind, id})
			mu.Unlock()
			switch {
			case f.stdin:
				if stdinN == 2 || stdinN == 4 {
					time.Sleep(400 * time.Millisecond) // the call waiting for this ack is cancelled
				}
				ackedAt = time.Now()
				_ = p.ack(id, nil)
			case kind == api.FrameKill:
				_ = p.ack(id, nil)
				_ = p.exit(137)
				p.closeNormally()
				return
			default:
				_ = p.ack(id, nil)
				close(closed)
			}
		}
	})
	ctx := t.Context()
	// 1: a write.
	if err := h.WriteStdin(ctx, []byte("a")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	// 2: a write cancelled while waiting for its ack (not torn: its one
	// frame was sent); 3: the next waits for that ack before it is sent.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := h.WriteStdin(cctx, []byte("b"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WriteStdin cancelled: %v; want context.DeadlineExceeded", err)
	}
	if err := h.WriteStdin(ctx, []byte("c")); err != nil {
		t.Fatalf("WriteStdin after a cancelled one: %v", err)
	}
	// 4: a write of two frames cancelled while its first waits for its
	// ack: torn, so its second is never sent and 5 closes stdin (its ack
	// awaited by nobody).
	cctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	err = h.WriteStdin(cctx, make([]byte, api.MaxStdinFrame+1))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stdin is now closed") {
		t.Fatalf("WriteStdin torn: %v; want context.DeadlineExceeded and stdin closed", err)
	}
	select { // the torn write's close goes out on its own
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("no close_stdin after a torn write")
	}
	// 6: the kill.
	kill(t, h, 5*time.Second)
	if _, _, exit, err := readAll(t, h, 5*time.Second); err != nil || exit == nil {
		t.Fatalf("the end: %v, %v", exit, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []sent{{"stdin", 1}, {"stdin", 2}, {"stdin", 3}, {"stdin", 4}, {api.FrameCloseStdin, 5}, {api.FrameKill, 6}}
	if len(frames) != len(want) {
		t.Fatalf("the daemon got %v; want %v", frames, want)
	}
	for i := range want {
		if frames[i] != want[i] {
			t.Fatalf("the daemon got %v; want %v", frames, want)
		}
	}
}

// A session destroyed elsewhere (another client, a TTL reap) frees a
// handle whose queue is full and that nobody reads: its blocked reader asks
// the daemon whether the session exists, and when it does not, lifts the
// bound and reads on to the end. The checks stop when the wait ends: at
// the end of the stream, or at a Kill.
func TestSessionGoneElsewhere(t *testing.T) {
	var destroyed atomic.Bool
	var gets, deletes atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sessions/s1", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r) {
			return
		}
		gets.Add(1)
		if destroyed.Load() {
			writeError(w, api.ErrorFrom(&sandbox.SessionNotFoundError{SessionID: "s1"}))
			return
		}
		writeJSON(w, http.StatusOK, fakeSession)
	})
	mux.HandleFunc("DELETE /v1/sessions/s1", func(w http.ResponseWriter, _ *http.Request) {
		deletes.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	var writtenA, writtenB atomic.Int64
	stopA := make(chan struct{})
	var n atomic.Int32
	execMux(t, mux, false, func(p *wsPeer) {
		_ = p.text(api.Frame{Type: api.FrameStarted})
		if n.Add(1) == 1 { // A: killed while its reader checks the session
			done := produce(p, 64<<10, 0, stopA, &writtenA)
			id, ok := waitKill(p)
			close(stopA)
			<-done
			if ok {
				_ = p.ack(id, nil)
				_ = p.exit(137)
				p.closeNormally()
			}
			return
		}
		// B: its session is destroyed elsewhere.
		<-produce(p, 64<<10, StreamBuffer+8<<20, nil, &writtenB)
		e := api.ErrorFrom(&sandbox.SessionNotFoundError{SessionID: "s1", Detail: "it was destroyed"})
		_ = p.text(api.Frame{Type: api.FrameError, Error: &e})
		p.closeNormally()
	})
	_, c := newFake(t, mux)
	c.goneAfter, c.goneEvery, c.goneTimeout = 200*time.Millisecond, 100*time.Millisecond, time.Second
	sess := getSession(t, c)
	settled := func(what string) {
		t.Helper()
		time.Sleep(100 * time.Millisecond) // a check in flight ends
		before := gets.Load()
		time.Sleep(500 * time.Millisecond)
		if n := gets.Load(); n != before {
			t.Errorf("%s: %d more session checks; want none", what, n-before)
		}
	}

	a, err := sess.ExecStart(t.Context(), []string{"yes"}, sandbox.StartOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// A failed test must not hang its cleanup on a fake blocked writing.
	t.Cleanup(func() { _ = a.(*handle).conn.CloseNow() })
	waitStalled(t, a, &writtenA, StreamBuffer)
	for i := 0; gets.Load() < 3; i++ { // checks every goneEvery; the session is there
		if i > 100 {
			t.Fatal("a reader blocked at its bound does not check the session")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if queued(a) > StreamBuffer+64<<10 {
		t.Errorf("the bound was lifted while the session exists")
	}
	kill(t, a, 5*time.Second)
	<-a.(*handle).done
	settled("after Kill")
	_, _, _, _ = readAll(t, a, 5*time.Second)

	b, err := sess.ExecStart(t.Context(), []string{"yes"}, sandbox.StartOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.(*handle).conn.CloseNow() })
	waitStalled(t, b, &writtenB, StreamBuffer)
	destroyed.Store(true) // by another client
	select {
	case <-b.(*handle).done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handle of a session destroyed elsewhere still reads 5s later")
	}
	settled("after the end")
	if deletes.Load() != 1 {
		t.Errorf("%d DELETEs; want 1, the reader's, tearing down an expired session now", deletes.Load())
	}
	stdout, _, _, err := readAll(t, b, 5*time.Second)
	if !errors.Is(err, sandbox.ErrSessionNotFound) || int64(len(stdout)) != writtenB.Load() {
		t.Errorf("the end: %d bytes, %v; want the %d written, then the SessionNotFoundError", len(stdout), err, writtenB.Load())
	}
	kill(t, b, time.Second)
}
