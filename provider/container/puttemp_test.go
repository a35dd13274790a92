package container_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// TestDestroyDuringPersistentPut: a session destroyed while a put_file
// into its persistent workspace is in flight leaves the old content and
// no temporary file (the agent dies with the container before it can
// remove it; the provider does).
func TestDestroyDuringPersistentPut(t *testing.T) {
	p := newProvider(t, "runc")
	sp := spec(containertest.Busybox, sandbox.NetworkNone)
	sp.Durability, sp.WorkspaceKey = sandbox.Persistent, "put-during-destroy"
	sess, err := p.sb.CreateSession(ctxFor(t), sp)
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.PutFile(ctxFor(t), "sub/f.txt", []byte("old")); err != nil {
		t.Fatal(err)
	}
	fs, ok := sess.(sandbox.FileStreamer)
	if !ok {
		t.Fatal("a container session is not a FileStreamer")
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- fs.PutFileFrom(context.Background(), "sub/f.txt", pr) }()
	if _, err := pw.Write([]byte("new content, part one ")); err != nil {
		t.Fatal(err)
	}
	// The workspace while the session holds it: its image, mounted.
	ws := p.workspace(t, sess.ID())
	temps := func() []string {
		entries, _ := os.ReadDir(filepath.Join(ws, "sub"))
		var out []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".tai42-put-") {
				out = append(out, e.Name())
			}
		}
		return out
	}
	for deadline := time.Now().Add(10 * time.Second); len(temps()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the put's temporary file never appeared")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := sess.Destroy(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	pw.CloseWithError(io.ErrClosedPipe)
	if err := <-done; err == nil {
		t.Error("the put interrupted by the destroy reported success")
	}
	// And after its destroy, as the next session would find it.
	withWorkspace(t, p.opts.StateDir, sp.WorkspaceKey, func(dir string) {
		ws = dir
		if left := temps(); len(left) > 0 {
			t.Errorf("temporary files left in the persistent workspace: %q", left)
		}
		if entries, err := os.ReadDir(filepath.Join(ws, "sub")); err != nil || len(entries) == 0 {
			t.Errorf("the workspace after the destroy: %v %v; want sub/f.txt in it", entries, err)
		}
		if b, err := os.ReadFile(filepath.Join(ws, "sub", "f.txt")); err != nil || string(b) != "old" {
			t.Errorf("the file after the interrupted put: %q %v; want the old content", b, err)
		}
	})
}
