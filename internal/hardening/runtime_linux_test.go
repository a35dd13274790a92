package hardening

// The harness of the escape tests: a tiny rootfs (Debian's static busybox
// and the escape probe), an OCI config built with runtime-spec types, and
// runc or crun running it, each container with a unique id and a state
// directory of its own, always deleted.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
)

const (
	busyboxPath = "/bin/busybox"
	probeInside = "/probe" // where the probe sits in the rootfs
	runTimeout  = 60 * time.Second
)

// busyboxApplets are linked into the rootfs's /bin.
var busyboxApplets = []string{
	"[", "cat", "chmod", "cut", "date", "echo", "env", "false", "grep", "head",
	"id", "ls", "mkdir", "mkfifo", "ps", "rm", "seq", "sh", "sleep", "sort",
	"stat", "tail", "test", "touch", "tr", "true", "uname", "wc", "xargs",
}

var (
	rootfsOnce sync.Once
	rootfsDir  string // the shared read-only rootfs's parent, removed by TestMain
	rootfsErr  error

	containerSeq atomic.Uint64
)

// needRoot skips t unless the test runs as root with name on PATH, and
// returns name's path.
func needRuntime(t *testing.T, name string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running containers needs root")
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed: %v", name, err)
	}
	return p
}

// sharedRootfs returns a rootfs built once per test binary run, for
// containers whose root is read-only.
func sharedRootfs(t *testing.T) string {
	t.Helper()
	probe := escapeprobetest.Build(t)
	rootfsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tai42-hardening-rootfs-")
		if err != nil {
			rootfsErr = err
			return
		}
		rootfsDir = dir
		rootfsErr = makeRootfs(filepath.Join(dir, "rootfs"), probe)
	})
	if rootfsErr != nil {
		t.Fatalf("building the shared rootfs: %v", rootfsErr)
	}
	return filepath.Join(rootfsDir, "rootfs")
}

// privateRootfs returns a rootfs of t's own, which a container may write.
func privateRootfs(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := makeRootfs(dir, escapeprobetest.Build(t)); err != nil {
		t.Fatalf("building a rootfs: %v", err)
	}
	return dir
}

func removeSharedRootfs() error {
	if rootfsDir == "" {
		return nil
	}
	return os.RemoveAll(rootfsDir)
}

func makeRootfs(dir, probe string) error {
	if _, err := os.Stat(busyboxPath); err != nil {
		return fmt.Errorf("%s (Debian's busybox-static) is needed: %w", busyboxPath, err)
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(busyboxPath, filepath.Join(dir, "bin", "busybox"), 0o755); err != nil {
		return err
	}
	for _, a := range busyboxApplets {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			return err
		}
	}
	if err := copyFile(probe, filepath.Join(dir, strings.TrimPrefix(probeInside, "/")), 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":  "127.0.0.1 localhost\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ociVersion is the config's ociVersion: crun 1.8.1 refuses any version
// but 1.0.x ("unknown version specified"), runc 1.1 takes it, and every
// field used here exists in 1.0.2.
const ociVersion = "1.0.2"

// baseSpec is a session-like config without the hardening: namespaces pid,
// mount, ipc, uts, network and cgroup; /proc, /dev, /dev/pts, /dev/shm, /tmp,
// a read-only /sys and a read-only cgroup mount; all devices denied but
// the runtime's defaults.
func baseSpec(rootfs string, readonly bool, args ...string) *specs.Spec {
	return &specs.Spec{
		Version: ociVersion,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: args,
			Env:  []string{"PATH=/bin", "HOME=/root", "TMPDIR=/tmp"},
			Cwd:  "/",
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024},
			},
		},
		Root:     &specs.Root{Path: rootfs, Readonly: readonly},
		Hostname: "probe",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.NetworkNamespace},
				{Type: specs.CgroupNamespace},
			},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
		},
	}
}

// hardenedSpec is baseSpec with Apply.
func hardenedSpec(rootfs string, readonly bool, args ...string) *specs.Spec {
	s := baseSpec(rootfs, readonly, args...)
	Apply(s)
	return s
}

// ociRuntime runs containers with one OCI runtime.
type ociRuntime struct {
	name string
	bin  string
	// hideUnified runs the runtime in a private mount namespace without
	// /sys/fs/cgroup/unified (crun refuses cgroups v1's hybrid mode).
	hideUnified bool
}

func runcRuntime(t *testing.T) ociRuntime {
	return ociRuntime{name: "runc", bin: needRuntime(t, "runc")}
}

func crunRuntime(t *testing.T) ociRuntime {
	rt := ociRuntime{name: "crun", bin: needRuntime(t, "crun")}
	if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
		needRuntime(t, "unshare")
		rt.hideUnified = true
	}
	return rt
}

// hideUnifiedScript unmounts /sys/fs/cgroup/unified in the private mount
// namespace unshare made (never in the host's), then execs its arguments.
const hideUnifiedScript = `umount /sys/fs/cgroup/unified 2>/dev/null; exec "$@"`

// command returns the command line that runs the runtime with args.
func (rt ociRuntime) command(ctx context.Context, stateRoot string, args ...string) *exec.Cmd {
	argv := append([]string{rt.bin, "--root", stateRoot}, args...)
	if rt.hideUnified {
		argv = append([]string{"unshare", "-m", "--propagation", "slave", "sh", "-c", hideUnifiedScript, "sh"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	// A killed runtime can leave the container holding the output pipes.
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// runResult is what a container run produced.
type runResult struct {
	stdout, stderr string
	code           int
	elapsed        time.Duration // of the runtime's run alone
}

// run runs s to completion as a new container and returns its output and
// exit code. The container is deleted (forcibly) when t ends, and its
// cgroups are checked to be gone.
func (rt ociRuntime) run(t *testing.T, s *specs.Spec) runResult {
	t.Helper()
	id := fmt.Sprintf("tai42-hardening-%d-%d", os.Getpid(), containerSeq.Add(1))
	bundle := t.TempDir()
	stateRoot := t.TempDir()
	cfg, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.delete(t, stateRoot, id) })

	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := rt.command(ctx, stateRoot, "run", "--bundle", bundle, id)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	elapsed := time.Since(start)
	r := runResult{stdout: stdout.String(), stderr: stderr.String(), elapsed: elapsed}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		r.code = exitErr.ExitCode()
	default:
		t.Fatalf("%s run %s: %v (ctx: %v)\nstdout: %s\nstderr: %s", rt.name, id, err, ctx.Err(), r.stdout, r.stderr)
	}
	return r
}

// delete removes the container id whatever its state, and checks that no
// cgroup of it is left.
func (rt ociRuntime) delete(t *testing.T, stateRoot, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := rt.command(ctx, stateRoot, "delete", "-f", id)
	out, err := cmd.CombinedOutput()
	// A container that ran to completion is already gone: the runtimes say
	// so in different words.
	if err != nil && !strings.Contains(string(out), "not exist") && !strings.Contains(string(out), "No such file") {
		t.Errorf("%s delete -f %s: %v: %s", rt.name, id, err, out)
	}
	for _, p := range leftoverCgroups(id) {
		t.Errorf("%s left cgroup %s behind", rt.name, p)
	}
}

// leftoverCgroups returns the cgroup directories named id below the cgroups
// of this process and below each hierarchy's root, where runtimes put a
// container's cgroups.
func leftoverCgroups(id string) []string {
	var found []string
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var hier string
		switch {
		case parts[1] == "":
			hier = "unified"
		default:
			hier = strings.TrimPrefix(strings.Split(parts[1], ",")[0], "name=")
		}
		mount := filepath.Join("/sys/fs/cgroup", hier)
		if _, err := os.Stat(mount); err != nil {
			mount = "/sys/fs/cgroup" // cgroup v2 only
		}
		for _, base := range []string{filepath.Join(mount, parts[2]), mount} {
			p := filepath.Join(base, id)
			if _, err := os.Stat(p); err == nil {
				found = append(found, p)
			}
		}
	}
	return found
}

// probeResult is the probe's JSON line.
type probeResult struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	Detail string `json:"detail"`
}

// items splits a multi-attempt detail into NAME -> RESULT.
func (p probeResult) items() map[string]string {
	m := map[string]string{}
	for f := range strings.FieldsSeq(p.Detail) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// probe runs the probe inside a container of s's making (args replace the
// process's) and returns its result; the run must exit 0 with one JSON
// line on stdout.
func (rt ociRuntime) probe(t *testing.T, s *specs.Spec, args ...string) probeResult {
	t.Helper()
	s.Process.Args = args
	r := rt.run(t, s)
	if r.code != 0 {
		t.Fatalf("%s: %q exited %d\nstdout: %s\nstderr: %s", rt.name, args, r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var p probeResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &p); err != nil {
		t.Fatalf("%s: %q: not the probe's JSON line: %v\nstdout: %s\nstderr: %s", rt.name, args, err, r.stdout, r.stderr)
	}
	return p
}

// runtimeNames are the OCI runtimes under test.
var runtimeNames = []string{"runc", "crun"}

// forEachRuntime runs f as a subtest per runtime; a runtime that is not
// installed (or a run without root) skips its subtest.
func forEachRuntime(t *testing.T, f func(t *testing.T, rt ociRuntime)) {
	for _, name := range runtimeNames {
		t.Run(name, func(t *testing.T) {
			var rt ociRuntime
			switch name {
			case "runc":
				rt = runcRuntime(t)
			case "crun":
				rt = crunRuntime(t)
			}
			f(t, rt)
		})
	}
}

// probeOnHost runs the probe outside any container. Only for subcommands
// that change nothing.
func probeOnHost(t *testing.T, probe string, args ...string) probeResult {
	t.Helper()
	out, err := exec.Command(probe, args...).Output()
	if err != nil {
		t.Fatalf("probe %q on the host: %v", args, err)
	}
	var p probeResult
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatalf("probe %q on the host: %v: %q", args, err, out)
	}
	return p
}
