package server

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// gatedHandle is an exec handle whose Kill waits for gate (or its ctx):
// the kills a stream has in flight at once pile up where the test sees
// them. Its output is nothing, then the exit 137 once a Kill returned.
type gatedHandle struct {
	gate      chan struct{}
	killed    chan struct{}
	kills     atomic.Int32
	inFlight  atomic.Int32
	peak      atomic.Int32
	cancelled chan struct{} // closed once a Next returned because its ctx ended (the stream aborted)
	once      sync.Once
	killOnce  sync.Once
}

func newGatedHandle() *gatedHandle {
	return &gatedHandle{gate: make(chan struct{}), killed: make(chan struct{}), cancelled: make(chan struct{})}
}

func (h *gatedHandle) Next(ctx context.Context) (sandbox.StreamItem, error) {
	select {
	case <-h.killed:
		return &sandbox.StreamExit{ExitCode: 137}, nil
	case <-ctx.Done():
		h.once.Do(func() { close(h.cancelled) })
		return nil, ctx.Err()
	}
}

func (h *gatedHandle) WriteStdin(context.Context, []byte) error { return nil }
func (h *gatedHandle) CloseStdin(context.Context) error         { return nil }

func (h *gatedHandle) Kill(ctx context.Context) error {
	h.kills.Add(1)
	n := h.inFlight.Add(1)
	for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
	}
	defer h.inFlight.Add(-1)
	select {
	case <-h.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.killOnce.Do(func() { close(h.killed) })
	return nil
}

// gatedEnv serves a host sandbox whose execs are gatedHandles; it returns
// the env and a func giving the handle of the last exec started.
func gatedEnv(t *testing.T) (*env, func() *gatedHandle) {
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	var (
		mu   sync.Mutex
		last *gatedHandle
	)
	e := newEnvOn(t, sb, scriptedSandbox{Sandbox: sb, start: func(sandbox.StartOptions) sandbox.ExecHandle {
		mu.Lock()
		defer mu.Unlock()
		last = newGatedHandle()
		return last
	}})
	return e, func() *gatedHandle {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

func killFrame(id int) []byte { return []byte(fmt.Sprintf(`{"type":"kill","id":%d}`, id)) }

// checkKillAcks checks that the acks are those of kill frames 1..n, in
// order, each without an error.
func checkKillAcks(t *testing.T, r *result, n int) {
	t.Helper()
	if len(r.acks) != n {
		t.Fatalf("%d acks, want %d (the last frame %+v)", len(r.acks), n, r.last)
	}
	for i, a := range r.acks {
		if a.ID != uint64(i+1) || a.Error != nil {
			t.Fatalf("ack %d is %+v, want id %d without an error", i, a, i+1)
		}
	}
}

// TestStreamKillFlood: a hostile client sends 100,000 kill frames while
// the provider's Kill is slow. At most one kill frame's Kill is in flight
// at once: later frames wait for it (a kill is idempotent) and are acked
// once it returned, and more than killQueueFrames kill frames received and
// not yet acked is a protocol violation, so neither goroutines nor queued
// ids grow with the flood. (Review finding: every kill frame started a
// goroutine with no bound.)
func TestStreamKillFlood(t *testing.T) {
	e, handle := gatedEnv(t)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"x"}, 60, nil)
	w.expectStarted()
	h := handle()

	base := runtime.NumGoroutine()
	peak := base
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan int, 1)
	go func() {
		n := 0
		for n < 100_000 && w.c.Write(ctx, websocket.MessageText, killFrame(n+1)) == nil {
			n++
		}
		sent <- n
	}()
	// The old server started a goroutine per frame, each blocked in Kill;
	// the fixed one blocks one Kill and aborts the stream at the limit.
	deadline := time.Now().Add(30 * time.Second)
	for h.inFlight.Load() < 100 && time.Now().Before(deadline) {
		peak = max(peak, runtime.NumGoroutine())
		select {
		case <-h.cancelled:
			deadline = time.Time{}
		case <-time.After(time.Millisecond):
		}
	}
	peak = max(peak, runtime.NumGoroutine())
	close(h.gate)
	r := w.readToEnd(30 * time.Second)
	cancel()
	<-sent

	if p := h.peak.Load(); p > 2 {
		t.Errorf("%d Kill calls in flight at once (one for the kill frames, one for the violation's abort at most)", p)
	}
	if d := peak - base; d > 50 {
		t.Errorf("the flood of kill frames raised the goroutine count by %d (from %d)", d, base)
	}
	checkViolation(t, r, websocket.StatusPolicyViolation, "kill frame "+strconv.Itoa(killQueueFrames+1), strconv.Itoa(killQueueFrames), "wait for")
	checkKillAcks(t, r, killQueueFrames)
	if k := h.kills.Load(); k > 3 {
		t.Errorf("Kill called %d times", k)
	}
}

// TestStreamKillsCoalesce: killQueueFrames kill frames sent at once while
// the first one's Kill is in flight are all acked, after it returned,
// with one Kill for them all; the exec ends with the kill's exit.
func TestStreamKillsCoalesce(t *testing.T) {
	e, handle := gatedEnv(t)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"x"}, 60, nil)
	w.expectStarted()
	h := handle()
	for i := 1; i <= killQueueFrames; i++ {
		w.sendRaw(websocket.MessageText, killFrame(i))
	}
	// The close_stdin's ack says the server has read every kill frame
	// before it: none comes after the exec's end, which would not be acked.
	w.sendJSON(api.Frame{Type: api.FrameCloseStdin, ID: killQueueFrames + 1})
	for {
		f, err := w.next(10 * time.Second)
		if err != nil {
			t.Fatalf("waiting for the close_stdin's ack: %v", err)
		}
		if f.text.Type == api.FrameAck && f.text.ID == killQueueFrames+1 {
			break
		}
		if f.text.Type == api.FrameAck {
			t.Fatalf("ack %+v while the kill was in flight", f.text)
		}
	}
	close(h.gate)
	r := w.readToEnd(30 * time.Second)
	checkExit(t, r, 137)
	checkKillAcks(t, r, killQueueFrames)
	// One for the kill frames, one when the stream ends.
	if k := h.kills.Load(); k != 2 {
		t.Errorf("Kill called %d times, want 2", k)
	}
	if p := h.peak.Load(); p != 1 {
		t.Errorf("%d Kill calls in flight at once, want 1", p)
	}
}
