package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

// A unix: URL reaches a daemon on a unix socket, for plain calls, files
// and the exec WebSocket alike.
func TestUnixSocket(t *testing.T) {
	policy := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	sb, err := host.New(host.Options{Options: kit.Options{Policy: policy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	srv, err := server.New(sb, server.Options{Token: conformanceToken, Policy: policy, Provider: host.Name})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "tai42.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ts := &httptest.Server{Listener: ln, Config: &http.Server{Handler: srv}}
	ts.Start()
	t.Cleanup(ts.Close)

	c := client.New("unix:"+sock, conformanceToken)
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.Provider != host.Name || info.Policy != policy {
		t.Fatalf("Info: %+v, %v", info, err)
	}
	if d := c.ExecDefaultTimeout(); d <= 0 {
		t.Errorf("ExecDefaultTimeout = %v; want the daemon's default", d)
	}
	sess, err := c.CreateSession(ctx, sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 60})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	defer func() { _ = sess.Destroy(context.WithoutCancel(ctx)) }()

	fs := sess.(sandbox.FileStreamer)
	if err := fs.PutFileFrom(ctx, "in.txt", strings.NewReader("over the socket\n")); err != nil {
		t.Fatalf("PutFileFrom: %v", err)
	}
	rc, size, err := fs.OpenFile(ctx, "in.txt")
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(data) != "over the socket\n" || size != int64(len(data)) {
		t.Errorf("OpenFile: %q (size %d), %v", data, size, err)
	}

	res, err := sess.Exec(ctx, []string{"cat", "in.txt"}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil || res.Stdout != "over the socket\n" {
		t.Errorf("Exec: %+v, %v", res, err)
	}

	h, err := sess.ExecStart(ctx, []string{"cat"}, sandbox.StartOptions{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("ExecStart: %v", err)
	}
	defer func() { _ = h.Kill(context.WithoutCancel(ctx)) }()
	if err := h.WriteStdin(ctx, []byte("ping\n")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	if err := h.CloseStdin(ctx); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	var out []byte
	for {
		item, err := h.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		switch it := item.(type) {
		case *sandbox.StreamChunk:
			out = append(out, it.Data...)
		case *sandbox.StreamExit:
			if it.ExitCode != 0 {
				t.Errorf("cat exited %d", it.ExitCode)
			}
		}
	}
	if string(out) != "ping\n" {
		t.Errorf("cat echoed %q over the socket; want \"ping\\n\"", out)
	}
}
