package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// session is the client side of one daemon session. Its ID and
// WorkspacePath are those the daemon returned; every other method asks the
// daemon.
type session struct {
	c  *Client
	id string
	ws string
}

var (
	_ sandbox.Session      = (*session)(nil)
	_ sandbox.FileStreamer = (*session)(nil)
)

// ID is the daemon-assigned id.
func (s *session) ID() string { return s.id }

// WorkspacePath is the absolute path of the session's workspace, as the
// daemon reported it.
func (s *session) WorkspacePath() string { return s.ws }

// Info returns the session's state (GET /v1/sessions/{id}).
func (s *session) Info(ctx context.Context) (sandbox.SessionInfo, error) {
	var info sandbox.SessionInfo
	if err := s.c.doJSON(ctx, "info", http.MethodGet, sessionPath(s.id, ""), nil, nil, &info); err != nil {
		return sandbox.SessionInfo{}, err
	}
	return info, nil
}

// Touch extends the session's life (POST /v1/sessions/{id}/touch).
func (s *session) Touch(ctx context.Context) error {
	return s.c.doJSON(ctx, "touch", http.MethodPost, sessionPath(s.id, "touch"), nil, nil, nil)
}

// Destroy tears the session down (DELETE /v1/sessions/{id}); nil on a
// session that is already gone.
func (s *session) Destroy(ctx context.Context) error {
	err := s.c.doJSON(ctx, "destroy", http.MethodDelete, sessionPath(s.id, ""), nil, nil, nil)
	if err == nil {
		s.c.sessionGone(s.id)
	}
	return err
}

// reveal turns an env of secrets into the plain map the wire carries.
func reveal(env map[string]sandbox.Secret) map[string]string {
	if len(env) == 0 {
		return nil
	}
	m := make(map[string]string, len(env))
	for k, v := range env {
		m[k] = v.Reveal()
	}
	return m
}

// Exec runs argv to completion (POST /v1/sessions/{id}/exec) and returns
// its result; a non-zero exit is a result. A timeout is an
// *sandbox.ExecTimeoutError with the daemon's lengths and timeout, too much
// output an *sandbox.OutputLimitError. When ctx ends first the request is
// abandoned, which ends the exec on the daemon.
func (s *session) Exec(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	req := api.ExecRequest{Argv: argv, Cwd: opts.Cwd, Env: reveal(opts.Env), TimeoutSeconds: api.SecondsOf(opts.Timeout), User: opts.User}
	if opts.Stdin != nil {
		b := base64.StdEncoding.EncodeToString(opts.Stdin)
		req.StdinBase64 = &b
	}
	var res api.ExecResult
	if err := s.c.doJSON(ctx, "exec", http.MethodPost, sessionPath(s.id, "exec"), nil, req, &res); err != nil {
		return sandbox.ExecResult{}, err
	}
	r, err := res.Result()
	if err != nil {
		return sandbox.ExecResult{}, sandbox.WrapError("exec", "the daemon's result holds output that is not valid base64", err)
	}
	return r, nil
}

func fileQuery(path string) url.Values { return url.Values{api.QueryPath: {path}} }

// PutFile writes data to path (PUT /v1/sessions/{id}/files?path=...).
func (s *session) PutFile(ctx context.Context, path string, data []byte) error {
	resp, err := s.c.do(ctx, request{
		op: "put_file", method: http.MethodPut, path: sessionPath(s.id, "files"), query: fileQuery(path),
		body: bytes.NewReader(data), length: int64(len(data)), contentType: "application/octet-stream",
	})
	if err != nil {
		return err
	}
	drain(resp.Body)
	return nil
}

// PutFileFrom streams everything r yields to path as the body of one PUT,
// without holding it in memory. When reading r fails the upload is broken
// off, the daemon keeps the old content, and the error (a *SandboxError
// whose cause is r's error) is returned. r is not closed.
//
// ctx bounds the call even while r.Read blocks (a pipe, a network stream):
// r is read by a goroutine that feeds the request body through a pipe, and
// when ctx ends the upload is broken off and PutFileFrom returns a
// *sandbox.SandboxError that matches ctx.Err() with errors.Is. One r.Read
// that was in progress then may outlive the call: its goroutine ends when
// that Read returns, and drops what it read. No Read of r starts once
// PutFileFrom has returned.
func (s *session) PutFileFrom(ctx context.Context, path string, r io.Reader) error {
	const op = "put_file"
	if err := ctx.Err(); err != nil {
		return ctxErr(op, err)
	}
	trailer := http.Header{api.TrailerUploadFailed: nil}
	src := &source{r: r, trailer: trailer}
	pr, pw := io.Pipe()
	go src.feed(pw)
	// The context's end breaks the body off, so that net/http, which
	// waits for the body's reader, returns even while r.Read blocks; a
	// failure of r from then on is not r's to report.
	stop := context.AfterFunc(ctx, func() {
		_ = src.stop()
		pw.CloseWithError(ctx.Err())
	})
	resp, err := s.c.do(ctx, request{
		op: op, method: http.MethodPut, path: sessionPath(s.id, "files"), query: fileQuery(path),
		body: pr, length: -1, contentType: "application/octet-stream", trailer: trailer,
	})
	stop()
	// net/http may go on reading a body after an early answer: the pipe's
	// close ends that, and src.stop ends the feeding.
	pr.CloseWithError(errUploadOver)
	rerr := src.stop()
	if err == nil {
		drain(resp.Body)
	}
	if rerr != nil {
		return sandbox.WrapError(op, "reading the data to write failed", rerr)
	}
	// A body broken off never ends as a whole one (net/http does not send
	// the last chunk of a body whose read failed), so a 2xx answer is a
	// complete upload; the context's end is a transport error, which do
	// reports as ctx's.
	return err
}

// errUploadOver ends the feeding of an upload's pipe once the request is
// over.
var errUploadOver = errors.New("the upload is over")

// GetFile reads path (GET /v1/sessions/{id}/files?path=...).
// *sandbox.FileNotFoundError only when nothing exists there.
func (s *session) GetFile(ctx context.Context, path string) ([]byte, error) {
	rc, size, err := s.OpenFile(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	var buf bytes.Buffer
	if size > 0 && size < 1<<30 {
		// MinRead more than the size: ReadFrom then meets the end with room
		// to spare instead of regrowing (and copying) the whole buffer.
		buf.Grow(int(size) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(rc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// OpenFile opens path for reading: the body of the daemon's answer, whose
// errors (a missing file, a directory, a gone session) are decided before
// it returns. size is the file's length from Content-Length (-1 if the
// daemon did not say). Reading the returned reader is bounded by ctx, which
// must stay live until the caller is done; read errors are
// *sandbox.SandboxError. The caller closes the reader.
func (s *session) OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	resp, err := s.c.do(ctx, request{op: "get_file", method: http.MethodGet, path: sessionPath(s.id, "files"), query: fileQuery(path), length: -1})
	if err != nil {
		return nil, 0, err
	}
	return &fileBody{rc: resp.Body, ctx: ctx, c: s.c}, resp.ContentLength, nil
}

// drain reads what is left of a small answer and closes it, so that the
// connection goes back to the pool.
func drain(rc io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(rc, maxErrorBody))
	rc.Close()
}

// source feeds an upload's pipe from r, recording r's first failure, so
// that a failing reader is told from a failing daemon or a cancelled call.
type source struct {
	r       io.Reader
	trailer http.Header // the upload's declared trailers
	mu      sync.Mutex
	stopped bool  // the call has returned or its ctx ended: no Read of r starts
	err     error // r's failure (not io.EOF)
}

// feed copies r into pw until r ends or fails, or the pipe is closed, and
// closes pw with r's outcome. It never starts a Read of r once stop has
// been called.
func (s *source) feed(pw *io.PipeWriter) {
	buf := make([]byte, 32<<10)
	for {
		s.mu.Lock()
		stopped := s.stopped
		s.mu.Unlock()
		if stopped {
			pw.CloseWithError(errUploadOver)
			return
		}
		n, err := s.r.Read(buf)
		if n > 0 {
			if _, werr := pw.Write(buf[:n]); werr != nil {
				return // the upload is over or broken off
			}
		}
		if err == io.EOF {
			pw.Close()
			return
		}
		if err != nil {
			s.mu.Lock()
			mine := !s.stopped
			if mine {
				s.err = err
			}
			s.mu.Unlock()
			if mine && s.trailer != nil {
				// End the body normally with the failure in its trailer:
				// the daemon then fails the put, cleaning up, before it
				// answers, so the call returns with the old content back.
				// (r's error text stays here: it is the caller's.)
				// The empty write waits for net/http's first read of the
				// body, which comes after it has written the headers (and
				// read the trailer's key): only then is the map ours.
				if _, werr := pw.Write(nil); werr != nil {
					return
				}
				s.trailer.Set(api.TrailerUploadFailed, "the source reader failed")
				pw.Close()
				return
			}
			pw.CloseWithError(err)
			return
		}
	}
}

// stop records that the call has returned, or its context ended, and
// returns r's failure, if r failed before.
func (s *source) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	return s.err
}

// fileBody is a download: its read errors become the family's.
type fileBody struct {
	rc  io.ReadCloser
	ctx context.Context
	c   *Client
}

func (f *fileBody) Read(p []byte) (int, error) {
	n, err := f.rc.Read(p)
	if err != nil && err != io.EOF {
		if cerr := f.ctx.Err(); cerr != nil {
			err = ctxErr("get_file", cerr)
		} else {
			err = sandbox.WrapError("get_file", "the download from the daemon at "+f.c.display+" broke off", noEOF(err))
		}
	}
	return n, err
}

func (f *fileBody) Close() error { return f.rc.Close() }
