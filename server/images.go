package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"

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
// goes away; a line the client no longer takes cancels it too.
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
	st := &pullStream{w: w, ctl: http.NewResponseController(w), cancel: cancel}
	info, err := im.PullImage(ctx, req.Ref, sandbox.PullOptions{Platform: req.Platform, Progress: st.event})
	started := st.stop()
	s.met.pulled(err)
	if err != nil {
		err = s.callError(r, err)
		if !started {
			s.writeError(w, r, err)
			return
		}
		e := s.wireError(r, err)
		st.end(api.PullEnd{Error: &e})
		return
	}
	st.end(api.PullEnd{Image: &info})
}

// pullStream writes a pull's lines. Events may come from a goroutine of
// the provider's: the mutex orders them with the handler's last line, and
// once the pull has returned (stop) a late event is dropped rather than
// written after the handler.
type pullStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	ctl     *http.ResponseController
	cancel  context.CancelFunc
	started bool // the 200 and its header went out
	stopped bool // the pull returned: no more events
	broken  bool // a write failed: the client is gone
}

func (p *pullStream) event(ev sandbox.PullProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		p.line(ev)
	}
}

// stop ends the events and reports whether the stream has started.
func (p *pullStream) stop() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	return p.started
}

// end writes the last line (starting the stream if no event did).
func (p *pullStream) end(v api.PullEnd) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line(v)
}

// line writes v as one line and flushes it, so the client sees each event
// as it happens. A write that fails (the client went away) cancels the
// pull: no one is left to tell.
func (p *pullStream) line(v any) {
	if p.broken {
		return
	}
	if !p.started {
		p.started = true
		h := p.w.Header()
		h.Set("Content-Type", api.ContentTypeNDJSON)
		h.Set("Cache-Control", "no-store")
		p.w.WriteHeader(http.StatusOK)
	}
	b, err := json.Marshal(v) // PullProgress and PullEnd always marshal
	if err == nil {
		_, err = p.w.Write(append(b, '\n'))
	}
	if err == nil {
		err = p.ctl.Flush()
	}
	if err != nil {
		p.broken = true
		p.cancel()
	}
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
