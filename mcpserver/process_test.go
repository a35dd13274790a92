package mcpserver

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// readUntil reads a process's output from cursor until its stdout holds
// want, and returns the stdout read and the next cursor.
func readUntil(t *testing.T, cs *mcp.ClientSession, pid string, cursor int64, want string) (string, int64, readProcOut) {
	t.Helper()
	var got strings.Builder
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := ok[readProcOut](t, cs, "read_process_output", map[string]any{"process_id": pid, "cursor": cursor, "wait_seconds": 5})
		got.WriteString(r.Stdout)
		cursor = r.NextCursor
		if strings.Contains(got.String(), want) || !r.Running && !r.More {
			return got.String(), cursor, r
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output after 30s: %q", want, got.String())
		}
	}
}

func TestProcess(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	id := createSession(t, cs, nil)
	st := ok[startOut](t, cs, "start_process", map[string]any{"session_id": id, "command": "echo ready; while read l; do echo \"got $l\"; echo \"e $l\" >&2; done; exit 7"})
	out, cur, _ := readUntil(t, cs, st.ProcessID, 0, "ready\n")
	if out != "ready\n" || cur != 6 {
		t.Fatalf("first read: %q, cursor %d", out, cur)
	}
	// No new output: a read without wait returns at once with nothing.
	r := ok[readProcOut](t, cs, "read_process_output", map[string]any{"process_id": st.ProcessID, "cursor": cur})
	if r.Stdout != "" || r.NextCursor != cur || !r.Running {
		t.Errorf("an idle read: %+v", r)
	}
	ok[bytesOut](t, cs, "write_process_stdin", map[string]any{"process_id": st.ProcessID, "data": "one\n"})
	out, cur, _ = readUntil(t, cs, st.ProcessID, cur, "got one\n")
	if out != "got one\n" {
		t.Errorf("after stdin: %q", out)
	}
	l := ok[listProcsOut](t, cs, "list_processes", nil)
	if len(l.Processes) != 1 || l.Processes[0].ProcessID != st.ProcessID || !l.Processes[0].Running || l.Processes[0].SessionID != id {
		t.Errorf("list_processes: %+v", l)
	}
	ok[okOut](t, cs, "close_process_stdin", map[string]any{"process_id": st.ProcessID})
	_, cur, r = readUntil(t, cs, st.ProcessID, cur, "never")
	if r.Running || r.ExitCode == nil || *r.ExitCode != 7 {
		t.Errorf("after the exit: %+v", r)
	}
	// Reading again from 0 gives everything, stderr too.
	r = ok[readProcOut](t, cs, "read_process_output", map[string]any{"process_id": st.ProcessID})
	if r.Stdout != "ready\ngot one\n" || r.Stderr != "e one\n" || r.NextCursor != cur {
		t.Errorf("reread: %+v", r)
	}
	fails(t, cs, "read_process_output", map[string]any{"process_id": st.ProcessID, "cursor": cur + 1}, "outside the output")
	fails(t, cs, "write_process_stdin", map[string]any{"process_id": st.ProcessID, "data": "late"})
	k := ok[killOut](t, cs, "kill_process", map[string]any{"process_id": st.ProcessID})
	if k.ExitCode == nil || *k.ExitCode != 7 {
		t.Errorf("kill after the exit: %+v", k)
	}
	fails(t, cs, "read_process_output", map[string]any{"process_id": st.ProcessID}, "no process", "has none")
}

// TestProcessServer: a background HTTP server in the session, its output
// read while it runs, then killed.
func TestProcessServer(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	id := createSession(t, cs, nil)
	st := ok[startOut](t, cs, "start_process", map[string]any{"session_id": id, "argv": []string{"python3", "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"}})
	out, cur, r := readUntil(t, cs, st.ProcessID, 0, "Serving HTTP")
	if !strings.Contains(out, "Serving HTTP") {
		t.Skipf("python3 http.server did not start here: %q %+v", out, r)
	}
	port := out[strings.LastIndex(out, ":")+1:]
	port = port[:strings.IndexFunc(port, func(r rune) bool { return r < '0' || r > '9' })]
	ok[writeOut](t, cs, "write_file", map[string]any{"session_id": id, "path": "hello.txt", "content": "hi there"})
	got := ok[runOut](t, cs, "run", map[string]any{"session_id": id, "argv": []string{"python3", "-c",
		"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:" + port + "/hello.txt').read().decode())"}})
	if got.Stdout != "hi there" {
		t.Errorf("fetching from the server: %+v", got)
	}
	eventually(t, "the server logs the request", func() bool {
		r := ok[readProcOut](t, cs, "read_process_output", map[string]any{"process_id": st.ProcessID, "cursor": cur, "wait_seconds": 1})
		return strings.Contains(r.Stderr+r.Stdout, "GET /hello.txt")
	})
	k := ok[killOut](t, cs, "kill_process", map[string]any{"process_id": st.ProcessID})
	if k.ExitCode == nil || *k.ExitCode != 137 && *k.ExitCode != 143 {
		t.Errorf("kill: %+v", k)
	}
}

// TestProcessUnreadOutputBounded: a process that writes forever while
// nobody reads keeps at most MaxProcessBytes; the read says what was
// dropped.
func TestProcessUnreadOutputBounded(t *testing.T) {
	e := newEnv(t, Options{MaxProcessBytes: 64 << 10})
	cs := e.connect()
	id := createSession(t, cs, nil)
	st := ok[startOut](t, cs, "start_process", map[string]any{"session_id": id, "command": "yes 0123456789"})
	c, _ := e.srv.connOf(firstSession(e.srv))
	p, err := c.process(st.ProcessID)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "1 MiB written", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.end > 1<<20 })
	p.mu.Lock()
	kept := p.kept
	p.mu.Unlock()
	if kept > 64<<10 {
		t.Errorf("kept %d bytes unread, over the bound of %d", kept, 64<<10)
	}
	r := ok[readProcOut](t, cs, "read_process_output", map[string]any{"process_id": st.ProcessID, "max_bytes": 100})
	if r.DroppedBytes < 1<<20-64<<10 || len(r.Stdout) > 100 || !r.More || !r.Running {
		t.Errorf("a read from 0: dropped %d, %d bytes, %+v", r.DroppedBytes, len(r.Stdout), r)
	}
	ok[killOut](t, cs, "kill_process", map[string]any{"process_id": st.ProcessID})
}

func firstSession(s *Server) *mcp.ServerSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ss := range s.conns {
		return ss
	}
	return nil
}

// TestDisconnectDestroys: a connection's end kills its processes and
// destroys its ephemeral sessions; a persistent one and another
// connection's stay.
func TestDisconnectDestroys(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	a, b := e.connect(), e.connect()
	eph := createSession(t, a, nil)
	pers := createSession(t, a, map[string]any{"persistent": "keep-me"})
	other := createSession(t, b, nil)
	ok[startOut](t, a, "start_process", map[string]any{"session_id": other, "argv": []string{"sleep", "313"}})
	info, err := e.sb.GetSession(ctx, eph)
	if err != nil {
		t.Fatal(err)
	}
	in, _ := info.Info(ctx)
	if in.Labels[LabelConnection] == "" {
		t.Fatalf("no connection label: %+v", in.Labels)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ephemeral session destroyed", func() bool {
		_, err := e.sb.GetSession(ctx, eph)
		return err != nil
	})
	for _, id := range []string{pers, other} {
		if _, err := e.sb.GetSession(ctx, id); err != nil {
			t.Errorf("session %s: %v", id, err)
		}
	}
	// The process a's connection started in b's session was killed.
	out := ok[runOut](t, b, "run", map[string]any{"session_id": other, "command": "ps -eo args | grep -c '^sleep 313' || true"})
	if strings.TrimSpace(out.Stdout) != "0" {
		t.Errorf("sleep 313 still runs: %q", out.Stdout)
	}
	if !strings.Contains(e.logs.String(), "connection ended") {
		t.Errorf("no log line of the end: %s", e.logs.String())
	}
	_ = e.sb.DestroySession(ctx, pers)
}

// TestHTTP: the Streamable HTTP transport, a client's close (DELETE)
// ending its connection, and a malformed request refused.
func TestHTTP(t *testing.T) {
	e := newEnv(t, Options{})
	cs, ts := e.connectHTTP()
	hc := ts.Client()
	id := createSession(t, cs, nil)
	out := ok[runOut](t, cs, "run", map[string]any{"session_id": id, "argv": []string{"echo", "over http"}})
	if out.Stdout != "over http\n" {
		t.Errorf("run: %+v", out)
	}
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the session destroyed at the client's close", func() bool {
		_, err := e.sb.GetSession(context.Background(), id)
		return err != nil
	})

	// Malformed JSON-RPC is a 400 naming the fault; a call before the
	// initialisation is a JSON-RPC error.
	for body, want := range map[string]string{
		`{not json`: "malformed payload",
		`[]`:        "empty batch",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run"}}`: "invalid during session initialization",
	} {
		code, got := post(t, hc, ts.URL, body)
		if !strings.Contains(got, want) || code >= 500 {
			t.Errorf("POST %s: %d %q, want %q", body, code, got, want)
		}
	}
	if l, _ := e.sb.ListSessions(context.Background()); len(l) != 0 {
		t.Errorf("sessions left: %+v", l)
	}
}

func post(t *testing.T, hc *http.Client, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHTTPHugeMessage: a message over MaxMessageBytes is refused with 413
// before it is read whole.
func TestHTTPHugeMessage(t *testing.T) {
	e := newEnv(t, Options{MaxMessageBytes: 1 << 20})
	cs, _ := e.connectHTTP()
	t.Cleanup(func() { _ = cs.Close() })
	id := createSession(t, cs, nil)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "write_file",
		Arguments: map[string]any{"session_id": id, "path": "big", "content": strings.Repeat("x", 2<<20)}})
	if err == nil || !strings.Contains(err.Error(), "Request Entity Too Large") {
		t.Errorf("a 2 MiB message over a 1 MiB bound: %v", err)
	}
	// The Go SDK's client closes its connection on that answer: the
	// connection's session goes with it.
	_ = cs.Close()
	eventually(t, "the session destroyed", func() bool {
		_, err := e.sb.GetSession(context.Background(), id)
		return err != nil
	})
}
