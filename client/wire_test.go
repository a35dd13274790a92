package client_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/sandboxtest"
)

// wireSession serves a fresh host runner through the daemon and returns a
// session of it, with a context bounding the test; all is torn down at
// cleanup.
func wireSession(t *testing.T) (*client.Client, string, sandbox.Session, context.Context) {
	t.Helper()
	policy := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	url := serveHost(t, sandboxtest.Config{Policy: policy})
	c := client.New(url, conformanceToken)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	sess, err := c.CreateSession(ctx, sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Destroy(context.Background()) })
	return c, url, sess, ctx
}

// The exec has exited and its output, more than the handle's bound, is
// unread: WriteStdin then fails promptly with a *SandboxError, as the
// contract says, and CloseStdin returns promptly. Their acks come behind
// the unread output, which the reader reads on to while they wait.
func TestWriteStdinAfterExitWithUnreadOutput(t *testing.T) {
	_, _, sess, ctx := wireSession(t)
	h, err := sess.ExecStart(ctx, []string{"sh", "-c", "head -c 9437184 /dev/zero; touch exited"}, sandbox.StartOptions{Timeout: 50 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Kill(context.Background()) }()
	for {
		res, err := sess.Exec(ctx, []string{"test", "-e", "exited"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // sh exits right after touch
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	begin := time.Now()
	err = h.WriteStdin(wctx, []byte("late\n"))
	took := time.Since(begin)
	if err == nil || !errors.Is(err, sandbox.ErrSandbox) || errors.Is(err, context.DeadlineExceeded) || took > 3*time.Second {
		t.Fatalf("WriteStdin after the exec exited (output unread): %v after %v; want a *SandboxError promptly, not the ctx's end", err, took)
	}
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	begin = time.Now()
	err = h.CloseStdin(cctx)
	if errors.Is(err, context.DeadlineExceeded) || time.Since(begin) > 3*time.Second {
		t.Errorf("CloseStdin after the exec exited (output unread): %v after %v; want nil or a *SandboxError promptly", err, time.Since(begin))
	}
	// Every byte is still yielded, then the exec's own exit.
	n := 0
	for {
		item, err := h.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %d bytes: %v; want the output, then the exit", n, err)
		}
		if c, ok := item.(*sandbox.StreamChunk); ok {
			n += len(c.Data)
			continue
		}
		if ex := item.(*sandbox.StreamExit); ex.ExitCode != 0 || n != 9437184 {
			t.Errorf("exit %d after %d bytes; want 0 after 9437184", ex.ExitCode, n)
		}
		break
	}
}

// A session destroyed elsewhere (by another client here; a TTL reap alike)
// frees the handle's reader goroutine and connection while its queue is
// full and nobody reads: the blocked reader finds the session gone and
// reads on to the stream's end.
func TestDestroyElsewhereFreesHandle(t *testing.T) {
	_, url, sess, ctx := wireSession(t)
	other := client.New(url, conformanceToken)
	defer other.Close()
	h, err := sess.ExecStart(ctx, []string{"sh", "-c", "head -c 67108864 /dev/zero; sleep 100"}, sandbox.StartOptions{Timeout: 40 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Kill(context.Background()) }()
	time.Sleep(time.Second) // every buffer on the way fills up
	if err := other.DestroySession(ctx, sess.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-client.HandleDone(h):
	case <-time.After(8 * time.Second):
		t.Fatal("8s after its session was destroyed by another client the handle still holds its reader goroutine and connection")
	}
	// What was received is yielded, then the stream's end.
	for {
		_, err := h.Next(ctx)
		if err == io.EOF || (err != nil && errors.Is(err, sandbox.ErrSandbox)) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
	}
}

// blockingReader yields n bytes, then blocks until released.
type blockingReader struct {
	n       int
	release chan struct{}
}

func (r *blockingReader) Read(p []byte) (int, error) {
	if r.n > 0 {
		k := min(r.n, len(p))
		r.n -= k
		clear(p[:k])
		return k, nil
	}
	<-r.release
	return 0, io.ErrUnexpectedEOF
}

// ctx bounds PutFileFrom even while its source blocks (a pipe, a network
// stream): it returns ctx's error once ctx ends, and the old content stays.
func TestPutFileFromCancelled(t *testing.T) {
	_, _, sess, ctx := wireSession(t)
	if err := sess.PutFile(ctx, "f", []byte("old")); err != nil {
		t.Fatal(err)
	}
	r := &blockingReader{n: 1 << 20, release: make(chan struct{})}
	defer close(r.release) // the one Read that may outlive the call
	uctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sess.(sandbox.FileStreamer).PutFileFrom(uctx, "f", r) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sandbox.ErrSandbox) {
			t.Errorf("PutFileFrom past its deadline: %v; want a SandboxError matching context.DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		r.release <- struct{}{}
		err := <-done
		t.Fatalf("PutFileFrom still running 4s after its ctx ended (returned %v only once the reader was released)", err)
	}
	b, err := sess.GetFile(ctx, "f")
	if string(b) != "old" {
		t.Errorf("after a cancelled upload: %q, %v; want the old content", b, err)
	}
}
