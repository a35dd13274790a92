package container_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// runSteps are the parts of a create that BenchmarkCreateSteps times
// apart, and then the first exec.
var runSteps = []string{"bundle", "run", "ping", "exec"}

// BenchmarkCreateSteps separates, in a session's create to first exec,
// the runtime's and the agent's cost from the provider's own. It keeps one
// live busybox session of a provider and, per op, starts one more
// container from that session's own bundle: bundle (a new bundle
// directory, the agent's listening socket, and the session's config.json
// decoded, given a new cgroup and the live session's network namespace,
// encoded and written there; the root is the live session's), run (`RUNTIME run --detach`
// of it, the agent as PID 1 with a new listening socket), ping (the
// agent's first answer), exec (the first exec of /bin/true through the
// agent); its deletion is not timed. crun runs in the provider's own
// mount namespace, where the session's root is mounted. Reports
// STEP-p50-ns for each, and total-p50-ns / total-p99-ns.
//
// The runc and crun variants also time, in the same loop, a real create
// to first exec through the provider (create-p50-ns): less run, ping and
// exec, it leaves the provider's own work (directories, root overlay,
// network namespace, socket, config, the kit). The -no-seccomp variants
// drop the seccomp filter from the config, the -no-hardening ones also
// the masked and read-only /proc paths, to show what they cost the
// runtime. agent-alone starts the agent outside any container. userns is
// 1 when the provider runs its sessions in a user namespace, else 0.
func BenchmarkCreateSteps(b *testing.B) {
	// crun's compiled program of the profile, which the provider hands it
	// after its first run, goes too.
	noSeccomp := func(s *specs.Spec) {
		s.Linux.Seccomp = nil
		delete(s.Annotations, "run.oci.seccomp_bpf_data")
	}
	noHardening := func(s *specs.Spec) {
		s.Linux.Seccomp = nil
		delete(s.Annotations, "run.oci.seccomp_bpf_data")
		s.Linux.MaskedPaths = nil
		s.Linux.ReadonlyPaths = nil
	}
	var peers []peer
	for _, rt := range []string{"runc", "crun"} {
		peers = append(peers,
			peer{rt, func(b *testing.B) { stepsBench(b, rt, nil) }},
			peer{rt + "-no-seccomp", func(b *testing.B) { stepsBench(b, rt, noSeccomp) }},
			peer{rt + "-no-hardening", func(b *testing.B) { stepsBench(b, rt, noHardening) }},
		)
	}
	peers = append(peers, peer{"agent-alone", agentAlone})
	runPeers(b, peers)
}

// stepTimer times the consecutive steps of one op.
type stepTimer struct {
	start, last time.Time
	durs        map[string]time.Duration
}

func newStepTimer() *stepTimer {
	now := time.Now()
	return &stepTimer{start: now, last: now, durs: map[string]time.Duration{}}
}

func (t *stepTimer) lap(step string) {
	now := time.Now()
	t.durs[step] = now.Sub(t.last)
	t.last = now
}

// liveBundle runs more containers from a live session's bundle.
type liveBundle struct {
	rt     *bareRuntime
	tmpl   []byte   // the session's config.json
	netns  *os.File // the session's network namespace
	userns *os.File // and its user namespace
	edit   func(*specs.Spec)
	base   string
	seq    int
}

// newLiveBundle makes a busybox session of provider sb (runtime rt) and
// returns what runs more containers from its bundle, its config edited by
// edit (nil: as the provider wrote it).
func newLiveBundle(b testing.TB, sb *tracked, opts container.Options, rt string, edit func(*specs.Spec)) *liveBundle {
	b.Helper()
	// The provider's first create is not as the later ones (on crun, its
	// config has no seccomp program yet: see the provider's
	// seccompCache): the live session is its second.
	first, err := sb.CreateSession(context.Background(), sessionSpec(containertest.Busybox))
	if err != nil {
		b.Fatal(err)
	}
	if err := sb.DestroySession(context.Background(), first.ID()); err != nil {
		b.Fatal(err)
	}
	s, err := sb.CreateSession(context.Background(), sessionSpec(containertest.Busybox))
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(opts.StateDir, "container", "sessions", s.ID(), "config.json"))
	if err != nil {
		b.Fatalf("the live session's config.json: %v", err)
	}
	pids, err := cgroupProcs("/tai42/" + s.ID())
	if err != nil || len(pids) == 0 {
		b.Fatalf("the live session's agent: %v %v", pids, err)
	}
	netns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pids[0]))
	if err != nil {
		b.Fatalf("the live session's network namespace: %v", err)
	}
	b.Cleanup(func() { netns.Close() })
	// On crun, remapped, the session joined a user namespace made for it
	// (its config names it by a descriptor of the provider's, closed
	// since): the containers run from its bundle join the live one's.
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pids[0]))
	if err != nil {
		b.Fatalf("the live session's user namespace: %v", err)
	}
	b.Cleanup(func() { userns.Close() })
	var r *bareRuntime
	if rt == "crun" && hybridCgroups() {
		// The provider's crun runs, and mounts its sessions' roots, in a
		// mount namespace of its own: run ours there too.
		path, err := foreignMountNS()
		if err != nil {
			b.Fatalf("the crun provider's mount namespace: %v", err)
		}
		r = newBareRuntimeIn(b, rt, path)
	} else {
		r = newBareRuntime(b, rt)
	}
	return &liveBundle{rt: r, tmpl: tmpl, netns: netns, userns: userns, edit: edit, base: b.TempDir()}
}

// foreignMountNS is the mount namespace of the one thread of this process
// whose mount namespace is not the process's own: the crun provider's
// runtime thread, where no other such namespace exists.
func foreignMountNS() (string, error) {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return "", err
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return "", err
	}
	found := map[string]string{}
	for _, t := range tasks {
		p := filepath.Join("/proc/self/task", t.Name(), "ns", "mnt")
		if ns, err := os.Readlink(p); err == nil && ns != self {
			found[ns] = p
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%d threads' mount namespaces differ from the process's (%v); want exactly the provider's", len(found), found)
	}
	for _, p := range found {
		return p, nil
	}
	panic("unreachable")
}

func stepsBench(b *testing.B, rt string, edit func(*specs.Spec)) {
	sb, opts := newProvider(b, rt)
	lb := newLiveBundle(b, sb, opts, rt, edit)
	ctx := context.Background()
	unedited := edit == nil
	// createFirstExec is a real create to first exec through the
	// provider, for the share of the provider's own work.
	createFirstExec := func() (time.Duration, error) {
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, sessionSpec(containertest.Busybox))
		if err != nil {
			return 0, err
		}
		err = execTrue(ctx, s)
		d := time.Since(t0)
		return d, errors.Join(err, sb.DestroySession(ctx, s.ID()))
	}
	one := func() (*stepTimer, time.Duration, error) {
		t, undo, err := lb.start(ctx)
		if err != nil {
			return nil, 0, err
		}
		if err := undo(); err != nil {
			return nil, 0, err
		}
		var d time.Duration
		if unedited {
			d, err = createFirstExec()
		}
		return t, d, err
	}
	if _, _, err := one(); err != nil { // warm-up
		b.Fatal(err)
	}
	steps := make(map[string]latencies)
	var total, creates latencies
	for b.Loop() {
		t, d, err := one()
		if err != nil {
			b.Fatal(err)
		}
		for k, d := range t.durs {
			steps[k] = append(steps[k], d)
		}
		total.add(t.last.Sub(t.start))
		if unedited {
			creates.add(d)
		}
	}
	for _, s := range runSteps {
		b.ReportMetric(float64(steps[s].percentile(0.5).Nanoseconds()), s+"-p50-ns")
	}
	b.ReportMetric(float64(total.percentile(0.5).Nanoseconds()), "total-p50-ns")
	b.ReportMetric(float64(total.percentile(0.99).Nanoseconds()), "total-p99-ns")
	if unedited {
		b.ReportMetric(float64(creates.percentile(0.5).Nanoseconds()), "create-p50-ns")
		remapped, err := lb.remapped()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(map[bool]float64{false: 0, true: 1}[remapped], "userns")
	}
}

// remapped reports whether the live session runs in a user namespace.
func (lb *liveBundle) remapped() (bool, error) {
	var spec specs.Spec
	if err := json.Unmarshal(lb.tmpl, &spec); err != nil {
		return false, fmt.Errorf("the provider's config.json: %w", err)
	}
	return slices.ContainsFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool {
		return ns.Type == specs.UserNamespace
	}), nil
}

// start starts one more container from the live session's bundle until
// its first exec has finished, timing each step, and returns the timings
// and the undo of what it made (done by start itself on error).
func (lb *liveBundle) start(ctx context.Context) (_ *stepTimer, _ func() error, err error) {
	lb.seq++
	id := fmt.Sprintf("steps-%d-%d", os.Getpid(), lb.seq)
	dir := filepath.Join(lb.base, id)
	var undos []func() error
	undo := func() error {
		var errs []error
		for _, u := range slices.Backward(undos) {
			errs = append(errs, u())
		}
		undos = nil
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, undo())
		}
	}()

	t := newStepTimer()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, nil, err
	}
	undos = append(undos, func() error { return os.RemoveAll(dir) })
	dirFD, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	undos = append(undos, func() error { return unix.Close(dirFD) })
	// The socket through the directory handle, as the provider reaches
	// it: a temp dir's path may be longer than a socket address may be.
	sock := "/proc/self/fd/" + strconv.Itoa(dirFD) + "/agent.sock"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("the agent's socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	lnFile, err := ln.File()
	ln.Close()
	if err != nil {
		return nil, nil, err
	}
	defer lnFile.Close()
	var spec specs.Spec
	if err := json.Unmarshal(lb.tmpl, &spec); err != nil {
		return nil, nil, fmt.Errorf("the provider's config.json: %w", err)
	}
	for i, ns := range spec.Linux.Namespaces {
		switch {
		case ns.Type == specs.NetworkNamespace:
			spec.Linux.Namespaces[i].Path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), lb.netns.Fd())
		case ns.Type == specs.UserNamespace && ns.Path != "":
			spec.Linux.Namespaces[i].Path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), lb.userns.Fd())
		}
	}
	spec.Linux.CgroupsPath = "/tai42/" + id
	if lb.edit != nil {
		lb.edit(&spec)
	}
	raw, err := json.Marshal(&spec)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o600); err != nil {
		return nil, nil, err
	}
	log, err := os.OpenFile(filepath.Join(dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer log.Close()
	t.lap("bundle")

	undos = append(undos, func() error { return lb.rt.delete(context.Background(), id) })
	if err := lb.rt.command(ctx, log, []*os.File{lnFile}, "run", "--detach", "--preserve-fds", "1", "--bundle", dir, id); err != nil {
		return nil, nil, err
	}
	t.lap("run")

	c := &agent.Client{Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Ping(pctx); err != nil {
		return nil, nil, fmt.Errorf("the agent did not answer: %w", err)
	}
	t.lap("ping")

	proc, err := c.Start(pctx, agent.ExecSpec{
		Argv: trueArgv,
		Dir:  "/workspace",
		Env:  []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"},
	}, func(int, []byte) bool { return true })
	if err != nil {
		return nil, nil, err
	}
	<-proc.Done()
	res := proc.Result()
	proc.Close()
	if res.Err != nil || !res.StatusKnown || res.ExitCode != 0 {
		return nil, nil, fmt.Errorf("the first exec of /bin/true: %+v", res)
	}
	t.lap("exec")
	return t, undo, nil
}

// agentAlone times the agent's start outside any container: `tai42-agent agent
// --listen-fd 3 --workspace DIR` started as a plain process until its
// first answer to a ping (reported as ping-p50-ns and total-p50-ns): the
// floor of the ping step, the Go program's own start.
func agentAlone(b *testing.B) {
	bin := containertest.Agent(b)
	dir, err := os.MkdirTemp("", "tai42-bench-agent-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	op := func() (time.Duration, error) {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			return 0, err
		}
		ln.SetUnlinkOnClose(false)
		lnFile, err := ln.File()
		ln.Close()
		defer os.Remove(sock)
		if err != nil {
			return 0, err
		}
		defer lnFile.Close()
		t0 := time.Now()
		var stderr bytes.Buffer
		cmd := exec.Command(bin, "agent", "--listen-fd", "3", "--workspace", dir)
		cmd.ExtraFiles = []*os.File{lnFile}
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		defer func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}()
		c := &agent.Client{Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Ping(ctx); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // stderr is complete from here on
			return 0, fmt.Errorf("the agent started alone did not answer: %w; its stderr: %s", err, strings.TrimSpace(stderr.String()))
		}
		return time.Since(t0), nil
	}
	if _, err := op(); err != nil { // warm-up
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		d, err := op()
		if err != nil {
			b.Fatal(err)
		}
		l.add(d)
	}
	b.ReportMetric(float64(l.percentile(0.5).Nanoseconds()), "ping-p50-ns")
	b.ReportMetric(float64(l.percentile(0.5).Nanoseconds()), "total-p50-ns")
	b.ReportMetric(float64(l.percentile(0.99).Nanoseconds()), "total-p99-ns")
}
