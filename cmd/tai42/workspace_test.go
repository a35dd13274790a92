package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// "tai42 workspace ls" and "rm" against a daemon over the host runner: the
// table, --json and -q, a refusal naming the live session, per-key failures
// with their causes and exit codes, and the workspace gone from disk.
func TestWorkspaceCommands(t *testing.T) {
	d := startDaemon(t)
	wsDir := filepath.Join(d.stateDir, "host", "workspaces")

	// None yet: a header, [] and nothing.
	r := d.cli(t, nil, "workspace", "ls")
	r.want(t, 0)
	if strings.Join(strings.Fields(r.stdout), " ") != "KEY SIZE MODIFIED IN USE BY" || r.stderr != "" {
		t.Errorf("workspace ls with none: %q %q", r.stdout, r.stderr)
	}
	if r = d.cli(t, nil, "workspace", "ls", "--json"); r.code != 0 || r.stdout != "[]\n" {
		t.Errorf("workspace ls --json with none: %d %q", r.code, r.stdout)
	}

	id := d.create(t, "--persistent", "notes", "--network", "egress")
	d.cli(t, nil, "exec", id, "--", "sh", "-c", "printf 12345 > f; mkdir -p d; printf abc > d/g").want(t, 0)

	// The table: KEY SIZE MODIFIED IN-USE-BY.
	r = d.cli(t, nil, "workspace", "ls")
	r.want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("workspace ls:\n%s", r.stdout)
	}
	row := strings.Fields(lines[1])
	if len(row) != 4 || row[0] != "notes" || row[1] != "8B" || row[3] != id {
		t.Errorf("workspace ls row %q; want notes, 8B, the time, %s", lines[1], id)
	} else if mod, err := time.Parse(time.RFC3339, row[2]); err != nil || time.Since(mod) > time.Minute {
		t.Errorf("MODIFIED %q: %v; want RFC 3339, just now", row[2], err)
	}
	// --json and -q.
	r = d.cli(t, nil, "workspace", "ls", "--json")
	r.want(t, 0)
	var infos []sandbox.WorkspaceInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 {
		t.Fatalf("workspace ls --json: %v\n%s", err, r.stdout)
	}
	if in := infos[0]; in.Key != "notes" || in.SizeBytes != 8 || in.InUseBy != id {
		t.Errorf("workspace ls --json: %+v", in)
	}
	if r = d.cli(t, nil, "workspace", "ls", "-q"); r.stdout != "notes\n" {
		t.Errorf("workspace ls -q: %q", r.stdout)
	}

	// In use: refused with the session named, exit 1; an invalid key exit 2;
	// each failure reported.
	r = d.cli(t, nil, "workspace", "rm", "notes")
	r.want(t, 1)
	if !strings.Contains(r.stderr, "notes") || !strings.Contains(r.stderr, id) || !strings.Contains(r.stderr, "destroy that session first") {
		t.Errorf("workspace rm of a workspace in use: stderr %q; want the key, the session and what to do", r.stderr)
	}
	r = d.cli(t, nil, "workspace", "rm", "../x", "notes")
	r.want(t, 2)
	if !strings.Contains(r.stderr, "../x: ") || !strings.Contains(r.stderr, "workspace_key") || !strings.Contains(r.stderr, "notes: ") {
		t.Errorf("workspace rm ../x notes: stderr %q; want both failures, each with its cause", r.stderr)
	}
	if _, err := os.Stat(filepath.Join(wsDir, "notes", "f")); err != nil {
		t.Fatalf("a refused removal touched the workspace: %v", err)
	}

	// Free: removed, even alongside a key that fails (exit 1).
	d.cli(t, nil, "rm", id).want(t, 0)
	r = d.cli(t, nil, "workspace", "rm", "missing", "notes")
	r.want(t, 1)
	if r.stdout != "" || !strings.Contains(r.stderr, `missing: sandbox: no persistent workspace "missing"`) || strings.Contains(r.stderr, "notes") {
		t.Errorf("workspace rm missing notes: stdout %q stderr %q; want only the missing key reported", r.stdout, r.stderr)
	}
	if _, err := os.Lstat(filepath.Join(wsDir, "notes")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the workspace directory is still there: %v", err)
	}
	if r = d.cli(t, nil, "workspace", "ls", "-q"); r.code != 0 || r.stdout != "" {
		t.Errorf("workspace ls -q after the removal: %d %q", r.code, r.stdout)
	}
	// All removed: exit 0, nothing printed.
	d.create(t, "--persistent", "again", "--network", "egress", "--ttl", "1s")
	time.Sleep(1100 * time.Millisecond) // an expired holder does not keep its workspace
	r = d.cli(t, nil, "workspace", "rm", "again")
	r.want(t, 0)
	if r.stdout != "" || r.stderr != "" {
		t.Errorf("workspace rm again: stdout %q stderr %q; want nothing", r.stdout, r.stderr)
	}
}

func TestWorkspaceUsage(t *testing.T) {
	d := startDaemon(t)
	r := d.cli(t, nil, "workspace")
	r.want(t, 0)
	if !strings.Contains(r.stdout, "ls") || !strings.Contains(r.stdout, "rm") {
		t.Errorf("workspace alone prints its help: %q", r.stdout)
	}
	r = d.cli(t, nil, "workspace", "bogus")
	r.want(t, 2)
	r = d.cli(t, nil, "workspace", "rm")
	r.want(t, 2)
	if !strings.Contains(r.stderr, "name the workspace keys") {
		t.Errorf("workspace rm without keys: %q", r.stderr)
	}
	r = d.cli(t, nil, "workspace", "ls", "extra")
	r.want(t, 2)
	// No daemon: a usage error saying how to name one.
	r = runCLI(t, nil, nil, "workspace", "ls")
	r.want(t, 2)
	if !strings.Contains(r.stderr, urlEnv) {
		t.Errorf("workspace ls without a daemon: %q", r.stderr)
	}
	// A wrong token: said once, the other keys not tried.
	r = runCLI(t, nil, map[string]string{urlEnv: d.url, tokenEnv: "wrong-token-0123456789"}, "workspace", "rm", "a", "b")
	r.want(t, 1)
	if strings.Count(r.stderr, "refused the token") != 1 {
		t.Errorf("workspace rm with a wrong token: %q", r.stderr)
	}
}
