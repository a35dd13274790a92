// Package server is the TAI42 Sandbox daemon's HTTP API over any
// [sandbox.Sandbox]: the routes of [api.Routes], their JSON bodies and
// errors, the interactive exec over WebSocket, Prometheus metrics and one
// structured log line per request. The wire format is package api's; this
// package only serves it.
//
// Security: every route but the public ones needs "Authorization: Bearer
// TOKEN", compared in constant time; a refused request touches nothing.
// Env values (secrets), request bodies, argv, tokens and the Authorization
// header never reach a log line, an error text or a panic.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// Defaults and fixed limits.
const (
	// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes is 0.
	DefaultMaxBodyBytes int64 = 1 << 30
	// DefaultShutdownGrace is Options.ShutdownGrace when it is 0.
	DefaultShutdownGrace = 10 * time.Second
	// ReadHeaderTimeout and MaxHeaderBytes are the http.Server's limits in Serve.
	ReadHeaderTimeout = 10 * time.Second
	MaxHeaderBytes    = 64 << 10
	// IdleTimeout closes a keep-alive connection idle that long (Serve).
	IdleTimeout = 2 * time.Minute
	// TransferIdleTimeout cuts a request whose body sends nothing for that
	// long (it gets a 400 bad_request and the connection is closed), and a
	// file download whose client takes nothing for that long (its body is
	// aborted). The deadline is pushed forward as data moves.
	TransferIdleTimeout = 60 * time.Second

	// maxJSONBytes limits a JSON request body (create, exec) below
	// MaxBodyBytes: the JSON decoder holds the whole value in memory.
	maxJSONBytes int64 = 64 << 20

	// hardStopWait bounds how long Serve waits, once the grace is over and
	// every exec was told to die, for the handlers to return.
	hardStopWait = 15 * time.Second
)

// Options configure a [Server].
type Options struct {
	// Token is required and non-empty: every non-public route needs
	// "Authorization: Bearer <Token>".
	Token string
	// Policy is the resolved policy, returned by GET /v1/policy and in GET
	// /v1/sandbox. The zero Policy means the sandbox's own when it has a
	// Policy() method (as a kit-built sandbox does); a policy that differs
	// from the sandbox's own is refused by New.
	Policy sandbox.Policy
	// EgressFences and Disk are what the provider enforces beyond the
	// policy, reported by GET /v1/policy beside it; nil leaves them out.
	EgressFences *api.EgressFences
	Disk         *api.DiskCap
	// Provider is the provider's name, reported by GET /v1/sandbox.
	Provider string
	// Version is reported by GET /v1/sandbox.
	Version string
	// MaxBodyBytes limits the body of a file upload; 0 means
	// [DefaultMaxBodyBytes]. A JSON body (create, exec) has the smaller
	// limit of min(MaxBodyBytes, 64 MiB). A body whose Content-Length is
	// over its limit is refused before it is read.
	MaxBodyBytes int64
	// Logger receives one line per request and the server's events; nil
	// discards them.
	Logger *slog.Logger
	// Registry receives the server's metrics and is served at /metrics; nil
	// means a fresh registry owned by this Server.
	Registry *prometheus.Registry
	// MCP, when set, is served at /mcp (every method) behind the token:
	// the MCP server's Streamable HTTP transport (package mcpserver).
	MCP http.Handler
	// ShutdownGrace is how long, at shutdown, in-flight requests and
	// interactive execs may finish before their execs are killed; 0 means
	// [DefaultShutdownGrace].
	ShutdownGrace time.Duration
}

// Server serves the API over one sandbox. It is an http.Handler; Serve runs
// it on a listener with graceful shutdown. All methods are safe for
// concurrent use.
type Server struct {
	sb       sandbox.Sandbox
	token    string
	policy   sandbox.Policy
	fences   atomic.Pointer[api.EgressFences]
	disk     *api.DiskCap
	provider string
	version  string
	maxBody  int64
	jsonMax  int64         // min(maxBody, maxJSONBytes)
	idle     time.Duration // TransferIdleTimeout (tests shorten it)
	grace    time.Duration
	log      *slog.Logger
	reg      *prometheus.Registry
	met      *metrics
	mcp      http.Handler
	handler  http.Handler

	// inflight counts running handlers, interactive execs included (they
	// run in their handler), so that Serve can wait for them.
	inflight tracker
	// closing refuses new requests once Serve is shutting down.
	closing atomic.Bool
	// hardStop is closed when the shutdown grace is over: every interactive
	// exec still running is killed.
	hardStop     chan struct{}
	hardStopOnce sync.Once
	served       atomic.Bool
	timing       streamTiming
}

// New returns a Server for sb. It fails when Token is empty, a limit is
// negative, the policy is invalid or differs from the sandbox's own, a
// route of [api.Routes] has no handler, or a metric cannot be registered
// (a Registry shared with another Server). New does not take ownership of
// sb: the caller closes it after Serve returns.
func New(sb sandbox.Sandbox, opts Options) (*Server, error) {
	if sb == nil {
		return nil, errors.New("server: a sandbox is required")
	}
	if opts.Token == "" {
		return nil, errors.New("server: a non-empty token is required")
	}
	if strings.ContainsFunc(opts.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, errors.New("server: the token must not contain spaces or control characters")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("server: MaxBodyBytes %d is negative", opts.MaxBodyBytes)
	}
	if opts.ShutdownGrace < 0 {
		return nil, fmt.Errorf("server: ShutdownGrace %v is negative", opts.ShutdownGrace)
	}
	policy, err := resolvePolicy(sb, opts.Policy)
	if err != nil {
		return nil, err
	}
	s := &Server{
		sb:       sb,
		token:    opts.Token,
		policy:   policy,
		disk:     opts.Disk,
		provider: opts.Provider,
		version:  opts.Version,
		maxBody:  opts.MaxBodyBytes,
		grace:    opts.ShutdownGrace,
		log:      opts.Logger,
		reg:      opts.Registry,
		mcp:      opts.MCP,
		hardStop: make(chan struct{}),
		timing:   defaultTiming,
	}
	s.fences.Store(opts.EgressFences)
	if s.maxBody == 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	s.jsonMax = min(s.maxBody, maxJSONBytes)
	s.idle = TransferIdleTimeout
	if s.grace == 0 {
		s.grace = DefaultShutdownGrace
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	if s.met, err = newMetrics(s.reg, sb); err != nil {
		return nil, err
	}
	if s.handler, err = s.routes(); err != nil {
		return nil, err
	}
	return s, nil
}

// SetEgressFences replaces the egress fences GET /v1/policy reports, once
// the operator changed them on a running daemon.
func (s *Server) SetEgressFences(f *api.EgressFences) { s.fences.Store(f) }

// resolvePolicy picks the policy the API reports: the given one, or the
// sandbox's own when none is given; a mismatch is a configuration error.
func resolvePolicy(sb sandbox.Sandbox, p sandbox.Policy) (sandbox.Policy, error) {
	own, hasOwn := sb.(interface{ Policy() sandbox.Policy })
	if p == (sandbox.Policy{}) && hasOwn {
		p = own.Policy()
	}
	if err := p.Validate(); err != nil {
		return sandbox.Policy{}, fmt.Errorf("server: %w", err)
	}
	if hasOwn && own.Policy() != p {
		return sandbox.Policy{}, fmt.Errorf("server: Options.Policy %+v differs from the policy the sandbox enforces %+v", p, own.Policy())
	}
	return p, nil
}

// ServeHTTP serves one request of the API. It never panics: a panic in a
// handler becomes a 500 of kind internal, logged with its route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

// Serve serves on ln until ctx is done, then shuts down gracefully: it stops
// accepting, lets in-flight requests and interactive execs run up to
// ShutdownGrace, then kills the execs still running (cancelling the
// contexts of plain execs and killing the handles of interactive ones) and
// returns once their handlers have returned (or, for a handler that will
// not, after a further bounded wait). It does not close the sandbox.
//
// tlsConfig nil serves plain HTTP; otherwise TLS (HTTP/1.1, which the
// WebSocket exec needs). Serve returns nil after a shutdown caused by ctx,
// and the listener's error if serving failed; it may be called once per
// Server.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tlsConfig *tls.Config) error {
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("server: Serve may be called only once per Server")
	}
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: ReadHeaderTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		IdleTimeout:       IdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if tlsConfig != nil {
		cfg := tlsConfig.Clone()
		if len(cfg.NextProtos) == 0 {
			cfg.NextProtos = []string{"http/1.1"}
		}
		hs.TLSConfig = cfg
		ln = tls.NewListener(ln, cfg)
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	var serveErr error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "grace", s.grace.String())
	case serveErr = <-errc:
		s.log.Error("serving failed; shutting down", "err", serveErr)
	}
	s.shutdown(hs, cancelBase)
	if serveErr == nil {
		serveErr = <-errc
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		return nil
	}
	return serveErr
}

// shutdown stops hs: no new connection, in-flight work up to the grace, then
// every exec killed and a bounded wait for the handlers.
func (s *Server) shutdown(hs *http.Server, cancelBase context.CancelFunc) {
	s.closing.Store(true)
	graceCtx, cancel := context.WithTimeout(context.Background(), s.grace)
	defer cancel()
	shutDone := make(chan struct{})
	go func() {
		defer close(shutDone)
		_ = hs.Shutdown(graceCtx) // closes the listeners at once; the grace is ours to enforce
	}()
	select {
	case <-s.inflight.idle():
	case <-graceCtx.Done():
		n := s.inflight.count()
		s.log.Warn("shutdown grace is over; killing the execs still running", "in_flight", n)
		s.stopHard()
		cancelBase()
		t := time.NewTimer(hardStopWait)
		select {
		case <-s.inflight.idle():
		case <-t.C:
			s.log.Error("handlers still running after their execs were killed; closing their connections", "in_flight", s.inflight.count())
		}
		t.Stop()
	}
	<-shutDone
	_ = hs.Close() // whatever connection is left
}

// stopHard tells every interactive exec to die.
func (s *Server) stopHard() { s.hardStopOnce.Do(func() { close(s.hardStop) }) }

// Listen listens on addr: "host:port" (TCP) or "unix:/path" (a unix
// socket: a stale socket file there is removed first, a live one or a
// non-socket file is an error, and the new socket gets mode 0600). The
// socket is made in a fresh 0700 directory beside path, given its mode
// there and then renamed into place, so it is never reachable with wider
// permissions. Closing the listener removes the socket file (while it is
// still this listener's). The caller closes the listener (Serve does).
func Listen(addr string) (net.Listener, error) {
	path, isUnix := strings.CutPrefix(addr, "unix:")
	if !isUnix {
		if addr == "" {
			return nil, errors.New("server: listen: an address is required (host:port or unix:/path)")
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("server: listen: %w", err)
		}
		return ln, nil
	}
	if path == "" {
		return nil, errors.New("server: listen: unix: needs a socket path")
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	return listenUnix(path)
}

// listenUnix listens on a socket made in a private directory beside path
// and renamed into place.
func listenUnix(path string) (_ net.Listener, err error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".tai42-") // mode 0700
	if err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	defer os.Remove(dir) // empty once the socket has moved; on failure, after it went
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	ln.SetUnlinkOnClose(false) // the file moves; unixListener.Close removes it
	defer func() {
		if err != nil {
			ln.Close()
			os.Remove(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	return &unixListener{UnixListener: ln, path: path, fi: fi}, nil
}

// unixListener is a unix socket listener renamed into place: its address
// is the final path, and Close removes the socket file unless another
// file has replaced it since.
type unixListener struct {
	*net.UnixListener
	path string
	fi   os.FileInfo
	once sync.Once
}

func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, lerr := os.Lstat(l.path); lerr == nil && os.SameFile(fi, l.fi) {
			_ = os.Remove(l.path)
		}
	})
	return err
}

// removeStaleSocket removes a socket file at path that no one listens on.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("server: listen: %w", err)
	case fi.Mode()&os.ModeSocket == 0:
		return fmt.Errorf("server: listen: %s exists and is not a socket; not removing it", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("server: listen: %s: another process is listening there", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("server: listen: removing stale socket: %w", err)
	}
	return nil
}

// tracker counts running handlers and tells when none runs.
type tracker struct {
	mu      sync.Mutex
	n       int
	waiters chan struct{} // closed when n drops to 0
}

func (t *tracker) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.waiters != nil {
		close(t.waiters)
		t.waiters = nil
	}
	t.mu.Unlock()
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// idle returns a channel closed once no handler runs.
func (t *tracker) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if t.waiters == nil {
		t.waiters = make(chan struct{})
	}
	return t.waiters
}

// errShuttingDown answers requests that arrive while Serve shuts down.
var errShuttingDown = api.Transportf(api.KindShuttingDown, "the daemon is shutting down")
