package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox/api"
)

// readLoop reads every client frame: the start first, then stdin,
// close_stdin and kill. Any read error means the client is gone.
func (st *execStream) readLoop() {
	var buf bytes.Buffer // reused: a frame's bytes are copied out before the next read
	for {
		typ, rd, err := st.conn.Reader(st.ioCtx)
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(rd)
		}
		if err != nil {
			st.abortWith(abortGone, "")
			return
		}
		data := buf.Bytes()
		st.bytesIn.Add(int64(len(data)))
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

// parseStart checks the first frame; a non-empty message is a violation.
func parseStart(typ websocket.MessageType, data []byte) (api.ExecRequest, string) {
	var req api.ExecRequest
	if typ != websocket.MessageText {
		return req, `the first frame must be a text start frame {"type":"start",...}`
	}
	if err := decodeStrict(bytes.NewReader(data), &req); err != nil {
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
		if err := decodeStrict(bytes.NewReader(data), &f); err != nil {
			st.violate(fmt.Sprintf("malformed %s frame: %v", head.Type, err), true)
			return false
		}
		if f.Type == api.FrameKill {
			st.clientKill(f.ID)
			return true
		}
		return st.enqueue(stdinOp{id: f.ID, close: true})
	case api.FrameStart:
		st.violate("a second start frame: the exec has already started", true)
	default:
		st.violate(fmt.Sprintf("unknown frame type %q (want close_stdin or kill, or a binary stdin frame)", clipText(head.Type)), true)
	}
	return false
}

// enqueue hands a stdin op to the worker, waiting for room (back-pressure).
func (st *execStream) enqueue(op stdinOp) bool {
	st.readerWaits.Store(true)
	ok := st.queue.put(st.ctx, op)
	st.readerWaits.Store(false)
	return ok
}

// clientKill kills the exec at once, in its own goroutine (a WriteStdin may
// be blocked on a full pipe), and acks once Kill returned. A kill that
// comes first stops the server's deadline.
func (st *execStream) clientKill(id uint64) {
	st.mu.Lock()
	if st.ended {
		st.mu.Unlock()
		return // the stream is ending: run kills the exec and its end answers the client
	}
	if !st.deadlineHit {
		st.clientKilled = true
		if st.deadline != nil {
			st.deadline.Stop()
		}
	}
	st.kills.Add(1)
	st.mu.Unlock()
	st.ending.Store(true)
	go func() {
		defer st.kills.Done()
		defer st.recoverPanic("kill")
		ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		st.sendAck(id, st.h.Kill(ctx))
	}()
}

// stdinWorker applies stdin ops in order and acks each.
func (st *execStream) stdinWorker() {
	for {
		op, ok := st.queue.get(st.ctx)
		if !ok {
			return
		}
		var err error
		if op.close {
			err = st.h.CloseStdin(st.ctx)
		} else if err = st.h.WriteStdin(st.ctx, op.data); err == nil {
			st.s.met.streamed(dirStdin, len(op.data))
		}
		if st.ctx.Err() != nil {
			return // the stream is over: no one to ack
		}
		st.sendAck(op.id, err)
	}
}

// stdinQueue is a FIFO of stdin ops bounded in bytes, for one producer (the
// reader) and one consumer (the worker). An op always fits in an empty
// queue, so a frame of any size moves.
type stdinQueue struct {
	mu    sync.Mutex
	items []stdinOp
	bytes int
	limit int
	ready chan struct{} // an item was added; capacity 1
	space chan struct{} // an item was taken; capacity 1
}

func newStdinQueue(limit int) *stdinQueue {
	return &stdinQueue{limit: limit, ready: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// put appends op, waiting while the queue is full; false when ctx ended.
func (q *stdinQueue) put(ctx context.Context, op stdinOp) bool {
	for {
		q.mu.Lock()
		if len(q.items) == 0 || q.bytes+len(op.data) <= q.limit {
			q.items = append(q.items, op)
			q.bytes += len(op.data)
			q.mu.Unlock()
			signal(q.ready)
			return true
		}
		q.mu.Unlock()
		select {
		case <-q.space:
		case <-ctx.Done():
			return false
		}
	}
}

// get takes the oldest op, waiting for one; false when ctx ended.
func (q *stdinQueue) get(ctx context.Context) (stdinOp, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			op := q.items[0]
			q.items[0] = stdinOp{}
			q.items = q.items[1:]
			q.bytes -= len(op.data)
			q.mu.Unlock()
			signal(q.space)
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
