package mcpserver

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tai42/sandbox"
)

// BenchmarkRunTrue: the tool "run" of /bin/true over an in-memory
// connection beside the same exec on the sandbox: what the MCP layer (the
// SDK's client and server, the schemas, this package) adds to an exec.
func BenchmarkRunTrue(b *testing.B) {
	e := newEnv(b, Options{})
	ctx := context.Background()
	sess, err := e.sb.CreateSession(ctx, sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: 3600})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("exec", func(b *testing.B) {
		for b.Loop() {
			if _, err := sess.Exec(ctx, []string{"/bin/true"}, sandbox.ExecOptions{Timeout: time.Minute}); err != nil {
				b.Fatal(err)
			}
		}
	})
	cs := e.connect()
	args := map[string]any{"session_id": sess.ID(), "argv": []string{"/bin/true"}}
	b.Run("tool", func(b *testing.B) {
		for b.Loop() {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: args})
			if err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})
}

// BenchmarkListProcesses: a tool call that does next to nothing: the MCP
// layer's own round trip.
func BenchmarkListProcesses(b *testing.B) {
	e := newEnv(b, Options{})
	ctx := context.Background()
	cs := e.connect()
	for b.Loop() {
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_processes"}); err != nil {
			b.Fatal(err)
		}
	}
}
