// Package mcp_test benchmarks an MCP tool call that runs /bin/true beside
// the daemon's own exec round trip, in the same run: the official Go SDK's
// client calling the tool "run" over Streamable HTTP (the daemon's /mcp)
// and over stdio ("tai42 mcp" on the daemon, through TAI42_URL), and the
// daemon's Go client's exec. bench/mcp.sh runs it and prints the table.
package mcp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/internal/buildtest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/mcpserver"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

const token = "bench-token-mcp"

var policy = sandbox.Policy{Egress: sandbox.NetworkNone, Isolation: sandbox.IsolationNone, Durable: true}

// daemon is a host sandbox behind the daemon's server (its /mcp included)
// on loopback.
type daemon struct {
	url string
	cl  *client.Client
}

func newDaemon(b *testing.B) daemon {
	b.Helper()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: policy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: b.TempDir()}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Close(context.Background()) })
	m := mcpserver.New(sb, mcpserver.Options{})
	b.Cleanup(func() { m.Close(context.Background()) })
	srv, err := server.New(sb, server.Options{Token: token, Policy: policy, Provider: host.Name, MCP: m.HTTPHandler()})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	b.Cleanup(ts.Close)
	cl := client.New(ts.URL, token)
	b.Cleanup(func() { cl.Close() })
	return daemon{url: ts.URL, cl: cl}
}

type bearer struct{ rt http.RoundTripper }

func (t bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+token)
	return t.rt.RoundTrip(r)
}

// connect opens an MCP connection over t and creates a session through
// it; it returns the connection and the session's id.
func connect(b *testing.B, t mcp.Transport) (*mcp.ClientSession, string) {
	b.Helper()
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "0"}, nil).Connect(ctx, t, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close() })
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{"ttl_seconds": 3600}})
	if err != nil || res.IsError {
		b.Fatalf("create_session: %v %+v", err, res)
	}
	id, _ := res.StructuredContent.(map[string]any)["session_id"].(string)
	return cs, id
}

// side is one way of running /bin/true once.
type side struct {
	name string
	run  func(ctx context.Context) error
}

func sides(b *testing.B) []side {
	b.Helper()
	d := newDaemon(b)
	ctx := context.Background()
	sess, err := d.cl.CreateSession(ctx, sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral,
		Network: sandbox.NetworkNone, TTLSeconds: 3600})
	if err != nil {
		b.Fatal(err)
	}
	tr := &http.Transport{}
	b.Cleanup(tr.CloseIdleConnections)
	httpCS, httpID := connect(b, &mcp.StreamableClientTransport{Endpoint: d.url + server.MCPPath,
		HTTPClient: &http.Client{Transport: bearer{tr}}, MaxRetries: -1})

	bin := filepath.Join(b.TempDir(), "tai42")
	if err := buildtest.Tai42(ctx, bin, false); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "mcp")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TAI42_URL=" + d.url, "TAI42_TOKEN=" + token}
	stdioCS, stdioID := connect(b, &mcp.CommandTransport{Command: cmd})

	call := func(cs *mcp.ClientSession, id string) func(context.Context) error {
		args := map[string]any{"session_id": id, "argv": []string{"/bin/true"}}
		return func(ctx context.Context) error {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: args})
			if err == nil && res.IsError {
				b.Fatalf("run: %+v", res.Content)
			}
			return err
		}
	}
	s := []side{
		{"exec-api", func(ctx context.Context) error {
			_, err := sess.Exec(ctx, []string{"/bin/true"}, sandbox.ExecOptions{Timeout: 30 * time.Second})
			return err
		}},
		{"mcp-http", call(httpCS, httpID)},
		{"mcp-stdio", call(stdioCS, stdioID)},
	}
	// bench/mcp.sh rotates which side goes first between rounds.
	if n, _ := os.LookupEnv("BENCH_ROTATE"); n != "" {
		k := int(n[0]-'0') % len(s)
		s = append(s[k:], s[:k]...)
	}
	return s
}

// BenchmarkToolCallTrue: /bin/true run once, round trip, each way.
func BenchmarkToolCallTrue(b *testing.B) {
	for _, s := range sides(b) {
		b.Run(s.name, func(b *testing.B) {
			ctx := context.Background()
			for range 20 { // warm: connections, the session's first exec
				if err := s.run(ctx); err != nil {
					b.Fatal(err)
				}
			}
			d := make([]time.Duration, 0, b.N)
			for b.Loop() {
				t0 := time.Now()
				err := s.run(ctx)
				d = append(d, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
			}
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}
