package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

const testToken = "test-token-0123456789"

// daemon is an in-process "tai42 serve": the host provider behind the
// HTTP server on a loopback httptest server.
type daemon struct {
	url      string
	stateDir string
	env      map[string]string // TAI42_URL and TAI42_TOKEN
}

// startDaemon starts a daemon whose background reaper is off (a test calls
// "tai42 reap" itself).
func startDaemon(t *testing.T) *daemon {
	t.Helper()
	dir := t.TempDir()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: defaultPolicy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(sb, server.Options{Token: testToken, Provider: host.Name, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the sandbox: %v", err)
		}
	})
	return &daemon{url: ts.URL, stateDir: dir, env: map[string]string{urlEnv: ts.URL, tokenEnv: testToken}}
}

// cli runs tai42 in-process against the daemon.
func (d *daemon) cli(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	return runCLI(t, stdin, d.env, args...)
}

// create makes a session and returns its id.
func (d *daemon) create(t *testing.T, args ...string) string {
	t.Helper()
	r := d.cli(t, nil, append([]string{"create"}, args...)...)
	r.want(t, 0)
	id := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(id, "sb-") || strings.Contains(id, "\n") || r.stderr != "" {
		t.Fatalf("create printed %q (stderr %q), want one id", r.stdout, r.stderr)
	}
	return id
}

func TestDaemonSessionLifecycle(t *testing.T) {
	d := startDaemon(t)
	id := d.create(t, "--ttl", "10m", "-l", "job=etl", "-l", "team=ai", "-e", "SPEC_VAR=from-spec")

	// ls: the table for people.
	r := d.cli(t, nil, "ls")
	r.want(t, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "ID IMAGE DURABILITY KEY EXPIRES LABELS" {
		t.Fatalf("ls table:\n%s", r.stdout)
	}
	row := strings.Fields(lines[1])
	if len(row) != 7 || row[0] != id || row[1] != "host" || row[2] != "ephemeral" || row[3] != "-" ||
		row[4] != "in" || !(strings.HasPrefix(row[5], "9m") || row[5] == "10m") || row[6] != "job=etl,team=ai" {
		t.Errorf("ls row %q", lines[1])
	}
	// ls --json: the infos for programs.
	r = d.cli(t, nil, "ls", "--json")
	r.want(t, 0)
	var infos []sandbox.SessionInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 {
		t.Fatalf("ls --json: %v\n%s", err, r.stdout)
	}
	if in := infos[0]; in.ID != id || in.Durability != sandbox.Ephemeral || in.Labels["job"] != "etl" || time.Until(in.ExpiresAt) < 9*time.Minute {
		t.Errorf("ls --json: %+v", in)
	}
	// ls -q: the ids.
	if r = d.cli(t, nil, "ls", "-q"); r.stdout != id+"\n" {
		t.Errorf("ls -q: %q", r.stdout)
	}

	// exec: stdin streamed in, stdout and stderr routed, the exit code passed
	// through, the spec's env and the exec's own.
	r = d.cli(t, strings.NewReader("hello\nworld\n"), "exec", id, "--", "sh", "-c", `cat; echo "$SPEC_VAR $EXEC_VAR" >&2; exit 7`)
	r.want(t, 7)
	if r.stdout != "hello\nworld\n" || r.stderr != "from-spec \n" {
		t.Errorf("exec: stdout %q stderr %q", r.stdout, r.stderr)
	}
	r = d.cli(t, nil, "exec", id, "-e", "EXEC_VAR=mine", "-w", ".", "--", "sh", "-c", `echo "$EXEC_VAR"; pwd`)
	r.want(t, 0)
	if !strings.HasPrefix(r.stdout, "mine\n/") {
		t.Errorf("exec with flags after the id: %q", r.stdout)
	}
	r = d.cli(t, nil, "exec", "-e", "EXEC_VAR=before", id, "sh", "-c", `echo "$EXEC_VAR"`)
	r.want(t, 0)
	if r.stdout != "before\n" {
		t.Errorf("exec without --: %q", r.stdout)
	}
	r = d.cli(t, nil, "exec", id, "--timeout", "1s", "--", "sh", "-c", "printf abc; sleep 30")
	r.want(t, 124)
	if r.stdout != "abc" || !strings.Contains(r.stderr, "timed out") {
		t.Errorf("exec timeout: stdout %q stderr %q", r.stdout, r.stderr)
	}

	// cp in and out: the bytes are identical, through files and "-".
	local := t.TempDir()
	big := make([]byte, 3<<20+17)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(local, "big.bin")
	if err := os.WriteFile(src, big, 0o600); err != nil {
		t.Fatal(err)
	}
	d.cli(t, nil, "cp", src, id+":in/big.bin").want(t, 0)
	back := filepath.Join(local, "back.bin")
	d.cli(t, nil, "cp", id+":in/big.bin", back).want(t, 0)
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, big) {
		t.Errorf("cp round trip: %d bytes, %v; want %d identical bytes", len(got), err, len(big))
	}
	d.cli(t, bytes.NewReader(big), "cp", "-", id+":stdin.bin").want(t, 0)
	r = d.cli(t, nil, "cp", id+":stdin.bin", "-")
	r.want(t, 0)
	if !bytes.Equal([]byte(r.stdout), big) {
		t.Errorf("cp via - round trip: %d bytes, want %d identical bytes", len(r.stdout), len(big))
	}
	// A remote path ending in "/" takes the local base name; a local
	// directory takes the remote base name.
	d.cli(t, nil, "cp", src, id+":dir/").want(t, 0)
	d.cli(t, nil, "cp", id+":dir/big.bin", t.TempDir()).want(t, 0)
	r = d.cli(t, nil, "exec", id, "--", "cmp", "in/big.bin", "dir/big.bin")
	r.want(t, 0)
	r = d.cli(t, nil, "cp", id+":nope.txt", filepath.Join(local, "nope.txt"))
	r.want(t, 1)
	if !strings.Contains(r.stderr, "nope.txt") {
		t.Errorf("cp of a missing file: %q", r.stderr)
	}
	if _, err := os.Stat(filepath.Join(local, "nope.txt")); !os.IsNotExist(err) {
		t.Errorf("a failed cp left a local file: %v", err)
	}

	// touch: the new expiry, as RFC 3339 and as JSON.
	r = d.cli(t, nil, "touch", id)
	r.want(t, 0)
	exp, err := time.Parse(time.RFC3339, strings.TrimSpace(r.stdout))
	if err != nil || time.Until(exp) < 9*time.Minute {
		t.Errorf("touch printed %q (%v)", r.stdout, err)
	}
	r = d.cli(t, nil, "touch", "--json", id)
	r.want(t, 0)
	var info sandbox.SessionInfo
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.ID != id {
		t.Errorf("touch --json: %v\n%s", err, r.stdout)
	}

	// rm: destroyed, the workspace removed; again is not an error.
	ws := info.WorkspacePath
	if _, err := os.Stat(ws); err != nil {
		t.Fatalf("workspace: %v", err)
	}
	r = d.cli(t, nil, "rm", id)
	r.want(t, 0)
	if r.stdout != "" || r.stderr != "" {
		t.Errorf("rm printed %q %q", r.stdout, r.stderr)
	}
	if _, err := os.Stat(ws); !os.IsNotExist(err) {
		t.Errorf("workspace after rm: %v", err)
	}
	d.cli(t, nil, "rm", id, "sb-000000000000000000000000").want(t, 0)
	if r = d.cli(t, nil, "ls"); strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("ls after rm:\n%s", r.stdout)
	}
	if r = d.cli(t, nil, "ls", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("ls --json after rm: %q", r.stdout)
	}

	// A destroyed session is unknown: exit 1 with the daemon's message.
	for _, args := range [][]string{
		{"exec", id, "--", "true"}, {"touch", id}, {"cp", id + ":x", "-"}, {"cp", src, id + ":x"}, {"shell", id},
	} {
		r = d.cli(t, nil, args...)
		if r.code != 1 || !strings.Contains(r.stderr, id) || !strings.Contains(r.stderr, "session") {
			t.Errorf("%v on a destroyed session: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

func TestDaemonCreateJSONAndPersistent(t *testing.T) {
	d := startDaemon(t)
	r := d.cli(t, nil, "create", "--persistent", "notes", "--json")
	r.want(t, 0)
	var info sandbox.SessionInfo
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
		t.Fatalf("create --json: %v\n%s", err, r.stdout)
	}
	if info.Durability != sandbox.Persistent || info.WorkspaceKey != "notes" || !strings.HasPrefix(info.ID, "sb-") {
		t.Errorf("create --json: %+v", info)
	}
	d.cli(t, strings.NewReader("kept\n"), "cp", "-", info.ID+":notes.txt").want(t, 0)
	// One live session per key: the daemon rejects a second (exit 2).
	r = d.cli(t, nil, "create", "--persistent", "notes")
	if r.code != 2 || !strings.Contains(r.stderr, "spec rejected") {
		t.Errorf("second session on a key: exit %d, stderr %q", r.code, r.stderr)
	}
	d.cli(t, nil, "rm", info.ID).want(t, 0)
	if b, err := os.ReadFile(filepath.Join(d.stateDir, "host", "workspaces", "notes", "notes.txt")); err != nil || string(b) != "kept\n" {
		t.Errorf("persistent workspace after rm: %q, %v", b, err)
	}
	// A rejected spec, and an invalid one, exit 2.
	for _, args := range [][]string{{"create", "--network", "internal"}, {"create", "--ttl", "10ms"}, {"create", "extra"}} {
		if r := d.cli(t, nil, args...); r.code != 2 || r.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q", args, r.code, r.stdout)
		}
	}
}

func TestDaemonReap(t *testing.T) {
	d := startDaemon(t)
	r := d.cli(t, nil, "reap", "--json")
	r.want(t, 0)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("reap --json with nothing expired: %q", r.stdout)
	}
	short := d.create(t, "--ttl", "1s")
	long := d.create(t)
	time.Sleep(1500 * time.Millisecond)
	r = d.cli(t, nil, "reap")
	r.want(t, 0)
	if r.stdout != short+"\n" {
		t.Errorf("reap printed %q, want %q", r.stdout, short+"\n")
	}
	if r = d.cli(t, nil, "ls", "-q"); r.stdout != long+"\n" {
		t.Errorf("ls -q after reap: %q", r.stdout)
	}
}

func TestRunViaDaemon(t *testing.T) {
	d := startDaemon(t)
	f := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(f, []byte("put via daemon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := d.cli(t, strings.NewReader("piped\n"), "run", "--put", f, "-l", "via=run", "--",
		"sh", "-c", "cat in.txt; cat; echo err >&2; exit 5")
	r.want(t, 5)
	if r.stdout != "put via daemon\npiped\n" || r.stderr != "err\n" {
		t.Errorf("run via daemon: stdout %q stderr %q", r.stdout, r.stderr)
	}
	// The session is destroyed after the run.
	if r = d.cli(t, nil, "ls", "-q"); r.stdout != "" {
		t.Errorf("sessions left after run: %q", r.stdout)
	}
	// The embedded provider's flags do not apply to a daemon.
	for _, flag := range []string{"--policy-egress=none", "--policy-isolation=none", "--policy-durable=false", "--provider=host", "--state-dir=/tmp"} {
		r = d.cli(t, nil, "run", flag, "--", "true")
		if r.code != 2 || !strings.Contains(r.stderr, "daemon") || !strings.Contains(r.stderr, strings.SplitN(flag, "=", 2)[0]) {
			t.Errorf("run %s with a daemon: exit %d, stderr %q", flag, r.code, r.stderr)
		}
	}
	// --url names the daemon too, with TAI42_URL unset.
	r = runCLI(t, nil, map[string]string{tokenEnv: testToken}, "run", "--url", d.url, "--", "echo", "flag")
	r.want(t, 0)
	if r.stdout != "flag\n" {
		t.Errorf("run --url: %q", r.stdout)
	}
	// An empty TAI42_URL is unset: the embedded provider runs it.
	r = runCLI(t, nil, map[string]string{urlEnv: "", stateDirEnv: t.TempDir()}, "run", "--policy-durable=false", "--", "echo", "embedded")
	r.want(t, 0)
	if r.stdout != "embedded\n" {
		t.Errorf("run with TAI42_URL empty: %q", r.stdout)
	}
}

func TestDaemonAuthAndAddress(t *testing.T) {
	d := startDaemon(t)
	// A wrong token: exit 1 naming TAI42_TOKEN, never showing the token.
	r := runCLI(t, nil, map[string]string{urlEnv: d.url, tokenEnv: "wrong-token-xyz"}, "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "TAI42_TOKEN") || strings.Contains(r.stderr, "wrong-token-xyz") {
		t.Errorf("wrong token: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, map[string]string{urlEnv: d.url}, "ls", "--token", "wrong-token-xyz")
	if r.code != 1 || !strings.Contains(r.stderr, "TAI42_TOKEN") || !strings.Contains(r.stderr, "--token") {
		t.Errorf("wrong --token: exit %d, stderr %q", r.code, r.stderr)
	}
	// No URL: a usage error saying how to name a daemon.
	for _, args := range [][]string{{"ls"}, {"create"}, {"exec", "sb-x", "--", "true"}, {"cp", "-", "sb-x:f"}, {"touch", "sb-x"}, {"rm", "sb-x"}, {"reap"}, {"shell", "sb-x"}} {
		r = runCLI(t, nil, map[string]string{tokenEnv: testToken}, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "TAI42_URL") || !strings.Contains(r.stderr, "tai42 serve") {
			t.Errorf("%v without a URL: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	// No token at all (and no local token file): a usage error.
	r = runCLI(t, nil, map[string]string{urlEnv: d.url}, "ls")
	if r.code != 2 || !strings.Contains(r.stderr, "TAI42_TOKEN") {
		t.Errorf("no token: exit %d, stderr %q", r.code, r.stderr)
	}
	// A daemon on this machine: the token file of the state directory.
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, tokenFileName), []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, map[string]string{urlEnv: d.url, stateDirEnv: state}, "ls", "-q")
	r.want(t, 0)
	// A daemon that cannot be reached: exit 1 naming where the address came from.
	r = runCLI(t, nil, map[string]string{urlEnv: "127.0.0.1:1", tokenEnv: testToken}, "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "cannot reach") || !strings.Contains(r.stderr, "TAI42_URL") {
		t.Errorf("unreachable daemon: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, map[string]string{urlEnv: "ftp://x", tokenEnv: testToken}, "ls")
	if r.code != 2 || !strings.Contains(r.stderr, "scheme") {
		t.Errorf("bad URL: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestDaemonShellWithoutTerminal(t *testing.T) {
	d := startDaemon(t)
	id := d.create(t)
	r := d.cli(t, strings.NewReader("echo hi; echo oops >&2; exit 3\n"), "shell", id)
	r.want(t, 3)
	if r.stdout != "hi\n" || r.stderr != "oops\n" {
		t.Errorf("shell: stdout %q stderr %q", r.stdout, r.stderr)
	}
	r = d.cli(t, strings.NewReader("pwd\n"), "shell", "-w", "sub", id)
	if r.code != 1 || !strings.Contains(r.stderr, "sub") {
		t.Errorf("shell in a missing workdir: exit %d, stderr %q", r.code, r.stderr)
	}
	r = d.cli(t, strings.NewReader("sleep 30\n"), "shell", "--timeout", "1s", id)
	r.want(t, 124)
}

func TestExecAndCpUsage(t *testing.T) {
	d := startDaemon(t)
	id := d.create(t)
	for name, args := range map[string][]string{
		"no id":                  {"exec"},
		"no command":             {"exec", id},
		"no command after --":    {"exec", id, "--"},
		"flags after id, no --":  {"exec", id, "--timeout", "5s", "true"},
		"stray arg before --":    {"exec", id, "--timeout", "5s", "x", "--", "true"},
		"zero timeout":           {"exec", id, "--timeout", "0s", "--", "true"},
		"bad env":                {"exec", "-e", "=v", id, "true"},
		"cp both local":          {"cp", "a", "b"},
		"cp both remote":         {"cp", id + ":a", id + ":b"},
		"cp one arg":             {"cp", "a"},
		"cp no remote path":      {"cp", id + ":", "-"},
		"cp stdin, no name":      {"cp", "-", id + ":dir/"},
		"cp missing local":       {"cp", "/nonexistent/x", id + ":x"},
		"cp local dir":           {"cp", t.TempDir(), id + ":x"},
		"touch two":              {"touch", id, id},
		"rm none":                {"rm"},
		"shell no id":            {"shell"},
		"shell negative timeout": {"shell", "--timeout", "-1s", id},
	} {
		r := d.cli(t, nil, args...)
		if r.code != 2 || r.stderr == "" || r.stdout != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want 2 with a message", name, r.code, r.stdout, r.stderr)
		}
	}
	// A command starting with "-" after "--" is the command's.
	r := d.cli(t, nil, "exec", id, "--", "sh", "-c", "echo -n x; exit 4")
	r.want(t, 4)
	// "--" inside the command, without flags after the id, stays the command's.
	r = d.cli(t, nil, "exec", id, "sh", "-c", `echo "$@"`, "sh", "a", "--", "b")
	r.want(t, 0)
	if r.stdout != "a -- b\n" {
		t.Errorf("exec with -- inside the command: %q", r.stdout)
	}
	r = d.cli(t, nil, "exec", id, "--help", "--", "true")
	r.want(t, 0)
	if !strings.Contains(r.stdout, "Usage:") {
		t.Errorf("exec ID --help --: %q", r.stdout)
	}
}

func TestDaemonTLS(t *testing.T) {
	dir := t.TempDir()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: defaultPolicy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	srv, err := server.New(sb, server.Options{Token: testToken, Provider: host.Name})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(srv)
	ts.EnableHTTP2 = false
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake of the untrusted client
	ts.StartTLS()
	defer ts.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pemCert(ts.Certificate().Raw), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{urlEnv: ts.URL, tokenEnv: testToken}
	// Untrusted without the CA.
	if r := runCLI(t, nil, env, "ls"); r.code != 1 || !strings.Contains(r.stderr, "certificate") {
		t.Errorf("https without --tls-ca: exit %d, stderr %q", r.code, r.stderr)
	}
	r := runCLI(t, nil, env, "run", "--tls-ca", ca, "--", "echo", "over tls")
	r.want(t, 0)
	if r.stdout != "over tls\n" {
		t.Errorf("run over TLS: %q", r.stdout)
	}
	env[tlsCAEnv] = ca
	runCLI(t, nil, env, "ls").want(t, 0)
}

func TestDaemonCommandsHelp(t *testing.T) {
	root := runCLI(t, nil, nil, "--help")
	root.want(t, 0)
	for _, name := range []string{"serve", "create", "ls", "exec", "shell", "cp", "touch", "rm", "reap"} {
		if !strings.Contains(root.stdout, "\n  "+name+" ") {
			t.Errorf("tai42 --help does not list %s", name)
		}
		r := runCLI(t, nil, nil, name, "--help")
		r.want(t, 0)
		for _, s := range []string{"Usage:", "Examples:", "tai42 " + name} {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("tai42 %s --help lacks %q", name, s)
			}
		}
	}
	r := runCLI(t, nil, nil, "serve", "--help")
	for _, s := range []string{"--listen", "TAI42_LISTEN", "[limits] shutdown_grace", "--policy-scrub-transcript", "--config", "--tls-cert", "token"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("tai42 serve --help lacks %q", s)
		}
	}
}
