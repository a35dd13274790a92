package agentexec

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/kit"
)

// newSession serves an agent in this process on a socket of t's and
// returns a Session over it, its workspace a temp directory.
func newSession(t *testing.T, opts kit.ProviderOptions, spec sandbox.SessionSpec, oom func() int64) (*Session, string) {
	t.Helper()
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Serve(ctx, ln, agent.Options{}) }()
	t.Cleanup(func() { cancel(); <-done })
	c := &agent.Client{Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return New(Config{ID: "s1", Spec: spec, Agent: c, Opts: opts, WorkspaceDir: ws,
		BaseEnv: map[string]string{"PATH": os.Getenv("PATH"), "BASE": "b"}, OOMKills: oom}), ws
}

func req(ws string, timeout time.Duration, argv ...string) kit.ExecRequest {
	return kit.ExecRequest{Argv: argv, Cwd: kit.Path{Rel: ".", Abs: ws, Orig: ""}, Timeout: timeout,
		Env: map[string]sandbox.Secret{"E": sandbox.NewSecret("e")}}
}

func TestExec(t *testing.T) {
	s, ws := newSession(t, kit.ProviderOptions{}, sandbox.SessionSpec{}, nil)
	ctx := context.Background()
	res, err := s.Exec(ctx, req(ws, 10*time.Second, "sh", "-c", "echo $BASE$E; pwd; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || string(res.Stdout) != "be\n"+ws+"\n" {
		t.Fatalf("%d %q", res.ExitCode, res.Stdout)
	}
	_, err = s.Exec(ctx, req(ws, 200*time.Millisecond, "sleep", "5"))
	var te *sandbox.ExecTimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("timeout: %v", err)
	}
}

func TestOutputLimit(t *testing.T) {
	s, ws := newSession(t, kit.ProviderOptions{MaxOutputBytes: 1000}, sandbox.SessionSpec{}, nil)
	_, err := s.Exec(context.Background(), req(ws, 10*time.Second, "sh", "-c", "yes | head -c 100000"))
	var le *sandbox.OutputLimitError
	if !errors.As(err, &le) {
		t.Fatalf("%v", err)
	}
}

func TestCloseEndsExecs(t *testing.T) {
	s, ws := newSession(t, kit.ProviderOptions{}, sandbox.SessionSpec{}, nil)
	ctx := context.Background()
	h, err := s.ExecStart(ctx, req(ws, time.Minute, "sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := s.Exec(ctx, req(ws, time.Minute, "sleep", "60"))
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	procs, first := s.Close()
	if !first || len(procs) != 2 {
		t.Fatalf("Close: %d procs, first %v", len(procs), first)
	}
	var nf *sandbox.SessionNotFoundError
	if err := <-errc; !errors.As(err, &nf) {
		t.Errorf("exec: %v", err)
	}
	for {
		_, err := h.Next(ctx)
		if err != nil {
			if !errors.As(err, &nf) {
				t.Errorf("handle: %v", err)
			}
			break
		}
	}
	if err := WaitEnded(procs, 5*time.Second); err != nil {
		t.Error(err)
	}
	if _, err := s.Exec(ctx, req(ws, time.Second, "true")); !errors.As(err, &nf) {
		t.Errorf("exec after close: %v", err)
	}
	if _, err := s.GetFile(ctx, kit.Path{Rel: "x", Abs: ws + "/x", Orig: "x"}); !errors.As(err, &nf) {
		t.Errorf("get after close: %v", err)
	}
	if _, first := s.Close(); first {
		t.Error("second Close is first")
	}
}

func TestOOMReport(t *testing.T) {
	var kills int64
	s, ws := newSession(t, kit.ProviderOptions{}, sandbox.SessionSpec{MemoryMB: 64}, func() int64 { return kills })
	ctx := context.Background()
	// A SIGKILL the count did not see is not the limit's.
	res, err := s.Exec(ctx, req(ws, 10*time.Second, "sh", "-c", "kill -9 $$"))
	if err != nil || res.ExitCode != 137 || strings.Contains(string(res.Stderr), "memory limit") {
		t.Fatalf("%v %d %q", err, res.ExitCode, res.Stdout)
	}
	// One it saw is reported: the count grows during the exec.
	s.cfg.OOMKills = func() int64 { kills++; return kills }
	res, err = s.Exec(ctx, req(ws, 10*time.Second, "sh", "-c", "kill -9 $$"))
	if err != nil || res.ExitCode != 137 || !strings.Contains(string(res.Stderr), "memory limit (memory_mb=64)") {
		t.Fatalf("%v %d %q", err, res.ExitCode, res.Stdout)
	}
}

func TestFiles(t *testing.T) {
	s, ws := newSession(t, kit.ProviderOptions{}, sandbox.SessionSpec{}, nil)
	ctx := context.Background()
	p := kit.Path{Rel: "d/f", Abs: ws + "/d/f", Orig: "d/f"}
	if err := s.PutFileFrom(ctx, s.FileRef(p), strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetFile(ctx, p)
	if err != nil || string(b) != "hello" {
		t.Fatalf("%v %q", err, b)
	}
	var fnf *sandbox.FileNotFoundError
	if _, err := s.GetFile(ctx, kit.Path{Rel: "nope", Abs: ws + "/nope", Orig: "nope"}); !errors.As(err, &fnf) {
		t.Errorf("missing: %v", err)
	}
	if ref := s.FileRef(kit.Path{Abs: "/etc/hostname", Orig: "/etc/hostname"}); ref.Root != "/" || ref.Rel != "etc/hostname" {
		t.Errorf("outside ref %+v", ref)
	}
}

// TestExecEnvReplacesBase: a variable the exec gives replaces the base
// environment's, in one entry. With both in the environment the process
// got the first (the base's: the image's PATH won silently over the
// caller's).
func TestExecEnvReplacesBase(t *testing.T) {
	s, ws := newSession(t, kit.ProviderOptions{}, sandbox.SessionSpec{}, nil)
	path := "/nonexistent-tai42-bin:" + os.Getenv("PATH")
	r := req(ws, 10*time.Second, "env")
	r.Env = map[string]sandbox.Secret{"PATH": sandbox.NewSecret(path), "BASE": sandbox.NewSecret("mine")}
	res, err := s.Exec(context.Background(), r)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("env: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
	}
	got := map[string][]string{}
	for line := range strings.Lines(string(res.Stdout)) {
		if k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "="); ok {
			got[k] = append(got[k], v)
		}
	}
	for k, want := range map[string]string{"PATH": path, "BASE": "mine"} {
		if len(got[k]) != 1 || got[k][0] != want {
			t.Errorf("%s in the process's environment: %q, want the exec's %q alone", k, got[k], want)
		}
	}
}
