package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

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
		return "", api.Transportf(api.KindBadRequest, "the %q query parameter %q contains a NUL byte", api.QueryPath, vals[0])
	}
	return vals[0], nil
}

// putFile streams the raw body into the file when the session can
// (sandbox.FileStreamer), else reads it whole (within the body limit). The
// body is under the idle deadline (countingBody); while it comes, the
// session is checked every second or so, so that a session destroyed
// mid-upload ends the upload with session_not_found rather than after the
// last byte.
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
	body := &liveReader{r: r.Body, ctx: r.Context(), sess: sess, checked: time.Now(), trailer: r}
	if fs, ok := sess.(sandbox.FileStreamer); ok {
		err = fs.PutFileFrom(r.Context(), path, body)
	} else {
		var data []byte
		if data, err = io.ReadAll(body); err == nil {
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

// liveReader reads r and, at most every liveCheck, fails with the
// session's *sandbox.SessionNotFoundError once the session is gone.
type liveReader struct {
	r       io.Reader
	ctx     context.Context
	sess    sandbox.Session
	checked time.Time
	trailer *http.Request // its Trailer is read at the body's end
}

const liveCheck = time.Second

func (l *liveReader) Read(p []byte) (int, error) {
	if now := time.Now(); now.Sub(l.checked) >= liveCheck {
		l.checked = now
		var snf *sandbox.SessionNotFoundError
		if _, err := l.sess.Info(l.ctx); errors.As(err, &snf) {
			return 0, err
		}
	}
	n, err := l.r.Read(p)
	if err == io.EOF && l.trailer != nil {
		if why := l.trailer.Trailer.Get(api.TrailerUploadFailed); why != "" {
			return n, api.Transportf(api.KindBadRequest, "the client broke the upload off (%s); the old content stays", clipText(why))
		}
	}
	return n, err
}

// getFile streams the file when the session can (sandbox.FileStreamer),
// else sends it from memory. Errors before the first byte are JSON. A
// failure midway aborts the response (the connection is cut), so the client
// never takes a partial body for the whole file, whether or not it knows
// the length. A client that reads nothing for the idle timeout is cut the
// same way.
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
	var (
		src  io.Reader // the file's reader, or nil and data
		data []byte
		size int64
	)
	if fs, ok := sess.(sandbox.FileStreamer); ok {
		rc, n, err := fs.OpenFile(r.Context(), path)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		defer rc.Close()
		src, size = rc, n
	} else {
		if data, err = sess.GetFile(r.Context(), path); err != nil {
			s.writeError(w, r, err)
			return
		}
		size = int64(len(data))
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	} else {
		// Chunked: net/http writes the last chunk after the handler
		// returns, when the write deadline cannot be lifted safely; the
		// connection ends with the response instead.
		h.Set("Connection", "close")
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	ctl := http.NewResponseController(w)
	n, err := s.sendBody(w, ctl, src, data, size)
	if err == nil && size >= 0 {
		// Everything is out but what net/http buffers: flush it under the
		// deadline, then lift the deadline so the connection may serve
		// another request.
		if err = ctl.Flush(); err == nil {
			_ = ctl.SetWriteDeadline(time.Time{})
		}
	}
	s.met.streamed(dirGet, int(n))
	if err != nil {
		rs := stateOf(r)
		rs.cut = "error"
		if errors.Is(err, os.ErrDeadlineExceeded) {
			rs.cut = "idle_timeout"
		}
		s.log.Warn("get_file: the body was cut short", "request_id", rs.id, "sent", n, "size", size, "err", err)
		panic(http.ErrAbortHandler) // the client must see the body fail, not end
	}
}

// sendChunk is how much of a download goes out between two looks at the
// idle deadline: a client that takes longer than the idle timeout to take
// one chunk (4 KiB/s for 60 s) is cut. Each chunk still goes through the
// ResponseWriter's ReadFrom (sendfile for a file).
const sendChunk = 256 << 10

// sendBody copies size bytes of src (all of it when size < 0), or data when
// src is nil, to w, pushing the write deadline to the idle timeout from now
// at most every deadlineStep. A src that ends before size bytes is an
// error.
func (s *Server) sendBody(w io.Writer, ctl *http.ResponseController, src io.Reader, data []byte, size int64) (int64, error) {
	if src == nil {
		size = int64(len(data))
	}
	var sent int64
	var moved time.Time
	step := deadlineStep(s.idle)
	for size < 0 || sent < size {
		if now := time.Now(); s.idle > 0 && now.Sub(moved) >= step {
			moved = now
			_ = ctl.SetWriteDeadline(now.Add(s.idle)) // ErrNotSupported: no deadline to keep
		}
		chunk := int64(sendChunk)
		if size >= 0 {
			chunk = min(chunk, size-sent)
		}
		var n int64
		var err error
		if src == nil { // one Write per chunk rather than a copy buffer
			var k int
			k, err = w.Write(data[sent : sent+chunk])
			n = int64(k)
		} else {
			n, err = io.CopyN(w, src, chunk)
		}
		sent += n
		switch {
		case errors.Is(err, io.EOF) && size < 0:
			return sent, nil
		case errors.Is(err, io.EOF):
			return sent, fmt.Errorf("the file ended after %d of its %d bytes", sent, size)
		case err != nil:
			return sent, err
		}
	}
	return sent, nil
}
