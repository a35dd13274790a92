package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox/api"
)

// readLoop reads every client frame: the start first, then stdin,
// close_stdin and kill. Any read error means the client is gone. It never
// waits on anything but the client: stdin goes to an unbounded queue
// (bounded by the protocol's limit on stdin not yet acked, see enqueue).
func (st *execStream) readLoop() {
	defer close(st.discarded)
	var buf bytes.Buffer // reused: a frame's bytes are copied out before the next read
	for {
		typ, rd, err := st.conn.Reader(st.ioCtx)
		if err == nil {
			buf.Reset()
			// At most one byte over the limit: enough to tell an oversized
			// frame, never more of it in memory.
			_, err = buf.ReadFrom(io.LimitReader(rd, api.MaxClientFrame+1))
		}
		if err != nil {
			st.gone()
			return
		}
		data := buf.Bytes()
		st.bytesIn.Add(int64(len(data)))
		if len(data) > api.MaxClientFrame {
			st.tooBig(typ, rd)
			return
		}
		if !st.gotStart.Load() {
			req, msg := parseStart(typ, data)
			if msg != "" {
				st.violate(msg, false)
				return
			}
			st.gotStart.Store(true)
			select {
			case st.startCh <- req:
			case <-st.ctx.Done():
				return
			}
			select {
			case <-st.startedCh:
			case <-st.ctx.Done():
				return
			}
			if st.h == nil {
				return // the start failed: run ends the stream (its close reads the client's)
			}
			continue
		}
		if !st.handleFrame(typ, data) {
			return
		}
	}
}

// tooBig ends the stream for a frame over api.MaxClientFrame: an error
// frame of kind bad_request naming the limit, the exec killed, close 1009
// (message too big). While end sends the error frame the reader reads the
// rest of the frame and discards it; end waits for that before the close
// handshake, so that the handshake starts at a message boundary (its own
// skipping of a frame's rest has no time limit). The violation's drop
// timer (closeTimeout) bounds the read. When the stream's end was already
// decided the reader just stops, as after any violation then.
func (st *execStream) tooBig(typ websocket.MessageType, rd io.Reader) {
	what := "binary"
	if typ == websocket.MessageText {
		what = "text"
	}
	msg := fmt.Sprintf("a %s frame of more than %d bytes: a client frame is at most %d bytes (a stdin frame carries at most %d bytes of data; split larger input)",
		what, api.MaxClientFrame, api.MaxClientFrame, api.MaxStdinFrame)
	// After the start frame h is set (the reader waited for it).
	if st.violateWith(websocket.StatusMessageTooBig, msg, st.gotStart.Load()) {
		_, _ = io.Copy(io.Discard, rd)
	}
}

// parseStart checks the first frame; a non-empty message is a violation.
func parseStart(typ websocket.MessageType, data []byte) (api.ExecRequest, string) {
	var req api.ExecRequest
	if typ != websocket.MessageText {
		return req, `the first frame must be a text start frame {"type":"start",...}`
	}
	// The type first: a kill or close_stdin sent before the start is named
	// as such, not as a start frame with an unknown field.
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &head) == nil && head.Type != "" && head.Type != api.FrameStart {
		return req, fmt.Sprintf("the first frame must be of type %q, not %q", api.FrameStart, clipText(head.Type))
	}
	if err := decodeStrict(data, &req); err != nil {
		return req, "malformed start frame: " + err.Error()
	}
	if req.Type != api.FrameStart {
		return req, fmt.Sprintf("the first frame must be of type %q, not %q", api.FrameStart, clipText(req.Type))
	}
	if req.StdinBase64 != nil {
		return req, "stdin_base64 is not allowed in a start frame: send stdin frames"
	}
	return req, ""
}

// handleFrame applies one frame after the start; false ends the reader.
func (st *execStream) handleFrame(typ websocket.MessageType, data []byte) bool {
	if typ == websocket.MessageBinary {
		id, payload, err := api.ParseStdinFrame(data)
		if err != nil {
			tag := "no tag (empty frame)"
			if len(data) > 0 {
				tag = fmt.Sprintf("tag 0x%02x", data[0])
			}
			st.violate(fmt.Sprintf("bad binary frame (%s, %d bytes): %v", tag, len(data), err), true)
			return false
		}
		if id == 0 {
			st.violate("a stdin frame with id 0: frame ids start at 1", true)
			return false
		}
		return st.enqueue(stdinOp{id: id, data: bytes.Clone(payload)})
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		st.violate("malformed text frame: "+err.Error(), true)
		return false
	}
	switch head.Type {
	case api.FrameCloseStdin, api.FrameKill:
		var f struct {
			Type string `json:"type"`
			ID   uint64 `json:"id"`
		}
		if err := decodeStrict(data, &f); err != nil {
			st.violate(fmt.Sprintf("malformed %s frame: %v", head.Type, err), true)
			return false
		}
		if f.ID == 0 {
			st.violate(fmt.Sprintf("a %s frame without an id (or with id 0): frame ids start at 1", f.Type), true)
			return false
		}
		if f.Type == api.FrameKill {
			return st.clientKill(f.ID)
		}
		return st.enqueue(stdinOp{id: f.ID, close: true})
	case api.FrameStart:
		st.violate("a second start frame: the exec has already started", true)
	default:
		st.violate(fmt.Sprintf("unknown frame type %q (want close_stdin or kill, or a binary stdin frame)", clipText(head.Type)), true)
	}
	return false
}

// enqueue hands a stdin op to the worker, never waiting. The protocol
// bounds what waits in the queue: at most stdinQueueBytes of stdin data
// and stdinQueueFrames stdin and close_stdin frames received and not yet
// acked; a frame past either is a violation. The worker subtracts an op
// before it sends its ack, so a client that waits for acks never crosses
// the limit by a race.
func (st *execStream) enqueue(op stdinOp) bool {
	n := int64(len(op.data))
	if b := st.unackedBytes.Load() + n; b > stdinQueueBytes {
		st.violate(fmt.Sprintf("stdin frame %d (%d bytes) brings the stdin received and not yet acked to %d bytes, over the limit of %d (2 MiB): wait for acks before sending more",
			op.id, n, b, stdinQueueBytes), true)
		return false
	}
	if st.unackedFrames.Load() >= stdinQueueFrames {
		what := "stdin"
		if op.close {
			what = api.FrameCloseStdin
		}
		st.violate(fmt.Sprintf("%s frame %d: more than %d stdin and close_stdin frames received and not yet acked: wait for acks before sending more",
			what, op.id, stdinQueueFrames), true)
		return false
	}
	st.unackedBytes.Add(n)
	st.unackedFrames.Add(1)
	st.queue.put(op)
	return true
}

// clientKill queues a kill frame for the killer, starting it unless it
// runs: a kill is applied at once (a WriteStdin may be blocked on a full
// pipe, so not in the stdin worker), one at a time however many frames
// come, and acked once Kill returned. A kill that comes first stops the
// server's deadline. false: the frame was a violation, the reader ends.
func (st *execStream) clientKill(id uint64) bool {
	st.mu.Lock()
	if st.ended {
		st.mu.Unlock()
		return true // the stream is ending: run kills the exec and its end answers the client
	}
	if st.killUnacked >= killQueueFrames {
		st.mu.Unlock()
		// No Kill here: one is in flight, and run kills the exec once
		// the abort has stopped the pump.
		st.violate(fmt.Sprintf("kill frame %d: more than %d kill frames received and not yet acked: wait for the ack of a kill before sending another",
			id, killQueueFrames), false)
		return false
	}
	if !st.deadlineHit {
		st.clientKilled = true
		if st.deadline != nil {
			st.deadline.Stop()
		}
	}
	st.killIDs = append(st.killIDs, id)
	st.killUnacked++
	start := !st.killing
	if start {
		st.killing = true
		st.kills.Add(1)
	}
	st.mu.Unlock()
	st.markEnding()
	if start {
		go st.killer()
	}
	return true
}

// killer kills the exec for the kill frames waiting, acks them, and goes
// on while more came meanwhile. Once a Kill returned nil the exec is
// killed: the frames that come later are acked without another.
func (st *execStream) killer() {
	defer st.kills.Done()
	defer st.recoverPanic("kill")
	for {
		st.mu.Lock()
		ids, killed := st.killIDs, st.killOK
		st.killIDs = nil
		if len(ids) == 0 {
			st.killing = false
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()
		var err error
		if !killed {
			ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
			err = st.h.Kill(ctx)
			cancel()
		}
		st.mu.Lock()
		st.killOK = st.killOK || err == nil
		st.mu.Unlock()
		for _, id := range ids {
			st.mu.Lock()
			st.killUnacked--
			st.mu.Unlock()
			st.sendAck(id, err)
		}
	}
}

// stdinWorker applies stdin ops in order and acks each, until end stops
// it (stdinCtx).
func (st *execStream) stdinWorker() {
	for {
		op, ok := st.queue.get(st.stdinCtx)
		if !ok {
			return
		}
		var err error
		if op.close {
			err = st.h.CloseStdin(st.stdinCtx)
		} else if err = st.h.WriteStdin(st.stdinCtx, op.data); err == nil {
			st.s.met.streamed(dirStdin, len(op.data))
		}
		if err != nil && st.stdinCtx.Err() != nil {
			return // the stream is ending and cut the op short: no ack
		}
		// Released before the ack leaves: a client that sends more once it
		// has the ack finds the room.
		st.unackedBytes.Add(-int64(len(op.data)))
		st.unackedFrames.Add(-1)
		st.sendAck(op.id, err)
	}
}

// stdinQueue is a FIFO of stdin ops for one producer (the reader) and one
// consumer (the worker). put never waits: the protocol's limit on stdin not
// yet acked (enqueue) bounds what it holds.
type stdinQueue struct {
	mu    sync.Mutex
	items []stdinOp
	ready chan struct{} // an item was added; capacity 1
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// put appends op.
func (q *stdinQueue) put(op stdinOp) {
	q.mu.Lock()
	q.items = append(q.items, op)
	q.mu.Unlock()
	signal(q.ready)
}

// get takes the oldest op, waiting for one; false when ctx ended.
func (q *stdinQueue) get(ctx context.Context) (stdinOp, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			op := q.items[0]
			q.items[0] = stdinOp{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return op, true
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-ctx.Done():
			return stdinOp{}, false
		}
	}
}
