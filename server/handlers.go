package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// writeJSON writes v with status. A value that cannot be marshalled (a bug)
// becomes a 500 of kind internal.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(api.ErrorBody{Error: api.Error{Kind: api.KindInternal, Message: "server: encoding the response failed: " + err.Error()}})
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeError writes err's wire form with its kind's status and records the
// kind for the log line.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := s.wireError(r, err)
	writeJSON(w, e.Status(), api.ErrorBody{Error: e})
}

// wireError is err's wire form for the request's route, its kind recorded
// for the log line: the one place an error of a request is mapped.
func (s *Server) wireError(r *http.Request, err error) api.Error {
	e := api.ErrorFrom(err)
	rs := stateOf(r)
	if e.Kind == api.KindSpecRejected && rs.route == "removeWorkspace" {
		e.Op = "remove_workspace" // a conflict of the removal, not of a create
	}
	rs.errKind = e.Kind
	if e.Kind == api.KindInternal {
		rs.errMsg = e.Message
	}
	return e
}

// overLimit reports whether an error met while consuming the request body
// comes from the body going over the limit, whatever wrapped it.
func (s *Server) overLimit(r *http.Request, err error) bool {
	var mbe *http.MaxBytesError
	b := stateOf(r).body
	return errors.As(err, &mbe) || (b != nil && b.tooLarge)
}

// stalled reports whether the request body failed because its client sent
// nothing for the idle timeout.
func (s *Server) stalled(r *http.Request) bool {
	b := stateOf(r).body
	return b != nil && b.stalled
}

// tooLarge is the too_large error of the request's route.
func (s *Server) tooLarge(rs *reqState) error {
	if rs.jsonBody {
		return api.Transportf(api.KindTooLarge, "the JSON request body is over the limit of %d bytes; "+
			"send exec stdin over ~%s (base64 grows it by a third) through the interactive exec or a file",
			s.jsonMax, sizeText(s.jsonMax*3/4))
	}
	return api.Transportf(api.KindTooLarge, "the request body is over the limit of %d bytes", s.maxBody)
}

// bodyError turns an error met while consuming the request body into
// too_large when the body went over the limit, and into bad_request when
// its client stalled.
func (s *Server) bodyError(r *http.Request, err error) error {
	switch {
	case s.overLimit(r, err):
		return s.tooLarge(stateOf(r))
	case s.stalled(r):
		return api.Transportf(api.KindBadRequest, "the request body stalled: nothing came for %v, so the request was cut", s.idle)
	}
	return err
}

// callError reports a sandbox call cut short by the shutdown as
// shutting_down rather than as the provider's cancellation error.
func (s *Server) callError(r *http.Request, err error) error {
	select {
	case <-s.hardStop:
		if r.Context().Err() != nil {
			return api.Transportf(api.KindShuttingDown, "the daemon is shutting down: the call was cancelled and its exec killed")
		}
	default:
	}
	return err
}

// decodeJSON decodes the body strictly into v (see decodeStrict).
// Errors are bad_request (naming the field or key where it can) or
// too_large.
func (s *Server) decodeJSON(r *http.Request, v any) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		if e := s.bodyError(r, err); e != err {
			return e
		}
		return api.Transportf(api.KindBadRequest, "reading the request body failed: %v", err)
	}
	err = decodeStrict(data, v)
	var se *shapeError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errEmptyBody):
		return api.Transportf(api.KindBadRequest, "the request body is empty; it must be one JSON object")
	case errors.As(err, &se):
		return api.Transportf(api.KindBadRequest, "the request body %s", se.msg)
	}
	return api.Transportf(api.KindBadRequest, "malformed JSON body: %v", err)
}

var errEmptyBody = errors.New("empty JSON input")

// sizeText writes n bytes in the largest binary unit that keeps it whole
// enough to read ("48 MiB", "48 KiB", "100 bytes").
func sizeText(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// shapeError is a JSON text that is well-formed but not of the shape the
// API takes; msg reads after a subject ("the request body ...").
type shapeError struct{ msg string }

func (e *shapeError) Error() string { return "the JSON value " + e.msg }

func shapef(format string, args ...any) error {
	return &shapeError{msg: fmt.Sprintf(format, args...)}
}

// strictJSON are the options of every request decode. JSON v2 matches a
// name to a field exactly (encoding/json would take "ARGV" for argv) and
// refuses a name twice in one object at any depth (encoding/json lets the
// last win silently); unknown members are refused too. Invalid UTF-8 in a
// string becomes U+FFFD, as encoding/json (and so the API until JSON v2)
// takes it.
var strictJSON = jsonv2.JoinOptions(jsonv2.RejectUnknownMembers(true), jsontext.AllowInvalidUTF8(true))

// decodeStrict decodes data, exactly one JSON object, into v (a
// pointer to a struct) under strictJSON. A body of the wrong shape (not an
// object, more than one value), an unknown field and a duplicate key are
// *shapeErrors naming the key; a wrong type or malformed JSON is JSON v2's
// error, which names where.
func decodeStrict(data []byte, v any) error {
	dec := jsontext.NewDecoder(bytes.NewReader(data), strictJSON)
	switch k := dec.PeekKind(); k {
	case '{':
	case 0: // no value: ReadToken says why
		if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
			return err
		}
		return errEmptyBody
	case '[':
		return shapef("must be one JSON object, not an array")
	default:
		return shapef("must be one JSON object, not %s", kindText(k))
	}
	if err := jsonv2.UnmarshalDecode(dec, v, strictJSON); err != nil {
		return strictError(err)
	}
	switch _, err := dec.ReadToken(); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err // what follows the object is not JSON
	}
	return shapef("holds more than one JSON value")
}

// strictError words JSON v2's refusal of a key in the API's terms, naming
// the key by its path (see keyPath). Any other error is JSON v2's, with the
// value that could not be decoded left out: it may be a secret (an env
// value sent as a number).
func strictError(err error) error {
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) && syn.Err == jsontext.ErrDuplicateName {
		return shapef("has the key %q twice", clipText(keyPath(syn.JSONPointer)))
	}
	var sem *jsonv2.SemanticError
	if errors.As(err, &sem) {
		if sem.Err == jsonv2.ErrUnknownName {
			return shapef("has an unknown field %q (names are case-sensitive)", clipText(keyPath(sem.JSONPointer)))
		}
		sem.JSONValue = nil
	}
	return err
}

// keyPath is a JSON Pointer's keys joined with dots ("env.A"; an array
// element by its index, "argv.0").
func keyPath(p jsontext.Pointer) string {
	return strings.Join(slices.Collect(p.Tokens()), ".")
}

// kindText names a JSON kind other than an object or array.
func kindText(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '0':
		return "a number"
	case '"':
		return "a string"
	}
	return "that"
}

// maxTimeoutSeconds is the longest timeout_seconds a time.Duration holds
// (as api.Seconds checks it), and maxTimeoutWhole its whole seconds.
const (
	maxTimeoutSeconds = math.MaxInt64 / 1e9
	maxTimeoutWhole   = math.MaxInt64 / int64(time.Second)
)

// execTimeout converts an exec's timeout_seconds. A value no Duration
// holds (NaN, infinite, over about 292 years) is refused here, naming the
// value and the range (api.Seconds would turn it into -1ns); a value <= 0
// is left to the sandbox to refuse, as it refuses any.
func execTimeout(f float64) (time.Duration, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > maxTimeoutSeconds {
		return 0, sandbox.Errorf("exec", "timeout_seconds %g is out of range: it must be > 0 and at most %d (about 292 years)",
			f, maxTimeoutWhole)
	}
	return api.Seconds(f), nil
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok"})
}

func (s *Server) openapi(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(api.OpenAPI)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(api.OpenAPI)
}

func (s *Server) getPolicy(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.PolicyInfo{Policy: s.policy, EgressFences: s.fences.Load(), Disk: s.disk})
}

func (s *Server) getSandbox(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.SandboxInfo{
		Provider:                  s.provider,
		ExecDefaultTimeoutSeconds: api.SecondsOf(s.sb.ExecDefaultTimeout()),
		ReapIntervalSeconds:       api.SecondsOf(s.sb.ReapInterval()),
		Policy:                    s.policy,
		MaxBodyBytes:              s.maxBody,
		Version:                   s.version,
	})
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var spec api.SessionSpec
	if err := s.decodeJSON(r, &spec); err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := s.sb.CreateSession(r.Context(), spec.Spec())
	if err != nil {
		s.met.rejected(err)
		s.writeError(w, r, err)
		return
	}
	s.met.created.Inc()
	stateOf(r).sessionID = sess.ID()
	info, err := sess.Info(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/sessions/"+url.PathEscape(sess.ID()))
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	infos, err := s.sb.ListSessions(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if infos == nil {
		infos = []sandbox.SessionInfo{}
	}
	writeJSON(w, http.StatusOK, api.SessionList{Sessions: infos})
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.sb.GetSession(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := sess.Info(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) destroySession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	_, liveErr := s.sb.GetSession(r.Context(), id)
	if err := s.sb.DestroySession(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	if liveErr == nil {
		s.met.destroyed.Inc()
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) touchSession(w http.ResponseWriter, r *http.Request) {
	sess, err := s.sb.GetSession(r.Context(), r.PathValue("id"))
	if err == nil {
		err = sess.Touch(r.Context())
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) reap(w http.ResponseWriter, r *http.Request) {
	ids, err := s.sb.Reap(r.Context())
	s.met.reapedByRoute(len(ids))
	if err != nil {
		s.log.Warn("reap failed", "request_id", stateOf(r).id, "reaped", len(ids), "err", err)
		s.writeError(w, r, err)
		return
	}
	if ids == nil {
		ids = []string{}
	}
	writeJSON(w, http.StatusOK, api.Reaped{Reaped: ids})
}

// exec runs a command to completion. A client that goes away cancels the
// request's context, which the sandbox uses to kill the exec.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := s.decodeJSON(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Type != "" {
		s.writeError(w, r, api.Transportf(api.KindBadRequest, "field type must be absent here: it belongs to the start frame of the interactive exec"))
		return
	}
	var stdin []byte
	if req.StdinBase64 != nil {
		var err error
		if stdin, err = base64.StdEncoding.DecodeString(*req.StdinBase64); err != nil {
			s.writeError(w, r, api.Transportf(api.KindBadRequest, "stdin_base64 is not valid standard base64: %v", err))
			return
		}
	}
	timeout, err := execTimeout(req.TimeoutSeconds)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := s.sb.GetSession(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.met.execsStarted.WithLabelValues(modeExec).Inc()
	start := time.Now()
	res, err := sess.Exec(r.Context(), req.Argv, sandbox.ExecOptions{
		Cwd:     req.Cwd,
		Env:     sandbox.SecretEnv(req.Env),
		Stdin:   stdin,
		Timeout: timeout,
		User:    req.User,
	})
	s.met.execDuration.WithLabelValues(modeExec).Observe(time.Since(start).Seconds())
	s.met.streamed(dirStdin, len(stdin))
	if err != nil {
		s.writeError(w, r, s.callError(r, err))
		return
	}
	s.met.streamed(dirStdout, len(res.Stdout))
	s.met.streamed(dirStderr, len(res.Stderr))
	writeJSON(w, http.StatusOK, api.ResultFrom(res))
}
