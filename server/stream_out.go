package server

import (
	"encoding/json"
	"errors"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// sendChunk writes one output chunk as binary frames of at most maxOutFrame
// data bytes. Only the pump calls it (outBuf is its own).
func (st *execStream) sendChunk(c *sandbox.StreamChunk) error {
	tag := api.TagStdout
	if c.Stream == sandbox.Stderr {
		tag = api.TagStderr
	}
	data := c.Data
	for len(data) > 0 {
		n := min(len(data), maxOutFrame)
		st.outBuf = append(append(st.outBuf[:0], tag), data[:n]...)
		if err := st.send(websocket.MessageBinary, st.outBuf, false); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (st *execStream) sendAck(id uint64, err error) {
	f := api.Frame{Type: api.FrameAck, ID: id}
	if err != nil {
		e := api.ErrorFrom(err)
		f.Error = &e
	}
	_ = st.sendJSON(f, false) // a dead connection shows in the reader and the pump
}

func (st *execStream) sendJSON(f api.Frame, final bool) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return st.send(websocket.MessageText, b, final)
}

var errStreamOver = errors.New("server: the stream's last frame was sent")

// send writes one frame; after the final frame it writes nothing.
func (st *execStream) send(typ websocket.MessageType, b []byte, final bool) error {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	if st.finalSent {
		return errStreamOver
	}
	if final {
		st.finalSent = true
	}
	st.writing.Store(true)
	err := st.conn.Write(st.ioCtx, typ, b)
	st.writing.Store(false)
	if err == nil {
		st.bytesOut.Add(int64(len(b)))
	}
	return err
}
