package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// muxAgent is an agent whose client dials every connection on one
// multiplexed connection.
func muxAgent(t *testing.T) (*testAgent, *Mux, net.Conn) {
	t.Helper()
	a := startAgent(t)
	var d net.Dialer
	nc, err := d.DialContext(context.Background(), "unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := OpenMux(ctx, nc)
	if err != nil {
		t.Fatalf("OpenMux: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	a.c = &Client{Dial: m.Dial}
	return a, m, nc
}

// TestMux: every operation works over a multiplexed connection, at once
// and with each its own flow control.
func TestMux(t *testing.T) {
	a, _, _ := muxAgent(t)
	ctx := context.Background()
	if err := a.c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	res, out, _ := a.run(t, a.spec("sh", "-c", "cat; echo done; exit 3"))
	if res.ExitCode != 3 || out != "done\n" {
		t.Errorf("exec: %+v %q", res, out)
	}
	spec := a.spec("cat")
	spec.Stdin = []byte("in")
	if res, out, _ := a.run(t, spec); res.ExitCode != 0 || out != "in" {
		t.Errorf("exec with stdin: %+v %q", res, out)
	}

	// Files of several windows, both ways, beside an exec whose output is
	// not read: one stream's back-pressure holds no other.
	stalled, err := a.c.Start(ctx, a.spec("sh", "-c", "head -c 33554432 /dev/zero"), func(int, []byte) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	data := make([]byte, 20<<20)
	rand.Read(data)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			ref := a.ref(fmt.Sprintf("f%d", i))
			if err := a.c.PutFile(ctx, ref, bytes.NewReader(data)); err != nil {
				t.Errorf("put %d: %v", i, err)
				return
			}
			got, err := a.get(t, ref)
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("get %d: %d bytes, %v", i, len(got), err)
			}
		})
	}
	wg.Wait()

	// An interactive exec: its output connection is a second stream.
	spec = a.spec("cat")
	spec.Interactive = true
	col := newCollector()
	p, err := a.c.Start(ctx, spec, col.out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteStdin(ctx, []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, 0, "hello\n", 10*time.Second)
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	p.Close()
	if r := p.Result(); r.ExitCode != 0 {
		t.Errorf("interactive: %+v", r)
	}
}

// TestMuxLost: the multiplexed connection's loss fails the operations on
// it (the exec in flight is killed by the agent, as a closed connection
// kills it) and every later Dial.
func TestMuxLost(t *testing.T) {
	a, m, nc := muxAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	col := newCollector()
	p, err := a.c.Start(ctx, a.spec("sh", "-c", "echo $$; exec sleep 600"), col.out)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	col.waitFor(t, 0, "\n", 10*time.Second)
	pid, err := strconv.Atoi(strings.TrimSpace(col.stdout()))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Fatal("the exec on a lost connection did not end")
	}
	if r := p.Result(); r.Err == nil {
		t.Errorf("an exec on a lost connection: %+v, want a lost-connection error", r)
	}
	select {
	case <-m.Done():
	case <-ctx.Done():
		t.Fatal("the Mux did not notice its connection's loss")
	}
	if _, err := m.Dial(ctx); err == nil {
		t.Error("Dial on a lost Mux succeeded")
	}
	// The agent killed the sleep (and reaped it).
	for syscall.Kill(pid, 0) == nil {
		if ctx.Err() != nil {
			t.Fatalf("the exec of the lost connection (pid %d) still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMuxAgentStops: the agent's shutdown ends the multiplexed connection
// and every stream on it.
func TestMuxAgentStops(t *testing.T) {
	a, m, _ := muxAgent(t)
	if err := a.c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.stop()
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the Mux outlived its agent")
	}
}

// TestMuxUnsupported: an agent that does not know op "mux" (an older
// tai42's) answers with a protocol error, which OpenMux reports as
// ErrMuxUnsupported, so that the client dials per operation instead.
func TestMuxUnsupported(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	go func() {
		defer server.Close()
		fc := newFrameConn(server)
		if _, _, err := fc.read(nil); err != nil {
			return
		}
		_ = fc.writeJSON(frameError, errorFrame{Kind: kindProtocol, Message: `agent protocol: unknown operation "mux"`})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := OpenMux(ctx, client)
	if !errors.Is(err, ErrMuxUnsupported) {
		t.Fatalf("OpenMux on an old agent: %v, want ErrMuxUnsupported", err)
	}
	// An agent that does not answer: OpenMux ends with ctx.
	c2, s2 := net.Pipe()
	defer s2.Close()
	go func() { _, _ = io.Copy(io.Discard, s2) }()
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	if _, err := OpenMux(sctx, c2); err == nil || sctx.Err() == nil {
		t.Fatalf("OpenMux on a silent agent: %v", err)
	}
}
