package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func TestInteractiveCat(t *testing.T) {
	a := startAgent(t)
	s := a.spec("cat")
	s.Interactive = true
	col := newCollector()
	p, err := a.c.Start(context.Background(), s, col.out)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	// A round trip: the ack means the bytes are in the pipe; cat echoes.
	for _, msg := range []string{"hello\n", "second line\n"} {
		n, err := p.WriteStdin(ctx, []byte(msg))
		if err != nil || n != len(msg) {
			t.Fatalf("WriteStdin(%q) = %d, %v", msg, n, err)
		}
		col.waitFor(t, 0, msg, 5*time.Second)
	}
	// Several frames in one call, and an empty write.
	big := make([]byte, 3<<20+5)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	if n, err := p.WriteStdin(ctx, big); err != nil || n != len(big) {
		t.Fatalf("WriteStdin(3 MiB) = %d, %v", n, err)
	}
	if n, err := p.WriteStdin(ctx, nil); err != nil || n != 0 {
		t.Fatalf("WriteStdin(nil) = %d, %v", n, err)
	}
	// CloseStdin: cat sees end-of-file and exits.
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatalf("a second CloseStdin: %v", err)
	}
	if _, err := p.WriteStdin(ctx, []byte("late")); !errors.Is(err, ErrStdinClosed) && !errors.Is(err, ErrExited) {
		t.Fatalf("WriteStdin after CloseStdin: %v, want ErrStdinClosed", err)
	}
	waitDone(t, p, 10*time.Second)
	if r := p.Result(); r.ExitCode != 0 || r.Err != nil || r.KilledBeforeExit {
		t.Fatalf("%+v", r)
	}
	want := "hello\nsecond line\n" + string(big)
	if got := col.stdout(); got != want {
		t.Fatalf("stdout: %d bytes, want the %d bytes written, in order", len(got), len(want))
	}
}

// WriteStdin right after CloseStdin (before the exit) is ErrStdinClosed.
func TestWriteAfterCloseStdin(t *testing.T) {
	a := startAgent(t)
	s := a.spec("sh", "-c", "cat >/dev/null; sleep 30")
	s.Interactive = true
	p, err := a.c.Start(context.Background(), s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.CloseStdin(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, err := p.WriteStdin(context.Background(), []byte("x")); n != 0 || !errors.Is(err, ErrStdinClosed) {
		t.Fatalf("WriteStdin after CloseStdin: %d, %v", n, err)
	}
	if err := p.Kill(false); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 5*time.Second)
}

func TestWriteStdinAfterExit(t *testing.T) {
	a := startAgent(t)
	// The command exited.
	s := a.spec("true")
	s.Interactive = true
	p, err := a.c.Start(context.Background(), s, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 5*time.Second)
	if _, err := p.WriteStdin(context.Background(), []byte("x")); !errors.Is(err, ErrExited) {
		t.Errorf("WriteStdin after the exit: %v, want ErrExited", err)
	}
	p.Close()
	// The command closed its stdin but runs on: EPIPE.
	s = a.spec("sh", "-c", "exec 0<&-; echo closed; sleep 30")
	s.Interactive = true
	col := newCollector()
	p, err = a.c.Start(context.Background(), s, col.out)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	col.waitFor(t, 0, "closed", 5*time.Second)
	if n, err := p.WriteStdin(context.Background(), []byte("x")); n != 0 || !errors.Is(err, ErrExited) {
		t.Errorf("WriteStdin to a closed stdin: %d, %v, want ErrExited", n, err)
	}
	if err := p.Kill(false); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 5*time.Second)
}

// A kill acts at once while a stdin write is blocked on a full pipe.
func TestKillWhileStdinBlocked(t *testing.T) {
	a := startAgent(t)
	s := a.spec("sleep", "60")
	s.Interactive = true
	p, err := a.c.Start(context.Background(), s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	type res struct {
		n   int
		err error
	}
	wrote := make(chan res, 1)
	go func() {
		n, err := p.WriteStdin(context.Background(), make([]byte, 10<<20))
		wrote <- res{n, err}
	}()
	select {
	case r := <-wrote:
		t.Fatalf("a 10 MiB write to a command that does not read returned: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	start := time.Now()
	if err := p.Kill(false); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-wrote:
		if !errors.Is(r.err, ErrExited) || r.n >= 10<<20 {
			t.Errorf("the blocked write returned %+v, want ErrExited with a prefix", r)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the blocked write did not return after the kill")
	}
	waitDone(t, p, 3*time.Second)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the kill took %v", d)
	}
	if r := p.Result(); r.ExitCode != 137 || !r.KilledBeforeExit || r.Err != nil {
		t.Errorf("%+v, want 137 killed", r)
	}
}

// A cancelled write that put some bytes in closes stdin; one that put
// none leaves it open.
func TestCancelledWrite(t *testing.T) {
	a := startAgent(t)
	t.Run("prefix", func(t *testing.T) {
		s := a.spec("sleep", "60")
		s.Interactive = true
		p, err := a.c.Start(context.Background(), s, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		n, err := p.WriteStdin(ctx, make([]byte, 10<<20))
		var se *sandbox.SandboxError
		if n <= 0 || n >= 10<<20 || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &se) || !strings.Contains(err.Error(), "stdin is now closed") {
			t.Fatalf("cancelled write: %d, %v; want a prefix and the deadline, stdin closed", n, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the cancel took %v", d)
		}
		if _, err := p.WriteStdin(context.Background(), []byte("x")); !errors.Is(err, ErrStdinClosed) {
			t.Errorf("WriteStdin after a cancelled write: %v, want ErrStdinClosed", err)
		}
		if err := p.Kill(false); err != nil {
			t.Fatal(err)
		}
		waitDone(t, p, 5*time.Second)
	})
	t.Run("none", func(t *testing.T) {
		// The command reads nothing for a while, then everything.
		s := a.spec("sh", "-c", "sleep 1; exec wc -c")
		s.Interactive = true
		col := newCollector()
		p, err := a.c.Start(context.Background(), s, col.out)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		const pipeSize = 65536 // the default pipe buffer
		if n, err := p.WriteStdin(context.Background(), make([]byte, pipeSize)); n != pipeSize || err != nil {
			t.Fatalf("filling the pipe: %d, %v", n, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		n, err := p.WriteStdin(ctx, []byte("x"))
		if n != 0 || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "before any byte") {
			t.Fatalf("a write into a full pipe, cancelled: %d, %v; want 0 bytes and the deadline", n, err)
		}
		// Stdin is still open: this write waits until the command reads.
		if n, err := p.WriteStdin(context.Background(), []byte("yz")); n != 2 || err != nil {
			t.Fatalf("a write after a cancel with nothing written: %d, %v", n, err)
		}
		if err := p.CloseStdin(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitDone(t, p, 10*time.Second)
		if got := strings.TrimSpace(col.stdout()); got != "65538" {
			t.Fatalf("the command read %s bytes, want 65538 (the cancelled byte not among them)", got)
		}
	})
}

// Concurrent WriteStdin calls are serialised: each call's bytes arrive
// whole; a waiting call can give up on its ctx.
func TestWriteStdinSerialised(t *testing.T) {
	a := startAgent(t)
	s := a.spec("cat")
	s.Interactive = true
	col := newCollector()
	p, err := a.c.Start(context.Background(), s, col.out)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	msgs := make([][]byte, 8)
	for i := range msgs {
		msgs[i] = bytes.Repeat([]byte{'a' + byte(i)}, 300<<10) // two frames each
		wg.Go(func() {
			if n, err := p.WriteStdin(context.Background(), msgs[i]); err != nil || n != len(msgs[i]) {
				t.Errorf("writer %d: %d, %v", i, n, err)
			}
		})
	}
	wg.Wait()
	if err := p.CloseStdin(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 10*time.Second)
	out := col.stdout()
	if len(out) != 8*300<<10 {
		t.Fatalf("%d bytes out, want %d", len(out), 8*300<<10)
	}
	for off := 0; off < len(out); off += 300 << 10 {
		chunk := out[off : off+300<<10]
		if strings.Count(chunk, chunk[:1]) != len(chunk) {
			t.Fatalf("the writes interleaved at offset %d", off)
		}
	}

	// A call waiting for the lock gives up on its ctx.
	s = a.spec("sleep", "60")
	s.Interactive = true
	p2, err := a.c.Start(context.Background(), s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	blocked := make(chan error, 1)
	go func() {
		_, err := p2.WriteStdin(context.Background(), make([]byte, 10<<20))
		blocked <- err
	}()
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := p2.WriteStdin(ctx, []byte("x")); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for another write") {
		t.Errorf("a waiting write: %v, want it to give up on its deadline", err)
	}
	if err := p2.Kill(false); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; !errors.Is(err, ErrExited) {
		t.Errorf("the blocked write after the kill: %v", err)
	}
	waitDone(t, p2, 5*time.Second)
}

// WriteStdin and CloseStdin on a non-interactive exec.
func TestStdinNotInteractive(t *testing.T) {
	a := startAgent(t)
	p, err := a.c.Start(context.Background(), a.spec("sleep", "60"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.WriteStdin(context.Background(), []byte("x")); err == nil || !strings.Contains(err.Error(), "not interactive") {
		t.Errorf("WriteStdin: %v", err)
	}
	if err := p.CloseStdin(context.Background()); err != nil {
		t.Errorf("CloseStdin: %v", err)
	}
	if err := p.Kill(false); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 5*time.Second)
}

// A cancelled Start kills what it started.
func TestStartCancelled(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p, err := a.c.Start(ctx, a.spec("true"), nil)
	if p != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a cancelled ctx: %v, %v", p, err)
	}
}
