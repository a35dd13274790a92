package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
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

// bodyError turns an error met while consuming the request body into
// too_large when the body went over the limit.
func (s *Server) bodyError(r *http.Request, err error) error {
	if s.overLimit(r, err) {
		return api.Transportf(api.KindTooLarge, "the request body is over the limit of %d bytes", s.maxBody)
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

// decodeJSON decodes the body strictly into v: exactly one JSON value, no
// unknown field, the right types. Errors are bad_request (naming the field
// where the decoder does) or too_large.
func (s *Server) decodeJSON(r *http.Request, v any) error {
	err := decodeStrict(r.Body, v)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errEmptyBody):
		return api.Transportf(api.KindBadRequest, "the request body is empty; it must be one JSON object")
	case s.overLimit(r, err):
		return s.bodyError(r, err)
	}
	return api.Transportf(api.KindBadRequest, "malformed JSON body: %v", err)
}

var errEmptyBody = errors.New("empty JSON input")

// decodeStrict decodes exactly one JSON value from rd into v, refusing
// unknown fields.
func decodeStrict(rd io.Reader, v any) error {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errEmptyBody
		}
		return err
	}
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	}
	return errors.New("the body holds more than one JSON value")
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
	writeJSON(w, http.StatusOK, s.policy)
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
		Timeout: api.Seconds(req.TimeoutSeconds),
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
