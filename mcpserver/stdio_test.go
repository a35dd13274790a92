package mcpserver

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"
)

// TestStdioClientNeverReads: a client that writes its requests (a session
// made among them) and never reads an answer, then closes its end: the
// server ends, and the connection's session is destroyed.
func TestStdioClientNeverReads(t *testing.T) {
	e := newEnv(t, Options{})
	inR, inW := io.Pipe()
	outR, outW, err := os.Pipe() // nobody reads outR until the end: a pipe's buffer fills
	if err != nil {
		t.Fatal(err)
	}
	defer outW.Close()
	done := make(chan error, 1)
	go func() { done <- e.srv.ServeIO(context.Background(), inR, outW) }()
	msgs := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_session","arguments":{}}}`,
	}
	for _, m := range msgs {
		if _, err := fmt.Fprintln(inW, m); err != nil {
			t.Fatal(err)
		}
	}
	var id string
	eventually(t, "the session made", func() bool {
		l, _ := e.sb.ListSessions(context.Background())
		if len(l) == 1 {
			id = l[0].ID
		}
		return id != ""
	})
	// Answers larger than the pipe's buffer (64 KiB), unread.
	for i := range 4 {
		if _, err := fmt.Fprintf(inW, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run","arguments":{"session_id":%q,"command":"head -c 60000 /dev/zero | tr '\\0' a"}}}`+"\n", 10+i, id); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // the answers are written, up to the full pipe
	inW.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		outR.Close()
		t.Fatal("ServeIO still runs 30s after its input ended, its answers unread")
	}
	outR.Close()
	if l, _ := e.sb.ListSessions(context.Background()); len(l) != 0 {
		t.Errorf("sessions left: %+v", l)
	}
}
