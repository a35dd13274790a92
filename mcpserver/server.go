// Package mcpserver serves a [sandbox.Sandbox] to agents as Model Context
// Protocol tools: sessions, commands run to completion, files, and
// background processes with their output read by cursor. It is a thin
// layer over the sandbox (a daemon's client or an embedded provider), with
// no session logic of its own: the policy, the errors and the limits are
// the sandbox's.
//
// One [Server] serves any number of MCP connections, over stdio
// ([Server.RunStdio], what a desktop agent launches) or the Streamable HTTP
// transport ([Server.HTTPHandler], which the daemon mounts at /mcp behind
// its token). The sessions a connection creates carry the label
// [LabelConnection] with the connection's id and are destroyed when the
// connection ends (the stdio stream closed, the HTTP session deleted or
// idle past its timeout), unless persistent; their TTL applies meanwhile.
//
// Every contract error is a tool error (isError) with the error's message,
// never a protocol error or a crash. Env values are secrets: they never
// appear in a tool result, a log line or an error.
package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tai42/sandbox"
)

// LabelConnection is the label every session created through a connection
// carries, its value the connection's id.
const LabelConnection = "tai42.mcp/connection"

// Defaults of [Options].
const (
	DefaultMaxResultBytes    = 64 << 10
	DefaultMaxProcessBytes   = 8 << 20
	DefaultHTTPSessionIdle   = 30 * time.Minute
	DefaultTTLSeconds        = 1800
	DefaultProcessTimeout    = time.Hour
	DefaultMaxProcesses      = 64
	DefaultMaxMessageBytes   = 64 << 20
	maxWaitSeconds           = 60
	connectionCleanupTimeout = time.Minute
)

// Options configure a [Server]. The zero value is usable.
type Options struct {
	// Name and Version identify the server to clients; "" is "tai42" and
	// "dev".
	Name, Version string
	// DefaultImage is a created session's image when the call names none;
	// "" is [sandbox.HostImage].
	DefaultImage string
	// MaxResultBytes bounds the output one tool result carries (a run's
	// stdout and stderr together, a file read, a process read); past it the
	// result says so with the full lengths and where the rest is. 0 is
	// [DefaultMaxResultBytes].
	MaxResultBytes int
	// MaxProcessBytes bounds the output a background process keeps unread;
	// past it the oldest is dropped and the next read says how much. 0 is
	// [DefaultMaxProcessBytes].
	MaxProcessBytes int
	// MaxProcesses bounds the background processes of one connection; 0 is
	// [DefaultMaxProcesses].
	MaxProcesses int
	// MaxMessageBytes bounds one message from a client (a write_file's
	// content with the rest). Over HTTP a larger request is refused with
	// 413 and the connection goes on; over stdio the SDK ends the
	// connection, since the stream cannot be resynchronised. 0 is
	// [DefaultMaxMessageBytes].
	MaxMessageBytes int
	// Isolation is the isolation every session of the sandbox runs at,
	// which the server tells the agent, in its instructions and in each
	// create_session result, so that it never takes a session for a
	// sandbox it is not; "" is not known, and the agent is told that.
	Isolation sandbox.Isolation
	// HTTPSessionIdle closes an HTTP connection (MCP session) that sent no
	// request for that long; 0 is [DefaultHTTPSessionIdle].
	HTTPSessionIdle time.Duration
	// Logger receives the server's events (a connection's end, a cleanup
	// that failed); nil discards them. Arguments are never logged.
	Logger *slog.Logger
}

// Server is the MCP server over one sandbox. Its methods are safe for
// concurrent use.
type Server struct {
	sb   sandbox.Sandbox
	opts Options
	mcp  *mcp.Server
	log  *slog.Logger

	cache sessionCache

	mu     sync.Mutex
	conns  map[*mcp.ServerSession]*conn
	closed bool
	wg     sync.WaitGroup
}

// protocolVersions are the MCP versions served: those with a session, the
// handshake's. The lifecycle needs one (a connection's sessions end with
// it), and 2026-07-28's requests over HTTP stand alone, with no connection
// to end.
var protocolVersions = slices.DeleteFunc(mcp.SupportedProtocolVersions(), func(v string) bool { return v >= "2026-07-28" })

// New returns a Server over sb. It does not take ownership of sb.
func New(sb sandbox.Sandbox, opts Options) *Server {
	if opts.Name == "" {
		opts.Name = "tai42"
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.DefaultImage == "" {
		opts.DefaultImage = sandbox.HostImage
	}
	if opts.MaxResultBytes <= 0 {
		opts.MaxResultBytes = DefaultMaxResultBytes
	}
	if opts.MaxProcessBytes <= 0 {
		opts.MaxProcessBytes = DefaultMaxProcessBytes
	}
	if opts.MaxProcesses <= 0 {
		opts.MaxProcesses = DefaultMaxProcesses
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if opts.HTTPSessionIdle <= 0 {
		opts.HTTPSessionIdle = DefaultHTTPSessionIdle
	}
	s := &Server{sb: sb, opts: opts, log: opts.Logger, conns: map[*mcp.ServerSession]*conn{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: opts.Name, Version: opts.Version}, &mcp.ServerOptions{
		Instructions:              instructions(opts.Isolation),
		Capabilities:              &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		SupportedProtocolVersions: protocolVersions,
	})
	s.addTools()
	return s
}

// instructions tells the agent what the tools are for and how isolated
// their sessions really are: isolation none is no sandbox at all.
func instructions(iso sandbox.Isolation) string {
	const tools = `Sessions to run commands in: create_session, then run commands (run), move files (write_file, read_file, list_dir), and start long-running servers or jobs (start_process, read_process_output, write_process_stdin, kill_process). Paths and cwd are relative to the session's workspace. Sessions made here are destroyed when this connection ends unless persistent; every session also expires after its ttl_seconds unless touched. `
	switch iso {
	case sandbox.IsolationNone:
		return tools + `Isolation: none. These sessions are NOT sandboxed: commands run directly on the user's machine, as the user running this server, and can read and change that user's files outside the workspace, see and signal their processes and reach whatever the machine reaches. Act as you would in the user's own shell.`
	case sandbox.IsolationContainer:
		return tools + `Isolation: container. Each session is a container of its own (its own filesystem, processes and network per its network tier), not the user's machine.`
	case sandbox.IsolationVM:
		return tools + `Isolation: vm. Each session runs in a virtual machine of its own, not the user's machine.`
	}
	return tools + `Isolation: not known to this server. Do not assume these sessions are sandboxed: create_session's result says what is known.`
}

// ServeIO serves one connection over r and w (a process's stdin and
// stdout: the stdio transport, newline-delimited JSON-RPC) until the
// client closes r or ctx ends, then destroys the connection's sessions.
// A client that ended its input but reads no answer (w full) is given
// stdioGrace for them, then the answers are dropped and the connection
// ends all the same.
func (s *Server) ServeIO(ctx context.Context, r io.Reader, w io.Writer) error {
	out := newStdioWriter(w)
	in := &eofReader{r: r, eof: out.abandonAfter}
	err := s.mcp.Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(in), Writer: out, MaxLineLength: s.opts.MaxMessageBytes})
	out.stop()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), connectionCleanupTimeout)
	defer cancel()
	if cerr := s.Close(cctx); err == nil || errors.Is(err, context.Canceled) {
		err = cerr
	}
	return err
}

// stdioGrace is how long, once the client's input ended, its answers may
// wait for it to read them.
const stdioGrace = 5 * time.Second

// eofReader calls eof(stdioGrace) once its reader ends.
type eofReader struct {
	r    io.Reader
	eof  func(time.Duration)
	once sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.once.Do(func() { e.eof(stdioGrace) })
	}
	return n, err
}

// stdioWriter writes on a goroutine of its own, so that a write to a
// client that reads nothing can be given up (abandonAfter): the write
// then fails and the connection ends, while the goroutine stays blocked
// until the client's end closes (or the process exits).
type stdioWriter struct {
	reqs    chan []byte
	results chan error    // one at most is ever unread: an abandoned write's
	gone    chan struct{} // closed: writes are given up
	quit    chan struct{} // closed: the goroutine ends after its write in progress
	once    sync.Once
}

func newStdioWriter(w io.Writer) *stdioWriter {
	sw := &stdioWriter{reqs: make(chan []byte), results: make(chan error, 1), gone: make(chan struct{}), quit: make(chan struct{})}
	go func() {
		for {
			select {
			case p := <-sw.reqs:
				_, err := w.Write(p)
				sw.results <- err
			case <-sw.quit:
				return
			}
		}
	}()
	return sw
}

// Write is called by one goroutine at a time (the SDK's connection
// serialises its writes).
func (sw *stdioWriter) Write(p []byte) (int, error) {
	select {
	case <-sw.gone:
		return 0, io.ErrClosedPipe
	default:
	}
	select {
	case sw.reqs <- bytes.Clone(p): // an abandoned write keeps its copy
	case <-sw.gone:
		return 0, io.ErrClosedPipe
	}
	select {
	case err := <-sw.results:
		if err != nil {
			return 0, err
		}
		return len(p), nil
	case <-sw.gone:
		return 0, io.ErrClosedPipe
	}
}

// abandonAfter gives up the writes still waiting after d, and every later
// one.
func (sw *stdioWriter) abandonAfter(d time.Duration) { time.AfterFunc(d, sw.abandon) }

func (sw *stdioWriter) abandon() { sw.once.Do(func() { close(sw.gone) }) }

func (sw *stdioWriter) Close() error { return nil }

// stop gives up every write and ends the writing goroutine once its write
// in progress, if any, is done.
func (sw *stdioWriter) stop() {
	sw.abandon()
	close(sw.quit)
}

// HTTPHandler serves the Streamable HTTP transport, one connection per MCP
// session. It does no authentication: mount it behind the daemon's.
func (s *Server) HTTPHandler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		SessionTimeout:      s.opts.HTTPSessionIdle,
		MaxRequestBodyBytes: int64(s.opts.MaxMessageBytes),
		Logger:              s.log,
	})
}

// Close ends every connection still open and destroys their sessions
// (persistent ones are left), waiting for that up to ctx.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	var sessions []*mcp.ServerSession
	for ss := range s.conns {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		_ = ss.Close()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mcpserver: closing the connections: %w", ctx.Err())
	}
}

// connOf returns the state of the connection a request came on, made at
// its first tool call; its end (the session's Wait) cleans it up.
func (s *Server) connOf(ss *mcp.ServerSession) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.conns[ss]; ok {
		return c, nil
	}
	if s.closed {
		return nil, errors.New("the server is shutting down")
	}
	c := newConn(s, newID("c"))
	s.conns[ss] = c
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = ss.Wait()
		s.mu.Lock()
		delete(s.conns, ss)
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), connectionCleanupTimeout)
		defer cancel()
		c.end(ctx)
	}()
	return c, nil
}

// newID returns prefix and 12 random hex digits.
func newID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%x", prefix, b)
}
