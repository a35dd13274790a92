package server

import (
	"bytes"
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

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
	e := api.ErrorFrom(err)
	rs := stateOf(r)
	if e.Kind == api.KindSpecRejected && rs.route == "removeWorkspace" {
		e.Op = "remove_workspace" // a conflict of the removal, not of a create
	}
	rs.errKind = e.Kind
	if e.Kind == api.KindInternal {
		rs.errMsg = e.Message
	}
	writeJSON(w, e.Status(), api.ErrorBody{Error: e})
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

// decodeJSON decodes the body strictly into v (see decodeStrictBytes).
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
	err = decodeStrictBytes(data, v)
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

// decodeStrict decodes exactly one JSON object from rd into v under the
// rules of decodeStrictBytes.
func decodeStrict(rd io.Reader, v any) error {
	data, err := io.ReadAll(rd)
	if err != nil {
		return err
	}
	return decodeStrictBytes(data, v)
}

// decodeStrictBytes decodes data, exactly one JSON object, into v (a
// pointer to a struct). encoding/json alone would match a key to a field
// case-insensitively and let the last of two equal keys win silently, so
// the keys are checked first (checkKeys): a key that is not exactly a
// field's name and a duplicate key at any depth are refused, naming the
// key. Then encoding/json decodes, refusing wrong types.
func decodeStrictBytes(data []byte, v any) error {
	if err := checkKeys(data, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// maxJSONDepth bounds the nesting checkKeys walks (encoding/json's own
// limit is 10000).
const maxJSONDepth = 1000

// checkKeys walks the one JSON value of data, which must be an object, with
// json.Decoder.Token. In every object it refuses a key seen before in that
// object, and in an object that decodes into a struct a key that is not
// exactly the json name of one of its fields. t is the type data decodes
// into; nil (or a type with its own decoding) means "any value".
func checkKeys(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return errEmptyBody
	case err != nil:
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		if ok && d == '[' {
			return shapef("must be one JSON object, not an array")
		}
		return shapef("must be one JSON object, not %s", describeToken(tok))
	}
	if err := walkObject(dec, t, "", 1); err != nil {
		if errors.Is(err, io.EOF) { // Token's word for a text that stops inside the object
			return io.ErrUnexpectedEOF
		}
		return err
	}
	switch _, err := dec.Token(); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	}
	return shapef("holds more than one JSON value")
}

func describeToken(tok json.Token) string {
	switch tok.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number, float64:
		return "a number"
	case string:
		return "a string"
	}
	return "that"
}

// walkValue walks the value that starts with tok.
func walkValue(dec *json.Decoder, tok json.Token, t reflect.Type, path string, depth int) error {
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar: its type is encoding/json's to check
	}
	if depth > maxJSONDepth {
		return shapef("nests deeper than %d levels", maxJSONDepth)
	}
	if d == '{' {
		return walkObject(dec, t, path, depth+1)
	}
	var elem reflect.Type // d is '[': a closing delimiter would be a syntax error
	if t = indirect(t); t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = t.Elem()
	}
	for i := 0; dec.More(); i++ {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if err := walkValue(dec, tok, elem, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
			return err
		}
	}
	_, err := dec.Token() // ']'
	return err
}

// walkObject walks an object whose '{' was read.
func walkObject(dec *json.Decoder, t reflect.Type, path string, depth int) error {
	var fields map[string]reflect.Type // t is a struct: its fields by json name
	var elem reflect.Type              // t is a map: its values' type
	if t = indirect(t); t != nil {
		switch t.Kind() {
		case reflect.Struct:
			fields = jsonFields(t)
		case reflect.Map:
			elem = t.Elem()
		}
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string) // Token returns a key as a string
		name := key
		if path != "" {
			name = path + "." + key
		}
		if seen[key] {
			return shapef("has the key %q twice", clipText(name))
		}
		seen[key] = true
		vt := elem
		if fields != nil {
			ft, ok := fields[key]
			if !ok {
				return shapef("has an unknown field %q (names are case-sensitive)", clipText(name))
			}
			vt = ft
		}
		if tok, err = dec.Token(); err != nil {
			return err
		}
		if err := walkValue(dec, tok, vt, name, depth); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	return err
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// indirect is t without its pointers, or nil when values of t decode
// themselves (their keys are theirs to check) or t is nil.
func indirect(t reflect.Type) reflect.Type {
	for t != nil {
		if t.Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(jsonUnmarshaler) ||
			t.Implements(textUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
			return nil
		}
		if t.Kind() != reflect.Pointer {
			return t
		}
		t = t.Elem()
	}
	return nil
}

// jsonFieldCache holds jsonFields' answers by type.
var jsonFieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// jsonFields maps the exact json names of a struct's fields to their
// types, as encoding/json names them (the tag's name, else the Go name;
// "-" skipped; the fields of an untagged embedded struct promoted).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := jsonFieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := make(map[string]reflect.Type)
	addJSONFields(m, t)
	jsonFieldCache.Store(t, m)
	return m
}

func addJSONFields(m map[string]reflect.Type, t reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				addJSONFields(m, ft)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if _, dup := m[name]; !dup {
			m[name] = f.Type
		}
	}
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
