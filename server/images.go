package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// images returns the served sandbox as a [sandbox.ImageManager], or a
// *sandbox.SandboxError for op saying this daemon's sandbox does not
// manage images.
func (s *Server) images(op string) (sandbox.ImageManager, error) {
	if im, ok := s.sb.(sandbox.ImageManager); ok {
		return im, nil
	}
	which := "this daemon's sandbox"
	if s.provider != "" {
		which += " (provider " + s.provider + ")"
	}
	return nil, sandbox.Errorf(op, "%s does not manage images (it does not implement sandbox.ImageManager): it cannot pull, list, remove or prune them", which)
}

// pullImage is POST /v1/images/pull: the pull's events as NDJSON, then its
// outcome (api.PullEnd). The 200 goes out with the first event, so a pull
// that fails before any (an invalid reference) is a plain error response.
// The pull runs under the request's context, which ends when the client
// goes away; a line the client does not take within the idle timeout
// cancels it too.
func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) {
	var req api.PullRequest
	if err := s.decodeJSON(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	im, err := s.images("pull_image")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st := newPullStream(w, s.idle, cancel)
	info, err := im.PullImage(ctx, req.Ref, sandbox.PullOptions{Platform: req.Platform, Progress: st.event})
	s.met.pulled(err)
	end := api.PullEnd{Image: &info}
	if err != nil {
		e := s.wireError(r, s.callError(r, err))
		end = api.PullEnd{Error: &e}
	}
	if !st.finish(end, err == nil) {
		writeJSON(w, end.Error.Status(), api.ErrorBody{Error: *end.Error})
		return
	}
	if st.cut != "" {
		stateOf(r).cut = st.cut
	}
}

// pullStream writes a pull's lines from a goroutine of its own, so that a
// client slow to read never holds up the pull (which other pulls of the
// reference may share). Events wait in a queue where a "fetching" event
// replaces the one of its layer still waiting, so the queue holds a few
// events per layer at most. A write that moves nothing for the idle
// timeout, or fails, ends the stream and cancels the pull.
type pullStream struct {
	w      http.ResponseWriter
	ctl    *http.ResponseController
	idle   time.Duration
	cancel context.CancelFunc
	wake   chan struct{} // a token: the queue has grown or the stream ended
	done   chan struct{} // closed when the writer has returned
	cut    string        // why the writer stopped short; read after done

	mu      sync.Mutex
	queue   []any // sandbox.PullProgress, then the api.PullEnd
	started bool  // a line was queued: the answer is the stream
	ended   bool  // no more lines
	broken  bool  // a write failed
}

func newPullStream(w http.ResponseWriter, idle time.Duration, cancel context.CancelFunc) *pullStream {
	p := &pullStream{w: w, ctl: http.NewResponseController(w), idle: idle, cancel: cancel,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	go p.run()
	return p
}

// event queues ev; it never waits for the client.
func (p *pullStream) event(ev sandbox.PullProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended || p.broken {
		return
	}
	p.started = true
	defer p.signal()
	if ev.Status == sandbox.PullLayerFetching {
		for i := len(p.queue) - 1; i >= 0; i-- {
			q, _ := p.queue[i].(sandbox.PullProgress)
			if q.Layer != ev.Layer {
				continue
			}
			if q.Status == sandbox.PullLayerFetching {
				p.queue[i] = ev
				return
			}
			break // an event of another status of the layer stays before this one
		}
	}
	p.queue = append(p.queue, ev)
}

// finish ends the events and, when the stream has started or always is
// set, queues end as the last line and waits for the writer to write it.
// It reports whether the answer is the stream; when it is not, nothing was
// written and the caller answers.
func (p *pullStream) finish(end api.PullEnd, always bool) bool {
	p.mu.Lock()
	p.ended = true
	stream := p.started || always
	if stream && !p.broken {
		p.queue = append(p.queue, end)
	}
	p.signal()
	p.mu.Unlock()
	<-p.done
	return stream
}

func (p *pullStream) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run writes the queue's lines as they come, until the end line.
func (p *pullStream) run() {
	defer close(p.done)
	var moved time.Time
	first := true
	for {
		p.mu.Lock()
		batch, ended := p.queue, p.ended
		p.queue = nil
		p.mu.Unlock()
		for _, v := range batch {
			if now := time.Now(); p.idle > 0 && now.Sub(moved) >= deadlineStep(p.idle) {
				moved = now
				_ = p.ctl.SetWriteDeadline(now.Add(p.idle)) // ErrNotSupported: no deadline to keep
			}
			err := p.line(v, first)
			first = false
			if err != nil {
				p.mu.Lock()
				p.broken = true
				p.mu.Unlock()
				p.cut = "error"
				if errors.Is(err, os.ErrDeadlineExceeded) {
					p.cut = "idle_timeout"
				}
				p.cancel() // no one is left to tell
				return
			}
		}
		if len(batch) == 0 {
			if ended {
				return
			}
			<-p.wake
		}
	}
}

// line writes v as one line and flushes it, so the client sees each event
// as it happens; the first line sends the 200 and its header. The
// connection closes with the answer: net/http writes the last chunk after
// the handler, where the write deadline could not be lifted safely.
func (p *pullStream) line(v any, first bool) error {
	if first {
		h := p.w.Header()
		h.Set("Content-Type", api.ContentTypeNDJSON)
		h.Set("Cache-Control", "no-store")
		h.Set("Connection", "close")
		p.w.WriteHeader(http.StatusOK)
	}
	b, err := json.Marshal(v) // PullProgress and PullEnd always marshal
	if err != nil {
		return err
	}
	if _, err := p.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return p.ctl.Flush()
}

// listImages is GET /v1/images.
func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	im, err := s.images("list_images")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	infos, err := im.ListImages(r.Context())
	if err != nil {
		s.writeError(w, r, s.callError(r, err))
		return
	}
	if infos == nil {
		infos = []sandbox.ImageInfo{}
	}
	writeJSON(w, http.StatusOK, api.ImageList{Images: infos})
}

// removeImage is DELETE /v1/images/{name...}: the name is the rest of the
// path, its '/' included ("ghcr.io/o/r:tag"), unescaped.
func (s *Server) removeImage(w http.ResponseWriter, r *http.Request) {
	im, err := s.images("remove_image")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	if name == "" {
		s.writeError(w, r, sandbox.Errorf("remove_image", "an image name is required: DELETE /v1/images/NAME, NAME as GET /v1/images lists it"))
		return
	}
	if err := im.RemoveImage(r.Context(), name); err != nil {
		s.writeError(w, r, s.callError(r, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pruneImages is POST /v1/images/prune.
func (s *Server) pruneImages(w http.ResponseWriter, r *http.Request) {
	im, err := s.images("prune_images")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := im.PruneImages(r.Context())
	if err != nil {
		s.writeError(w, r, s.callError(r, err))
		return
	}
	writeJSON(w, http.StatusOK, res)
}
