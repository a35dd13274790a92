package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func TestPing(t *testing.T) {
	a := startAgent(t)
	if err := a.c.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// An agent answers a request of another version with an error naming both.
func TestVersionMismatchAgentSide(t *testing.T) {
	a := startAgent(t)
	for _, op := range []string{"ping", "exec", "put"} {
		fc := a.rawConn(t)
		if err := fc.writeJSON(frameRequest, map[string]any{"v": 7, "op": op, "future": []int{1}}); err != nil {
			t.Fatal(err)
		}
		ef, err := fc.readJSON(frameReply, nil)
		if err != nil || ef == nil {
			t.Fatalf("%s: got (%v, %v), want an error frame", op, ef, err)
		}
		if want := fmt.Sprintf("versions %d to %d", minVersion, Version); ef.Kind != kindVersion || !strings.Contains(ef.Message, "version 7") || !strings.Contains(ef.Message, want) {
			t.Errorf("%s: error frame %+v, want kind version naming version 7 and %s", op, ef, want)
		}
		err = ef.toError("ping")
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != "ping" {
			t.Errorf("toError: %T %v, want a *sandbox.SandboxError of op ping", err, err)
		}
	}
}

// A client meeting an agent that answers with another version says so.
func TestVersionMismatchClientSide(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		fc := newFrameConn(nc)
		if _, _, err := fc.read(nil); err == nil {
			_ = fc.writeJSON(frameReply, pingReply{V: 7})
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	err = dialer(sock).Ping(context.Background())
	var se *sandbox.SandboxError
	want := fmt.Sprintf("the client pinged in version %d, the agent answered in version 7", minVersion)
	if !errors.As(err, &se) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Ping against a newer agent: %v, want a SandboxError saying %q", err, want)
	}
}

func TestPingUnreachable(t *testing.T) {
	c := dialer(filepath.Join(t.TempDir(), "none.sock"))
	err := c.Ping(context.Background())
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "cannot reach the agent") {
		t.Fatalf("Ping with no agent: %v", err)
	}
}

func TestExecEcho(t *testing.T) {
	a := startAgent(t)
	r, out, errOut := a.run(t, a.spec("/bin/echo", "hello", "world"))
	if r != (Result{ExitCode: 0, StatusKnown: true}) || out != "hello world\n" || errOut != "" {
		t.Fatalf("echo: %+v stdout %q stderr %q", r, out, errOut)
	}
	// PATH lookup, both streams.
	r, out, errOut = a.run(t, a.spec("sh", "-c", "echo out; echo err >&2; exit 3"))
	if r.ExitCode != 3 || !r.StatusKnown || r.Err != nil || out != "out\n" || errOut != "err\n" {
		t.Fatalf("sh: %+v stdout %q stderr %q", r, out, errOut)
	}
}

func TestExecExitCodes(t *testing.T) {
	a := startAgent(t)
	for _, tc := range []struct {
		script string
		code   int
	}{
		{"exit 0", 0}, {"exit 1", 1}, {"exit 255", 255},
		{"kill -9 $$", 128 + 9}, {"kill -TERM $$", 128 + 15},
	} {
		r, _, _ := a.run(t, a.spec("sh", "-c", tc.script))
		if r.ExitCode != tc.code || !r.StatusKnown || r.KilledBeforeExit || r.Err != nil {
			t.Errorf("%q: %+v, want exit %d", tc.script, r, tc.code)
		}
	}
}

// A command that cannot be started is a result (127 or 126 with the
// reason on stderr), not an error, and is done at once.
func TestExecStartFailures(t *testing.T) {
	a := startAgent(t)
	noExec := filepath.Join(a.ws, "bin", "noexec")
	if err := os.MkdirAll(filepath.Dir(noExec), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	withPath := func(s ExecSpec) ExecSpec { s.Env = []string{"PATH=" + filepath.Dir(noExec)}; return s }
	for _, tc := range []struct {
		spec   ExecSpec
		code   int
		stderr string
	}{
		{a.spec("no-such-command-tai42"), 127, "tai42: no-such-command-tai42: command not found\n"},
		{a.spec("./missing"), 127, "tai42: ./missing: no such file or directory\n"},
		{withPath(a.spec("noexec")), 126, fmt.Sprintf("tai42: %s: permission denied (not executable)\n", noExec)},
		{a.spec(noExec), 126, fmt.Sprintf("tai42: %s: cannot execute: permission denied\n", noExec)},
		{a.spec("/tmp"), 126, "tai42: /tmp: cannot execute: permission denied\n"},
		{ExecSpec{Argv: []string{"true"}, Dir: a.ws}, 127, "tai42: true: command not found\n"}, // no PATH
	} {
		col := newCollector()
		p, err := a.c.Start(context.Background(), tc.spec, col.out)
		if err != nil {
			t.Fatalf("%q: Start: %v", tc.spec.Argv, err)
		}
		select {
		case <-p.Done():
		default:
			t.Fatalf("%q: a command that cannot be started is not done at once", tc.spec.Argv)
		}
		<-p.Exited()
		r := p.Result()
		if r.ExitCode != tc.code || !r.StatusKnown || r.Err != nil || col.stderr() != tc.stderr || col.stdout() != "" {
			t.Errorf("%q: %+v stderr %q, want %d %q", tc.spec.Argv, r, col.stderr(), tc.code, tc.stderr)
		}
		if _, err := p.WriteStdin(context.Background(), []byte("x")); !errors.Is(err, ErrExited) {
			t.Errorf("%q: WriteStdin: %v, want ErrExited", tc.spec.Argv, err)
		}
		if err := p.Kill(false); err != nil {
			t.Errorf("Kill: %v", err)
		}
		p.Close()
	}
}

func TestExecCwdErrors(t *testing.T) {
	a := startAgent(t)
	if err := os.WriteFile(filepath.Join(a.ws, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir, orig, msg string
	}{
		{filepath.Join(a.ws, "sub"), "sub", `sandbox: exec_start: cwd "sub" does not exist in the workspace`},
		{filepath.Join(a.ws, "file"), "file", `sandbox: exec_start: cwd "file" is not a directory`},
		{filepath.Join(a.ws, "file", "x"), "file/x", `sandbox: exec_start: cwd "file/x" does not exist in the workspace`},
	} {
		for _, interactive := range []bool{false, true} {
			s := a.spec("true")
			s.Op, s.Dir, s.DirOrig, s.Interactive = "exec_start", tc.dir, tc.orig, interactive
			p, err := a.c.Start(context.Background(), s, nil)
			var se *sandbox.SandboxError
			if p != nil || !errors.As(err, &se) || se.Op != "exec_start" || err.Error() != tc.msg {
				t.Errorf("cwd %q: (%v, %v), want %q", tc.orig, p, err, tc.msg)
			}
		}
	}
}

// The command's environment is exactly the request's: nothing of the
// agent's own leaks in.
func TestExecEnvExact(t *testing.T) {
	t.Setenv("TAI42_AGENT_OWN_SECRET", "do-not-leak")
	a := startAgent(t)
	env := []string{"PATH=" + testPath, "A=1", "B=two words", "EMPTY=", "UNI=héllo"}
	s := a.spec("/usr/bin/env")
	s.Env = env
	r, out, _ := a.run(t, s)
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	slices.Sort(got)
	want := slices.Clone(env)
	slices.Sort(want)
	if r.ExitCode != 0 || !slices.Equal(got, want) {
		t.Fatalf("env: %+v %q, want exactly %q", r, got, want)
	}
	s.Env = nil
	r, out, _ = a.run(t, s)
	if r.ExitCode != 0 || out != "" {
		t.Fatalf("no env: %+v %q, want an empty environment", r, out)
	}
}

// Bytes that are not UTF-8 pass through argv, env and the cwd intact.
func TestExecNonUTF8(t *testing.T) {
	a := startAgent(t)
	dir := filepath.Join(a.ws, "d\xfe")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := a.spec("sh", "-c", `printf '%s|%s|' "$1" "$X"; pwd`, "sh", "a\xffb")
	s.Env = append(s.Env, "X=\xc3\x28")
	s.Dir, s.DirOrig = dir, "d\xfe"
	r, out, errOut := a.run(t, s)
	want := "a\xffb|\xc3\x28|" + dir + "\n"
	if r.ExitCode != 0 || out != want {
		t.Fatalf("%+v stdout %q stderr %q, want %q", r, out, errOut, want)
	}
}

func TestExecStdin(t *testing.T) {
	a := startAgent(t)
	in := make([]byte, 3<<20+17) // several data frames
	if _, err := rand.Read(in); err != nil {
		t.Fatal(err)
	}
	s := a.spec("cat")
	s.Stdin = in
	r, out, _ := a.run(t, s)
	if r.ExitCode != 0 || out != string(in) {
		t.Fatalf("cat: %+v, %d bytes out, want the %d bytes in", r, len(out), len(in))
	}
	// No stdin: /dev/null.
	r, out, _ = a.run(t, a.spec("sh", "-c", "cat; readlink /proc/self/fd/0"))
	if r.ExitCode != 0 || out != "/dev/null\n" {
		t.Fatalf("no stdin: %+v %q", r, out)
	}
	// A command that does not read its stdin still ends.
	s = a.spec("true")
	s.Stdin = in
	if r, _, _ := a.run(t, s); r.ExitCode != 0 || r.Err != nil {
		t.Fatalf("true with stdin: %+v", r)
	}
}

func writeRandom(t *testing.T, path string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// hashingOutput hashes each stream.
type hashingOutput struct {
	mu sync.Mutex
	h  [2]hashState
}

type hashState struct {
	n   int64
	sum interface {
		Write([]byte) (int, error)
		Sum([]byte) []byte
	}
}

func newHashingOutput() *hashingOutput {
	return &hashingOutput{h: [2]hashState{{sum: sha256.New()}, {sum: sha256.New()}}}
}

func (h *hashingOutput) out(stream int, b []byte) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.h[stream].n += int64(len(b))
	_, _ = h.h[stream].sum.Write(b)
	return true
}

func TestExecLargeOutputBothStreams(t *testing.T) {
	a := startAgent(t)
	big := writeRandom(t, filepath.Join(a.ws, "big"), 64<<20)
	small := writeRandom(t, filepath.Join(a.ws, "small"), 5<<20+3)
	for _, interactive := range []bool{false, true} {
		h := newHashingOutput()
		s := a.spec("sh", "-c", "cat big & cat small >&2; wait")
		s.Interactive = interactive
		p, err := a.c.Start(context.Background(), s, h.out)
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, p, 60*time.Second)
		p.Close()
		if r := p.Result(); r.ExitCode != 0 || r.Err != nil || r.Held {
			t.Fatalf("interactive=%v: %+v", interactive, r)
		}
		for i, want := range [][]byte{big, small} {
			sum := sha256.Sum256(want)
			if h.h[i].n != int64(len(want)) || !bytes.Equal(h.h[i].sum.Sum(nil), sum[:]) {
				t.Errorf("interactive=%v stream %d: %d bytes, want %d byte-exact", interactive, i, h.h[i].n, len(want))
			}
		}
	}
}

// An Output that blocks stops the command: its output does not grow
// while the client does not take it.
func TestBackPressure(t *testing.T) {
	a := startAgent(t)
	pidFile := filepath.Join(a.ws, "pid")
	gate := make(chan struct{})
	var got atomic.Int64
	out := func(stream int, b []byte) bool {
		if stream == 0 {
			<-gate
		}
		got.Add(int64(len(b)))
		return true
	}
	for _, interactive := range []bool{false, true} {
		os.Remove(pidFile)
		s := a.spec("sh", "-c", `echo $$ > pid; exec head -c 4294967296 /dev/zero`)
		s.Interactive = interactive
		gate = make(chan struct{})
		p, err := a.c.Start(context.Background(), s, out)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if b, err := os.ReadFile(pidFile); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
				pid = pids(t, string(b))[0]
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the command did not start")
			}
		}
		wchar := func() int64 {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
			if err != nil {
				t.Fatalf("the command ended while its output was blocked: %v", err)
			}
			var n int64
			for line := range strings.Lines(string(b)) {
				if v, ok := strings.CutPrefix(line, "wchar: "); ok {
					_, _ = fmt.Sscan(v, &n)
				}
			}
			return n
		}
		time.Sleep(time.Second)
		w1 := wchar()
		time.Sleep(300 * time.Millisecond)
		w2 := wchar()
		if w1 != w2 || w1 > 32<<20 {
			t.Errorf("interactive=%v: the command wrote %d then %d bytes while the output was blocked; want it stopped, under 32 MiB", interactive, w1, w2)
		}
		if err := p.Kill(false); err != nil {
			t.Fatal(err)
		}
		close(gate)
		waitDone(t, p, 10*time.Second)
		p.Close()
		if r := p.Result(); r.ExitCode != 137 || !r.KilledBeforeExit || r.Err != nil {
			t.Errorf("interactive=%v: %+v, want 137 killed", interactive, r)
		}
		waitGone(t, 5*time.Second, pid)
	}
}

// Output returning false kills the exec and gets no more output.
func TestOutputLimit(t *testing.T) {
	a := startAgent(t)
	var got atomic.Int64
	var calls atomic.Int64
	out := func(_ int, b []byte) bool {
		calls.Add(1)
		return got.Add(int64(len(b))) <= 1<<20
	}
	p, err := a.c.Start(context.Background(), a.spec("head", "-c", "1000000000", "/dev/zero"), out)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 10*time.Second)
	p.Close()
	r := p.Result()
	if r.ExitCode != 137 || !r.KilledBeforeExit || r.Err != nil {
		t.Fatalf("%+v, want killed", r)
	}
	if n := got.Load(); n > 1<<20+maxData {
		t.Errorf("out got %d bytes, more than one unit past the limit", n)
	}
}

func TestKillStopAndDrain(t *testing.T) {
	a := startAgent(t)
	const size = 1000000 // fits in the 1 MiB pipe: the command finishes writing
	for _, tc := range []struct {
		drain       bool
		interactive bool
	}{{true, false}, {false, false}, {true, true}, {false, true}} {
		marker := filepath.Join(a.ws, "written")
		os.Remove(marker)
		gate := make(chan struct{})
		var got atomic.Int64
		first := true
		out := func(_ int, b []byte) bool {
			if first {
				first = false
				<-gate
			}
			got.Add(int64(len(b)))
			return true
		}
		s := a.spec("sh", "-c", fmt.Sprintf("head -c %d /dev/zero; echo $$ > written.tmp; mv written.tmp written; exec sleep 60", size))
		s.Interactive = tc.interactive
		p, err := a.c.Start(context.Background(), s, out)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if b, err := os.ReadFile(marker); err == nil {
				pid = pids(t, string(b))[0]
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the command did not write its output")
			}
		}
		start := time.Now()
		if err := p.Kill(tc.drain); err != nil {
			t.Fatal(err)
		}
		// The output is blocked: for a non-interactive exec the exited
		// notice waits behind it, so watch the process instead. The agent
		// stops reading right after it sends the signal.
		waitGone(t, 5*time.Second, pid)
		time.Sleep(50 * time.Millisecond)
		close(gate)
		waitDone(t, p, 5*time.Second)
		p.Close()
		r := p.Result()
		if r.ExitCode != 137 || !r.KilledBeforeExit || r.Err != nil || r.Held {
			t.Errorf("%+v: %+v, want 137, killed before exit", tc, r)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%+v: the kill took %v", tc, d)
		}
		if tc.drain && got.Load() != size {
			t.Errorf("%+v: drained %d bytes, want all %d", tc, got.Load(), size)
		}
		if !tc.drain && got.Load() >= size {
			t.Errorf("%+v: got all %d bytes after a stop kill, want reading stopped at once", tc, got.Load())
		}
	}
}

// After the command exits, a process it left holding the pipes keeps the
// output open for the grace only; Kill then ends that process, Close does
// not.
func TestGraceHeld(t *testing.T) {
	a := startAgent(t)
	for _, interactive := range []bool{false, true} {
		s := a.spec("sh", "-c", "sleep 30 & echo $!")
		s.Grace = 300 * time.Millisecond
		s.Interactive = interactive
		col := newCollector()
		start := time.Now()
		p, err := a.c.Start(context.Background(), s, col.out)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Exited():
		case <-time.After(5 * time.Second):
			t.Fatal("Exited was not closed")
		}
		exited := time.Since(start)
		waitDone(t, p, 5*time.Second)
		d := time.Since(start)
		r := p.Result()
		if r.ExitCode != 0 || !r.Held || r.KilledBeforeExit || r.Err != nil {
			t.Errorf("interactive=%v: %+v, want exit 0, held", interactive, r)
		}
		if d < exited+250*time.Millisecond || d > exited+3*time.Second {
			t.Errorf("interactive=%v: done %v after the exit, want about the grace (300ms)", interactive, d-exited)
		}
		left := pids(t, col.stdout())[0]
		if gone(left) {
			t.Fatalf("the left process %d is gone before the kill", left)
		}
		if interactive {
			if err := p.Kill(false); err != nil {
				t.Fatal(err)
			}
			waitGone(t, 5*time.Second, left)
			p.Close()
		} else {
			p.Close()
			time.Sleep(200 * time.Millisecond)
			if gone(left) {
				t.Errorf("Close after the end killed the process the command left")
			}
			killPid(left)
		}
	}
}

// Closing the control connection before the end kills the process group.
func TestConnectionDropKillsGroup(t *testing.T) {
	a := startAgent(t)
	for _, interactive := range []bool{false, true} {
		s := a.spec("sh", "-c", "sleep 60 & echo $$ $!; wait")
		s.Interactive = interactive
		col := newCollector()
		p, err := a.c.Start(context.Background(), s, col.out)
		if err != nil {
			t.Fatal(err)
		}
		col.waitFor(t, 0, "\n", 5*time.Second)
		ps := pids(t, col.stdout())
		p.Close()
		waitDone(t, p, 5*time.Second)
		if r := p.Result(); r.Err == nil || !strings.Contains(r.Err.Error(), "Close") {
			t.Errorf("interactive=%v: Result.Err = %v, want the Close named", interactive, r.Err)
		}
		waitGone(t, 5*time.Second, ps...)
	}
}

// An exec's Exited closes at the command's exit, before its output ends.
func TestExitedBeforeDone(t *testing.T) {
	a := startAgent(t)
	s := a.spec("sh", "-c", "sleep 30 & echo $!")
	s.Grace = 2 * time.Second
	s.Interactive = true
	col := newCollector()
	p, err := a.c.Start(context.Background(), s, col.out)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	select {
	case <-p.Exited():
	case <-time.After(3 * time.Second):
		t.Fatal("Exited did not close")
	}
	select {
	case <-p.Done():
		t.Fatal("Done closed while the left process holds the output within the grace")
	default:
	}
	if _, err := p.WriteStdin(context.Background(), []byte("x")); !errors.Is(err, ErrExited) {
		t.Errorf("WriteStdin after the exit: %v, want ErrExited", err)
	}
	col.waitFor(t, 0, "\n", 3*time.Second)
	left := pids(t, col.stdout())[0]
	if err := p.Kill(false); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 5*time.Second)
	if r := p.Result(); r.ExitCode != 0 || r.KilledBeforeExit || r.Held || r.Err != nil {
		t.Errorf("%+v, want the command's own exit 0 (the kill came after it)", r)
	}
	waitGone(t, 5*time.Second, left)
}

func TestConcurrentExecs(t *testing.T) {
	a := startAgent(t)
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			s := a.spec("sh", "-c", fmt.Sprintf("echo %d; echo e%d >&2; exit %d", i, i, i%7))
			s.Interactive = i%2 == 0
			col := newCollector()
			p, err := a.c.Start(context.Background(), s, col.out)
			if err != nil {
				t.Error(err)
				return
			}
			defer p.Close()
			<-p.Done()
			if r := p.Result(); r.ExitCode != i%7 || col.stdout() != fmt.Sprintf("%d\n", i) || col.stderr() != fmt.Sprintf("e%d\n", i) {
				t.Errorf("exec %d: %+v %q %q", i, r, col.stdout(), col.stderr())
			}
		})
	}
	wg.Wait()
}

// An interactive exec nobody attaches is killed.
func TestAttachTimeout(t *testing.T) {
	old := attachTimeout
	attachTimeout = 300 * time.Millisecond
	t.Cleanup(func() { attachTimeout = old })
	a := startAgent(t)
	fc := a.rawConn(t)
	if err := fc.writeJSON(frameRequest, request{V: Version, Op: "exec", Argv: []string{"/bin/sleep", "60"}, Dir: a.ws, Interactive: true}); err != nil {
		t.Fatal(err)
	}
	var rep startReply
	if ef, err := fc.readJSON(frameReply, &rep); err != nil || ef != nil || rep.ID == 0 {
		t.Fatalf("start: %+v %v %v", rep, ef, err)
	}
	start := time.Now()
	// The exited frame is left out when the output is over at the reap
	// (here: never attached, so never read).
	typ, p, err := fc.read(nil)
	if err == nil && typ == frameExited {
		typ, p, err = fc.read(nil)
	}
	var ex exitFrame
	if err != nil || typ != frameExit || json.Unmarshal(p, &ex) != nil {
		t.Fatalf("got frame %q %s (%v), want the exit frame", typ, p, err)
	}
	if ex.Code != 137 || !ex.Known || ex.Killed {
		t.Errorf("exit %+v, want 137 known, not killed by the client", ex)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("killed after %v, want about 300ms", d)
	}
	// A late attach is refused.
	oc := a.rawConn(t)
	if err := oc.writeJSON(frameRequest, request{V: Version, Op: "attach", ID: rep.ID}); err != nil {
		t.Fatal(err)
	}
	if ef, err := oc.readJSON(frameReply, nil); err != nil || ef == nil {
		t.Errorf("late attach: %v %v, want an error frame", ef, err)
	}
}

// A second attach to the same exec is refused.
func TestAttachOnce(t *testing.T) {
	a := startAgent(t)
	fc := a.rawConn(t)
	if err := fc.writeJSON(frameRequest, request{V: Version, Op: "exec", Argv: []string{"/bin/cat"}, Dir: a.ws, Interactive: true}); err != nil {
		t.Fatal(err)
	}
	var rep startReply
	if ef, err := fc.readJSON(frameReply, &rep); err != nil || ef != nil {
		t.Fatalf("start: %v %v", ef, err)
	}
	for i, wantOK := range []bool{true, false} {
		oc := a.rawConn(t)
		if err := oc.writeJSON(frameRequest, request{V: Version, Op: "attach", ID: rep.ID}); err != nil {
			t.Fatal(err)
		}
		ef, err := oc.readJSON(frameReply, nil)
		if err != nil || (ef == nil) != wantOK {
			t.Errorf("attach %d: %v %v, want ok=%v", i, ef, err, wantOK)
		}
	}
}

// Serve's end kills every exec and returns.
func TestServeShutdownKillsExecs(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, Options{}) }()
	c := dialer(sock)
	var ps []int
	var procs []*Proc
	for _, interactive := range []bool{false, true} {
		col := newCollector()
		p, err := c.Start(context.Background(), ExecSpec{Argv: []string{"/bin/sh", "-c", "echo $$; exec sleep 60"}, Dir: dir, Interactive: interactive}, col.out)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		col.waitFor(t, 0, "\n", 5*time.Second)
		ps = append(ps, pids(t, col.stdout())...)
		procs = append(procs, p)
	}
	// A left process of a finished exec.
	col := newCollector()
	p, err := c.Start(context.Background(), ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 60 & echo $!"}, Dir: dir, Grace: time.Millisecond}, col.out)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	p.Close()
	ps = append(ps, pids(t, col.stdout())...)

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	for _, p := range procs {
		waitDone(t, p, 5*time.Second)
	}
	waitGone(t, 5*time.Second, ps...)
}

// A malformed first frame gets a protocol error.
func TestProtocolErrors(t *testing.T) {
	a := startAgent(t)
	for _, tc := range []struct {
		typ     byte
		payload string
	}{
		{frameData, "x"},
		{frameRequest, "not json"},
		{frameRequest, `{"v":1,"op":"dance"}`},
		{frameRequest, `{"v":1,"op":"exec","argv":[],"dir":"/"}`},
		{frameRequest, `{"v":1,"op":"exec","argv":["true"],"dir":"/","user":"nobody"}`},
		{frameRequest, `{"v":1,"op":"get","root":"/workspace/../x","rel":"a"}`},
		{frameRequest, `{"v":1,"op":"get","root":"/","rel":"../a"}`},
	} {
		fc := a.rawConn(t)
		if err := fc.write(tc.typ, []byte(tc.payload)); err != nil {
			t.Fatal(err)
		}
		ef, err := fc.readJSON(frameReply, nil)
		if err != nil || ef == nil || ef.Kind != kindProtocol {
			t.Errorf("%q %s: %+v %v, want a protocol error frame", tc.typ, tc.payload, ef, err)
		}
	}
	// An oversized frame is refused by the reader.
	fc := a.rawConn(t)
	hdr := make([]byte, headerLen)
	putHeader(hdr, frameRequest, maxPayload+1)
	if _, err := fc.c.Write(hdr); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fc.read(nil); err == nil {
		t.Error("the agent answered an oversized frame")
	}
	// A request encodes with base64 strings when needed, and decodes back.
	r := request{Argv: []string{"a\xff"}, Rel: "ok", User: "nobody"}
	r.encodeBytes()
	b, _ := json.Marshal(r)
	var back request
	if err := json.Unmarshal(b, &back); err != nil || back.decodeBytes() != nil || back.Argv[0] != "a\xff" || back.Rel != "ok" || back.User != "nobody" {
		t.Errorf("base64 round trip: %+v", back)
	}
}

// Every fd the agent and client open is closed again.
func TestNoFDLeak(t *testing.T) {
	before := openFDs(t)
	a := startAgent(t)
	for _, interactive := range []bool{false, true} {
		s := a.spec("sh", "-c", "cat; echo done")
		s.Interactive = interactive
		s.Stdin = []byte("in")
		col := newCollector()
		p, err := a.c.Start(context.Background(), s, col.out)
		if err != nil {
			t.Fatal(err)
		}
		if interactive {
			if _, err := p.WriteStdin(context.Background(), []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := p.CloseStdin(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		waitDone(t, p, 5*time.Second)
		p.Close()
	}
	a.run(t, a.spec("no-such-command"))
	if _, err := a.c.Start(context.Background(), ExecSpec{Argv: []string{"true"}, Dir: "/nonexistent"}, nil); err == nil {
		t.Fatal("want a cwd error")
	}
	f := FileRef{Root: a.ws, Rel: "f", Orig: "f"}
	if err := a.c.PutFile(context.Background(), f, strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	rc, _, err := a.c.OpenFile(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if _, _, err := a.c.OpenFile(context.Background(), FileRef{Root: a.ws, Rel: "none", Orig: "none"}); err == nil {
		t.Fatal("want not found")
	}
	a.stop()
	// A descriptor may still be on its way to being closed by a goroutine
	// that is ending (a loaded machine): give it a moment, not forever.
	after := openFDs(t)
	for deadline := time.Now().Add(3 * time.Second); after != before && time.Now().Before(deadline); after = openFDs(t) {
		time.Sleep(20 * time.Millisecond)
	}
	if after != before {
		t.Fatalf("%d fds open before the agent, %d after it stopped", before, after)
	}
}
