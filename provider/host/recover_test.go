package host_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/ledger"
	"github.com/tai42/sandbox/provider/host"
)

// crashState is what the crash helper made, as it reports it.
type crashState struct {
	Live, Pers, Short, Leftover string
	Pids                        []int // processes of running execs and left behind
}

func openDurable(dir string) (*ledger.DB, error) {
	if err := os.MkdirAll(filepath.Join(dir, "host"), 0o700); err != nil {
		return nil, err
	}
	return ledger.Open(filepath.Join(dir, "host", ledger.FileName))
}

// crashHelper runs in a child process (TAI42_HOST_TEST_HELPER=crash): on
// the state directory $TAI42_CRASH_DIR it makes sessions with a durable
// ledger, starts execs and leaves a process behind, prints what it made
// as one JSON line and waits to be killed.
func crashHelper() int {
	dir := os.Getenv("TAI42_CRASH_DIR")
	fail := func(err error) int { fmt.Println("ERROR", err); return 1 }
	l, err := openDurable(dir)
	if err != nil {
		return fail(err)
	}
	sb, err := host.New(host.Options{Options: kit.Options{Policy: openPolicy, ReapInterval: -1, Ledger: l}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	var st crashState
	mk := func(spec sandbox.SessionSpec) sandbox.Session {
		s, err := sb.CreateSession(ctx, spec)
		if err != nil {
			panic(err)
		}
		return s
	}
	live := hostSpec(sandbox.NetworkNone)
	live.Env = sandbox.SecretEnv(map[string]string{"GREETING": "hello"})
	sl := mk(live)
	st.Live = sl.ID()
	pers := hostSpec(sandbox.NetworkEgress)
	pers.Durability, pers.WorkspaceKey = sandbox.Persistent, "crash-key"
	sp := mk(pers)
	st.Pers = sp.ID()
	short := hostSpec(sandbox.NetworkEgress)
	short.TTLSeconds = 1
	st.Short = mk(short).ID()
	left := mk(hostSpec(sandbox.NetworkEgress))
	st.Leftover = left.ID()
	if err := sl.PutFile(ctx, "kept.txt", []byte("ephemeral content")); err != nil {
		return fail(err)
	}
	if err := sp.PutFile(ctx, "dir/pers.txt", []byte("persistent content")); err != nil {
		return fail(err)
	}
	// A running exec in each, and a process left behind by setsid.
	for _, s := range []sandbox.Session{sl, sp} {
		h, err := s.ExecStart(ctx, []string{"sh", "-c", "echo $$; exec sleep 1000"}, sandbox.StartOptions{Timeout: time.Hour})
		if err != nil {
			return fail(err)
		}
		it, err := h.Next(ctx)
		ch, ok := it.(*sandbox.StreamChunk)
		if err != nil || !ok {
			return fail(fmt.Errorf("no pid from the exec: %v", err))
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(ch.Data)))
		if err != nil {
			return fail(err)
		}
		st.Pids = append(st.Pids, pid)
	}
	res, err := left.Exec(ctx, []string{"sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil {
		return fail(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil {
		return fail(fmt.Errorf("setsid pid %q: %v", res.Stdout, err))
	}
	st.Pids = append(st.Pids, pid)
	b, _ := json.Marshal(st)
	fmt.Println(string(b))
	select {}
}

// TestRecoverAfterKill: a runner killed with SIGKILL, and a new one on its
// state directory with its durable ledger: the live sessions come back
// (same id, workspace, env, files; exec works), the expired one is reaped,
// the one whose resources were lost is dropped, every process of the
// killed runner's execs (and the one left behind) is gone, and nothing is
// left on the machine that no session owns.
func TestRecoverAfterKill(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the runner tracks processes in a cgroup v2 group, and network none needs a namespace")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TAI42_HOST_TEST_HELPER=crash", "TAI42_CRASH_DIR="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var st crashState
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || json.Unmarshal([]byte(line), &st) != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the helper said %q (%v)", line, err)
	}
	t.Cleanup(func() {
		for _, pid := range st.Pids {
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, pid := range st.Pids {
		if !alive(pid) {
			t.Fatalf("process %d ended with the runner; the test needs it to outlive it", pid)
		}
	}
	// The leftover session's workspace is lost while the runner is down.
	if err := os.RemoveAll(filepath.Join(dir, "host", "sessions", st.Leftover)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the short session expires

	l, err := openDurable(dir)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := host.New(host.Options{Options: kit.Options{Policy: openPolicy, ReapInterval: -1, Ledger: l}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			sb.Close(context.Background())
		}
	})
	ctx := context.Background()
	for _, pid := range st.Pids {
		if alive(pid) {
			t.Errorf("process %d of the killed runner's sessions is still running", pid)
		}
	}
	list, err := sb.ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range list {
		ids = append(ids, in.ID)
	}
	want := []string{st.Live, st.Pers}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("listed %q; want %q (the live and persistent sessions)", ids, want)
	}
	if sb.ReapedCount() != 1 {
		t.Errorf("reaped %d; want 1 (the expired session)", sb.ReapedCount())
	}
	for _, gone := range []string{st.Short, st.Leftover} {
		if _, err := sb.GetSession(ctx, gone); err == nil {
			t.Errorf("session %s is back", gone)
		}
	}
	sl, err := sb.GetSession(ctx, st.Live)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sl.Exec(ctx, []string{"sh", "-c", "cat kept.txt; echo \" $GREETING\"; pwd"}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wantOut := "ephemeral content hello\n" + filepath.Join(dir, "host", "sessions", st.Live) + "\n"
	if string(res.Stdout) != wantOut || res.ExitCode != 0 {
		t.Errorf("exec in the recovered session: %q (exit %d, stderr %q); want %q", res.Stdout, res.ExitCode, res.Stderr, wantOut)
	}
	// Network none holds after the restart: no interface but loopback.
	res, err = sl.Exec(ctx, []string{"sh", "-c", "tail -n +3 /proc/self/net/dev | cut -d: -f1 | tr -d ' '"}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "lo" {
		t.Errorf("interfaces in the recovered none session: %q %v", res.Stdout, err)
	}
	sp, err := sb.GetSession(ctx, st.Pers)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := sp.GetFile(ctx, "dir/pers.txt"); err != nil || string(b) != "persistent content" {
		t.Errorf("the persistent file: %q %v", b, err)
	}
	// Nothing of the dropped sessions is left.
	for _, gone := range []string{st.Short, st.Leftover} {
		for _, p := range []string{
			filepath.Join(dir, "host", "sessions", gone),
			filepath.Join(dir, "host", "tmp", gone),
			filepath.Join(dir, "host", "locks", gone+".lock"),
			filepath.Join("/sys/fs/cgroup/unified/tai42-host", gone),
		} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s is left", p)
			}
		}
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, id := range []string{st.Live, st.Pers, st.Short, st.Leftover} {
		for _, p := range []string{
			filepath.Join(dir, "host", "sessions", id),
			filepath.Join(dir, "host", "tmp", id),
			filepath.Join(dir, "host", "locks", id+".lock"),
			filepath.Join("/sys/fs/cgroup/unified/tai42-host", id),
		} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("after Close %s is left", p)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "host", "workspaces", "crash-key", "dir", "pers.txt")); err != nil || string(b) != "persistent content" {
		t.Errorf("the persistent workspace after Close: %q %v", b, err)
	}
	l2, err := openDurable(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if recs, _ := l2.Load(ctx); len(recs) != 0 {
		t.Errorf("the ledger keeps %d records after Close", len(recs))
	}
}
