package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var allTools = []string{"close_process_stdin", "create_session", "destroy_session", "kill_process", "list_dir",
	"list_processes", "list_sessions", "read_file", "read_process_output", "run", "start_process", "touch",
	"write_file", "write_process_stdin"}

func TestToolsListed(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if len(tl.Description) < 40 {
			t.Errorf("%s: description %q is too thin to act on", tl.Name, tl.Description)
		}
		b, _ := json.Marshal(tl.InputSchema)
		var schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil || schema.Type != "object" {
			t.Errorf("%s: input schema %s is not an object schema", tl.Name, b)
		}
		if tl.OutputSchema == nil {
			t.Errorf("%s: no output schema", tl.Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, allTools) {
		t.Errorf("tools %v, want %v", names, allTools)
	}
}

func TestRun(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	id := createSession(t, cs, nil)

	out := ok[runOut](t, cs, "run", map[string]any{"session_id": id, "argv": []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if out.ExitCode != 3 || out.Stdout != "out\n" || out.Stderr != "err\n" || out.Truncated {
		t.Errorf("argv: %+v", out)
	}
	out = ok[runOut](t, cs, "run", map[string]any{"session_id": id, "command": "mkdir -p d && cd d && cat && pwd", "stdin": "in put"})
	if out.ExitCode != 0 || !strings.HasPrefix(out.Stdout, "in put") || !strings.HasSuffix(out.Stdout, "/d\n") {
		t.Errorf("command with stdin: %+v", out)
	}
	out = ok[runOut](t, cs, "run", map[string]any{"session_id": id, "argv": []string{"pwd"}, "cwd": "d"})
	if !strings.HasSuffix(out.Stdout, "/d\n") {
		t.Errorf("cwd d: %+v", out)
	}
	out = ok[runOut](t, cs, "run", map[string]any{"session_id": id, "argv": []string{"head", "-c", "3"},
		"stdin": base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe, 0x00, 'x'}), "stdin_encoding": "base64"})
	if out.StdoutEncoding != "base64" || out.Stdout != base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe, 0x00}) {
		t.Errorf("binary stdout: %+v", out)
	}
	fails(t, cs, "run", map[string]any{"session_id": id, "argv": []string{"true"}, "command": "true"}, "argv or command, not both")
	fails(t, cs, "run", map[string]any{"session_id": id}, "give argv")
	fails(t, cs, "run", map[string]any{"session_id": id, "argv": []string{"true"}, "timeout_seconds": -1}, "timeout_seconds")
}

func TestRunTimeout(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	id := createSession(t, cs, nil)
	fails(t, cs, "run", map[string]any{"session_id": id, "command": "printf 12345; printf ab >&2; exec sleep 30", "timeout_seconds": 0.5},
		"timed out after 500ms", "5 bytes to stdout and 2 to stderr")
}

// TestRunOutputBound: output past the limit is cut with the full lengths
// and the whole of it in a workspace file that read_file pages.
func TestRunOutputBound(t *testing.T) {
	e := newEnv(t, Options{MaxResultBytes: 1000})
	cs := e.connect()
	id := createSession(t, cs, nil)
	out := ok[runOut](t, cs, "run", map[string]any{"session_id": id, "command": "seq 1 2000; echo small >&2"})
	want := ok[runOut](t, cs, "run", map[string]any{"session_id": id, "command": "seq 1 2000 | wc -c"})
	if !out.Truncated || out.StdoutFile == "" || out.StderrFile != "" || out.Stderr != "small\n" {
		t.Fatalf("result: %+v", out)
	}
	if len(out.Stdout)+len(out.Stderr) > 1000 || !strings.HasPrefix(out.Stdout, "1\n2\n3\n") {
		t.Errorf("stdout shown %d bytes, stderr %d: over the limit of 1000, or not the head", len(out.Stdout), len(out.Stderr))
	}
	if got := strings.TrimSpace(want.Stdout); got != itoa(out.StdoutBytes) {
		t.Errorf("stdout_bytes %d, want %s", out.StdoutBytes, got)
	}
	if !strings.Contains(out.Note, out.StdoutFile) || !strings.Contains(out.Note, itoa(out.StdoutBytes)) {
		t.Errorf("the note %q does not say where the rest is and how long it is", out.Note)
	}
	var whole strings.Builder
	for off := int64(0); ; {
		r := ok[readOut](t, cs, "read_file", map[string]any{"session_id": id, "path": out.StdoutFile, "offset": off})
		whole.WriteString(r.Content)
		if r.Size != int64(out.StdoutBytes) || r.Length > 1000 {
			t.Fatalf("read_file: %+v", r)
		}
		if r.EOF {
			break
		}
		off = r.NextOffset
	}
	if n := strings.Count(whole.String(), "\n"); n != 2000 || !strings.HasSuffix(whole.String(), "\n2000\n") {
		t.Errorf("the saved stdout has %d lines, want the 2000", n)
	}
}

func TestFiles(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	id := createSession(t, cs, nil)

	w := ok[writeOut](t, cs, "write_file", map[string]any{"session_id": id, "path": "dir/a.txt", "content": "héllo\n"})
	if w.Bytes != 7 {
		t.Errorf("write_file: %+v", w)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, 'z'}
	ok[writeOut](t, cs, "write_file", map[string]any{"session_id": id, "path": "dir/b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})

	r := ok[readOut](t, cs, "read_file", map[string]any{"session_id": id, "path": "dir/a.txt"})
	if r.Content != "héllo\n" || r.Encoding != "text" || !r.EOF || r.Size != 7 {
		t.Errorf("read text: %+v", r)
	}
	r = ok[readOut](t, cs, "read_file", map[string]any{"session_id": id, "path": "dir/b.bin"})
	if got, _ := base64.StdEncoding.DecodeString(r.Content); r.Encoding != "base64" || string(got) != string(bin) {
		t.Errorf("read binary: %+v", r)
	}
	r = ok[readOut](t, cs, "read_file", map[string]any{"session_id": id, "path": "dir/a.txt", "offset": 1, "length": 2})
	if r.Content != "é" || r.NextOffset != 3 || r.EOF {
		t.Errorf("read 2 bytes at 1: %+v", r)
	}
	r = ok[readOut](t, cs, "read_file", map[string]any{"session_id": id, "path": "dir/a.txt", "offset": 100})
	if r.Content != "" || !r.EOF || r.Size != 7 {
		t.Errorf("read past the end: %+v", r)
	}
	fails(t, cs, "read_file", map[string]any{"session_id": id, "path": "dir/b.bin", "encoding": "text"}, "not UTF-8", "base64")
	fails(t, cs, "read_file", map[string]any{"session_id": id, "path": "nope.txt"}, "nope.txt")
	fails(t, cs, "read_file", map[string]any{"session_id": id, "path": "dir"}, "dir")
	fails(t, cs, "write_file", map[string]any{"session_id": id, "path": "x", "content": "***", "encoding": "base64"}, "not valid base64")

	ok[runOut](t, cs, "run", map[string]any{"session_id": id, "command": "ln -s a.txt dir/l && mkdir dir/sub && touch 'dir/sp ace' dir/.hid"})
	l := ok[listDirOut](t, cs, "list_dir", map[string]any{"session_id": id, "path": "dir"})
	got := map[string]dirEntry{}
	for _, en := range l.Entries {
		got[en.Name] = en
	}
	want := map[string]dirEntry{"a.txt": {"a.txt", "file", 7}, "b.bin": {"b.bin", "file", 6}, "l": {"l", "symlink", 0},
		"sub": {"sub", "dir", 0}, "sp ace": {"sp ace", "file", 0}, ".hid": {".hid", "file", 0}}
	if len(got) != len(want) {
		t.Errorf("list_dir: %+v, want %+v", l.Entries, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("list_dir %s: %+v, want %+v", k, got[k], w)
		}
	}
	fails(t, cs, "list_dir", map[string]any{"session_id": id, "path": "missing"}, "no directory at missing")
}

func TestSessionErrors(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	fails(t, cs, "run", map[string]any{"session_id": "nope", "argv": []string{"true"}}, "nope")
	fails(t, cs, "touch", map[string]any{"session_id": "nope"}, "nope")
	// The policy caps the network at none: a looser one is refused with the reason.
	fails(t, cs, "create_session", map[string]any{"network": "egress"}, "network", "policy")
	fails(t, cs, "create_session", map[string]any{"labels": map[string]string{LabelConnection: "x"}}, LabelConnection)

	id := createSession(t, cs, map[string]any{"ttl_seconds": 60, "labels": map[string]string{"k": "v"}})
	before, err := e.sb.GetSession(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	info0, _ := before.Info(context.Background())
	tc := ok[touchOut](t, cs, "touch", map[string]any{"session_id": id})
	if tc.ExpiresAt.Before(info0.ExpiresAt) {
		t.Errorf("touch: expires %v, before %v", tc.ExpiresAt, info0.ExpiresAt)
	}
	l := ok[listSessionsOut](t, cs, "list_sessions", nil)
	if len(l.Sessions) != 1 || l.Sessions[0].SessionID != id || !l.Sessions[0].ThisConnection || l.Sessions[0].Labels["k"] != "v" {
		t.Errorf("list_sessions: %+v", l)
	}
	ok[destroyOut](t, cs, "destroy_session", map[string]any{"session_id": id})
	ok[destroyOut](t, cs, "destroy_session", map[string]any{"session_id": id}) // idempotent
	fails(t, cs, "run", map[string]any{"session_id": id, "argv": []string{"true"}}, id)
}

// TestSecretsNeverShown: an env value given to create_session, run or
// start_process appears in no result, error or log line.
func TestSecretsNeverShown(t *testing.T) {
	const secret = "s3cr3t-VALUE-9d1f"
	e := newEnv(t, Options{})
	cs := e.connect()
	var seen []string
	record := func(res *mcp.CallToolResult) {
		b, _ := json.Marshal(res)
		seen = append(seen, string(b))
	}
	res := call(t, cs, "create_session", map[string]any{"env": map[string]string{"TOKEN": secret}})
	record(res)
	var s sessionOut
	b, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(b, &s)
	record(call(t, cs, "run", map[string]any{"session_id": s.SessionID, "argv": []string{"sh", "-c", `test "$TOKEN" = "$X"`}, "env": map[string]string{"X": secret}}))
	record(call(t, cs, "run", map[string]any{"session_id": s.SessionID, "argv": []string{"/nonexistent"}, "env": map[string]string{"X": secret}}))
	record(call(t, cs, "run", map[string]any{"session_id": s.SessionID, "argv": []string{"sleep", "5"}, "env": map[string]string{"X": secret}, "timeout_seconds": 0.2}))
	record(call(t, cs, "run", map[string]any{"session_id": "gone", "argv": []string{"true"}, "env": map[string]string{"X": secret}}))
	record(call(t, cs, "start_process", map[string]any{"session_id": s.SessionID, "argv": []string{"true"}, "env": map[string]string{"X": secret}}))
	record(call(t, cs, "list_processes", nil))
	record(call(t, cs, "list_sessions", nil))
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the connection's session destroyed", func() bool { l, _ := e.sb.ListSessions(context.Background()); return len(l) == 0 })
	seen = append(seen, e.logs.String())
	for _, s := range seen {
		if strings.Contains(s, secret) {
			t.Errorf("the secret is in %s", s)
		}
	}
	// The exec did get it: its test matched.
	if !strings.Contains(seen[1], `"exit_code":0`) {
		t.Errorf("the env did not reach the command: %s", seen[1])
	}
}

// TestArgumentErrors: bad arguments are tool errors naming the argument;
// an unknown tool is a protocol error; neither ends the connection.
func TestArgumentErrors(t *testing.T) {
	e := newEnv(t, Options{})
	cs := e.connect()
	fails(t, cs, "run", map[string]any{"session_id": 5, "argv": []string{"true"}}, "session_id")
	fails(t, cs, "run", map[string]any{"session_id": "x", "argv": "true"}, "argv")
	fails(t, cs, "create_session", map[string]any{"network": "lan"}, "network")
	fails(t, cs, "create_session", map[string]any{"bogus": 1}, "bogus")
	// A key differing from a property only in case is unknown, not the
	// property (encoding/json alone would take it).
	fails(t, cs, "run", map[string]any{"Session_ID": "x", "argv": []string{"true"}}, "Session_ID")
	fails(t, cs, "list_sessions", []int{1}, "arguments")
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "list_sessions"}); err != nil {
		t.Errorf("no arguments to a tool that needs none: %v", err)
	}
	fails(t, cs, "read_process_output", map[string]any{"process_id": "p-x", "wait_seconds": 61}, "p-x")
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "no_such_tool") {
		t.Errorf("an unknown tool: %v", err)
	}
	// A big argument (the in-memory transport's bound is the SDK's 16 MiB).
	big := strings.Repeat("x", 12<<20)
	id := createSession(t, cs, nil)
	if w := ok[writeOut](t, cs, "write_file", map[string]any{"session_id": id, "path": "big", "content": big}); w.Bytes != len(big) {
		t.Errorf("big write: %+v", w)
	}
	ok[runOut](t, cs, "run", map[string]any{"session_id": id, "argv": []string{"true"}})
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
