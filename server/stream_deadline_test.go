package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// TestStreamExitedBeforeDeadlineReadAfter: an exec that exits well before
// its deadline, whose output the client reads only after the deadline,
// ends with its exit, never a timeout (it was not killed). The server's
// deadline fires while its pump is still blocked on the unread output; the
// host's handle (a sandbox.ExitWatcher) tells it the exec had exited.
// (Review finding: over the wire this was reported as exec_timeout.) Also
// with pings every 100ms, which the paused client leaves unanswered.
//
// The output fits in the host's stream buffer, so the command exits
// whatever the connection holds; the connection's socket buffers are
// pinned small, so the pump is surely blocked at the deadline. (The test
// was flaky when it relied on the connection to hold the output beyond
// that buffer: TCP's send buffer grows by itself, up to tcp_wmem's
// maximum, as fast as the congestion window does, and under load it did
// not reach the ~5 MiB the 9 MiB needed by the deadline, so the command
// was still writing and was rightly killed.)
func TestStreamExitedBeforeDeadlineReadAfter(t *testing.T) {
	const (
		sockBuf = 64 << 10
		n       = 3 << 20 // within the host's stream buffer, far over what the connection holds
	)
	if n >= kit.DefaultStreamBuffer {
		t.Fatalf("the output (%d bytes) does not fit in the host's stream buffer (%d)", n, kit.DefaultStreamBuffer)
	}
	smallSend := func(ts *httptest.Server) {
		ts.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			if err := c.(*net.TCPConn).SetWriteBuffer(sockBuf); err != nil {
				t.Errorf("the server connection's send buffer: %v", err)
			}
			return ctx
		}
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			err = c.(*net.TCPConn).SetReadBuffer(sockBuf)
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	for _, c := range []struct {
		name string
		mod  []any
	}{{"default timing", nil}, {"fast pings", []any{fastTiming}}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, append(c.mod, smallSend)...)
			id := e.create(hostSpec()).ID
			w := wsClient{t, e.dial(id, &http.Client{Transport: tr})}
			w.start([]string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/zero"}, 2, nil)
			w.expectStarted()
			time.Sleep(4 * time.Second) // the exec exits at once; we read after its deadline
			r := w.readToEnd(30 * time.Second)
			checkExit(t, r, 0)
			if r.stdout.Len() != n {
				t.Errorf("stdout %d bytes, want %d", r.stdout.Len(), n)
			}
		})
	}
}

// watchedHandle is a fakeHandle that implements sandbox.ExitWatcher.
type watchedHandle struct {
	*fakeHandle
	exited chan struct{}
}

func (h watchedHandle) Exited() <-chan struct{} { return h.exited }

var _ sandbox.ExitWatcher = watchedHandle{}

// TestStreamDeadlineExitWatcher: at the deadline, with output the client
// has not read still in front of the exec's end, a handle whose Exited is
// closed ends with its exit and all its output; one whose Exited is open,
// and one that does not implement sandbox.ExitWatcher (the server cannot
// tell), are killed and end with the timeout. (The default timing: no
// ping comes while the client is paused.)
func TestStreamDeadlineExitWatcher(t *testing.T) {
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	const chunks = 24 // far more than the buffers between hold: the pump blocks
	script := func() []any {
		data := make([]byte, 1<<20)
		var s []any
		for range chunks {
			s = append(s, &sandbox.StreamChunk{Stream: sandbox.Stdout, Data: data})
		}
		return append(s, &sandbox.StreamExit{ExitCode: 3})
	}
	closed := make(chan struct{})
	close(closed)
	var (
		mu   sync.Mutex
		next func() sandbox.ExecHandle
	)
	e := newEnvOn(t, sb, scriptedSandbox{Sandbox: sb, start: func(sandbox.StartOptions) sandbox.ExecHandle {
		mu.Lock()
		defer mu.Unlock()
		return next()
	}})
	id := e.create(hostSpec()).ID
	for _, c := range []struct {
		name    string
		handle  func() sandbox.ExecHandle
		timeout bool
	}{
		{"exited", func() sandbox.ExecHandle { return watchedHandle{&fakeHandle{script: script()}, closed} }, false},
		{"running", func() sandbox.ExecHandle { return watchedHandle{&fakeHandle{script: script()}, make(chan struct{})} }, true},
		{"no watcher", func() sandbox.ExecHandle { return &fakeHandle{script: script()} }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			mu.Lock()
			next = c.handle
			mu.Unlock()
			w := wsClient{t, e.dial(id, nil)}
			w.start([]string{"x"}, 0.3, nil)
			w.expectStarted()
			time.Sleep(1500 * time.Millisecond) // past the deadline, reading nothing
			r := w.readToEnd(30 * time.Second)
			if !c.timeout {
				checkExit(t, r, 3)
				if r.stdout.Len() != chunks<<20 {
					t.Errorf("stdout %d bytes, want %d", r.stdout.Len(), chunks<<20)
				}
				return
			}
			f := r.last
			if f.Type != api.FrameError || f.Error == nil || f.Error.Kind != api.KindExecTimeout || f.ExitCode == nil || *f.ExitCode != 137 {
				t.Fatalf("last frame %+v, want exec_timeout with the kill's exit 137", f)
			}
			if r.stdout.Len() >= chunks<<20 {
				t.Errorf("all %d bytes came: the pump was not behind at the deadline", r.stdout.Len())
			}
		})
	}
}

// TestStreamPausedAcrossDeadline: a client that pauses (applies
// back-pressure) across its exec's deadline, so that the ping waits behind
// output it has not read, then reads on, gets the output and the timeout.
// (Review finding: once the exec was being killed a paused client was
// judged by pongs and dropped as gone.)
func TestStreamPausedAcrossDeadline(t *testing.T) {
	e := newEnv(t, fastTiming)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	arg := uniqueSleep(t, 100)
	w.start([]string{"sh", "-c", "head -c 33554432 /dev/zero; sleep " + arg}, 1, nil)
	w.expectStarted()
	time.Sleep(3 * time.Second) // paused: the deadline passes at 1s, pings go unanswered
	r := w.readToEnd(30 * time.Second)
	f := r.last
	if f.Type != api.FrameError || f.Error == nil || f.Error.Kind != api.KindExecTimeout {
		t.Fatalf("after %d bytes the stream ended with %+v (close %v); want the exec_timeout frame", r.stdout.Len(), f, r.closeErr)
	}
	if f.ExitCode == nil || *f.ExitCode != 137 || f.Error.StdoutLen == nil || *f.Error.StdoutLen != int64(r.stdout.Len()) {
		t.Errorf("timeout %+v (exit_code %v, stdout_len %v) after %d bytes", f.Error, f.ExitCode, f.Error.StdoutLen, r.stdout.Len())
	}
	if r.closeStatus != websocket.StatusNormalClosure {
		t.Errorf("close %v (%v)", r.closeStatus, r.closeErr)
	}
	waitProcs(t, arg, false, 5*time.Second)
}

// TestStreamPausedBound: a paused client is waited for at most
// timing.paused once its exec is being killed: a client that never reads
// again loses its connection then, and the stream's goroutines end.
func TestStreamPausedBound(t *testing.T) {
	e := newEnv(t, fastTiming, func(s *Server) { s.timing.paused = time.Second })
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	arg := uniqueSleep(t, 100)
	begin := time.Now()
	w.start([]string{"sh", "-c", "head -c 33554432 /dev/zero; sleep " + arg}, 0.3, nil)
	w.expectStarted()
	time.Sleep(1100 * time.Millisecond) // the deadline at 0.3s, the bound not yet passed
	if e.srv.inflight.count() == 0 {
		t.Fatalf("the stream ended %v after the start, before the bound", time.Since(begin))
	}
	waitFor(t, 20*time.Second, "the stream of a client that never reads to end", func() bool { return e.srv.inflight.count() == 0 })
	if d := time.Since(begin); d < 1300*time.Millisecond {
		t.Errorf("the stream ended after %v, before the deadline + the bound", d)
	}
	waitProcs(t, arg, false, 5*time.Second)
	if !strings.Contains(e.logs.String(), `"exec_end":"client_gone"`) {
		t.Errorf("the stream's log line does not say the client is gone:\n%s", e.logs.String())
	}
}
