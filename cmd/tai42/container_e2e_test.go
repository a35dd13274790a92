package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
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

// getPolicy is GET /v1/policy of the daemon at addr, with testToken.
func getPolicy(t *testing.T, addr string) api.PolicyInfo {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/policy", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p api.PolicyInfo
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("GET /v1/policy: %v", err)
	}
	return p
}

// runBinary runs bin with args, env and stdin, and returns its stdout,
// stderr and exit code; t fails when it cannot be run at all.
func runBinary(t *testing.T, bin string, env []string, stdin string, args ...string) (string, string, int) {
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

// TestBinaryContainer runs the real binary, static, on the container
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
		return runBinary(t, bin, env, stdin, args...)
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

// TestBinaryContainerCgo builds tai42 the ordinary way with cgo on (as
// `go build` does where a C compiler is installed: dynamically linked) and
// runs it on the container provider as a user would: "tai42 run" in the
// host image and in an imported busybox image, which has no libc; then
// "tai42 serve" on crun with create, exec, cp both ways and rm. The
// commands see no LD_* variable, and nothing is left.
func TestBinaryContainerCgo(t *testing.T) {
	requireContainer(t)
	bin := buildBinaryCgo(t, true)
	if f, err := elf.Open(bin); err != nil {
		t.Fatal(err)
	} else {
		dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		f.Close()
		if !dynamic {
			t.Skip("cgo is unavailable: the CGO_ENABLED=1 build is static (no C compiler? apt-get install -y gcc)")
		}
	}
	state := t.TempDir()
	path := "PATH=" + os.Getenv("PATH")
	run := func(env []string, stdin string, args ...string) (string, string, int) {
		t.Helper()
		return runBinary(t, bin, env, stdin, args...)
	}
	// checkEnv checks the output of `echo ok; env`.
	checkEnv := func(what, out string) {
		t.Helper()
		first, env, _ := strings.Cut(out, "\n")
		if first != "ok" {
			t.Errorf("%s: stdout %q, want ok and the environment", what, out)
		}
		for kv := range strings.SplitSeq(env, "\n") {
			if strings.HasPrefix(kv, "LD_") {
				t.Errorf("%s: the command's environment holds %q", what, kv)
			}
		}
	}
	sessionsLeft := func(state string) {
		t.Helper()
		entries, _ := os.ReadDir(filepath.Join(state, "container", "sessions"))
		for _, e := range entries {
			t.Errorf("session directory left in %s: %s", state, e.Name())
		}
	}
	importBusybox := func(state string) {
		t.Helper()
		layout := imagestoretest.BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "busybox:test")
		if _, errOut, code := run([]string{path, "TAI42_STATE_DIR=" + state}, "", "image", "import", layout, "--name", "busybox:test"); code != 0 {
			t.Fatalf("tai42 image import: exit %d, stderr %q", code, errOut)
		}
	}

	importBusybox(state)
	env := []string{path, "TAI42_STATE_DIR=" + state}
	for _, image := range []string{"host", "busybox:test"} {
		out, errOut, code := run(env, "", "run", "--provider", "container", "--image", image, "--", "sh", "-c", "echo ok; env")
		if code != 0 {
			t.Errorf("tai42 run --image %s: exit %d, stdout %q, stderr %q", image, code, out, errOut)
			continue
		}
		checkEnv("tai42 run --image "+image, out)
	}
	sessionsLeft(state)

	rt := "crun"
	if _, err := exec.LookPath(rt); err != nil {
		rt = "runc"
	}
	dstate := t.TempDir()
	importBusybox(dstate)
	d := startDaemonProc(t, bin, []string{path}, "--listen", "127.0.0.1:0", "--state-dir", dstate, "--provider", "container", "--runtime", rt, "--log-format", "text")
	token, err := os.ReadFile(filepath.Join(dstate, "token"))
	if err != nil {
		t.Fatal(err)
	}
	cenv := []string{path, "TAI42_URL=http://" + d.addr, "TAI42_TOKEN=" + strings.TrimSpace(string(token))}
	out, errOut, code := run(cenv, "", "create", "--image", "busybox:test")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("create on %s: exit %d, stderr %q", rt, code, errOut)
	}
	out, errOut, code = run(cenv, "", "exec", id, "--", "sh", "-c", "echo ok; env")
	if code != 0 {
		t.Errorf("exec: exit %d, stderr %q", code, errOut)
	}
	checkEnv("tai42 exec on "+rt, out)
	if _, errOut, code := run(cenv, "through the cgo agent\n", "cp", "-", id+":d/f.txt"); code != 0 {
		t.Errorf("cp in: exit %d, stderr %q", code, errOut)
	}
	if out, errOut, code := run(cenv, "", "cp", id+":d/f.txt", "-"); code != 0 || out != "through the cgo agent\n" {
		t.Errorf("cp out: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code := run(cenv, "", "rm", id); code != 0 {
		t.Errorf("rm: exit %d, stderr %q", code, errOut)
	}
	sessionsLeft(dstate)
	if code, _ := d.stop(t); code != 0 {
		t.Errorf("the daemon exited %d on SIGTERM; stderr:\n%s", code, d.stderr.String())
	}
	if s := d.stderr.String(); strings.Contains(s, "level=WARN") || strings.Contains(s, "level=ERROR") {
		t.Errorf("the daemon warned:\n%s", s)
	}
}

// TestBinaryContainerReload: "tai42 serve --provider container" reports its
// egress fences in GET /v1/policy, and a SIGHUP after the config file's
// [egress] changed applies the new ones (the provider's test of
// SetEgressFences checks what sessions then reach); a file that no longer
// resolves changes nothing.
func TestBinaryContainerReload(t *testing.T) {
	requireContainer(t)
	bin := buildBinary(t)
	conf := filepath.Join(t.TempDir(), "tai42.toml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("[egress]\ndeny = [\"203.0.113.0/24\"]\n")
	state := t.TempDir()
	d := startDaemonProc(t, bin, []string{"PATH=" + os.Getenv("PATH"), "TAI42_TOKEN=" + testToken},
		"--listen", "127.0.0.1:0", "--state-dir", state, "--provider", "container", "--net-prefix", "t42rl", "--config", conf)
	policy := func() api.PolicyInfo {
		t.Helper()
		p := getPolicy(t, d.addr)
		if p.EgressFences == nil || !p.EgressFences.Enforced {
			t.Fatalf("GET /v1/policy on the container provider: fences %+v, want enforced", p.EgressFences)
		}
		return p
	}
	if got := policy().EgressFences.Deny; !slices.Equal(got, []string{"203.0.113.0/24"}) {
		t.Errorf("deny at start: %v", got)
	}
	waitDeny := func(want []string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got := policy().EgressFences.Deny; !slices.Equal(got, want); got = policy().EgressFences.Deny {
			if time.Now().After(deadline) {
				t.Fatalf("deny after SIGHUP: %v, want %v; stderr:\n%s", got, want, d.stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	write("[egress]\ndeny = [\"198.51.100.0/24\"]\nallow_domains = [\"*.example.org\"]\n")
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitDeny([]string{"198.51.100.0/24"})
	if got := policy().EgressFences.AllowDomains; !slices.Equal(got, []string{"*.example.org"}) {
		t.Errorf("allow_domains after SIGHUP: %v", got)
	}
	write("[egress]\ndeny = [\"198.51.100.7/24\"]\n")
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.stderr.String(), "198.51.100.7/24") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal naming the bad CIDR after SIGHUP:\n%s", d.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitDeny([]string{"198.51.100.0/24"})
	if code, _ := d.stop(t); code != 0 {
		t.Errorf("the daemon exited %d on SIGTERM; stderr:\n%s", code, d.stderr.String())
	}
}

// TestBinaryContainerDisk: "tai42 serve --provider container --disk-mb N"
// caps each session's disk (a write past it fails with ENOSPC inside, df
// shows the cap) and says so in GET /v1/policy; --disk-mb 0 is no cap,
// said the same way.
func TestBinaryContainerDisk(t *testing.T) {
	requireContainer(t)
	bin := buildBinary(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "TAI42_TOKEN=" + testToken}
	diskOf := func(d *daemonProc) api.DiskCap {
		t.Helper()
		p := getPolicy(t, d.addr)
		if p.Disk == nil {
			t.Fatalf("GET /v1/policy has no disk: %+v", p)
		}
		return *p.Disk
	}
	run := func(d *daemonProc, args ...string) (string, string, int) {
		t.Helper()
		return runBinary(t, bin, append(env, "TAI42_URL=http://"+d.addr), "", args...)
	}

	d := startDaemonProc(t, bin, env, "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--provider", "container",
		"--net-prefix", "t42dk", "--disk-mb", "64", "--disk-inodes", "4096")
	if got := diskOf(d); got != (api.DiskCap{Enforced: true, MB: 64, Inodes: 4096, ReserveMB: defaultDiskReserveMB}) {
		t.Errorf("GET /v1/policy disk: %+v", got)
	}
	out, errOut, code := run(d, "create")
	id := strings.TrimSpace(out)
	if code != 0 {
		t.Fatalf("create: exit %d, %s", code, errOut)
	}
	out, errOut, code = run(d, "exec", id, "--", "sh", "-c",
		"df -k / /tmp /workspace | tail -n +2 | while read fs size rest; do echo $size; done; dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; echo dd=$?")
	lines := strings.Fields(out)
	if code != 0 || len(lines) < 4 {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for i, fs := range []string{"/", "/tmp", "/workspace"} {
		if kb, err := strconv.Atoi(lines[i]); err != nil || kb > 64<<10 || kb < 32<<10 {
			t.Errorf("df %s inside shows %q KiB, want the 64 MiB cap", fs, lines[i])
		}
	}
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "dd=0") {
		t.Errorf("a 100 MiB write past the 64 MiB cap: %q, want ENOSPC", out)
	}
	run(d, "rm", id)
	if code, _ := d.stop(t); code != 0 {
		t.Errorf("the daemon exited %d on SIGTERM; stderr:\n%s", code, d.stderr.String())
	}

	off := startDaemonProc(t, bin, env, "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--provider", "container",
		"--net-prefix", "t42dk", "--disk-mb", "0", "--disk-reserve-mb", "0")
	if got := diskOf(off); got != (api.DiskCap{}) {
		t.Errorf("GET /v1/policy disk with --disk-mb 0 --disk-reserve-mb 0: %+v, want not enforced", got)
	}
	if code, _ := off.stop(t); code != 0 {
		t.Errorf("the daemon exited %d on SIGTERM; stderr:\n%s", code, off.stderr.String())
	}
}

// TestBinaryContainerPull: "tai42 run --image REF" on the container
// provider pulls an image its store lacks (--pull missing, the default)
// from a registry on loopback, and a reference the registry lacks is a
// rejected spec (exit 2) naming it; --pull never rejects what is missing.
func TestBinaryContainerPull(t *testing.T) {
	requireContainer(t)
	bin := buildBinary(t)
	reg := startRegistry(t)
	ref := reg.push(t, "tools/box:1", busyboxPlus(t, 1))
	state := t.TempDir()
	env := []string{"PATH=" + os.Getenv("PATH"), "TAI42_STATE_DIR=" + state, "DOCKER_CONFIG=" + t.TempDir(), "TAI42_INSECURE_REGISTRY=" + reg.host}

	missing := reg.host + "/tools/none:1"
	out, errOut, code := runBinary(t, bin, env, "", "run", "--provider", "container", "--image", missing, "--", "true")
	if code != exitUsage || !strings.Contains(errOut, missing) || !strings.Contains(errOut, "image") || out != "" {
		t.Errorf("run --image %s (not in the registry): exit %d, stdout %q, stderr %q", missing, code, out, errOut)
	}
	out, errOut, code = runBinary(t, bin, env, "", "run", "--provider", "container", "--pull", "never", "--image", ref, "--", "true")
	if code != exitUsage || !strings.Contains(errOut, ref) {
		t.Errorf("run --pull never --image %s: exit %d, stdout %q, stderr %q", ref, code, out, errOut)
	}
	out, errOut, code = runBinary(t, bin, env, "", "run", "--provider", "container", "--image", ref, "--", "sh", "-c", "echo ok")
	if code != 0 || out != "ok\n" {
		t.Fatalf("run --image %s (pulled on create): exit %d, stdout %q, stderr %q", ref, code, out, errOut)
	}
	out, errOut, code = runBinary(t, bin, env, "", "image", "ls", "-q")
	if code != 0 || out != ref+"\n" {
		t.Errorf("image ls after the pull on create: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// metricsOf is GET /metrics of the daemon at addr: "name{labels}" -> value.
func metricsOf(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// TestBinaryContainerPool: "tai42 serve --pool" keeps sessions ready on
// the container provider and serves creates from them (in /metrics), and
// refuses to start, exit 2 with the reason, on a pool the policy, the
// image store or the machine's memory cannot have.
func TestBinaryContainerPool(t *testing.T) {
	requireContainer(t)
	bin := buildBinary(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "TAI42_TOKEN=" + testToken}
	state := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		msg  string
	}{
		"policy": {[]string{"--pool", "host:egress=1", "--policy-egress", "internal"}, `pool host:egress=1: sandbox: spec rejected (network: violates the operator policy)`},
		"image":  {[]string{"--pool", "nosuch:none=1", "--pull", "never"}, `pool nosuch:none=1: sandbox: spec rejected (image: the provider cannot enforce it): image "nosuch" is not in the local store`},
		"memory": {[]string{"--pool", "host:none=10000000"}, "more than half"},
	} {
		code, errOut := runServeToExit(t, bin, env, append([]string{"--listen", "127.0.0.1:0", "--state-dir", state, "--provider", "container", "--net-prefix", "t42pl"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%s: exit %d, stderr %q; want 2 saying %q", name, code, errOut, tc.msg)
		}
	}

	d := startDaemonProc(t, bin, env, "--listen", "127.0.0.1:0", "--state-dir", state, "--provider", "container",
		"--net-prefix", "t42pl", "--pool", "host:none=2", "--pool", "host:internal=1", "--policy-egress", "internal")
	run := func(args ...string) (string, string, int) {
		t.Helper()
		return runBinary(t, bin, append(env, "TAI42_URL=http://"+d.addr), "", args...)
	}
	waitMetric := func(key string, want float64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if v := metricsOf(t, d.addr)[key]; v == want {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("metric %s = %v after 30s, want %v", key, v, want)
			}
		}
	}
	none := `{image="host",network="none"}`
	waitMetric("tai42_pool_ready"+none, 2)
	out, errOut, code := run("create", "--memory-mb", "64", "--label", "k=v")
	id := strings.TrimSpace(out)
	if code != 0 {
		t.Fatalf("create: exit %d, %s", code, errOut)
	}
	waitMetric("tai42_pool_hits_total"+none, 1)
	waitMetric("tai42_pool_ready"+none, 2) // refilled
	if m := metricsOf(t, d.addr); m["tai42_pool_misses_total"+none] != 0 || m["tai42_pool_size"+none] != 2 || m[`tai42_pool_size{image="host",network="internal"}`] != 1 {
		t.Errorf("pool metrics after one create: %v", m)
	}
	out, errOut, code = run("exec", id, "--", "echo", "hi")
	if code != 0 || out != "hi\n" {
		t.Errorf("exec in the pooled session: exit %d, %q, %s", code, out, errOut)
	}
	// Its memory cap, set when it was taken, is its cgroup's (v1 or v2).
	found := false
	for _, f := range []string{"/sys/fs/cgroup/memory/tai42/" + id + "/memory.limit_in_bytes", "/sys/fs/cgroup/tai42/" + id + "/memory.max"} {
		if b, err := os.ReadFile(f); err == nil {
			found = true
			if strings.TrimSpace(string(b)) != strconv.Itoa(64<<20) {
				t.Errorf("%s holds %q, want 64 MiB", f, b)
			}
		}
	}
	if !found {
		t.Errorf("session %s has no memory cgroup on the host", id)
	}
	run("rm", id)
	if code, _ := d.stop(t); code != 0 {
		t.Errorf("the daemon exited %d on SIGTERM; stderr:\n%s", code, d.stderr.String())
	}
	// Nothing of the pool is left in the state directory.
	if entries, _ := os.ReadDir(filepath.Join(state, "container", "sessions")); len(entries) > 0 {
		t.Errorf("after the daemon stopped, session bundles are left: %v", entries)
	}
}

// runServeToExit runs "BIN serve ARGS..." to its exit (within 60 s) and
// returns its exit code and stderr.
func runServeToExit(t *testing.T, bin string, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve"}, args...)...)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stderr.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}
