package server

import (
	"bytes"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox/api"
)

func checkExit(t *testing.T, r *result, code int) {
	t.Helper()
	if r.last.Type != api.FrameExit || r.last.ExitCode == nil || *r.last.ExitCode != code {
		t.Fatalf("last frame %+v (exit code %v), want exit %d; stdout %q stderr %q (%d, %d bytes)", r.last, r.last.ExitCode, code,
			clip(r.stdout.Bytes()), clip(r.stderr.Bytes()), r.stdout.Len(), r.stderr.Len())
	}
	if r.closeStatus != websocket.StatusNormalClosure {
		t.Errorf("close %v (%v), want 1000", r.closeStatus, r.closeErr)
	}
}

// TestStreamEcho: stdin frames and close_stdin are applied in order and
// acked; the output comes back; the exit frame ends the stream.
func TestStreamEcho(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"cat"}, 10, nil)
	w.expectStarted()
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(1, []byte("hello\n")))
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(2, []byte("world\n")))
	w.sendJSON(api.Frame{Type: api.FrameCloseStdin, ID: 3})
	r := w.readToEnd(10 * time.Second)
	checkExit(t, r, 0)
	if r.stdout.String() != "hello\nworld\n" || r.stderr.Len() != 0 {
		t.Errorf("stdout %q stderr %q", r.stdout.String(), r.stderr.String())
	}
	var ids []uint64
	for _, a := range r.acks {
		if a.Error != nil {
			t.Errorf("ack %d: %+v", a.ID, a.Error)
		}
		ids = append(ids, a.ID)
	}
	if !slices.Equal(ids, []uint64{1, 2, 3}) {
		t.Errorf("acks %v", ids)
	}
}

// TestStreamOutput: stdout and stderr interleaved, the start's env, a
// non-zero exit, output larger than any buffer, large stdin.
func TestStreamOutput(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID

	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"sh", "-c", `echo "out1 $X"; echo err1 >&2; echo out2; echo err2 >&2; exit 4`}, 10, map[string]string{"X": "from-env"})
	w.expectStarted()
	r := w.readToEnd(10 * time.Second)
	checkExit(t, r, 4)
	if r.stdout.String() != "out1 from-env\nout2\n" || r.stderr.String() != "err1\nerr2\n" {
		t.Errorf("stdout %q stderr %q", r.stdout.String(), r.stderr.String())
	}

	const n = 9 << 20
	w = wsClient{t, e.dial(id, nil)}
	w.start([]string{"head", "-c", "9437184", "/dev/zero"}, 20, nil)
	w.expectStarted()
	r = w.readToEnd(20 * time.Second)
	checkExit(t, r, 0)
	if r.stdout.Len() != n || !bytes.Equal(r.stdout.Bytes(), make([]byte, n)) {
		t.Errorf("stdout %d bytes, want %d zeros", r.stdout.Len(), n)
	}

	// 3 MiB of stdin in full frames, counted by the exec: two frames ahead
	// of their acks (the 2 MiB the protocol allows), the third once the
	// first is acked.
	w = wsClient{t, e.dial(id, nil)}
	w.start([]string{"wc", "-c"}, 20, nil)
	w.expectStarted()
	chunk := bytes.Repeat([]byte("z"), api.MaxStdinFrame)
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(1, chunk))
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(2, chunk))
	if f, err := w.next(10 * time.Second); err != nil || f.binary || f.text.Type != api.FrameAck || f.text.ID != 1 || f.text.Error != nil {
		t.Fatalf("waiting for the ack of stdin frame 1: %+v %v", f, err)
	}
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(3, chunk))
	w.sendJSON(api.Frame{Type: api.FrameCloseStdin, ID: 4})
	r = w.readToEnd(20 * time.Second)
	checkExit(t, r, 0)
	if strings.TrimSpace(r.stdout.String()) != "3145728" || len(r.acks) != 3 {
		t.Errorf("wc says %q; %d acks after the first: %+v", r.stdout.String(), len(r.acks), r.acks)
	}
}

// TestStreamKill: a kill frame ends a long exec promptly with its exit
// frame, acked first, even while a stdin write waits on a full pipe.
func TestStreamKill(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	for _, blockedStdin := range []bool{false, true} {
		arg := uniqueSleep(t, 30)
		w := wsClient{t, e.dial(id, nil)}
		w.start([]string{"sleep", arg}, 60, nil)
		w.expectStarted()
		waitProcs(t, arg, true, 5*time.Second)
		if blockedStdin {
			// sleep never reads: the first frame fills the pipe and the
			// worker blocks on it; the second waits in the queue.
			big := make([]byte, api.MaxStdinFrame)
			w.sendRaw(websocket.MessageBinary, api.StdinFrame(1, big))
			w.sendRaw(websocket.MessageBinary, api.StdinFrame(2, big))
			time.Sleep(100 * time.Millisecond)
		}
		start := time.Now()
		w.sendJSON(api.Frame{Type: api.FrameKill, ID: 9})
		r := w.readToEnd(10 * time.Second)
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("the kill took %v", d)
		}
		checkExit(t, r, 137)
		i := slices.IndexFunc(r.acks, func(a api.Frame) bool { return a.ID == 9 })
		if i < 0 || r.acks[i].Error != nil {
			t.Errorf("kill ack: %+v", r.acks)
		}
		if r.order[len(r.order)-1] != api.FrameExit {
			t.Errorf("frames %v", r.order)
		}
		waitProcs(t, arg, false, 2*time.Second)
	}
}

// TestStreamTimeout: the server's deadline kills the exec and the stream
// ends with exec_timeout carrying the lengths and the exit status; a kill
// that comes after the deadline does not change that.
func TestStreamTimeout(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID

	arg := uniqueSleep(t, 30)
	w := wsClient{t, e.dial(id, nil)}
	start := time.Now()
	w.start([]string{"sh", "-c", "printf early; echo err >&2; sleep " + arg}, 0.3, nil)
	w.expectStarted()
	r := w.readToEnd(10 * time.Second)
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("the timeout came after %v", d)
	}
	checkTimeout(t, r, 5, 4)
	if r.stdout.String() != "early" || r.stderr.String() != "err\n" {
		t.Errorf("stdout %q stderr %q", r.stdout.String(), r.stderr.String())
	}
	waitProcs(t, arg, false, 2*time.Second)

	// A kill sent after the deadline: still the timeout, with the status.
	arg = uniqueSleep(t, 30)
	w = wsClient{t, e.dial(id, nil)}
	w.start([]string{"sleep", arg}, 0.3, nil)
	w.expectStarted()
	time.Sleep(600 * time.Millisecond)
	w.sendJSON(api.Frame{Type: api.FrameKill, ID: 1})
	r = w.readToEnd(10 * time.Second)
	checkTimeout(t, r, 0, 0)
	waitProcs(t, arg, false, 2*time.Second)
}

func checkTimeout(t *testing.T, r *result, stdoutLen, stderrLen int64) {
	t.Helper()
	f := r.last
	if f.Type != api.FrameError || f.Error == nil || f.Error.Kind != api.KindExecTimeout {
		t.Fatalf("last frame %+v, want an exec_timeout error", f)
	}
	if f.ExitCode == nil || *f.ExitCode != 137 {
		t.Errorf("exit_code %v, want 137", f.ExitCode)
	}
	if f.Error.TimeoutSeconds != 0.3 || f.Error.StdoutLen == nil || *f.Error.StdoutLen != stdoutLen ||
		f.Error.StderrLen == nil || *f.Error.StderrLen != stderrLen {
		t.Errorf("timeout error %+v (stdout_len %v, stderr_len %v)", f.Error, f.Error.StdoutLen, f.Error.StderrLen)
	}
	if r.closeStatus != websocket.StatusNormalClosure {
		t.Errorf("close %v", r.closeStatus)
	}
}

// TestStreamStartErrors: a start the sandbox refuses ends with its error
// frame and a normal close; a command that cannot be found exits 127.
func TestStreamStartErrors(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	for _, c := range []struct {
		name    string
		argv    []string
		timeout float64
		mention string
	}{
		{"empty argv", nil, 1, "argv"},
		{"no timeout", []string{"true"}, 0, "timeout"},
		{"negative timeout", []string{"true"}, -2, "timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := wsClient{t, e.dial(id, nil)}
			w.start(c.argv, c.timeout, nil)
			r := w.readToEnd(10 * time.Second)
			if r.last.Type != api.FrameError || r.last.Error.Kind != api.KindSandbox || !strings.Contains(r.last.Error.Message, c.mention) {
				t.Fatalf("last frame %+v", r.last)
			}
			if r.closeStatus != websocket.StatusNormalClosure {
				t.Errorf("close %v", r.closeStatus)
			}
		})
	}
	// A kill before the start is named as what it is.
	kw := wsClient{t, e.dial(id, nil)}
	kw.sendRaw(websocket.MessageText, []byte(`{"type":"kill","id":1}`))
	kr := kw.readToEnd(10 * time.Second)
	if kr.last.Error == nil || kr.last.Error.Kind != api.KindBadRequest || !strings.Contains(kr.last.Error.Message, `not "kill"`) {
		t.Errorf("a kill as the first frame: last frame %+v; want bad_request saying the first frame must be start, not kill", kr.last)
	}
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"no-such-command-xyz"}, 5, nil)
	w.expectStarted()
	r := w.readToEnd(10 * time.Second)
	checkExit(t, r, 127)
	if !strings.Contains(r.stderr.String(), "no-such-command-xyz") {
		t.Errorf("stderr %q", r.stderr.String())
	}
}

// TestStreamViolations: a frame of the wrong kind gets a bad_request error
// frame, the exec is killed, and the connection closes with 1008.
func TestStreamViolations(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	for _, c := range []struct {
		name    string
		typ     websocket.MessageType
		data    string
		mention string
	}{
		{"binary tag 0x05", websocket.MessageBinary, "\x05\x00\x00\x00\x00\x00\x00\x00\x01data", "0x05"},
		{"short binary", websocket.MessageBinary, "\x00\x01", "binary"},
		{"unknown type", websocket.MessageText, `{"type":"resize","id":1}`, "resize"},
		{"second start", websocket.MessageText, `{"type":"start","argv":["true"],"timeout_seconds":1}`, "start"},
		{"malformed JSON", websocket.MessageText, `{"type":`, "malformed"},
		{"unknown kill field", websocket.MessageText, `{"type":"kill","id":1,"signal":9}`, "signal"},
		{"wrong id type", websocket.MessageText, `{"type":"close_stdin","id":"one"}`, "id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			arg := uniqueSleep(t, 30)
			w := wsClient{t, e.dial(id, nil)}
			w.start([]string{"sleep", arg}, 60, nil)
			w.expectStarted()
			waitProcs(t, arg, true, 5*time.Second)
			w.sendRaw(c.typ, []byte(c.data))
			r := w.readToEnd(10 * time.Second)
			if r.last.Type != api.FrameError || r.last.Error == nil || r.last.Error.Kind != api.KindBadRequest {
				t.Fatalf("last frame %+v", r.last)
			}
			if !strings.Contains(r.last.Error.Message, c.mention) {
				t.Errorf("message %q does not mention %q", r.last.Error.Message, c.mention)
			}
			if r.closeStatus != websocket.StatusPolicyViolation {
				t.Errorf("close %v (%v), want 1008", r.closeStatus, r.closeErr)
			}
			var ce websocket.CloseError
			if asClose(r.closeErr, &ce) && ce.Reason == "" {
				t.Errorf("close without a reason")
			}
			if got := procsWith(t, arg); len(got) != 0 {
				t.Errorf("the exec's process is still there after the close: %v", got)
			}
			e.healthy()
		})
	}
}

// TestStreamClientVanishes: a client whose TCP connection drops without a
// close frame leaves no process behind, and the daemon keeps serving.
func TestStreamClientVanishes(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	marker := "marker-" + randHex(t)
	arg := uniqueSleep(t, 1000)
	d := &rawDialer{}
	tr := &http.Transport{DialContext: d.dial}
	defer tr.CloseIdleConnections()
	w := wsClient{t, e.dial(id, &http.Client{Transport: tr})}
	w.start([]string{"sh", "-c", "echo " + marker + "; sleep " + arg}, 60, nil)
	w.expectStarted()
	f, err := w.next(10 * time.Second)
	if err != nil || !f.binary || !bytes.Contains(f.data, []byte(marker)) {
		t.Fatalf("first output %+v %v", f, err)
	}
	waitProcs(t, arg, true, 5*time.Second)
	d.closeAll()
	waitProcs(t, arg, false, 5*time.Second)
	waitProcs(t, marker, false, 5*time.Second)
	e.healthy()
	waitIdle(t, e.srv)
	if !strings.Contains(e.logs.String(), `"exec_end":"client_gone"`) {
		t.Errorf("the stream's log line does not say the client is gone:\n%s", e.logs.String())
	}
}

func asClose(err error, ce *websocket.CloseError) bool { return errors.As(err, ce) }

// clip keeps a failure message short.
func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}
