package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpProc starts "tai42 mcp ARGS" as a process with env and connects to
// it as an agent does; its stderr is returned at the end by the func.
func mcpProc(t *testing.T, bin string, env []string, args ...string) (*mcp.ClientSession, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"mcp"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	return mcpConnect(t, cmd)
}

// mcpConnect starts cmd, a "tai42 mcp", and connects to it as an agent
// does; its stderr is returned at the end by the func.
func mcpConnect(t *testing.T, cmd *exec.Cmd) (*mcp.ClientSession, *syncBuffer) {
	t.Helper()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting to %s: %v; stderr:\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, stderr
}

// callTool calls a tool; isErr says whether a tool error is wanted. The
// result's text is returned, and its structured content decoded into out
// when out is not nil.
func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, isErr bool, out any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if res.IsError != isErr {
		t.Fatalf("%s: isError %v, want %v: %s", name, res.IsError, isErr, text.String())
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %s: %v", name, b, err)
		}
	}
	return text.String()
}

// TestMCPStdio runs "tai42 mcp" as an agent launches it, on the embedded
// host provider (no sandbox, opted into): the tools work, the agent's close ends the process with
// exit 0 and destroys its sessions; a persistent key one tai42 mcp uses is
// refused to another.
func TestMCPStdio(t *testing.T) {
	bin := buildBinary(t)
	state := t.TempDir()
	cs, stderr := mcpProc(t, bin, nil, "--provider", "host", "--state-dir", state, "--allow-unsandboxed")
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 14 {
		t.Fatalf("tools: %v %+v", err, tools)
	}
	if ins := cs.InitializeResult().Instructions; !strings.Contains(ins, "Isolation: none") {
		t.Errorf("the instructions do not say isolation none: %q", ins)
	}
	var s struct {
		SessionID     string `json:"session_id"`
		WorkspacePath string `json:"workspace_path"`
		Isolation     string `json:"isolation"`
		Network       string `json:"network"`
	}
	callTool(t, cs, "create_session", nil, false, &s)
	if s.Isolation != "none" || s.Network != "none" {
		t.Errorf("create_session: isolation %q, network %q; want none, none", s.Isolation, s.Network)
	}
	var r struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	callTool(t, cs, "run", map[string]any{"session_id": s.SessionID, "command": "echo hi from $0"}, false, &r)
	if r.ExitCode != 0 || r.Stdout != "hi from sh\n" {
		t.Errorf("run: %+v", r)
	}
	var p struct {
		SessionID string `json:"session_id"`
	}
	callTool(t, cs, "create_session", map[string]any{"persistent": "shared-key"}, false, &p)

	// Another tai42 mcp on the same state directory: the key is held.
	cs2, _ := mcpProc(t, bin, nil, "--provider", "host", "--state-dir", state, "--allow-unsandboxed")
	msg := callTool(t, cs2, "create_session", map[string]any{"persistent": "shared-key"}, true, nil)
	if !strings.Contains(msg, "in use by another tai42 process") {
		t.Errorf("the second process's create: %s", msg)
	}
	if err := cs2.Close(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("the second tai42 mcp: %v", err)
	}

	if _, err := os.Stat(s.WorkspacePath); err != nil {
		t.Fatalf("the workspace: %v", err)
	}
	// stdin closed; the process exits on its own. The SDK's Close signals
	// it after waiting 5 s, and says os.ErrProcessDone when it has exited
	// just then: that is an exit on its own too.
	if err := cs.Close(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("tai42 mcp's exit: %v; stderr:\n%s", err, stderr.String())
	}
	if _, err := os.Stat(s.WorkspacePath); !os.IsNotExist(err) {
		t.Errorf("the ephemeral session's workspace is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "host", "workspaces", "shared-key")); err != nil {
		t.Errorf("the persistent workspace is gone: %v; the state directory holds %v", err, listDir(state))
	}
	if !strings.Contains(stderr.String(), "sessions_destroyed=1") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
}

func listDir(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, _ os.DirEntry, _ error) error { out = append(out, p); return nil })
	return out
}

// TestMCPStdioDaemon: "tai42 mcp" with TAI42_URL uses the daemon, whose
// sessions end with the connection; the embedded provider's flags are
// refused then.
func TestMCPStdioDaemon(t *testing.T) {
	d := startDaemon(t)
	bin := buildBinary(t)
	// The test daemon runs the host runner: no sandbox, opted into.
	cs, _ := mcpProc(t, bin, []string{urlEnv + "=" + d.url, tokenEnv + "=" + testToken, allowUnsandboxedEnv + "=1"})
	var s struct {
		SessionID string `json:"session_id"`
	}
	callTool(t, cs, "create_session", map[string]any{"labels": map[string]string{"who": "agent"}}, false, &s)
	if ls := d.cli(t, nil, "ls"); !strings.Contains(ls.stdout, s.SessionID) {
		t.Fatalf("the daemon does not list %s: %+v", s.SessionID, ls)
	}
	if err := cs.Close(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	if ls := d.cli(t, nil, "ls"); strings.Contains(ls.stdout, s.SessionID) {
		t.Errorf("the session outlived tai42 mcp: %+v", ls)
	}

	r := runCLI(t, nil, d.env, "mcp", "--policy-egress", "none")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--policy-egress does not apply to a daemon") {
		t.Errorf("stderr: %s", r.stderr)
	}
	r = runCLI(t, nil, nil, "mcp", "--max-result-bytes", "0")
	r.want(t, exitUsage)
}
