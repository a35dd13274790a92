package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
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

func fastTiming(s *Server) {
	s.timing.ping, s.timing.pong, s.timing.start = 100*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
}

// TestStreamNoPong: a client that stops answering pings (it reads
// nothing, and nothing waits on it) is gone: its exec is killed.
func TestStreamNoPong(t *testing.T) {
	e := newEnv(t, fastTiming)
	id := e.create(hostSpec()).ID
	arg := uniqueSleep(t, 60)
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"sleep", arg}, 60, nil)
	w.expectStarted()
	waitProcs(t, arg, true, 5*time.Second)
	waitProcs(t, arg, false, 5*time.Second) // no Read: the client's library never answers the pings
	_ = w.c.CloseNow()
	waitIdle(t, e.srv)
	if !strings.Contains(e.logs.String(), "no pong") {
		t.Errorf("no log of the missing pong:\n%s", e.logs.String())
	}
}

// TestStreamSlowReader: a client that is slow to read (the server waits on
// it) is not judged by pongs; it gets all its output once it reads.
func TestStreamSlowReader(t *testing.T) {
	e := newEnv(t, fastTiming)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	const n = 24 << 20
	w.start([]string{"head", "-c", "25165824", "/dev/zero"}, 60, nil)
	w.expectStarted()
	time.Sleep(1500 * time.Millisecond) // many ping periods without reading
	r := w.readToEnd(30 * time.Second)
	checkExit(t, r, 0)
	if r.stdout.Len() != n {
		t.Errorf("stdout %d bytes, want %d", r.stdout.Len(), n)
	}
}

// TestStreamStartTimeout: no start frame in time is a violation.
func TestStreamStartTimeout(t *testing.T) {
	e := newEnv(t, fastTiming)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	r := w.readToEnd(5 * time.Second)
	if r.last.Type != api.FrameError || r.last.Error.Kind != api.KindBadRequest || !strings.Contains(r.last.Error.Message, "no start frame") {
		t.Fatalf("last frame %+v", r.last)
	}
	if r.closeStatus != websocket.StatusPolicyViolation {
		t.Errorf("close %v", r.closeStatus)
	}
}

// TestExecClientGone: a client that goes away during a plain exec gets its
// exec killed through the request's context.
func TestExecClientGone(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	arg := uniqueSleep(t, 60)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		b := `{"argv":["sleep","` + arg + `"],"timeout_seconds":60}`
		r, _ := http.NewRequestWithContext(ctx, "POST", e.ts.URL+"/v1/sessions/"+id+"/exec", strings.NewReader(b))
		r.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := e.hc.Do(r)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitProcs(t, arg, true, 5*time.Second)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("client: %v", err)
	}
	waitProcs(t, arg, false, 5*time.Second)
	e.healthy()
}

// scriptedSandbox serves sessions whose ExecStart returns a scripted
// handle, for what the host runner does not do on demand.
type scriptedSandbox struct {
	sandbox.Sandbox
	start func(sandbox.StartOptions) sandbox.ExecHandle
}

func (s scriptedSandbox) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	ss, err := s.Sandbox.CreateSession(ctx, spec)
	if err != nil {
		return nil, err
	}
	return scriptedSession{ss, s.start}, nil
}

func (s scriptedSandbox) GetSession(ctx context.Context, id string) (sandbox.Session, error) {
	ss, err := s.Sandbox.GetSession(ctx, id)
	if err != nil {
		return nil, err
	}
	return scriptedSession{ss, s.start}, nil
}

type scriptedSession struct {
	sandbox.Session
	start func(sandbox.StartOptions) sandbox.ExecHandle
}

func (s scriptedSession) ExecStart(_ context.Context, _ []string, opts sandbox.StartOptions) (sandbox.ExecHandle, error) {
	return s.start(opts), nil
}

// fakeHandle yields its script: *StreamChunk, *StreamExit, an error, or
// the string "panic".
type fakeHandle struct {
	mu     sync.Mutex
	script []any
	kills  atomic.Int32
}

func (h *fakeHandle) Next(ctx context.Context) (sandbox.StreamItem, error) {
	h.mu.Lock()
	if len(h.script) == 0 {
		h.mu.Unlock()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	it := h.script[0]
	if _, isErr := it.(error); !isErr {
		h.script = h.script[1:] // an error repeats, as the contract says
	}
	h.mu.Unlock()
	switch v := it.(type) {
	case sandbox.StreamItem:
		return v, nil
	case error:
		return nil, v
	}
	panic("scripted panic with secret-in-panic")
}

func (h *fakeHandle) WriteStdin(context.Context, []byte) error { return nil }
func (h *fakeHandle) CloseStdin(context.Context) error         { return nil }
func (h *fakeHandle) Kill(context.Context) error {
	h.kills.Add(1)
	h.mu.Lock()
	h.script = []any{&sandbox.StreamExit{ExitCode: 137}}
	h.mu.Unlock()
	return nil
}

// TestStreamProviderEnds: how a provider's own ends reach the client: its
// timeout (the safety net) as exec_timeout of the requested timeout without
// exit_code, a failure of the exec as its error, a panic as internal; the
// handle is killed each time.
func TestStreamProviderEnds(t *testing.T) {
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	var (
		mu      sync.Mutex
		handles []*fakeHandle
		scripts [][]any
		gotTO   []time.Duration
	)
	e := newEnvOn(t, sb, scriptedSandbox{Sandbox: sb, start: func(o sandbox.StartOptions) sandbox.ExecHandle {
		mu.Lock()
		defer mu.Unlock()
		h := &fakeHandle{script: scripts[len(handles)]}
		handles = append(handles, h)
		gotTO = append(gotTO, o.Timeout)
		return h
	}})
	id := e.create(hostSpec()).ID
	run := func(script ...any) *result {
		t.Helper()
		mu.Lock()
		scripts = append(scripts, script)
		mu.Unlock()
		w := wsClient{t, e.dial(id, nil)}
		w.start([]string{"x"}, 5, nil)
		w.expectStarted()
		return w.readToEnd(10 * time.Second)
	}

	r := run(&sandbox.StreamChunk{Stream: sandbox.Stdout, Data: []byte("a")},
		&sandbox.ExecTimeoutError{Timeout: 40 * time.Second, StdoutLen: 1, Note: "left running"})
	if f := r.last; f.Type != api.FrameError || f.Error.Kind != api.KindExecTimeout || f.Error.TimeoutSeconds != 5 ||
		*f.Error.StdoutLen != 1 || f.Error.Note != "left running" || f.ExitCode != nil {
		t.Errorf("provider timeout: %+v", f)
	}
	if r.stdout.String() != "a" {
		t.Errorf("stdout %q", r.stdout.String())
	}
	if gotTO[0] != 40*time.Second {
		t.Errorf("the provider's timeout is %v, want 2*5s+30s", gotTO[0])
	}

	r = run(sandbox.Errorf("exec_start", "stdin input was lost"))
	if f := r.last; f.Type != api.FrameError || f.Error.Kind != api.KindSandbox || !strings.Contains(f.Error.Message, "stdin input was lost") {
		t.Errorf("provider failure: %+v", f)
	}

	r = run(&sandbox.StreamChunk{Stream: sandbox.Stderr, Data: []byte("e")}, "panic")
	if f := r.last; f.Type != api.FrameError || f.Error.Kind != api.KindInternal {
		t.Errorf("provider panic: %+v", f)
	}
	if r.closeStatus != websocket.StatusInternalError {
		t.Errorf("close after a panic: %v", r.closeStatus)
	}
	waitIdle(t, e.srv)
	e.healthy()
	if strings.Contains(e.logs.String(), "secret-in-panic") {
		t.Errorf("the panic value reached the log")
	}
	if !strings.Contains(e.logs.String(), "panic serving an interactive exec") {
		t.Errorf("the panic was not logged")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, h := range handles {
		if h.kills.Load() == 0 {
			t.Errorf("handle %d was never killed", i)
		}
	}
}

// Compile-time check of the fake.
var _ sandbox.ExecHandle = (*fakeHandle)(nil)

// TestStreamPausedReaderWithUnreadOutput: a client that stops reading
// while output it has not read sits in the buffers between (a consumer
// applying back-pressure) answers no ping, yet is not gone: its exec goes
// on and the client gets everything once it reads again.
func TestStreamPausedReaderWithUnreadOutput(t *testing.T) {
	e := newEnv(t, fastTiming)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"sh", "-c", "head -c 100000 /dev/zero; sleep 1.5; echo done"}, 60, nil)
	w.expectStarted()
	time.Sleep(2500 * time.Millisecond) // many ping periods, reading nothing, the server idle
	r := w.readToEnd(30 * time.Second)
	checkExit(t, r, 0)
	if r.stdout.Len() != 100005 || !strings.HasSuffix(r.stdout.String(), "done\n") {
		t.Errorf("stdout %d bytes ending %q; want 100005 ending \"done\\n\"", r.stdout.Len(), r.stdout.String()[max(0, r.stdout.Len()-10):])
	}
}
