package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// routeUnknown is the route label of a request that matched no route.
const routeUnknown = "unknown"

// MCPPath is where Options.MCP is served.
const MCPPath = "/mcp"

// reqState is what one request's handlers tell the log line and the
// metrics. It is written by the request's own goroutine only.
type reqState struct {
	id        string
	route     string
	sessionID string
	body      *countingBody
	// jsonBody: the route's body is JSON, under the JSON limit (the
	// message of a too_large says so).
	jsonBody bool
	errKind  api.Kind
	errMsg   string // only for kind internal: the daemon's own failures
	// cut says why a response body was cut short (the client sees a
	// truncated or aborted body); "" when it was not.
	cut string
	// ws is set once a WebSocket took the connection over: its byte counts
	// replace the ResponseWriter's, and end describes how the exec ended.
	ws        bool
	wsIn      int64
	wsOut     int64
	streamEnd []any
}

type stateKey struct{}

func stateOf(r *http.Request) *reqState {
	rs, _ := r.Context().Value(stateKey{}).(*reqState)
	if rs == nil {
		rs = &reqState{route: routeUnknown} // a handler called outside outer (never in this package)
	}
	return rs
}

// routes builds the handler: the outer middleware around a ServeMux that
// holds exactly api.Routes, and a fallback that answers 405 (with Allow)
// for a path some route serves with another method, 404 for the rest.
func (s *Server) routes() (_ http.Handler, err error) {
	handlers := map[string]http.HandlerFunc{
		"healthz":        s.healthz,
		"openapi":        s.openapi,
		"metrics":        s.metricsHandler(),
		"getPolicy":      s.getPolicy,
		"getSandbox":     s.getSandbox,
		"createSession":  s.createSession,
		"listSessions":   s.listSessions,
		"getSession":     s.getSession,
		"destroySession": s.destroySession,
		"touchSession":   s.touchSession,
		"exec":           s.exec,
		"execStream":     s.execStream,
		"putFile":        s.putFile,
		"getFile":        s.getFile,
		"reap":           s.reap,
		// workspaces.go
		"listWorkspaces":  s.listWorkspaces,
		"removeWorkspace": s.removeWorkspace,
		// images.go
		"pullImage":   s.pullImage,
		"listImages":  s.listImages,
		"removeImage": s.removeImage,
		"pruneImages": s.pruneImages,
	}
	mux := http.NewServeMux()
	defer func() {
		if p := recover(); p != nil { // a conflicting pattern in the route table
			err = fmt.Errorf("server: registering the routes: %v", p)
		}
	}()
	for _, rt := range api.Routes {
		h, ok := handlers[rt.OperationID]
		if !ok {
			return nil, fmt.Errorf("server: route %s %s (%s) has no handler", rt.Method, rt.Path, rt.OperationID)
		}
		delete(handlers, rt.OperationID)
		mux.Handle(rt.Pattern(), s.route(rt, h))
	}
	if len(handlers) > 0 {
		var extra []string
		for op := range handlers {
			extra = append(extra, op)
		}
		slices.Sort(extra)
		return nil, fmt.Errorf("server: handlers without a route in api.Routes: %s", strings.Join(extra, ", "))
	}
	if s.mcp != nil {
		mux.Handle(MCPPath, s.route(api.Route{Path: MCPPath, OperationID: "mcp"}, s.mcp.ServeHTTP))
	}
	// A method-less pattern per path would conflict with a wildcard route
	// of another method ("/v1/images/pull" with "DELETE
	// /v1/images/{name...}"), so the one fallback finds the methods by
	// asking the mux.
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if allow := allowedMethods(mux, r); allow != "" {
			w.Header().Set("Allow", allow)
			s.writeError(w, r, api.Transportf(api.KindMethodNotAllowed, "method %s is not allowed on %s; allowed: %s", r.Method, clipText(r.URL.Path), allow))
			return
		}
		s.writeError(w, r, api.Transportf(api.KindNotFound, "no route %s %s", r.Method, clipText(r.URL.Path)))
	}))
	return s.outer(mux), nil
}

// allowedMethods lists, in the order of api.Routes, the methods of the
// routes that serve r's path (HEAD after GET: ServeMux serves HEAD with
// GET); "" when none does.
func allowedMethods(mux *http.ServeMux, r *http.Request) string {
	var allow []string
	for _, rt := range api.Routes {
		if slices.Contains(allow, rt.Method) {
			continue
		}
		probe := r.WithContext(r.Context())
		probe.Method = rt.Method
		if _, pattern := mux.Handler(probe); pattern != rt.Pattern() {
			continue
		}
		allow = append(allow, rt.Method)
		if rt.Method == http.MethodGet {
			allow = append(allow, http.MethodHead)
		}
	}
	return strings.Join(allow, ", ")
}

// maxSessionID is the longest session id the server passes to the sandbox;
// a longer id in a path names no session (a real id is short).
const maxSessionID = 128

// bodyRoutes are the routes that read a request body: true for a JSON body
// (under the JSON limit), false for raw bytes (under MaxBodyBytes).
var bodyRoutes = map[string]bool{
	"createSession": true,
	"exec":          true,
	"putFile":       false,
	"pullImage":     true,
	"mcp":           true,
}

// route wraps one route's handler: it names the route for the log and the
// metrics, and refuses a request without the right token before anything
// else is done (the body is not read, no session is touched). It then
// refuses, still before reading anything, a session id no session can have
// and a body whose declared length is over the route's limit.
func (s *Server) route(rt api.Route, h http.HandlerFunc) http.Handler {
	isJSON, readsBody := bodyRoutes[rt.OperationID]
	limit := s.maxBody
	if isJSON {
		limit = s.jsonMax
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs := stateOf(r)
		rs.route = rt.OperationID
		if !rt.Public {
			if err := s.authorize(r); err != nil {
				w.Header().Set("WWW-Authenticate", "Bearer")
				s.writeError(w, r, err)
				return
			}
		}
		if id := r.PathValue("id"); id != "" {
			rs.sessionID = clipText(id)
			if len(id) > maxSessionID {
				if rt.OperationID == "destroySession" { // idempotent: no such session is nothing to do
					w.WriteHeader(http.StatusNoContent)
					return
				}
				s.writeError(w, r, &sandbox.SessionNotFoundError{SessionID: clipText(id),
					Detail: fmt.Sprintf("the id is %d bytes long; no session id is longer than %d", len(id), maxSessionID)})
				return
			}
		}
		if readsBody {
			rs.jsonBody = isJSON
			if rs.body != nil {
				rs.body.setLimit(limit)
			}
			if r.ContentLength > limit { // refused before a byte is read (nor a 100 Continue sent)
				s.writeError(w, r, s.tooLarge(rs))
				return
			}
		}
		h(w, r)
	})
}

// authorize checks the bearer token in constant time (of the token's
// length too: both sides are hashed first).
func (s *Server) authorize(r *http.Request) error {
	vals := r.Header.Values("Authorization")
	if len(vals) == 0 {
		return api.Transportf(api.KindUnauthorized, "missing bearer token: send \"Authorization: Bearer <token>\"")
	}
	if len(vals) > 1 {
		return api.Transportf(api.KindUnauthorized, "more than one Authorization header")
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return api.Transportf(api.KindUnauthorized, "the Authorization header must use the Bearer scheme")
	}
	got := sha256.Sum256([]byte(strings.TrimLeft(tok, " ")))
	want := sha256.Sum256([]byte(s.token))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return api.Transportf(api.KindUnauthorized, "the bearer token is not valid")
	}
	return nil
}

// outer is the middleware every request passes: request id, body limit and
// count, in-flight tracking, panic recovery, shutdown refusal, and at the
// end the log line and the request metric.
func (s *Server) outer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s.inflight.add()
		defer s.inflight.done()

		rs := &reqState{id: requestID(r.Header.Get(api.HeaderRequestID)), route: routeUnknown}
		rs.body = newCountingBody(w, r, s.jsonMax, s.idle)
		rw := &respWriter{ResponseWriter: w, body: rs.body}
		rw.Header().Set(api.HeaderRequestID, rs.id)
		// A copy of the request takes the new body: net/http looks at its
		// own request's body after the handler (to close the connection
		// gracefully, without a reset, when it left much of it unread).
		r = r.WithContext(context.WithValue(r.Context(), stateKey{}, rs))
		r.Body = rs.body

		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler { // net/http's own way to abort a response: let it through
					s.finishRequest(rw, r, rs, start)
					panic(p)
				}
				// The panic value may quote request data: only its type
				// and the stack (code locations) are logged.
				s.log.Error("panic serving a request", "request_id", rs.id, "route", rs.route,
					"panic_type", fmt.Sprintf("%T", p), "stack", string(debug.Stack()))
				if rw.status == 0 {
					s.writeError(rw, r, api.Transportf(api.KindInternal, "internal error serving request %s; the daemon's log has the details", rs.id))
				}
			}
			s.finishRequest(rw, r, rs, start)
		}()
		defer rs.body.finish()
		if s.closing.Load() {
			rw.Header().Set("Connection", "close")
			s.writeError(rw, r, errShuttingDown)
			return
		}
		next.ServeHTTP(rw, r)
	})
}

// respWriter records the status and the bytes written. It unwraps to the
// underlying writer, so http.ResponseController and the WebSocket upgrade
// reach its Hijacker and Flusher.
//
// A response that starts while the request's body is not read to its end
// (refused before the body was read: 401, 404, 405, 413, a bad query, ...)
// says "Connection: close": net/http would otherwise read and discard up to
// 256 KiB of the unread body, with no deadline, before it answers, so a
// client that never sends its body would hold the connection for good
// (countingBody.finish bounds the read net/http still does after the
// handler).
type respWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	body   *countingBody
}

// start runs before the response's header goes out.
func (w *respWriter) start(code int) {
	if w.status != 0 || (code < 200 && code != http.StatusSwitchingProtocols) {
		return
	}
	w.status = code
	if w.body != nil && !w.body.consumed() {
		w.Header().Set("Connection", "close")
	}
}

func (w *respWriter) WriteHeader(code int) {
	w.start(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *respWriter) Write(b []byte) (int, error) {
	w.start(http.StatusOK)
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// ReadFrom keeps net/http's sendfile path for file downloads.
func (w *respWriter) ReadFrom(src io.Reader) (int64, error) {
	w.start(http.StatusOK)
	var n int64
	var err error
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(src)
	} else {
		n, err = io.Copy(struct{ io.Writer }{w.ResponseWriter}, src)
	}
	w.bytes += n
	return n, err
}

func (w *respWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// deadlineStep is how often, at most, a transfer's idle deadline is pushed
// forward: at each read or write that comes at least that long after the
// last push (a deadline per read would cost the transfer). A short idle
// timeout (tests) is pushed at a tenth of itself.
func deadlineStep(idle time.Duration) time.Duration { return min(time.Second, idle/10) }

// countingBody is the request body under the route's limit and the idle
// deadline. It counts the bytes and remembers how reading ended (its end,
// the limit, the deadline), whatever a consumer does with the read error.
//
// The idle deadline: each read that comes deadlineStep after the last one
// moved it sets the connection's read deadline to idle from now, so a body
// whose client sends nothing for idle fails its read (and the request's
// context ends). The deadline is lifted at the body's end (or its first
// error): net/http then reads on in the background to see the client go,
// and a deadline there would cancel the request's context.
type countingBody struct {
	w     http.ResponseWriter
	raw   io.ReadCloser // the request's own body
	rc    io.ReadCloser // raw under the limit
	limit int64
	cl    int64 // the request's ContentLength (-1: unknown)
	n     int64

	ctl      *http.ResponseController
	idle     time.Duration
	step     time.Duration // deadlineStep(idle)
	moved    time.Time     // when the deadline was last set
	armed    bool
	eof      bool
	tooLarge bool
	stalled  bool
}

func newCountingBody(w http.ResponseWriter, r *http.Request, limit int64, idle time.Duration) *countingBody {
	b := &countingBody{w: w, raw: r.Body, cl: r.ContentLength, idle: idle, step: deadlineStep(idle), ctl: http.NewResponseController(w)}
	b.setLimit(limit)
	return b
}

// setLimit sets the limit before the body is read.
func (b *countingBody) setLimit(limit int64) {
	b.limit = limit
	b.rc = http.MaxBytesReader(b.w, b.raw, limit)
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.idle > 0 {
		if now := time.Now(); now.Sub(b.moved) >= b.step {
			b.moved = now
			b.armed = b.ctl.SetReadDeadline(now.Add(b.idle)) == nil
		}
	}
	n, err := b.rc.Read(p)
	b.n += int64(n)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.Is(err, io.EOF):
			b.eof = true
		case errors.As(err, &mbe):
			b.tooLarge = true
		case errors.Is(err, os.ErrDeadlineExceeded):
			b.stalled = true
		}
		b.disarm()
	}
	return n, err
}

// disarm lifts the idle deadline.
func (b *countingBody) disarm() {
	if b.armed {
		b.armed = false
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
}

// unreadBodyWait is how long net/http may go on reading a body the handler
// left unread before the connection closes (see finish).
const unreadBodyWait = time.Second

// finish runs when the handler has returned. A body read to its end has its
// idle deadline lifted. A body left unread (the response said "Connection:
// close") gets a read deadline unreadBodyWait from now: net/http still
// reads and discards up to 256 KiB of it before closing the connection, and
// without a deadline a client that never sends it would hold the
// connection and its goroutine for as long as it likes.
func (b *countingBody) finish() {
	if b.consumed() {
		b.disarm()
		return
	}
	_ = b.ctl.SetReadDeadline(time.Now().Add(unreadBodyWait))
}

// consumed reports whether the body was read to its end (or has none).
func (b *countingBody) consumed() bool {
	return b.eof || (b.cl >= 0 && b.n >= b.cl)
}

func (b *countingBody) Close() error {
	b.disarm()
	return b.rc.Close()
}

// clipText shortens and sanitises a client-supplied string for a message or
// a log attribute.
func clipText(s string) string {
	const n = 128
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}
