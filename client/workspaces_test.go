package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

// serveWorkspaces serves a fresh host runner (which keeps its persistent
// workspaces in <state>/host/workspaces) on loopback, and returns the
// daemon's URL, the workspaces directory and a counter of the requests the
// daemon got.
func serveWorkspaces(t *testing.T) (string, string, *atomic.Int32) {
	t.Helper()
	dir := t.TempDir()
	policy := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	sb, err := host.New(host.Options{Options: kit.Options{Policy: policy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	srv, err := server.New(sb, server.Options{Token: conformanceToken, Provider: host.Name})
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, filepath.Join(dir, "host", "workspaces"), &requests
}

// The client lists and removes the daemon's persistent workspaces, with
// the contract's errors, over the wire.
func TestWorkspacesRoundTrip(t *testing.T) {
	url, wsDir, requests := serveWorkspaces(t)
	c := client.New(url, conformanceToken)
	t.Cleanup(func() { c.Close() })
	var wm sandbox.WorkspaceManager = c
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	list, err := wm.ListWorkspaces(ctx)
	if err != nil || list == nil || len(list) != 0 {
		t.Fatalf("ListWorkspaces on a fresh daemon = %#v, %v; want an empty list", list, err)
	}
	spec := sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Persistent, WorkspaceKey: "proj", Network: sandbox.NetworkEgress, TTLSeconds: 600}
	sess, err := c.CreateSession(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Destroy(context.Background()) })
	if err := sess.PutFile(ctx, "data.txt", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := sess.PutFile(ctx, "sub/more.bin", make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	list, err = wm.ListWorkspaces(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListWorkspaces = %+v, %v; want proj", list, err)
	}
	if w := list[0]; w.Key != "proj" || w.SizeBytes != 1005 || w.InUseBy != sess.ID() || time.Since(w.ModifiedAt) > time.Minute || w.ModifiedAt.Location() != time.UTC {
		t.Errorf("ListWorkspaces[0] = %+v; want proj, 1005 bytes, in use by %s, modified just now (UTC)", w, sess.ID())
	}

	// In use: refused, naming the session; its files stay.
	err = wm.RemoveWorkspace(ctx, "proj")
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Reason != sandbox.ReasonConflict || rej.Field != "workspace_key" || !strings.Contains(err.Error(), sess.ID()) {
		t.Fatalf("removing a live session's workspace = %v; want a conflict naming %s", err, sess.ID())
	}
	if got, err := sess.GetFile(ctx, "data.txt"); err != nil || string(got) != "hello" {
		t.Errorf("the refused removal touched the workspace: %q, %v", got, err)
	}

	if err := sess.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if list, err = wm.ListWorkspaces(ctx); err != nil || len(list) != 1 || list[0].InUseBy != "" {
		t.Errorf("after the destroy: %+v, %v; want proj, not in use", list, err)
	}
	if err := wm.RemoveWorkspace(ctx, "proj"); err != nil {
		t.Fatalf("RemoveWorkspace: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(wsDir, "proj")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the workspace directory is still there: %v", err)
	}
	if list, err = wm.ListWorkspaces(ctx); err != nil || len(list) != 0 {
		t.Errorf("after the removal: %+v, %v; want none", list, err)
	}
	err = wm.RemoveWorkspace(ctx, "proj")
	var nf *sandbox.WorkspaceNotFoundError
	if !errors.As(err, &nf) || nf.Key != "proj" || !errors.Is(err, sandbox.ErrWorkspaceNotFound) {
		t.Errorf("removing it again = %#v; want *WorkspaceNotFoundError{proj}", err)
	}

	// The next session with the key starts from an empty workspace.
	again, err := c.CreateSession(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Destroy(context.Background()) })
	if _, err := again.GetFile(ctx, "data.txt"); !errors.Is(err, sandbox.ErrFileNotFound) {
		t.Errorf("a file of the removed workspace: %v; want FileNotFoundError", err)
	}

	// A key that is not one is refused without a request.
	before := requests.Load()
	for _, key := range []string{"", "..", "../x", "a/b"} {
		err := wm.RemoveWorkspace(ctx, key)
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != "remove_workspace" || !strings.Contains(err.Error(), "workspace_key") {
			t.Errorf("RemoveWorkspace(%q) = %v; want a remove_workspace SandboxError about the key", key, err)
		}
	}
	if n := requests.Load() - before; n != 0 {
		t.Errorf("invalid keys cost %d requests; want none", n)
	}
}
