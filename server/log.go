package server

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"time"
)

// maxRequestID is the longest client-supplied request id the server keeps.
const maxRequestID = 128

// requestID returns the client's X-Request-Id when it is printable ASCII of
// at most 128 bytes, else a new random 16-hex-digit id.
func requestID(given string) string {
	if given != "" && len(given) <= maxRequestID {
		ok := true
		for i := 0; i < len(given); i++ {
			if c := given[i]; c < 0x20 || c > 0x7e {
				ok = false
				break
			}
		}
		if ok {
			return given
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics on a broken system)
	return hex.EncodeToString(b[:])
}

// finishRequest writes the request's one log line and counts it. The line
// never holds a body, argv, env, token or the Authorization header: only
// what the server itself decided (route, status, sizes, ids, error kind).
func (s *Server) finishRequest(rw *respWriter, r *http.Request, rs *reqState, start time.Time) {
	status := rw.status
	if status == 0 {
		status = http.StatusOK // net/http's answer for a handler that wrote nothing
	}
	bytesIn, bytesOut := rs.body.n, rw.bytes
	if rs.ws {
		bytesIn, bytesOut = rs.wsIn, rs.wsOut
	}
	attrs := []any{
		"request_id", rs.id,
		"method", r.Method,
		"route", rs.route,
		"status", status,
		"duration_ms", float64(time.Since(start).Microseconds()) / 1000,
		"bytes_in", bytesIn,
		"bytes_out", bytesOut,
	}
	if rs.sessionID != "" {
		attrs = append(attrs, "session_id", rs.sessionID)
	}
	if rs.errKind != "" {
		attrs = append(attrs, "error_kind", string(rs.errKind))
	}
	if rs.errMsg != "" {
		attrs = append(attrs, "error", rs.errMsg)
	}
	if rs.cut != "" {
		attrs = append(attrs, "body_cut", rs.cut)
	}
	attrs = append(attrs, rs.streamEnd...)
	s.log.Log(r.Context(), slog.LevelInfo, "request", attrs...)
	s.met.request(rs.route, status)
}
