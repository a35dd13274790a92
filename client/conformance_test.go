package client_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/provider/host/hosttest"
	"github.com/tai42/sandbox/sandboxtest"
	"github.com/tai42/sandbox/server"
)

const conformanceToken = "tai42-conformance-token"

// serveHost serves a fresh host runner through the daemon's HTTP API on
// loopback and returns the daemon's URL. Everything is torn down at
// cleanup: the server, then the sandbox (every session it still holds).
func serveHost(t *testing.T, cfg sandboxtest.Config) string {
	t.Helper()
	sb := hosttest.New(t, cfg)
	srv, err := server.New(sb, server.Options{Token: conformanceToken, Policy: cfg.Policy, Provider: host.Name, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts.URL
}

// TestConformance runs the whole contract suite against the host runner
// served by the daemon's HTTP API, through the client: every clause holds
// over the wire. Options are the host runner's (hosttest.Options).
func TestConformance(t *testing.T) {
	opts := hosttest.Options(t)
	opts.Restartable = restartableOverAPI
	sandboxtest.Run(t, func(t *testing.T, cfg sandboxtest.Config) sandbox.Sandbox {
		c := client.New(serveHost(t, cfg), conformanceToken)
		t.Cleanup(func() { c.Close() })
		return c
	}, opts)
}

// restartableOverAPI is the suite's Options.Restartable through the API:
// a daemon (server + host runner) and a client of it; the restart stops
// that daemon (for a crash, its connections cut and its sandbox abandoned)
// and serves a new host runner on the same state, to a new client.
func restartableOverAPI(t *testing.T, cfg sandboxtest.Config) (sandbox.Sandbox, func(crash bool) sandbox.Sandbox) {
	serve := func(sb sandbox.Sandbox) (*client.Client, *httptest.Server) {
		srv, err := server.New(sb, server.Options{Token: conformanceToken, Policy: cfg.Policy, Provider: host.Name, Logger: cfg.Logger})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv)
		t.Cleanup(ts.Close)
		c := client.New(ts.URL, conformanceToken)
		t.Cleanup(func() { c.Close() })
		return c, ts
	}
	sb, again := hosttest.Restartable(t, cfg)
	c, ts := serve(sb)
	return c, func(crash bool) sandbox.Sandbox {
		c.Close()
		if crash {
			ts.CloseClientConnections()
		}
		ts.Close()
		next, _ := serve(again(crash))
		return next
	}
}

// Over the wire, Kill returns promptly while the handle's output queue is
// full and nobody reads; a handle abandoned after Kill frees its reader and
// connection on its own (goleak checks it at the end of the package), and
// one that is read yields the output received, then the kill's exit.
func TestKillUnreadOutput(t *testing.T) {
	policy := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	c := client.New(serveHost(t, sandboxtest.Config{Policy: policy}), conformanceToken)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sess, err := c.CreateSession(ctx, sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Destroy(context.Background()) })
	for _, read := range []bool{false, true} {
		h, err := sess.ExecStart(ctx, []string{"sh", "-c", "head -c 67108864 /dev/zero; sleep 30"}, sandbox.StartOptions{Timeout: 40 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // every buffer on the way fills up
		kctx, kcancel := context.WithTimeout(ctx, 5*time.Second)
		begin := time.Now()
		err = h.Kill(kctx)
		kcancel()
		if err != nil || time.Since(begin) > 3*time.Second {
			t.Fatalf("Kill with 64 MiB unread: %v after %v; want nil, promptly", err, time.Since(begin))
		}
		if !read {
			continue // abandoned: goleak checks that nothing of it is left
		}
		var n int
		for {
			item, err := h.Next(ctx)
			if err != nil {
				t.Fatalf("Next after Kill: %v (after %d bytes); want the output, then the exit", err, n)
			}
			if chunk, ok := item.(*sandbox.StreamChunk); ok {
				n += len(chunk.Data)
				continue
			}
			if exit := item.(*sandbox.StreamExit); exit.ExitCode != 137 {
				t.Errorf("StreamExit %d; want 137, the kill's", exit.ExitCode)
			}
			break
		}
		if n < client.StreamBuffer {
			t.Errorf("%d bytes yielded after Kill; want at least the %d the client had queued", n, client.StreamBuffer)
		}
	}
}
