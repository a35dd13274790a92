package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/mcpserver"
	"github.com/tai42/sandbox/provider/host"
)

// bearer adds the token to every request of an MCP client.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// TestMCP: /mcp serves the MCP server behind the token: refused without
// it or with a wrong one, served with it; a request is logged under the
// route "mcp".
func TestMCP(t *testing.T) {
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	m := mcpserver.New(sb, mcpserver.Options{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = m.Close(ctx)
	})
	e := newEnvOn(t, sb, sb, func(o *Options) { o.MCP = m.HTTPHandler() })

	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
	for _, tok := range []string{"", "wrong-token"} {
		resp := e.req(http.MethodPost, MCPPath, strings.NewReader(init), tok, "Content-Type", "application/json", "Accept", "application/json, text/event-stream")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("token %q: %d %v, want 401 with WWW-Authenticate: Bearer", tok, resp.StatusCode, resp.Header)
		}
	}
	if l, _ := sb.ListSessions(context.Background()); len(l) != 0 {
		t.Fatalf("a refused request made sessions: %+v", l)
	}

	hc := &http.Client{Transport: bearer{testToken, e.tr}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: e.ts.URL + MCPPath, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("create_session: %v %+v", err, res)
	}
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for l, _ := sb.ListSessions(context.Background()); len(l) != 0; l, _ = sb.ListSessions(context.Background()) {
		if time.Now().After(deadline) {
			t.Fatalf("the connection's session outlived it: %+v", l)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitIdle(t, e.srv)
	if logs := e.logs.String(); !strings.Contains(logs, `"route":"mcp"`) {
		t.Errorf("no log line of route mcp: %s", logs)
	}
}
