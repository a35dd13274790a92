package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/tai42/sandbox/api"
)

// routeUnknown is the route label of a request that matched no route.
const routeUnknown = "unknown"

// reqState is what one request's handlers tell the log line and the
// metrics. It is written by the request's own goroutine only.
type reqState struct {
	id        string
	route     string
	sessionID string
	body      *countingBody
	errKind   api.Kind
	errMsg    string // only for kind internal: the daemon's own failures
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
// holds exactly api.Routes, a 405 for each known path and a 404 for the
// rest.
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
	}
	mux := http.NewServeMux()
	defer func() {
		if p := recover(); p != nil { // a conflicting pattern in the route table
			err = fmt.Errorf("server: registering the routes: %v", p)
		}
	}()
	allow := make(map[string][]string)
	var paths []string
	for _, rt := range api.Routes {
		h, ok := handlers[rt.OperationID]
		if !ok {
			return nil, fmt.Errorf("server: route %s %s (%s) has no handler", rt.Method, rt.Path, rt.OperationID)
		}
		delete(handlers, rt.OperationID)
		mux.Handle(rt.Pattern(), s.route(rt, h))
		if _, seen := allow[rt.Path]; !seen {
			paths = append(paths, rt.Path)
		}
		allow[rt.Path] = append(allow[rt.Path], rt.Method)
		if rt.Method == http.MethodGet {
			allow[rt.Path] = append(allow[rt.Path], http.MethodHead) // ServeMux serves HEAD with GET
		}
	}
	if len(handlers) > 0 {
		var extra []string
		for op := range handlers {
			extra = append(extra, op)
		}
		slices.Sort(extra)
		return nil, fmt.Errorf("server: handlers without a route in api.Routes: %s", strings.Join(extra, ", "))
	}
	for _, p := range paths {
		methods := strings.Join(allow[p], ", ")
		mux.Handle(p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", methods)
			s.writeError(w, r, api.Transportf(api.KindMethodNotAllowed, "method %s is not allowed on %s; allowed: %s", r.Method, p, methods))
		}))
	}
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, api.Transportf(api.KindNotFound, "no route %s %s", r.Method, clipText(r.URL.Path)))
	}))
	return s.outer(mux), nil
}

// route wraps one route's handler: it names the route for the log and the
// metrics, and refuses a request without the right token before anything
// else is done (the body is not read, no session is touched).
func (s *Server) route(rt api.Route, h http.HandlerFunc) http.Handler {
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
		rw := &respWriter{ResponseWriter: w}
		rw.Header().Set(api.HeaderRequestID, rs.id)
		rs.body = &countingBody{rc: http.MaxBytesReader(w, r.Body, s.maxBody)}
		r.Body = rs.body
		r = r.WithContext(context.WithValue(r.Context(), stateKey{}, rs))

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
type respWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *respWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *respWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// ReadFrom keeps net/http's sendfile path for file downloads.
func (w *respWriter) ReadFrom(src io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
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

// countingBody counts the request body's bytes and remembers whether the
// limit was hit, whatever a consumer does with the read error.
type countingBody struct {
	rc       io.ReadCloser
	n        int64
	tooLarge bool
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.n += int64(n)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			b.tooLarge = true
		}
	}
	return n, err
}

func (b *countingBody) Close() error { return b.rc.Close() }

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
