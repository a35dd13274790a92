package container_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
	"github.com/tai42/sandbox/internal/nsthread"
)

// busyboxRootfs is the busybox root filesystem for the bare runtimes:
// BENCH_ROOTFS, or one written into a temp dir of b.
func busyboxRootfs(b testing.TB) string {
	b.Helper()
	if dir := os.Getenv("BENCH_ROOTFS"); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(abs, "bin", "busybox")); err != nil {
			b.Fatalf("BENCH_ROOTFS=%s is not the busybox rootfs: %v", dir, err)
		}
		return abs
	}
	return imagestoretest.BusyboxRootfs(b, filepath.Join(b.TempDir(), "rootfs"))
}

// bareRuntime drives runc or crun by hand, as a person would: a bundle
// made by `runc spec` over the busybox rootfs, `run`, `exec`, `delete`.
// Its state lives in a temp dir of its own (--root). Safe for concurrent
// use.
type bareRuntime struct {
	name string // "runc" or "crun"
	bin  string
	root string
	// ns is a mount namespace without the cgroup2 mount beside the v1
	// hierarchies, which crun refuses (the provider runs crun the same
	// way); nil for runc, or where the host is not in hybrid mode.
	ns  *nsthread.Worker
	seq atomic.Int64
}

// newBareRuntime returns runtime name, skipping b when it is not
// installed; the containers it made and its state go at b's cleanup.
func newBareRuntime(b testing.TB, name string) *bareRuntime {
	b.Helper()
	return newBareRuntimeIn(b, name, "")
}

// newBareRuntimeIn is newBareRuntime whose runtime runs in the mount
// namespace at nsPath ("": its own, for crun on a hybrid-cgroup host).
func newBareRuntimeIn(b testing.TB, name, nsPath string) *bareRuntime {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("the bare runtimes need root")
	}
	bin, err := exec.LookPath(name)
	if err != nil {
		b.Skipf("%s is not installed (apt-get install -y %s)", name, name)
	}
	r := &bareRuntime{name: name, bin: bin, root: filepath.Join(b.TempDir(), "state")}
	switch {
	case nsPath != "":
		r.ns, err = nsthread.JoinMountNS(nsPath)
	case name == "crun" && hybridCgroups():
		r.ns, err = nsthread.NewMountNS("/sys/fs/cgroup/unified")
	}
	if err != nil {
		b.Fatalf("%s's mount namespace: %v", name, err)
	}
	if r.ns != nil {
		b.Cleanup(r.ns.Close)
	}
	b.Cleanup(func() {
		// Whatever a failed benchmark left running.
		for _, id := range r.list() {
			if err := r.delete(context.Background(), id); err != nil {
				b.Errorf("%s delete %s: %v", name, id, err)
			}
		}
	})
	return r
}

// hybridCgroups reports cgroups v1 with a cgroup2 mount beside them.
func hybridCgroups() bool {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup/unified", &st) != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}

// id is a new container id.
func (r *bareRuntime) id() string {
	return fmt.Sprintf("bench-%s-%d-%d", r.name, os.Getpid(), r.seq.Add(1))
}

// command runs the runtime with args; stdio is /dev/null but for out, and
// stderr goes into the error. extra are files the container inherits from
// fd 3 on (with --preserve-fds).
func (r *bareRuntime) command(ctx context.Context, out *os.File, extra []*os.File, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, r.bin, append([]string{"--root", r.root}, args...)...)
	cmd.Stderr = &stderr
	cmd.ExtraFiles = extra
	if out != nil {
		// A file, not a pipe: a detached container keeps it.
		cmd.Stdout, cmd.Stderr = out, out
	}
	// Only the fork needs the namespace's thread; the wait does not.
	err := r.do(cmd.Start)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if out != nil {
			b, _ := os.ReadFile(out.Name())
			msg = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%s %s: %w: %s", r.name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// bundle makes a bundle in a temp dir of b: `runc spec`'s config with the
// busybox rootfs (read-only, as runc spec has it), no terminal, and args.
func (r *bareRuntime) bundle(b testing.TB, rootfs string, args ...string) string {
	b.Helper()
	dir := b.TempDir()
	runc, err := exec.LookPath("runc")
	if err != nil {
		b.Skip("runc is not installed (apt-get install -y runc): its `runc spec` makes the bare bundles")
	}
	if out, err := exec.Command(runc, "spec", "--bundle", dir).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v: %s", err, out)
	}
	file := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(file)
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatalf("runc spec's config: %v", err)
	}
	proc, _ := cfg["process"].(map[string]any)
	root, _ := cfg["root"].(map[string]any)
	if proc == nil || root == nil {
		b.Fatalf("runc spec's config has no process or root: %s", raw)
	}
	proc["terminal"] = false
	proc["args"] = args
	root["path"] = rootfs
	if raw, err = json.Marshal(cfg); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	return dir
}

// run runs bundle's process to its end in a new container, which the
// runtime then deletes: create + start + wait + delete.
func (r *bareRuntime) run(ctx context.Context, bundle string) error {
	return r.command(ctx, nil, nil, "run", "--bundle", bundle, r.id())
}

// runDetached creates and starts a container from bundle and returns its
// id; its stdio is log.
func (r *bareRuntime) runDetached(ctx context.Context, bundle string, log *os.File) (string, error) {
	id := r.id()
	return id, r.command(ctx, log, nil, "run", "--detach", "--bundle", bundle, id)
}

// exec runs argv in container id to its end.
func (r *bareRuntime) exec(ctx context.Context, id string, argv ...string) error {
	return r.command(ctx, nil, nil, append([]string{"exec", id}, argv...)...)
}

// delete kills container id's processes and removes it.
func (r *bareRuntime) delete(ctx context.Context, id string) error {
	return r.command(ctx, nil, nil, "delete", "--force", id)
}

// list is the ids of the containers in the runtime's state dir.
func (r *bareRuntime) list() []string {
	entries, _ := os.ReadDir(r.root)
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// dockerCLI runs the docker CLI against the dockerd of BENCH_DOCKER_HOST,
// as a person would. It removes the containers it made at the cleanup of
// the test that made it. Safe for concurrent use.
type dockerCLI struct {
	bin, host, image string

	mu   sync.Mutex
	live map[string]bool // containers made and not yet removed
}

// newDocker returns the CLI, or skips b when no dockerd was given.
func newDocker(b testing.TB) *dockerCLI {
	b.Helper()
	host := os.Getenv("BENCH_DOCKER_HOST")
	if host == "" {
		b.Skip("docker not measured: BENCH_DOCKER_HOST is not set (bench/container.sh starts a private dockerd and sets it)")
	}
	d := &dockerCLI{bin: os.Getenv("BENCH_DOCKER_BIN"), host: host, image: os.Getenv("BENCH_DOCKER_IMAGE"), live: map[string]bool{}}
	if d.bin == "" {
		d.bin = "docker"
	}
	if d.image == "" {
		d.image = "busybox:test"
	}
	b.Cleanup(func() {
		d.mu.Lock()
		ids := make([]string, 0, len(d.live))
		for id := range d.live {
			ids = append(ids, id)
		}
		d.mu.Unlock()
		if len(ids) == 0 {
			return
		}
		if _, err := d.do(context.Background(), append([]string{"rm", "--force"}, ids...)...); err != nil {
			b.Errorf("removing the docker containers: %v", err)
		}
	})
	return d
}

// do runs `docker -H HOST args...` and returns its stdout, trimmed.
func (d *dockerCLI) do(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, d.bin, append([]string{"-H", d.host}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// made records a container to remove at cleanup; removed forgets it.
func (d *dockerCLI) made(id string) {
	d.mu.Lock()
	d.live[id] = true
	d.mu.Unlock()
}

func (d *dockerCLI) removed(id string) {
	d.mu.Lock()
	delete(d.live, id)
	d.mu.Unlock()
}

// idleArgv is the command of docker's and the bare runtimes' long-lived
// containers: a process that does nothing.
var idleArgv = []string{"/bin/sleep", "1000000"}

// runIdle is `docker run -d --network none IMAGE sleep ...`: a new
// started container, its id.
func (d *dockerCLI) runIdle(ctx context.Context) (string, error) {
	id, err := d.do(ctx, append([]string{"run", "--detach", "--network", "none", d.image}, idleArgv...)...)
	if err == nil {
		d.made(id)
	}
	return id, err
}

// createStart is `docker create` + `docker start` of the same.
func (d *dockerCLI) createStart(ctx context.Context) (string, error) {
	id, err := d.do(ctx, append([]string{"create", "--network", "none", d.image}, idleArgv...)...)
	if err != nil {
		return "", err
	}
	d.made(id)
	_, err = d.do(ctx, "start", id)
	return id, err
}

// execTrue is `docker exec ID true`.
func (d *dockerCLI) execTrue(ctx context.Context, id string) error {
	_, err := d.do(ctx, "exec", id, "true")
	return err
}

// remove is `docker rm --force ID`.
func (d *dockerCLI) remove(ctx context.Context, id string) error {
	_, err := d.do(ctx, "rm", "--force", id)
	if err == nil {
		d.removed(id)
	}
	return err
}

// do runs fn where the runtime runs: in its mount namespace, or here.
func (r *bareRuntime) do(fn func() error) error {
	if r.ns != nil {
		return r.ns.Do(fn)
	}
	return fn()
}
