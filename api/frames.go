package api

import (
	"encoding/binary"
	"errors"
)

// Frame types of the interactive exec (text frames, JSON).
const (
	FrameStart      = "start"
	FrameStarted    = "started"
	FrameCloseStdin = "close_stdin"
	FrameKill       = "kill"
	FrameAck        = "ack"
	FrameExit       = "exit"
	FrameError      = "error"
)

// Tags of binary frames: the first byte.
const (
	TagStdin  byte = 0x00
	TagStdout byte = 0x01
	TagStderr byte = 0x02
)

// MaxStdinFrame is the most stdin data one binary frame carries; a client
// splits a larger WriteStdin into consecutive frames.
const MaxStdinFrame = 1 << 20

// MaxClientFrame is the largest frame the server reads: a stdin frame with
// its 9-byte header, or a start frame (argv, env) of up to 1 MiB.
const MaxClientFrame = MaxStdinFrame + 9

// Frame is a text frame of the interactive exec, either way. Only the fields
// of its Type are set.
type Frame struct {
	Type     string `json:"type"`
	ID       uint64 `json:"id,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Error    *Error `json:"error,omitempty"`
}

// StdinFrame builds a binary stdin frame.
func StdinFrame(id uint64, data []byte) []byte {
	b := make([]byte, 9+len(data))
	b[0] = TagStdin
	binary.BigEndian.PutUint64(b[1:9], id)
	copy(b[9:], data)
	return b
}

// ParseStdinFrame splits a binary stdin frame.
func ParseStdinFrame(b []byte) (id uint64, data []byte, err error) {
	if len(b) < 9 || b[0] != TagStdin {
		return 0, nil, errors.New("a binary frame from the client must be stdin: tag 0x00, an 8-byte id, then data")
	}
	return binary.BigEndian.Uint64(b[1:9]), b[9:], nil
}
