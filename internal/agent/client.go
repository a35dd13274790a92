package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/tai42/sandbox"
)

// Client talks to one agent. Dial opens a new connection to it (the
// provider dials the socket's host path); every operation uses a
// connection of its own. Safe for concurrent use.
type Client struct {
	Dial func(ctx context.Context) (net.Conn, error)
}

// FileRef names a file for PutFile and OpenFile.
type FileRef struct {
	// Root is "/workspace" for a path inside the workspace, or "/" for an
	// absolute path outside it. Under any root but "/" the agent refuses a
	// path that leads out of it through ".." or a symlink.
	Root string
	// Rel is the clean path relative to Root; "." names Root itself.
	Rel string
	// Orig is the caller's path as given, for messages.
	Orig string
	// Sync (put only) makes the agent flush the new file and its
	// directories to disk before it answers: for persistent workspaces.
	Sync bool
}

// connect dials the agent for op.
func (c *Client) connect(ctx context.Context, op string) (*frameConn, error) {
	if c.Dial == nil {
		return nil, sandbox.Errorf(op, "the agent client has no Dial function")
	}
	nc, err := c.Dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, sandbox.WrapError(op, "cancelled while connecting to the agent", ctx.Err())
		}
		return nil, sandbox.WrapError(op, "cannot reach the agent", err)
	}
	return newFrameConn(nc), nil
}

// guard makes blocked reads and writes on nc fail once ctx is done; the
// returned function disarms it and reports whether it had not fired.
func guard(ctx context.Context, nc net.Conn) func() bool {
	return context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
}

// connError describes a failed exchange with the agent during op.
func connError(ctx context.Context, op, what string, err error) error {
	if ctx.Err() != nil {
		return sandbox.WrapError(op, what+": the call was cancelled", ctx.Err())
	}
	var pe *protocolError
	if errors.As(err, &pe) {
		return sandbox.WrapError(op, what, err)
	}
	return sandbox.WrapError(op, what+": lost the connection to the agent", err)
}

// toError turns an error frame into the error the host runner returns for
// the same situation: *sandbox.FileNotFoundError for kind not_found,
// *sandbox.UserNotFoundError for user_not_found, else a
// *sandbox.SandboxError (whose Op is op when the frame names none).
func (ef *errorFrame) toError(op string) error {
	switch ef.Kind {
	case kindNotFound:
		return &sandbox.FileNotFoundError{Path: ef.Path}
	case kindUserNotFound:
		return &sandbox.UserNotFoundError{User: ef.User}
	}
	e := &sandbox.SandboxError{Op: ef.Op, Message: ef.Message}
	if e.Op == "" {
		e.Op = op
	}
	if ef.Cause != "" {
		e.Err = errors.New(ef.Cause)
	}
	return e
}

// Ping checks that the agent is ready and speaks version 1 of the
// protocol, which every request but an exec with a user is written in.
// Errors are *sandbox.SandboxError: the agent cannot be reached, or the
// versions differ (the message names both).
func (c *Client) Ping(ctx context.Context) error {
	const op = "ping"
	fc, err := c.connect(ctx, op)
	if err != nil {
		return err
	}
	defer fc.Close()
	defer guard(ctx, fc.c)()
	if err := fc.writeJSON(frameRequest, request{V: minVersion, Op: "ping"}); err != nil {
		return connError(ctx, op, "cannot send the ping", err)
	}
	var rep pingReply
	ef, err := fc.readJSON(frameReply, &rep)
	switch {
	case err != nil:
		return connError(ctx, op, "no answer to the ping", err)
	case ef != nil:
		return ef.toError(op)
	case rep.V != minVersion:
		return sandbox.Errorf(op, "protocol version mismatch: the client pinged in version %d, the agent answered in version %d", minVersion, rep.V)
	}
	return nil
}

// PutFile streams r into the file f names: the agent writes a temporary
// file beside it (creating missing parent directories) and moves it into
// place only once r is read to its end, so a failed upload keeps the old
// file. If r fails (or ctx is done), the upload is aborted and the error
// wraps r's error (or ctx's). Errors are *sandbox.SandboxError with op
// "put_file", as the host runner returns them (a directory, an escape, a
// failed write).
func (c *Client) PutFile(ctx context.Context, f FileRef, r io.Reader) error {
	const op = "put_file"
	fc, err := c.connect(ctx, op)
	if err != nil {
		return err
	}
	defer fc.Close() // before the end frame, this makes the agent drop the upload
	defer guard(ctx, fc.c)()
	req := request{V: minVersion, Op: "put", Root: f.Root, Rel: f.Rel, Orig: f.Orig, Sync: f.Sync}
	req.encodeBytes()
	if err := fc.writeJSON(frameRequest, req); err != nil {
		return connError(ctx, op, fmt.Sprintf("%q: cannot send the request", f.Orig), err)
	}
	if ef, err := fc.readJSON(frameReply, nil); err != nil {
		return connError(ctx, op, fmt.Sprintf("%q: no answer to the request", f.Orig), err)
	} else if ef != nil {
		return ef.toError(op)
	}
	readFailed := func(err error) error {
		return sandbox.WrapError(op, fmt.Sprintf("%q: reading the new content failed; the old content stays", f.Orig), err)
	}
	// writeFailed: the agent may have failed first and said why.
	writeFailed := func(err error) error {
		if ctx.Err() != nil {
			return readFailed(ctx.Err())
		}
		if ef, rerr := fc.readJSON(frameReply, nil); rerr == nil && ef != nil {
			return ef.toError(op)
		}
		return sandbox.WrapError(op, fmt.Sprintf("%q: lost the connection to the agent during the upload; the old content stays", f.Orig), err)
	}
	bp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bp)
	buf := *bp
	for {
		if err := ctx.Err(); err != nil {
			return readFailed(err)
		}
		n, rerr := r.Read(buf[headerLen:])
		if n > 0 {
			if err := fc.writeBuf(frameData, buf[:headerLen+n]); err != nil {
				return writeFailed(err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// The agent removes its temporary file before it answers.
			if fc.write(frameAbort, nil) == nil {
				_, _ = fc.readJSON(frameReply, nil)
			}
			return readFailed(rerr)
		}
	}
	if err := fc.write(frameEnd, nil); err != nil {
		return writeFailed(err)
	}
	ef, err := fc.readJSON(frameReply, nil)
	switch {
	case err != nil:
		return connError(ctx, op, fmt.Sprintf("%q: no answer after the upload (the file may or may not have been replaced)", f.Orig), err)
	case ef != nil:
		return ef.toError(op)
	}
	return nil
}

// OpenFile opens the regular file f names for streaming; it returns the
// reader and the file's size when opened. Errors are the host runner's: a
// *sandbox.FileNotFoundError when nothing exists at the path, else a
// *sandbox.SandboxError with op "get_file" (a directory, not a regular
// file, a dangling symlink, an escape). ctx bounds the open only; a read
// failure later is a *sandbox.SandboxError from Read. The reader must be
// closed; it is for one goroutine at a time.
func (c *Client) OpenFile(ctx context.Context, f FileRef) (io.ReadCloser, int64, error) {
	const op = "get_file"
	fc, err := c.connect(ctx, op)
	if err != nil {
		return nil, 0, err
	}
	disarm := guard(ctx, fc.c)
	req := request{V: minVersion, Op: "get", Root: f.Root, Rel: f.Rel, Orig: f.Orig}
	req.encodeBytes()
	var rep getReply
	var ef *errorFrame
	err = fc.writeJSON(frameRequest, req)
	if err == nil {
		ef, err = fc.readJSON(frameReply, &rep)
	}
	if fired := !disarm(); fired || err != nil || ef != nil {
		fc.Close()
		switch {
		case fired:
			return nil, 0, connError(ctx, op, fmt.Sprintf("opening %q failed", f.Orig), ctx.Err())
		case err != nil:
			return nil, 0, connError(ctx, op, fmt.Sprintf("opening %q failed", f.Orig), err)
		}
		return nil, 0, ef.toError(op)
	}
	return &fileReader{fc: fc, orig: f.Orig}, rep.Size, nil
}

// fileReader reads a get's data frames.
type fileReader struct {
	fc        *frameConn
	orig      string
	remaining int // payload bytes left in the current data frame
	err       error
	closed    bool
}

func (r *fileReader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, sandbox.Errorf("get_file", "reading %q: the reader is closed", r.orig)
	}
	for r.remaining == 0 {
		if r.err != nil {
			return 0, r.err
		}
		typ, n, err := r.fc.readHeader()
		if err != nil {
			r.err = r.lost(err)
			continue
		}
		switch typ {
		case frameData:
			r.remaining = n
		case frameEnd:
			r.err = io.EOF
		case frameError:
			r.err = r.lost(protoErrorf("a malformed error frame"))
			if p, err := r.fc.readPayload(n, nil); err == nil {
				var ef errorFrame
				if json.Unmarshal(p, &ef) == nil {
					r.err = ef.toError("get_file")
				}
			}
		default:
			r.err = r.lost(protoErrorf("got a frame of type %q in a file's content", typ))
		}
	}
	if len(p) > r.remaining {
		p = p[:r.remaining]
	}
	n, err := r.fc.r.Read(p)
	r.remaining -= n
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		r.err = r.lost(err)
		if n == 0 {
			return 0, r.err
		}
	}
	return n, nil
}

func (r *fileReader) lost(err error) error {
	return sandbox.WrapError("get_file", fmt.Sprintf("reading %q failed: lost the connection to the agent", r.orig), err)
}

// Close drops the connection; the agent stops sending.
func (r *fileReader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	return r.fc.Close()
}
