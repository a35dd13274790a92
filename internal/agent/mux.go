package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tai42/sandbox"
)

// A multiplexed connection (op "mux"): one connection that carries many,
// for a transport where a new connection is dear. Through a Kubernetes
// port-forward each one is a stream pair made by the apiserver, the
// kubelet and the runtime, and a TCP connection the runtime makes in the
// Pod; over a mux it is a yamux stream, opened without a round trip. Every
// stream is a connection as the protocol defines them (its first frame a
// request, its own flow control), served as if accepted by the listener.

// ErrMuxUnsupported: the agent does not know op "mux" (an agent of an
// older tai42); the client dials a connection per operation instead.
var ErrMuxUnsupported = errors.New("the agent cannot multiplex a connection")

// muxConfig is yamux's configuration on both ends.
//   - The client pings (the agent does not): a dead transport is found
//     within KeepAliveInterval + ConnectionWriteTimeout, and the session
//     with all its streams fails, as the transport's loss would.
//   - A stream's window is 4 MiB (yamux's default is 256 KiB): a file
//     moves at the transport's speed over a round trip of a few
//     milliseconds through the apiserver and the kubelet, while an exec
//     whose output is not read holds at most that much.
//   - A stream closed on one end and not on the other within
//     StreamCloseTimeout is reset, so that an agent writing to a client
//     that went away (a get abandoned) stops: yamux's Close is a
//     half-close, and the reset is the end a closed TCP connection gives.
func muxConfig(client bool) *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = client
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	c.MaxStreamWindowSize = 4 << 20
	c.StreamCloseTimeout = 2 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}

// bufferedConn is a yamux session's connection: its reads come through r
// first (what the frame reader buffered past the mux request belongs to
// the session), and a data frame's header is written with its body.
//
// yamux writes each frame as two writes, its 12-byte header and then its
// body; through a port-forward each write is a frame of its own through
// the apiserver, the kubelet and the runtime. So the header of a data
// frame that has a body (yamux's spec: version 0, type 0, the length in
// bytes 8 to 12) is held and written with the next write, which is that
// body: yamux's one sending goroutine writes them back to back.
type bufferedConn struct {
	net.Conn
	r    *bufio.Reader
	held []byte // a data frame's header, waiting for its body
	buf  []byte
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

const muxHeaderLen = 12

func (c *bufferedConn) Write(p []byte) (int, error) {
	if c.held == nil && len(p) == muxHeaderLen && p[0] == 0 && p[1] == 0 && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.held = append(c.buf[:0], p...)
		return len(p), nil
	}
	if c.held == nil {
		return c.Conn.Write(p)
	}
	c.buf = append(c.held, p...)
	c.held = nil
	n, err := c.Conn.Write(c.buf)
	return max(n-muxHeaderLen, 0), err
}

// handleMux answers the mux request on nc (whose frames c reads) and then
// serves every stream of the session as a connection, until the session
// ends (nc closed by either end, or the server's shutdown).
func (s *server) handleMux(nc net.Conn, c *frameConn, req *request) {
	if err := c.writeJSON(frameReply, pingReply{V: req.V}); err != nil {
		return
	}
	sess, err := yamux.Server(&bufferedConn{Conn: nc, r: c.r}, muxConfig(false))
	if err != nil {
		s.log.Warn("agent: cannot start a multiplexed session", "err", err)
		return
	}
	defer sess.Close()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			st.Close()
			return
		}
		s.conns[st] = struct{}{}
		s.handlers.Add(1)
		s.mu.Unlock()
		go s.handle(st)
	}
}

// Mux is the client's end of a multiplexed connection: Dial opens a new
// agent connection on it. Safe for concurrent use.
type Mux struct {
	sess *yamux.Session
}

// OpenMux asks the agent at the other end of nc to multiplex it, and
// returns the client's end; from then on nc is the Mux's, closed by its
// Close or its failure. ctx bounds the exchange. Errors: ErrMuxUnsupported
// (wrapped) when the agent does not know the op; else a
// *sandbox.SandboxError of op "mux".
func OpenMux(ctx context.Context, nc net.Conn) (*Mux, error) {
	const op = "mux"
	fc := newFrameConn(nc)
	disarm := guard(ctx, nc)
	err := fc.writeJSON(frameRequest, request{V: minVersion, Op: op})
	var rep pingReply
	var ef *errorFrame
	if err == nil {
		ef, err = fc.readJSON(frameReply, &rep)
	}
	fired := !disarm()
	switch {
	case fired || (err != nil && ctx.Err() != nil):
		nc.Close()
		return nil, sandbox.WrapError(op, "multiplexing the agent's connection was cancelled", ctx.Err())
	case err != nil:
		nc.Close()
		return nil, connError(ctx, op, "cannot multiplex the agent's connection", err)
	case ef != nil && ef.Kind == kindProtocol && strings.Contains(ef.Message, "unknown operation"):
		nc.Close()
		return nil, fmt.Errorf("%w: %s", ErrMuxUnsupported, ef.Message)
	case ef != nil:
		nc.Close()
		return nil, ef.toError(op)
	}
	_ = nc.SetDeadline(time.Time{})
	sess, err := yamux.Client(&bufferedConn{Conn: nc, r: fc.r}, muxConfig(true))
	if err != nil {
		nc.Close()
		return nil, sandbox.WrapError(op, "cannot start the multiplexed session", err)
	}
	return &Mux{sess: sess}, nil
}

// Dial opens a new agent connection on m (a Client's Dial). It fails once
// m is closed or its connection failed.
func (m *Mux) Dial(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := m.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("opening a stream on the agent's multiplexed connection: %w", err)
	}
	return st, nil
}

// Done is closed once m is closed or its connection failed.
func (m *Mux) Done() <-chan struct{} { return m.sess.CloseChan() }

// Close closes m, every connection on it and the connection it runs on.
func (m *Mux) Close() error { return m.sess.Close() }
