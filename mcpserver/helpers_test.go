package mcpserver

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/syncbuf"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// Every test leaves no goroutine behind: the server's connections, the
// processes' drains and the kit's are all ended by each test's cleanup.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testPolicy = sandbox.Policy{Egress: sandbox.NetworkNone, Isolation: sandbox.IsolationNone, Durable: true}

// syncBuffer is a log or output sink safe to read while it is written.
type syncBuffer = syncbuf.Buffer

// env is a host sandbox and a Server over it, its log in logs.
type env struct {
	t    testing.TB
	sb   *kit.Sandbox
	srv  *Server
	logs *syncBuffer
}

func newEnv(t testing.TB, opts Options) *env {
	t.Helper()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	logs := &syncBuffer{}
	opts.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := New(sb, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return &env{t: t, sb: sb, srv: srv, logs: logs}
}

// connect opens one connection over an in-memory transport; closed at
// cleanup if the test did not.
func (e *env) connect() *mcp.ClientSession {
	e.t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	if _, err := e.srv.mcp.Connect(ctx, st, nil); err != nil {
		e.t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// connectHTTP serves the Server's Streamable HTTP handler on a loopback
// test server and connects a client to it; closing the client is the
// caller's (a test of the close makes it itself).
func (e *env) connectHTTP() (*mcp.ClientSession, *httptest.Server) {
	e.t.Helper()
	ts := httptest.NewServer(e.srv.HTTPHandler())
	e.t.Cleanup(ts.Close)
	hc := ts.Client()
	e.t.Cleanup(hc.CloseIdleConnections)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: ts.URL, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return cs, ts
}

// call calls a tool and returns its result; a protocol error fails the test.
func call(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured result.
func ok[Out any](t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) Out {
	t.Helper()
	res := call(t, cs, name, args)
	if res.IsError {
		t.Fatalf("%s: tool error: %s", name, text(res))
	}
	var out Out
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: decoding %s: %v", name, b, err)
	}
	return out
}

// fails calls a tool that must fail with a tool error whose text holds
// every one of want, and returns the text.
func fails(t *testing.T, cs *mcp.ClientSession, name string, args any, want ...string) string {
	t.Helper()
	res := call(t, cs, name, args)
	msg := text(res)
	if !res.IsError {
		t.Fatalf("%s: want a tool error, got a result: %s", name, msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: the error %q does not say %q", name, msg, w)
		}
	}
	return msg
}

// text is the text content of a result.
func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func createSession(t *testing.T, cs *mcp.ClientSession, args map[string]any) string {
	t.Helper()
	if args == nil {
		args = map[string]any{}
	}
	return ok[sessionOut](t, cs, "create_session", args).SessionID
}

// eventually polls cond until it holds or 20 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 20s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
