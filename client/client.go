package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// Tunables of the client.
const (
	// StreamBuffer bounds the output an interactive exec's handle queues
	// before its reader stops reading from the daemon (back-pressure), as
	// the host provider's default stream buffer does.
	StreamBuffer = 4 << 20
	// ackBound is the output bound of an interactive exec's handle while a
	// stdin or close_stdin ack is awaited (see handle.full). It must hold
	// all the output the daemon can have sent ahead of an ack, so that the
	// ack of an exec that has exited always arrives with nobody reading.
	// Ahead of the ack are: StreamBuffer already queued; at most two output
	// frames of api.MaxStdinFrame bytes (the daemon writes frames and acks
	// under one mutex, which Go hands to a waiter that has waited 1 ms, so
	// the ack follows the frame being written and at most one more); and
	// what the TCP stacks and WebSocket buffers hold on the way (Linux's
	// default limits: 4 MiB sent, 6 MiB received; about 6 MiB measured on
	// loopback). That is 16 MiB, 20 MiB should the daemon's whole output
	// buffer (the host runner's 4 MiB) go first; ackBound is 32 MiB, for
	// socket limits raised above the defaults, TLS and proxies. Past it the
	// reader waits for Next (or a Kill, which lifts the bound), and
	// WriteStdin for its ctx. Below it, nothing waits on the consumer.
	ackBound = 8 * StreamBuffer
	// goneAfter is how long a handle's reader waits at its bound before it
	// checks, every goneEvery, with goneTimeout per check, whether the
	// session still exists (a session destroyed elsewhere frees the
	// handle).
	goneAfter   = 2 * time.Second
	goneEvery   = 2 * time.Second
	goneTimeout = 5 * time.Second
	// MaxIdleConnsPerHost is how many idle keep-alive connections the
	// client's own transport keeps to the daemon, so that parallel calls
	// reuse connections.
	MaxIdleConnsPerHost = 64
	// defaultsTimeout bounds the one request that ExecDefaultTimeout and
	// ReapInterval make.
	defaultsTimeout = 10 * time.Second
	// maxErrorBody is the most of an error response that is read.
	maxErrorBody = 1 << 20
	// maxFrame is the largest frame the client reads from the daemon.
	maxFrame = 16 << 20
)

// Client is a [sandbox.Sandbox] served by a TAI42 daemon over HTTP. Its
// methods are safe for concurrent use. The zero value is not usable; call
// [New].
type Client struct {
	display  string   // the daemon's URL for error texts: no userinfo
	base     *url.URL // scheme and host (and path prefix) of every request
	urlErr   error    // a URL New could not use; every call returns it
	unixPath string   // the socket of a unix: URL
	token    string
	hc       *http.Client
	tr       *http.Transport // the transport the client built, if any

	userHC *http.Client
	tlsCfg *tls.Config

	infoMu sync.Mutex
	info   *api.SandboxInfo // GET /v1/sandbox, once it succeeded

	regMu   sync.Mutex
	handles map[string]map[*handle]struct{} // live exec handles by session id

	// goneAfter, goneEvery and goneTimeout time the session checks of a
	// handle's reader waiting at its bound (tests shorten them).
	goneAfter, goneEvery, goneTimeout time.Duration
}

var _ sandbox.Sandbox = (*Client)(nil)

// Option configures a [Client].
type Option func(*Client)

// WithHTTPClient makes the client send every request, the exec WebSockets
// included, through hc (for a custom TLS set-up, a proxy, a test
// transport). When hc's Transport is nil or an *http.Transport, the client
// uses a clone of it, to which a unix: URL's socket and [WithTLSConfig]
// apply; any other RoundTripper is used as it is and must reach the daemon
// itself. WebSockets need HTTP/1.1: a transport that negotiates HTTP/2 with
// the daemon cannot start interactive execs. hc.Timeout must be zero: the
// contexts bound every call.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.userHC = hc }
}

// WithTLSConfig sets the TLS configuration of https: URLs (a private CA, a
// client certificate).
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *Client) { c.tlsCfg = cfg }
}

// New returns a client of the daemon at rawURL ("http://127.0.0.1:4242",
// "https://host:port", or "unix:/path/to.sock") authenticating with token.
// It does no I/O. A URL it cannot use is reported by every call, as a
// *sandbox.SandboxError.
func New(rawURL, token string, opts ...Option) *Client {
	c := &Client{token: token, handles: make(map[string]map[*handle]struct{}),
		goneAfter: goneAfter, goneEvery: goneEvery, goneTimeout: goneTimeout}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	c.parseURL(rawURL)
	c.buildHTTP()
	return c
}

func (c *Client) parseURL(raw string) {
	c.display = "the configured URL"
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the url.Error repeats the URL, which may hold a password
		}
		c.urlErr = sandbox.WrapError("client", "the daemon URL is not valid (want http://host:port, https://host:port or unix:/path/to.sock)", err)
		return
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if p == "" {
			p = u.Opaque
		}
		if p == "" {
			c.urlErr = sandbox.Errorf("client", "the daemon URL %q names no socket (want unix:/path/to.sock)", raw)
			return
		}
		c.unixPath = p
		c.display = "unix:" + p
		c.base = &url.URL{Scheme: "http", Host: "unix"}
	case "http", "https":
		if u.Host == "" {
			c.urlErr = sandbox.Errorf("client", "the daemon URL %s names no host", u.Redacted())
			return
		}
		c.base = &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/")}
		c.display = c.base.String()
	default:
		c.urlErr = sandbox.Errorf("client", "the daemon URL scheme %q is not http, https or unix", u.Scheme)
	}
}

func (c *Client) buildHTTP() {
	var hc http.Client
	if c.userHC != nil {
		hc = *c.userHC
	}
	switch t := hc.Transport.(type) {
	case nil:
		c.tr = http.DefaultTransport.(*http.Transport).Clone()
		c.tr.MaxIdleConns = 4 * MaxIdleConnsPerHost
		c.tr.MaxIdleConnsPerHost = MaxIdleConnsPerHost
		// HTTP/1.1 only: the exec WebSocket is an HTTP/1.1 upgrade, and
		// keep-alive connections serve parallel calls.
		c.tr.ForceAttemptHTTP2 = false
		c.tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	case *http.Transport:
		c.tr = t.Clone()
	}
	if c.tr != nil {
		if c.tlsCfg != nil {
			c.tr.TLSClientConfig = c.tlsCfg.Clone()
		}
		if c.unixPath != "" {
			path := c.unixPath
			var d net.Dialer
			c.tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", path)
			}
			c.tr.Proxy = nil
		}
		hc.Transport = c.tr
	}
	c.hc = &hc
}

// Close closes the client's idle connections. Sessions and exec handles
// obtained from it keep working (they open new connections as needed);
// Close never destroys a session. It is safe to call more than once and
// concurrently with other calls, and always returns nil.
func (c *Client) Close() error {
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	} else if c.hc != nil {
		c.hc.CloseIdleConnections()
	}
	return nil
}

// Policy returns the policy the daemon enforces (GET /v1/policy).
func (c *Client) Policy(ctx context.Context) (sandbox.Policy, error) {
	var p sandbox.Policy
	err := c.doJSON(ctx, "policy", http.MethodGet, "/v1/policy", nil, nil, &p)
	return p, err
}

// Info returns what the daemon says about itself (GET /v1/sandbox): its
// provider, defaults, policy, body limit and version. A successful answer
// is also what ExecDefaultTimeout and ReapInterval report from then on.
func (c *Client) Info(ctx context.Context) (api.SandboxInfo, error) {
	var info api.SandboxInfo
	if err := c.doJSON(ctx, "sandbox_info", http.MethodGet, "/v1/sandbox", nil, nil, &info); err != nil {
		return api.SandboxInfo{}, err
	}
	c.infoMu.Lock()
	if c.info == nil {
		c.info = &info
	}
	c.infoMu.Unlock()
	return info, nil
}

// Health checks that the daemon answers (GET /healthz, which needs no
// token). It returns nil when the daemon reports itself healthy.
func (c *Client) Health(ctx context.Context) error {
	var h api.Health
	return c.doJSON(ctx, "health", http.MethodGet, "/healthz", nil, nil, &h)
}

// defaults returns the daemon's GET /v1/sandbox answer, fetching it once
// (bounded by defaultsTimeout) and caching the first success; a failure is
// retried by the next call.
func (c *Client) defaults() (api.SandboxInfo, bool) {
	c.infoMu.Lock()
	defer c.infoMu.Unlock()
	if c.info != nil {
		return *c.info, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultsTimeout)
	defer cancel()
	var info api.SandboxInfo
	if err := c.doJSON(ctx, "sandbox_info", http.MethodGet, "/v1/sandbox", nil, nil, &info); err != nil {
		return api.SandboxInfo{}, false
	}
	c.info = &info
	return info, true
}

// ExecDefaultTimeout is the daemon's default for one short exec. It has no
// context: the first call asks the daemon (GET /v1/sandbox, bounded by 10s)
// and caches the answer; until an answer is had it returns 0 and a later
// call asks again. Safe for concurrent use.
func (c *Client) ExecDefaultTimeout() time.Duration {
	info, ok := c.defaults()
	if !ok {
		return 0
	}
	return max(api.Seconds(info.ExecDefaultTimeoutSeconds), 0)
}

// ReapInterval is the daemon's reap sweep cadence, fetched and cached like
// ExecDefaultTimeout (0 while unknown).
func (c *Client) ReapInterval() time.Duration {
	info, ok := c.defaults()
	if !ok {
		return 0
	}
	return max(api.Seconds(info.ReapIntervalSeconds), 0)
}

// CreateSession asks the daemon for a session (POST /v1/sessions). A spec
// the daemon cannot honour is a *sandbox.SpecRejectedError with its Field
// and Reason. Env values travel to the daemon in the request body only.
func (c *Client) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	var info sandbox.SessionInfo
	if err := c.doJSON(ctx, "create_session", http.MethodPost, "/v1/sessions", nil, api.SpecFrom(spec), &info); err != nil {
		return nil, err
	}
	return c.session(info), nil
}

// GetSession fetches a live session (GET /v1/sessions/{id}); a
// *sandbox.SessionNotFoundError for an id with no live session.
func (c *Client) GetSession(ctx context.Context, id string) (sandbox.Session, error) {
	if id == "" {
		return nil, &sandbox.SessionNotFoundError{SessionID: id}
	}
	var info sandbox.SessionInfo
	if err := c.doJSON(ctx, "get_session", http.MethodGet, sessionPath(id, ""), nil, nil, &info); err != nil {
		return nil, err
	}
	return c.session(info), nil
}

// ListSessions returns the state of every live session (GET /v1/sessions).
func (c *Client) ListSessions(ctx context.Context) ([]sandbox.SessionInfo, error) {
	var list api.SessionList
	if err := c.doJSON(ctx, "list_sessions", http.MethodGet, "/v1/sessions", nil, nil, &list); err != nil {
		return nil, err
	}
	if list.Sessions == nil {
		list.Sessions = []sandbox.SessionInfo{}
	}
	return list.Sessions, nil
}

// DestroySession tears a session down (DELETE /v1/sessions/{id}). It is
// idempotent: an unknown or already-gone id returns nil.
func (c *Client) DestroySession(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	err := c.doJSON(ctx, "destroy_session", http.MethodDelete, sessionPath(id, ""), nil, nil, nil)
	if err == nil {
		c.sessionGone(id)
	}
	return err
}

// Reap asks the daemon to destroy every expired session (POST /v1/reap)
// and returns exactly the destroyed ids.
func (c *Client) Reap(ctx context.Context) ([]string, error) {
	var r api.Reaped
	if err := c.doJSON(ctx, "reap", http.MethodPost, "/v1/reap", nil, nil, &r); err != nil {
		return nil, err
	}
	if r.Reaped == nil {
		r.Reaped = []string{}
	}
	for _, id := range r.Reaped {
		c.sessionGone(id)
	}
	return r.Reaped, nil
}

// sessionPath is /v1/sessions/{id}[/rest] with id escaped.
func sessionPath(id, rest string) string {
	p := "/v1/sessions/" + url.PathEscape(id)
	if rest != "" {
		p += "/" + rest
	}
	return p
}

// endpoint returns the URL of path (already escaped) with query q.
func (c *Client) endpoint(path string, q url.Values) string {
	s := c.base.String() + path
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// request is one HTTP request to the daemon.
type request struct {
	op, method, path string
	query            url.Values
	body             io.Reader
	length           int64 // of body; -1 unknown
	contentType      string
	accept           string      // "" is application/json
	trailer          http.Header // declared trailers, set before the body ends
}

// do sends r and returns the response when its status is 2xx; any other
// answer is decoded into its error and the body closed. The caller closes
// the body of a returned response.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	// A body is closed in every case, as http.Client.Do does.
	notSent := func(err error) (*http.Response, error) {
		if cl, ok := r.body.(io.Closer); ok {
			cl.Close()
		}
		return nil, err
	}
	if c.urlErr != nil {
		return notSent(c.urlErr)
	}
	if err := ctx.Err(); err != nil {
		return notSent(ctxErr(r.op, err))
	}
	req, err := http.NewRequestWithContext(ctx, r.method, c.endpoint(r.path, r.query), r.body)
	if err != nil {
		return notSent(sandbox.WrapError(r.op, "cannot build the request", err))
	}
	if r.body != nil && r.length >= 0 {
		req.ContentLength = r.length
		if r.length == 0 {
			req.Body = http.NoBody
		}
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.trailer != nil {
		req.Trailer = r.trailer
	}
	accept := r.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	c.authorize(req.Header)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportErr(ctx, r.op, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, c.responseErr(ctx, r.op, resp.Status, resp.Body)
}

func (c *Client) authorize(h http.Header) {
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
}

// doJSON sends in (if not nil) as a JSON body and decodes a 2xx answer's
// JSON body into out (if not nil).
func (c *Client) doJSON(ctx context.Context, op, method, path string, q url.Values, in, out any) error {
	r := request{op: op, method: method, path: path, query: q, length: -1}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			// encoding/json's errors name types, never values.
			return sandbox.WrapError(op, "cannot encode the request", err)
		}
		r.body, r.length, r.contentType = bytes.NewReader(b), int64(len(b)), "application/json"
	}
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return ctxErr(op, ctx.Err())
		}
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		if errors.As(err, &se) || errors.As(err, &te) || errors.Is(err, io.EOF) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // an empty body: never the clean end of a stream
			}
			return sandbox.WrapError(op, fmt.Sprintf("the daemon at %s answered %s with a body that is not the expected JSON", c.display, resp.Status), err)
		}
		return c.transportErr(ctx, op, err)
	}
	return nil
}

// responseErr decodes a non-2xx answer: an API error body becomes the
// contract's error with every field; anything else a *SandboxError naming
// the status.
func (c *Client) responseErr(ctx context.Context, op, status string, body io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(body, maxErrorBody))
	if err != nil && ctx.Err() != nil {
		return ctxErr(op, ctx.Err())
	}
	var eb api.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Kind != "" {
		return eb.Error.Err()
	}
	return sandbox.Errorf(op, "the daemon at %s answered %s, which is not an API error body", c.display, status)
}

// transportErr is the error of a request that got no answer: the context's
// end, or a daemon that cannot be reached.
func (c *Client) transportErr(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return ctxErr(op, cerr)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the url.Error repeats the URL
	}
	if err = noEOF(err); err == ErrConnectionClosed {
		return sandbox.WrapError(op, "the connection to the daemon at "+c.display+" ended before its answer", err)
	}
	return sandbox.WrapError(op, "cannot reach the daemon at "+c.display, err)
}

// ErrConnectionClosed is the cause of an error of a call, an exec stream
// or a download whose connection was closed (by the daemon, or a proxy in
// between) before the answer was whole: errors.Is(err,
// ErrConnectionClosed). It also matches io.ErrUnexpectedEOF, never io.EOF:
// a caller reading a stream must not take it for the stream's clean end.
var ErrConnectionClosed error = connectionClosed{}

type connectionClosed struct{}

func (connectionClosed) Error() string {
	return "the daemon closed the connection before the answer was whole"
}

func (connectionClosed) Is(target error) bool { return target == io.ErrUnexpectedEOF }

// noEOF replaces a cause that matches io.EOF or io.ErrUnexpectedEOF (a
// connection closed midway) by ErrConnectionClosed: an error the client
// returns says so, and never passes for the clean end of a stream
// (errors.Is(err, io.EOF)).
func noEOF(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return ErrConnectionClosed
	}
	return err
}

// ctxErr is the error of a call whose context ended: a *SandboxError that
// also matches err (context.Canceled or context.DeadlineExceeded).
func ctxErr(op string, err error) error {
	msg := "the call was cancelled"
	if errors.Is(err, context.DeadlineExceeded) {
		msg = "the call's deadline passed"
	}
	return sandbox.WrapError(op, msg, err)
}

// session builds the client side of a session the daemon described.
func (c *Client) session(info sandbox.SessionInfo) *session {
	return &session{c: c, id: info.ID, ws: info.WorkspacePath}
}

// register records a live exec handle of session id, so that destroying
// the session through this client lifts the handle's output bound.
func (c *Client) register(id string, h *handle) {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	m := c.handles[id]
	if m == nil {
		m = make(map[*handle]struct{})
		c.handles[id] = m
	}
	m[h] = struct{}{}
}

func (c *Client) unregister(id string, h *handle) {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	if m := c.handles[id]; m != nil {
		delete(m, h)
		if len(m) == 0 {
			delete(c.handles, id)
		}
	}
}

// sessionGone tells the handles of a destroyed session that their streams
// are ending: they read the rest without bound, so that their readers see
// the last frame and free the connection even when nobody calls Next.
func (c *Client) sessionGone(id string) {
	c.regMu.Lock()
	hs := make([]*handle, 0, len(c.handles[id]))
	for h := range c.handles[id] {
		hs = append(hs, h)
	}
	c.regMu.Unlock()
	for _, h := range hs {
		h.unbound()
	}
}
