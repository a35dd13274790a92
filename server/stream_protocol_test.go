package server

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox/api"
)

// checkViolation checks that a stream ended with a bad_request error frame
// whose message holds every one of mention, and the close status want.
func checkViolation(t *testing.T, r *result, want websocket.StatusCode, mention ...string) {
	t.Helper()
	if r.last.Type != api.FrameError || r.last.Error == nil || r.last.Error.Kind != api.KindBadRequest {
		t.Fatalf("last frame %+v (close %v), want a bad_request error frame", r.last, r.closeErr)
	}
	for _, m := range mention {
		if !strings.Contains(r.last.Error.Message, m) {
			t.Errorf("message %q does not mention %q", r.last.Error.Message, m)
		}
	}
	if r.closeStatus != want {
		t.Errorf("close %v (%v), want %d", r.closeStatus, r.closeErr, want)
	}
}

// TestStreamKillBehindPipelinedStdin: a client may send up to 2 MiB of
// stdin ahead of its acks; a kill frame behind it is read and acked at
// once, even though the exec reads none of it. (Review finding: the reader
// blocked on the full stdin queue and never read the kill.)
func TestStreamKillBehindPipelinedStdin(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	arg := uniqueSleep(t, 60)
	w.start([]string{"sleep", arg}, 60, nil)
	w.expectStarted()
	waitProcs(t, arg, true, 5*time.Second)
	chunk := make([]byte, api.MaxStdinFrame)
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(1, chunk))
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(2, chunk)) // 2 MiB unacked: the limit, not past it
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(3, nil))
	w.sendJSON(api.Frame{Type: api.FrameCloseStdin, ID: 4})
	begin := time.Now()
	w.sendJSON(api.Frame{Type: api.FrameKill, ID: 99})
	r := w.readToEnd(10 * time.Second)
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("the kill took %v", d)
	}
	checkExit(t, r, 137)
	i := slices.IndexFunc(r.acks, func(a api.Frame) bool { return a.ID == 99 })
	if i < 0 || r.acks[i].Error != nil {
		t.Errorf("kill ack: %+v", r.acks)
	}
	waitProcs(t, arg, false, 2*time.Second)
}

// TestStreamStdinOverLimit: more than 2 MiB of stdin, or more than 1024
// stdin and close_stdin frames, received and not yet acked is a protocol
// violation: a bad_request error frame saying so, the exec killed, close
// 1008, promptly (the kill frame behind does not wait either).
func TestStreamStdinOverLimit(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	for _, c := range []struct {
		name    string
		send    func(w wsClient)
		mention []string
	}{
		{"bytes", func(w wsClient) {
			chunk := make([]byte, api.MaxStdinFrame)
			for i := uint64(1); i <= 4; i++ {
				w.sendRaw(websocket.MessageBinary, api.StdinFrame(i, chunk))
			}
		}, []string{"stdin frame 3", strconv.Itoa(stdinQueueBytes), "2 MiB", "wait for acks"}},
		{"frames", func(w wsClient) {
			// The first frame fills the pipe and holds the worker: the
			// empty frames behind it wait unacked.
			w.sendRaw(websocket.MessageBinary, api.StdinFrame(1, make([]byte, api.MaxStdinFrame)))
			for i := uint64(2); i <= stdinQueueFrames+10; i++ {
				w.sendRaw(websocket.MessageBinary, api.StdinFrame(i, nil))
			}
		}, []string{strconv.Itoa(stdinQueueFrames), "wait for acks"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := wsClient{t, e.dial(id, nil)}
			arg := uniqueSleep(t, 60)
			w.start([]string{"sleep", arg}, 60, nil)
			w.expectStarted()
			waitProcs(t, arg, true, 5*time.Second)
			begin := time.Now()
			c.send(w)
			w.sendJSON(api.Frame{Type: api.FrameKill, ID: 99999})
			r := w.readToEnd(10 * time.Second)
			if d := time.Since(begin); d > 5*time.Second {
				t.Errorf("the violation took %v", d)
			}
			checkViolation(t, r, websocket.StatusPolicyViolation, c.mention...)
			waitProcs(t, arg, false, 2*time.Second)
			e.healthy()
		})
	}
}

// TestStreamStdinWindow: a client that keeps exactly 2 MiB of stdin ahead
// of its acks, sending the next frame as soon as an ack comes, never
// crosses the limit: the server frees a frame's room before its ack
// leaves.
func TestStreamStdinWindow(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"wc", "-c"}, 60, nil)
	w.expectStarted()
	const total = 24
	chunk := bytes.Repeat([]byte("q"), api.MaxStdinFrame)
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(1, chunk))
	w.sendRaw(websocket.MessageBinary, api.StdinFrame(2, chunk))
	sent := 2
	for acked := 0; acked < total; {
		f, err := w.next(20 * time.Second)
		if err != nil {
			t.Fatalf("after %d acks: %v", acked, err)
		}
		if f.binary || f.text.Type != api.FrameAck || f.text.Error != nil {
			t.Fatalf("after %d acks: frame %+v (error %+v)", acked, f, f.text.Error)
		}
		acked++
		if sent < total {
			sent++
			w.sendRaw(websocket.MessageBinary, api.StdinFrame(uint64(sent), chunk))
		}
	}
	w.sendJSON(api.Frame{Type: api.FrameCloseStdin, ID: total + 1})
	r := w.readToEnd(20 * time.Second)
	checkExit(t, r, 0)
	if got := strings.TrimSpace(r.stdout.String()); got != strconv.Itoa(total*api.MaxStdinFrame) {
		t.Errorf("wc says %q", got)
	}
}

// TestStreamFrameIDZero: frame ids start at 1; a stdin, close_stdin or
// kill frame with id 0, or without an id (which is id 0 on the wire), is
// a protocol violation.
func TestStreamFrameIDZero(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	for _, c := range []struct {
		name string
		typ  websocket.MessageType
		data []byte
	}{
		{"stdin id 0", websocket.MessageBinary, api.StdinFrame(0, []byte("x"))},
		{"close_stdin id 0", websocket.MessageText, []byte(`{"type":"close_stdin","id":0}`)},
		{"close_stdin without id", websocket.MessageText, []byte(`{"type":"close_stdin"}`)},
		{"kill id 0", websocket.MessageText, []byte(`{"type":"kill","id":0}`)},
		{"kill without id", websocket.MessageText, []byte(`{"type":"kill"}`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			arg := uniqueSleep(t, 30)
			w := wsClient{t, e.dial(id, nil)}
			w.start([]string{"sleep", arg}, 60, nil)
			w.expectStarted()
			waitProcs(t, arg, true, 5*time.Second)
			w.sendRaw(c.typ, c.data)
			r := w.readToEnd(10 * time.Second)
			checkViolation(t, r, websocket.StatusPolicyViolation, "frame ids start at 1")
			if len(r.acks) != 0 {
				t.Errorf("acks %+v", r.acks)
			}
			waitProcs(t, arg, false, 2*time.Second)
		})
	}
}

// TestStreamOversizedFrame: a client frame over api.MaxClientFrame gets a
// bad_request error frame naming the limit, then the close 1009 (message
// too big); the exec is killed.
func TestStreamOversizedFrame(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	limit := strconv.Itoa(api.MaxClientFrame)
	big := func(n int) []byte { return append(api.StdinFrame(1, nil), make([]byte, n-9)...) }
	for _, c := range []struct {
		name    string
		first   bool // the oversized frame is the first one, instead of a start
		typ     websocket.MessageType
		data    []byte
		mention string
	}{
		{"stdin", false, websocket.MessageBinary, big(api.MaxClientFrame + 1), "binary"},
		{"much larger stdin", false, websocket.MessageBinary, big(3 * api.MaxClientFrame), "binary"},
		{"text", false, websocket.MessageText, bytes.Repeat([]byte(" "), api.MaxClientFrame+1), "text"},
		{"start", true, websocket.MessageText, []byte(`{"type":"start","argv":["` + strings.Repeat("a", api.MaxClientFrame) + `"],"timeout_seconds":5}`), "text"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := wsClient{t, e.dial(id, nil)}
			arg := uniqueSleep(t, 30)
			if !c.first {
				w.start([]string{"sleep", arg}, 60, nil)
				w.expectStarted()
				waitProcs(t, arg, true, 5*time.Second)
			}
			w.sendRaw(c.typ, c.data)
			r := w.readToEnd(10 * time.Second)
			checkViolation(t, r, websocket.StatusMessageTooBig, limit, c.mention)
			waitProcs(t, arg, false, 2*time.Second)
			e.healthy()
		})
	}

	// A frame at the limit is no violation.
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"wc", "-c"}, 10, nil)
	w.expectStarted()
	w.sendRaw(websocket.MessageBinary, big(api.MaxClientFrame))
	w.sendJSON(api.Frame{Type: api.FrameCloseStdin, ID: 2})
	r := w.readToEnd(10 * time.Second)
	checkExit(t, r, 0)
	if got := strings.TrimSpace(r.stdout.String()); got != strconv.Itoa(api.MaxStdinFrame) {
		t.Errorf("wc says %q", got)
	}
}

// TestStreamOversizedFrameStalled: a client that sends more than the limit
// of a frame, then nothing more of it, still gets the error frame, and the
// stream ends within its bounds (the rest of the frame is not waited for).
func TestStreamOversizedFrameStalled(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	w := wsClient{t, e.dial(id, nil)}
	arg := uniqueSleep(t, 30)
	w.start([]string{"sleep", arg}, 60, nil)
	w.expectStarted()
	waitProcs(t, arg, true, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wr, err := w.c.Writer(ctx, websocket.MessageBinary)
	if err != nil {
		t.Fatal(err)
	}
	// More than the limit reaches the server (the writer may keep some
	// bytes in its buffer until the message is finished), and the message
	// is never finished.
	if _, err := wr.Write(append(api.StdinFrame(1, nil), make([]byte, api.MaxClientFrame+256<<10)...)); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	f, err := w.next(10 * time.Second)
	if err != nil || f.binary || f.text.Type != api.FrameError || f.text.Error == nil || f.text.Error.Kind != api.KindBadRequest ||
		!strings.Contains(f.text.Error.Message, strconv.Itoa(api.MaxClientFrame)) {
		t.Fatalf("frame %+v (error %+v), %v; want the bad_request error frame", f, f.text.Error, err)
	}
	waitProcs(t, arg, false, 2*time.Second)
	waitFor(t, 3*closeTimeout, "the stream's end", func() bool { return e.srv.inflight.count() == 0 })
	t.Logf("the stream ended %v after the error frame", time.Since(begin))
	e.healthy()
}
