package agent

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"unicode/utf8"
)

// The protocol versions this package speaks: every version from
// minVersion to Version. A request is written in the lowest version that
// carries it (userVersion for an exec with a user, else minVersion), so a
// client of this package keeps working with an agent that speaks only
// version 1, as a session started by an older tai42 runs.
const (
	Version     = 2
	minVersion  = 1
	userVersion = 2 // adds the exec's "user"
)

const (
	headerLen  = 5
	maxPayload = 4 << 20   // any frame
	maxData    = 256 << 10 // data, stdout and stderr frames
)

// Frame types; doc.go describes each.
const (
	frameRequest    byte = 'Q'
	frameReply      byte = 'R'
	frameError      byte = 'E'
	frameData       byte = 'D'
	frameEnd        byte = 'N'
	frameAbort      byte = 'B'
	frameStdout     byte = '1'
	frameStderr     byte = '2'
	frameAck        byte = 'A'
	frameCancel     byte = 'X'
	frameCloseStdin byte = 'C'
	frameKill       byte = 'K'
	frameExited     byte = 'x'
	frameExit       byte = 'Z'
)

// Error kinds of an error frame.
const (
	kindSandbox  = "sandbox"
	kindNotFound = "not_found"
	kindVersion  = "version"
	kindProtocol = "protocol"
	// kindUserNotFound: an exec's user names no passwd entry (version 2).
	kindUserNotFound = "user_not_found"
)

// Ack outcomes.
const (
	ackCancelled = "cancelled"
	ackExited    = "exited"
	ackClosed    = "closed"
	ackIO        = "io"
)

// request is the first frame of every connection.
type request struct {
	V  int    `json:"v"`
	Op string `json:"op"`
	// B64: every string field below is the standard base64 of its bytes.
	B64 bool `json:"b64,omitempty"`

	// exec
	Argv        []string `json:"argv,omitempty"`
	Env         []string `json:"env,omitempty"`
	Dir         string   `json:"dir,omitempty"`
	DirOrig     string   `json:"dir_orig,omitempty"`
	GraceNS     int64    `json:"grace_ns,omitempty"`
	StdinLen    int64    `json:"stdin_len,omitempty"`
	Interactive bool     `json:"interactive,omitempty"`
	User        string   `json:"user,omitempty"` // version 2

	// attach
	ID uint64 `json:"id,omitempty"`

	// put, get
	Root string `json:"root,omitempty"`
	Rel  string `json:"rel,omitempty"`
	Orig string `json:"orig,omitempty"`
	Sync bool   `json:"sync,omitempty"` // put: flush to disk before the reply
}

// eachString calls f on every string field of r.
func (r *request) eachString(f func(*string) error) error {
	for i := range r.Argv {
		if err := f(&r.Argv[i]); err != nil {
			return err
		}
	}
	for i := range r.Env {
		if err := f(&r.Env[i]); err != nil {
			return err
		}
	}
	for _, p := range []*string{&r.Dir, &r.DirOrig, &r.Root, &r.Rel, &r.Orig, &r.User} {
		if err := f(p); err != nil {
			return err
		}
	}
	return nil
}

// encodeBytes switches r to base64 strings when one of them is not valid
// UTF-8 (JSON would replace the bytes).
func (r *request) encodeBytes() {
	valid := true
	_ = r.eachString(func(s *string) error {
		if !utf8.ValidString(*s) {
			valid = false
		}
		return nil
	})
	if valid {
		return
	}
	r.B64 = true
	_ = r.eachString(func(s *string) error {
		*s = base64.StdEncoding.EncodeToString([]byte(*s))
		return nil
	})
}

// decodeBytes undoes encodeBytes.
func (r *request) decodeBytes() error {
	if !r.B64 {
		return nil
	}
	r.B64 = false
	return r.eachString(func(s *string) error {
		b, err := base64.StdEncoding.DecodeString(*s)
		if err != nil {
			return fmt.Errorf("a base64 string of the request is malformed: %w", err)
		}
		*s = string(b)
		return nil
	})
}

// errorFrame is the payload of an error frame.
type errorFrame struct {
	Kind    string `json:"kind"`
	Op      string `json:"op,omitempty"`
	Message string `json:"message"`
	Cause   string `json:"cause,omitempty"`
	Path    string `json:"path,omitempty"`
	User    string `json:"user,omitempty"` // user_not_found
}

// startReply answers an exec request.
type startReply struct {
	ID       uint64 `json:"id,omitempty"`
	Failed   bool   `json:"failed,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
	Message  []byte `json:"message,omitempty"`
}

// getReply answers a get request.
type getReply struct {
	Size int64 `json:"size"`
}

// pingReply answers a ping request.
type pingReply struct {
	V int `json:"v"`
}

type ackFrame struct {
	N   int    `json:"n"`
	Err string `json:"err,omitempty"`
	Msg string `json:"msg,omitempty"`
}

type killFrame struct {
	Drain bool `json:"drain,omitempty"`
}

type exitFrame struct {
	Code   int  `json:"code"`
	Known  bool `json:"known"`
	Killed bool `json:"killed,omitempty"`
	Held   bool `json:"held,omitempty"`
}

// protocolError is a frame that breaks the protocol.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return "agent protocol: " + e.msg }

func protoErrorf(format string, args ...any) error {
	return &protocolError{fmt.Sprintf(format, args...)}
}

// frameBufs are buffers for one data frame with room for its header in
// front: readers fill b[headerLen:] and send b[:headerLen+n] in one write.
var frameBufs = sync.Pool{New: func() any { b := make([]byte, headerLen+maxData); return &b }}

// frameConn is one connection: frames are read by one goroutine at a time
// and written by any number (each frame in one piece, under wmu).
type frameConn struct {
	c   net.Conn
	r   *bufio.Reader
	hdr [headerLen]byte
	wmu sync.Mutex
}

func newFrameConn(c net.Conn) *frameConn {
	return &frameConn{c: c, r: bufio.NewReaderSize(c, 8<<10)}
}

// readHeader reads a frame's header; the caller then reads exactly n bytes
// of payload (readPayload or fc.r).
func (fc *frameConn) readHeader() (typ byte, n int, err error) {
	if _, err := io.ReadFull(fc.r, fc.hdr[:]); err != nil {
		return 0, 0, err
	}
	l := binary.BigEndian.Uint32(fc.hdr[1:])
	typ = fc.hdr[0]
	limit := uint32(maxPayload)
	switch typ {
	case frameData, frameStdout, frameStderr:
		limit = maxData
	}
	if l > limit {
		return 0, 0, protoErrorf("a frame of type %q has %d bytes, over the limit of %d", typ, l, limit)
	}
	return typ, int(l), nil
}

// readPayload reads n bytes of payload into buf (grown when too small).
func (fc *frameConn) readPayload(n int, buf []byte) ([]byte, error) {
	if n > cap(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(fc.r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// read reads one whole frame; the payload may alias buf.
func (fc *frameConn) read(buf []byte) (byte, []byte, error) {
	typ, n, err := fc.readHeader()
	if err != nil {
		return 0, nil, err
	}
	p, err := fc.readPayload(n, buf)
	return typ, p, err
}

// readJSON reads one frame and decodes a JSON payload into v unless the
// frame is of another type than want; it returns the frame's type. An error
// frame is returned decoded as *errorFrame in ef.
func (fc *frameConn) readJSON(want byte, v any) (ef *errorFrame, err error) {
	typ, p, err := fc.read(nil)
	if err != nil {
		return nil, err
	}
	switch typ {
	case want:
		if v == nil || len(p) == 0 {
			return nil, nil
		}
		if err := json.Unmarshal(p, v); err != nil {
			return nil, protoErrorf("a frame of type %q does not decode: %v", typ, err)
		}
		return nil, nil
	case frameError:
		ef = new(errorFrame)
		if err := json.Unmarshal(p, ef); err != nil {
			return nil, protoErrorf("an error frame does not decode: %v", err)
		}
		return ef, nil
	}
	return nil, protoErrorf("got a frame of type %q where %q was expected", typ, want)
}

func putHeader(b []byte, typ byte, n int) {
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:headerLen], uint32(n))
}

// writeBuf sends b as one frame of type typ: b[:headerLen] is room for the
// header, b[headerLen:] the payload.
func (fc *frameConn) writeBuf(typ byte, b []byte) error {
	putHeader(b, typ, len(b)-headerLen)
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_, err := fc.c.Write(b)
	return err
}

// write sends one frame.
func (fc *frameConn) write(typ byte, payload []byte) error {
	if len(payload) <= 4096 {
		b := make([]byte, headerLen+len(payload))
		copy(b[headerLen:], payload)
		return fc.writeBuf(typ, b)
	}
	var h [headerLen]byte
	putHeader(h[:], typ, len(payload))
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	bufs := net.Buffers{h[:], payload}
	_, err := bufs.WriteTo(fc.c)
	return err
}

// writeJSON sends v as a frame of type typ.
func (fc *frameConn) writeJSON(typ byte, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(p) > maxPayload {
		return fmt.Errorf("the %q frame has %d bytes, over the protocol's limit of %d", typ, len(p), maxPayload)
	}
	return fc.write(typ, p)
}

func (fc *frameConn) Close() error { return fc.c.Close() }
