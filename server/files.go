package server

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// filePath reads the path query parameter: required, once, without NUL.
func filePath(r *http.Request) (string, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "", api.Transportf(api.KindBadRequest, "malformed query string: %v", err)
	}
	vals := q[api.QueryPath]
	switch {
	case len(vals) == 0 || vals[0] == "":
		return "", api.Transportf(api.KindBadRequest, "the %q query parameter is required: name a file in the workspace", api.QueryPath)
	case len(vals) > 1:
		return "", api.Transportf(api.KindBadRequest, "the %q query parameter must be given once", api.QueryPath)
	case strings.IndexByte(vals[0], 0) >= 0:
		return "", api.Transportf(api.KindBadRequest, "the %q query parameter contains a NUL byte", api.QueryPath)
	}
	return vals[0], nil
}

// putFile streams the raw body into the file when the session can
// (sandbox.FileStreamer), else reads it whole (within the body limit).
func (s *Server) putFile(w http.ResponseWriter, r *http.Request) {
	path, err := filePath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := s.sb.GetSession(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if fs, ok := sess.(sandbox.FileStreamer); ok {
		err = fs.PutFileFrom(r.Context(), path, r.Body)
	} else {
		var data []byte
		if data, err = io.ReadAll(r.Body); err == nil {
			err = sess.PutFile(r.Context(), path, data)
		}
	}
	s.met.streamed(dirPut, int(stateOf(r).body.n))
	if err != nil {
		s.writeError(w, r, s.bodyError(r, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// getFile streams the file when the session can (sandbox.FileStreamer),
// else sends it from memory. Errors before the first byte are JSON; a
// failure midway cuts the body short of its Content-Length, which the
// client sees.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	path, err := filePath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := s.sb.GetSession(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	fs, ok := sess.(sandbox.FileStreamer)
	if !ok {
		data, err := sess.GetFile(r.Context(), path)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			n, _ := w.Write(data)
			s.met.streamed(dirGet, n)
		}
		return
	}
	rc, size, err := fs.OpenFile(r.Context(), path)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	h.Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	var n int64
	if size >= 0 {
		n, err = io.CopyN(w, rc, size)
	} else {
		n, err = io.Copy(w, rc)
	}
	s.met.streamed(dirGet, int(n))
	if err != nil {
		s.log.Warn("get_file: the body was cut short", "request_id", stateOf(r).id, "sent", n, "size", size, "err", err)
	}
}
