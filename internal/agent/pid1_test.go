package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func mkfifo(path string) error { return syscall.Mkfifo(path, 0o644) }

// runPID1Agent is the test binary run as the agent: ServeFD on fd 3, as
// "tai42 agent" does, until SIGTERM.
func runPID1Agent() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if os.Getpid() != 1 {
		fmt.Fprintf(os.Stderr, "agent helper: pid %d, want 1\n", os.Getpid())
		return 3
	}
	if err := ServeFD(ctx, 3, logger); err != nil {
		fmt.Fprintln(os.Stderr, "agent helper:", err)
		return 1
	}
	return 0
}

// children lists the processes whose parent is ppid, with their states.
func children(t *testing.T, ppid int) map[int]string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+2:]) // state, ppid, ...
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			out[pid] = f[0]
		}
	}
	return out
}

// The agent as PID 1 of a new PID namespace reaps orphans and still hands
// each exec its own status.
func TestPID1Reaper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a new PID namespace needs root (CAP_SYS_ADMIN)")
	}
	sock, lf := listenerFile(t)
	dir := filepath.Dir(sock)
	var stderr bytes.Buffer
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), pid1Env+"=1")
	cmd.ExtraFiles = []*os.File{lf} // fd 3
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("starting the agent in a new PID namespace: %v", err)
	}
	lf.Close()
	agentPid := cmd.Process.Pid
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	c := dialer(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v (agent stderr: %s)", err, stderr.String())
	}
	run := func(argv ...string) (Result, string) {
		t.Helper()
		col := newCollector()
		p, err := c.Start(ctx, ExecSpec{Argv: argv, Dir: dir, Env: []string{"PATH=" + testPath}}, col.out)
		if err != nil {
			t.Fatalf("Start %q: %v", argv, err)
		}
		defer p.Close()
		waitDone(t, p, 10*time.Second)
		return p.Result(), col.stdout()
	}
	// Execs work, and each gets its own status, also when it exits at
	// once (before the agent registered it, were it not for the lock).
	if r, out := run("sh", "-c", "echo $$; exit 3"); r.ExitCode != 3 || !r.StatusKnown || out == "" {
		t.Fatalf("exec: %+v %q", r, out)
	}
	for i := range 50 {
		if r, _ := run("sh", "-c", fmt.Sprintf("exit %d", i%5)); r.ExitCode != i%5 || !r.StatusKnown {
			t.Fatalf("fast exec %d: %+v", i, r)
		}
	}
	// An orphaned grandchild is reparented to the agent, then reaped.
	for range 3 {
		if r, _ := run("sh", "-c", `sh -c "sleep 0.5" >/dev/null 2>&1 & exit 0`); r.ExitCode != 0 {
			t.Fatalf("orphan maker: %+v", r)
		}
		if kids := children(t, agentPid); len(kids) == 0 {
			out, _ := exec.Command("ps", "-eo", "pid,ppid,stat,args").Output()
			t.Fatalf("the orphan was not reparented to the agent %d: the test would prove nothing\n%s", agentPid, out)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			kids := children(t, agentPid)
			if len(kids) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the agent's children after the orphan's exit: %v (Z: a zombie not reaped)", kids)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// SIGTERM ends the agent cleanly.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		stopped = true
		if err != nil {
			t.Fatalf("the agent exited with %v after SIGTERM (stderr: %s)", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not exit on SIGTERM")
	}
}

// listenerFile is a unix socket listening at sock, as the file a
// provider hands the agent as its fd 3 (closed at the test's end).
func listenerFile(t *testing.T) (sock string, lf *os.File) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	lf, err = ul.File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lf.Close() })
	return sock, lf
}
