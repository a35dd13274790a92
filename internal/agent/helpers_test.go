package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// pid1Env makes the test binary run as the agent (see TestPID1Reaper).
const pid1Env = "TAI42_AGENT_TEST_PID1"

func TestMain(m *testing.M) {
	if os.Getenv(pid1Env) == "1" {
		os.Exit(runPID1Agent())
	}
	if sock := os.Getenv(brokenStdioEnv); sock != "" {
		os.Exit(runBrokenStdioAgent(sock))
	}
	goleak.VerifyTestMain(m)
}

const testPath = "/usr/local/bin:/usr/bin:/bin"

// testAgent is an agent served in-process on a unix socket.
type testAgent struct {
	c    *Client
	sock string
	ws   string // a workspace directory for execs and files
	stop func() // ends Serve and checks it returned nil; idempotent
}

// startAgent serves an agent until the test ends; the cleanup checks that
// Serve returns nil.
func startAgent(t *testing.T) *testAgent { return startAgentB(t) }

// startAgentB is startAgent for tests and benchmarks.
func startAgentB(t testing.TB) *testAgent {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() { done <- Serve(ctx, ln, Options{Logger: logger}) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Serve did not return within 15s of its context's end")
			}
		})
	}
	t.Cleanup(stop)
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	return &testAgent{c: dialer(sock), sock: sock, ws: ws, stop: stop}
}

func dialer(sock string) *Client {
	return &Client{Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
}

// spec is an exec of argv in the agent's workspace with a plain PATH.
func (a *testAgent) spec(argv ...string) ExecSpec {
	return ExecSpec{Op: "exec", Argv: argv, Dir: a.ws, DirOrig: ".", Env: []string{"PATH=" + testPath}, Grace: 200 * time.Millisecond}
}

// collector gathers output; notify gets a token after each unit.
type collector struct {
	mu     sync.Mutex
	bufs   [2]bytes.Buffer
	notify chan struct{}
}

func newCollector() *collector { return &collector{notify: make(chan struct{}, 1)} }

func (c *collector) out(stream int, b []byte) bool {
	c.mu.Lock()
	c.bufs[stream].Write(b)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return true
}

func (c *collector) stdout() string { c.mu.Lock(); defer c.mu.Unlock(); return c.bufs[0].String() }
func (c *collector) stderr() string { c.mu.Lock(); defer c.mu.Unlock(); return c.bufs[1].String() }

// waitFor waits until stream holds want (as a substring).
func (c *collector) waitFor(t *testing.T, stream int, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		c.mu.Lock()
		got := c.bufs[stream].String()
		c.mu.Unlock()
		if strings.Contains(got, want) {
			return
		}
		select {
		case <-c.notify:
		case <-deadline:
			t.Fatalf("stream %d has %q after %v, want it to hold %q", stream, got, within, want)
		}
	}
}

// run runs spec to its end and returns the result and output.
func (a *testAgent) run(t *testing.T, spec ExecSpec) (Result, string, string) {
	t.Helper()
	col := newCollector()
	p, err := a.c.Start(context.Background(), spec, col.out)
	if err != nil {
		t.Fatalf("Start %q: %v", spec.Argv, err)
	}
	defer p.Close()
	waitDone(t, p, 30*time.Second)
	return p.Result(), col.stdout(), col.stderr()
}

func waitDone(t *testing.T, p *Proc, within time.Duration) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(within):
		t.Fatalf("the exec was not done within %v", within)
	}
}

// gone reports whether pid no longer runs: no such process, or a zombie
// (an orphan whose reaper is outside this test).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	return procState(b) == "Z"
}

func procState(stat []byte) string {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// waitGone waits until every pid is gone.
func waitGone(t *testing.T, within time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, pid := range pids {
		for !gone(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still runs %v after the kill", pid, within)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// pids parses whitespace-separated pids.
func pids(t *testing.T, s string) []int {
	t.Helper()
	var out []int
	for f := range strings.FieldsSeq(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("not a pid: %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out
}

// killPid ends a process the test started, if still there.
func killPid(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) }

// rawConn dials the agent for hand-made frames.
func (a *testAgent) rawConn(t *testing.T) *frameConn {
	t.Helper()
	nc, err := net.Dial("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	return newFrameConn(nc)
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
