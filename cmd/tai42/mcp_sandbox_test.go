package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/unixuser/unixusertest"
)

// The attack: a desktop user (not root) launches "tai42 mcp" as the docs
// say; the default provider is then the host runner, isolation none, and
// an agent told it has sandbox sessions reads files outside the workspace
// and lists the host's processes. tai42 mcp must refuse that unless asked
// (--allow-unsandboxed or $TAI42_ALLOW_UNSANDBOXED), exit 2 naming the
// flag, and tell an agent it serves which isolation it really has.
func TestMCPRefusesUnsandboxed(t *testing.T) {
	r := runCLI(t, nil, nil, "mcp", "--provider", "host", "--state-dir", t.TempDir())
	r.want(t, exitUsage)
	for _, w := range []string{"--allow-unsandboxed", allowUnsandboxedEnv, "isolation none", `"host"`} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("mcp on the host runner: stderr %q does not say %q", r.stderr, w)
		}
	}
	r = runCLI(t, nil, map[string]string{allowUnsandboxedEnv: "maybe"}, "mcp", "--provider", "host", "--state-dir", t.TempDir())
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, allowUnsandboxedEnv) {
		t.Errorf("$%s=maybe: stderr %q", allowUnsandboxedEnv, r.stderr)
	}
	// On a daemon that runs the host runner, likewise.
	d := startDaemon(t)
	r = d.cli(t, nil, "mcp")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--allow-unsandboxed") || !strings.Contains(r.stderr, d.url) {
		t.Errorf("mcp on a host daemon: stderr %q; want it to name the flag and the daemon", r.stderr)
	}
	// Opted in with an empty stdin: it starts, and ends at once.
	r = d.cli(t, nil, "mcp", "--allow-unsandboxed")
	r.want(t, exitOK)
	if !strings.Contains(r.stderr, "no sandbox") {
		t.Errorf("mcp --allow-unsandboxed: stderr %q; want a warning that the sessions have no sandbox", r.stderr)
	}
}

// As an ordinary user (nobody), "tai42 mcp" with no flag at all (the
// desktop agent's configuration) is refused; with
// $TAI42_ALLOW_UNSANDBOXED it serves, and both the instructions and the
// create_session result say isolation none.
func TestMCPUnsandboxedAsUser(t *testing.T) {
	if _, err := user.LookupId(fmt.Sprint(unixusertest.Nobody)); os.Geteuid() != 0 || err != nil {
		t.Skip("running tai42 as nobody needs root and a nobody in /etc/passwd")
	}
	bin := buildBinary(t)
	cmd := exec.Command(bin, "mcp")
	unixusertest.AsNobody(t, cmd)
	cmd.Stdin = strings.NewReader("")
	out, err := unixusertest.CombinedOutput(context.Background(), cmd)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), "--allow-unsandboxed") {
		t.Fatalf("tai42 mcp as nobody: %v; want exit %d naming --allow-unsandboxed; output:\n%s", err, exitUsage, out)
	}

	cmd = exec.Command(bin, "mcp")
	cmd.Env = []string{allowUnsandboxedEnv + "=true"}
	unixusertest.AsNobody(t, cmd)
	cs, stderr := mcpConnect(t, cmd)
	if ins := cs.InitializeResult().Instructions; !strings.Contains(ins, "Isolation: none") || !strings.Contains(ins, "NOT sandboxed") {
		t.Errorf("the instructions do not say there is no sandbox: %q", ins)
	}
	var s struct {
		SessionID string `json:"session_id"`
		Isolation string `json:"isolation"`
		Network   string `json:"network"`
	}
	// Network none needs a network namespace, which an ordinary user may
	// not make: egress, the host's own network, is what works here.
	callTool(t, cs, "create_session", map[string]any{"network": "egress"}, false, &s)
	if s.Isolation != "none" || s.Network != "egress" {
		t.Errorf("create_session: isolation %q, network %q; want none, egress", s.Isolation, s.Network)
	}
	if !strings.Contains(stderr.String(), "no sandbox") {
		t.Errorf("stderr does not warn that the sessions have no sandbox:\n%s", stderr.String())
	}
}

// mcpPipe is "tai42 mcp" driven over raw pipes: what an agent that closes
// its end at any moment does, without the SDK's own waiting.
type mcpPipe struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *syncBuffer
	done   chan error // its Wait's result
	id     int
}

func startMCPPipe(t *testing.T, bin string, args ...string) *mcpPipe {
	t.Helper()
	p := &mcpPipe{t: t, cmd: exec.Command(bin, append([]string{"mcp"}, args...)...), stderr: &syncBuffer{}}
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	p.cmd.Stderr = p.stderr
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewScanner(stdout)
	p.out.Buffer(nil, 1<<20)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan error, 1)
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	p.send("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "t", "version": "0"}}, true)
	p.recv()
	p.send("notifications/initialized", nil, false)
	return p
}

func (p *mcpPipe) send(method string, params any, call bool) {
	p.t.Helper()
	m := map[string]any{"jsonrpc": "2.0", "method": method}
	if params != nil {
		m["params"] = params
	}
	if call {
		p.id++
		m["id"] = p.id
	}
	b, _ := json.Marshal(m)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatal(err)
	}
}

// recv reads the next message's structured result.
func (p *mcpPipe) recv() map[string]any {
	p.t.Helper()
	if !p.out.Scan() {
		p.t.Fatalf("tai42 mcp's stdout ended: %v; stderr:\n%s", p.out.Err(), p.stderr.String())
	}
	var m struct {
		Result struct {
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal(p.out.Bytes(), &m); err != nil {
		p.t.Fatalf("%s: %v", p.out.Bytes(), err)
	}
	return m.Result.StructuredContent
}

func (p *mcpPipe) tool(name string, args map[string]any) {
	p.send("tools/call", map[string]any{"name": name, "arguments": args}, true)
}

// An agent that closes tai42 mcp's stdin with a session, a background
// process and a command still running: tai42 mcp ends them all and exits
// at once (the SDK's client signals a server that has not exited 5 s
// after the close). A functional deadline, not a benchmark: 2 s.
func TestMCPExitsOnStdinEOF(t *testing.T) {
	bin := buildBinary(t)
	p := startMCPPipe(t, bin, "--provider", "host", "--state-dir", t.TempDir(), "--allow-unsandboxed")
	p.tool("create_session", map[string]any{})
	id, _ := p.recv()["session_id"].(string)
	if id == "" {
		t.Fatalf("no session made; stderr:\n%s", p.stderr.String())
	}
	p.tool("start_process", map[string]any{"session_id": id, "command": "sleep 100"})
	p.recv()
	p.tool("run", map[string]any{"session_id": id, "command": "sleep 100"})
	time.Sleep(200 * time.Millisecond) // the run starts

	start := time.Now()
	if err := p.in.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("tai42 mcp exited %v after its stdin closed; want well under a second", took.Round(time.Millisecond))
		}
		if err != nil {
			t.Errorf("tai42 mcp's exit: %v; stderr:\n%s", err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("tai42 mcp still runs 30 s after its stdin closed; stderr:\n%s", p.stderr.String())
	}
	if s := p.stderr.String(); !strings.Contains(s, "sessions_destroyed=1") || !strings.Contains(s, "processes_killed=1") {
		t.Errorf("the connection's session and process were not ended; stderr:\n%s", s)
	}
}
