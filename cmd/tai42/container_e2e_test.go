package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// requireContainer skips a test of the container provider where it cannot
// run, saying why.
func requireContainer(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the container provider needs root (namespaces, mounts, cgroups)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed (apt-get install -y runc)")
	}
}

// TestBinaryContainer runs the real, static binary on the container
// provider as the README does: "tai42 run --provider container --image
// host -- CMD", then "tai42 serve --provider container" with the client
// commands; each leaves no session directory behind.
func TestBinaryContainer(t *testing.T) {
	requireContainer(t)
	bin := buildBinary(t)
	state := t.TempDir()
	path := "PATH=" + os.Getenv("PATH")
	run := func(env []string, stdin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return out.String(), errb.String(), ee.ExitCode()
		case err != nil:
			t.Fatalf("tai42 %v: %v", args, err)
		}
		return out.String(), errb.String(), 0
	}
	sessionsLeft := func() []string {
		entries, _ := os.ReadDir(filepath.Join(state, "container", "sessions"))
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}

	env := []string{path, "TAI42_STATE_DIR=" + state}
	out, errOut, code := run(env, "in\n", "run", "--provider", "container", "--image", "host", "--",
		"sh", "-c", `cat; pwd; hostname; test -e /root/.bashrc && echo has-root-home || echo no-root-home; ls /home 2>/dev/null | wc -l; exit 5`)
	if code != 5 || out != "in\n/workspace\ntai42\nno-root-home\n0\n" {
		t.Errorf("run on the container provider: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// The default provider here (root, runc installed) is the container
	// provider.
	if out, errOut, code := run(env, "", "run", "--", "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '"); code != 0 || !strings.Contains(out, "agent") {
		t.Errorf("run on the default provider: exit %d, stdout %q (want PID 1 the agent), stderr %q", code, out, errOut)
	}
	if left := sessionsLeft(); len(left) != 0 {
		t.Errorf("tai42 run left session directories: %v", left)
	}

	dstate := t.TempDir()
	d := startDaemonProc(t, bin, []string{path}, "--listen", "127.0.0.1:0", "--state-dir", dstate, "--provider", "container")
	if !strings.Contains(d.stderr.String(), "(provider container)") {
		t.Errorf("listening line does not name the container provider:\n%s", d.stderr.String())
	}
	token, err := os.ReadFile(filepath.Join(dstate, "token"))
	if err != nil {
		t.Fatal(err)
	}
	cenv := []string{path, "TAI42_URL=http://" + d.addr, "TAI42_TOKEN=" + strings.TrimSpace(string(token))}
	out, errOut, code = run(cenv, "", "create", "--network", "internal")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("create: exit %d, stderr %q", code, errOut)
	}
	if out, errOut, code := run(cenv, "", "exec", id, "--", "sh", "-c", "echo hi; cat /sys/class/net/eth0/operstate"); code != 0 || out != "hi\nup\n" {
		t.Errorf("exec in a container session: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code := run(cenv, "file content\n", "cp", "-", id+":f.txt"); code != 0 {
		t.Errorf("cp in: exit %d, stderr %q", code, errOut)
	}
	if out, _, _ := run(cenv, "", "exec", id, "--", "cat", "/workspace/f.txt"); out != "file content\n" {
		t.Errorf("the file put is not in /workspace: %q", out)
	}
	if code, _ := d.stop(t); code != 0 {
		t.Errorf("the daemon exited %d on SIGTERM; stderr:\n%s", code, d.stderr.String())
	}
	entries, _ := os.ReadDir(filepath.Join(dstate, "container", "sessions"))
	if len(entries) != 0 {
		t.Errorf("the daemon left session directories after SIGTERM: %d", len(entries))
	}
}
