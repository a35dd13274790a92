package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

// imageSandbox is a host runner whose image calls it answers itself. A pull
// reports events, then waits for its context when hold is set (sending
// its end on cancelled), then returns pulled or pullErr.
type imageSandbox struct {
	*kit.Sandbox
	mu        sync.Mutex
	events    []sandbox.PullProgress
	pulled    sandbox.ImageInfo
	pullErr   error
	hold      bool
	cancelled chan error
	list      []sandbox.ImageInfo
	rmErr     error
	pruned    sandbox.PruneResult
	removed   []string
	ref       string
	platform  string
}

func (f *imageSandbox) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	f.mu.Lock()
	f.ref, f.platform = ref, opts.Platform
	events, pulled, pullErr, hold := f.events, f.pulled, f.pullErr, f.hold
	f.mu.Unlock()
	for _, ev := range events {
		opts.Progress(ev)
	}
	if hold {
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		f.cancelled <- ctx.Err()
		return sandbox.ImageInfo{}, ctx.Err()
	}
	return pulled, pullErr
}

func (f *imageSandbox) ListImages(context.Context) ([]sandbox.ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.list, nil
}

func (f *imageSandbox) RemoveImage(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, name)
	return f.rmErr
}

func (f *imageSandbox) PruneImages(context.Context) (sandbox.PruneResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pruned, nil
}

func (f *imageSandbox) set(fn func(*imageSandbox)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
	f.removed = nil
}

// serveImages serves an imageSandbox over a host runner on loopback and
// returns a client of it.
func serveImages(t *testing.T) (*client.Client, *imageSandbox) {
	t.Helper()
	policy := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	sb, err := host.New(host.Options{Options: kit.Options{Policy: policy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	f := &imageSandbox{Sandbox: sb, cancelled: make(chan error, 1)}
	srv, err := server.New(f, server.Options{Token: conformanceToken, Provider: host.Name})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	c := client.New(ts.URL, conformanceToken)
	t.Cleanup(func() { c.Close() })
	return c, f
}

var (
	image = sandbox.ImageInfo{Name: "ghcr.io/o/r:tag", ID: "sha256:c0", Digest: "sha256:d1", Platform: "linux/arm64/v8",
		Size: 3 << 20, SharedSize: 1 << 20, Layers: 2, Pulled: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	events = []sandbox.PullProgress{
		{Ref: "ghcr.io/o/r:tag", Status: sandbox.PullResolved, Digest: "sha256:d1"},
		{Ref: "ghcr.io/o/r:tag", Status: sandbox.PullLayerExists, Layer: "sha256:l0"},
		{Ref: "ghcr.io/o/r:tag", Status: sandbox.PullLayerFetching, Layer: "sha256:l1", Done: 1 << 19, Total: 2 << 20},
		{Ref: "ghcr.io/o/r:tag", Status: sandbox.PullLayerDone, Layer: "sha256:l1"},
		{Ref: "ghcr.io/o/r:tag", Status: sandbox.PullComplete, Digest: "sha256:d1"},
	}
)

// The client pulls, lists, removes and prunes the daemon's images over the
// wire, with every event in order and the contract's errors.
func TestImagesRoundTrip(t *testing.T) {
	c, f := serveImages(t)
	var im sandbox.ImageManager = c
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	f.set(func(f *imageSandbox) { f.events, f.pulled = events, image })
	var got []sandbox.PullProgress
	info, err := im.PullImage(ctx, "ghcr.io/o/r:tag", sandbox.PullOptions{Platform: "linux/arm64/v8", Progress: func(ev sandbox.PullProgress) { got = append(got, ev) }})
	if err != nil || !info.Pulled.Equal(image.Pulled) || info.Name != image.Name || info.SharedSize != image.SharedSize || info.Digest != image.Digest {
		t.Fatalf("PullImage = %+v, %v; want %+v", info, err, image)
	}
	if !reflect.DeepEqual(got, events) || f.ref != "ghcr.io/o/r:tag" || f.platform != "linux/arm64/v8" {
		t.Errorf("the events %+v (ref %q, platform %q); want %+v", got, f.ref, f.platform, events)
	}
	if _, err := im.PullImage(ctx, "ghcr.io/o/r:tag", sandbox.PullOptions{}); err != nil {
		t.Errorf("a pull without a Progress: %v", err)
	}

	// Failures: midway (in the stream) and before any event (a plain error).
	for _, n := range []int{3, 0} {
		want := &sandbox.ImagePullError{Ref: "127.0.0.1:5000/r@sha256:0d", Reason: sandbox.PullUnauthorized, Message: "the registry refused the credentials"}
		f.set(func(f *imageSandbox) { f.events, f.pullErr = events[:n], want })
		got = nil
		_, err := im.PullImage(ctx, want.Ref, sandbox.PullOptions{Progress: func(ev sandbox.PullProgress) { got = append(got, ev) }})
		var pe *sandbox.ImagePullError
		if !errors.As(err, &pe) || !reflect.DeepEqual(pe, want) || !errors.Is(err, sandbox.ErrImagePull) || len(got) != n {
			t.Errorf("a pull failing after %d events = %#v (%d events); want %#v", n, err, len(got), want)
		}
	}
	f.set(func(f *imageSandbox) {
		f.events, f.pullErr = nil, sandbox.Errorf("pull_image", "provider host keeps no images")
	})
	if _, err := im.PullImage(ctx, "a", sandbox.PullOptions{}); err == nil || !strings.Contains(err.Error(), "keeps no images") {
		t.Errorf("a sandbox error: %v", err)
	}

	f.set(func(f *imageSandbox) { f.list = []sandbox.ImageInfo{image} })
	if list, err := im.ListImages(ctx); err != nil || len(list) != 1 || list[0].Name != image.Name {
		t.Errorf("ListImages = %+v, %v", list, err)
	}
	f.set(func(f *imageSandbox) { f.list = nil })
	if list, err := im.ListImages(ctx); err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListImages of none = %#v, %v; want an empty, non-nil list", list, err)
	}

	names := []string{"ghcr.io/o/r:tag", "127.0.0.1:5000/r@sha256:9f1c5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6", "python:3.12-slim", "pull", "odd name%2F/x?y#z"}
	f.set(func(*imageSandbox) {})
	for _, n := range names {
		if err := im.RemoveImage(ctx, n); err != nil {
			t.Errorf("RemoveImage(%q): %v", n, err)
		}
	}
	f.mu.Lock()
	removed := f.removed
	f.mu.Unlock()
	if !reflect.DeepEqual(removed, names) {
		t.Errorf("the daemon removed %q; want %q", removed, names)
	}
	f.set(func(f *imageSandbox) { f.rmErr = &sandbox.ImageNotFoundError{Name: "ghcr.io/o/gone:1"} })
	err = im.RemoveImage(ctx, "ghcr.io/o/gone:1")
	var nf *sandbox.ImageNotFoundError
	if !errors.As(err, &nf) || nf.Name != "ghcr.io/o/gone:1" || !errors.Is(err, sandbox.ErrImageNotFound) {
		t.Errorf("removing an image not held = %#v; want *ImageNotFoundError", err)
	}
	var se *sandbox.SandboxError
	if err := im.RemoveImage(ctx, ""); !errors.As(err, &se) || se.Op != "remove_image" {
		t.Errorf("RemoveImage(\"\") = %v; want a remove_image SandboxError", err)
	}

	f.set(func(f *imageSandbox) { f.pruned = sandbox.PruneResult{Layers: 4, Bytes: 1 << 30} })
	if res, err := im.PruneImages(ctx); err != nil || res != (sandbox.PruneResult{Layers: 4, Bytes: 1 << 30}) {
		t.Errorf("PruneImages = %+v, %v", res, err)
	}
}

// Ending the context cancels the pull on the daemon.
func TestPullImageCancelled(t *testing.T) {
	c, f := serveImages(t)
	f.set(func(f *imageSandbox) { f.events, f.hold = events[:1], true })
	ctx, cancel := context.WithCancel(t.Context())
	_, err := c.PullImage(ctx, "ghcr.io/o/r:tag", sandbox.PullOptions{Progress: func(sandbox.PullProgress) { cancel() }})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("a cancelled pull = %v; want a SandboxError matching context.Canceled", err)
	}
	select {
	case err := <-f.cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the daemon's pull ended with %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon's pull was not cancelled")
	}
}

// A stream that ends without its outcome, or that is not the pull's, is
// an error saying so, never a success nor io.EOF.
func TestPullImageBrokenStream(t *testing.T) {
	for name, c := range map[string]struct {
		ct, body, says string
	}{
		"cut":      {api.ContentTypeNDJSON, `{"ref":"a","status":"resolved"}` + "\n", "ended before its outcome"},
		"not json": {api.ContentTypeNDJSON, "{\"ref\":\n", "not the expected JSON"},
		"json":     {"application/json", `{"image":{"name":"a"}}`, "not the application/x-ndjson stream"},
	} {
		t.Run(name, func(t *testing.T) {
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", c.ct)
				_, _ = io.WriteString(w, c.body)
			}))
			defer ts.Close()
			cl := client.New(ts.URL, conformanceToken)
			defer cl.Close()
			_, err := cl.PullImage(t.Context(), "a", sandbox.PullOptions{})
			if err == nil || !strings.Contains(err.Error(), c.says) || errors.Is(err, io.EOF) || !errors.Is(err, sandbox.ErrSandbox) {
				t.Errorf("PullImage = %v; want a SandboxError saying %q (not io.EOF)", err, c.says)
			}
		})
	}
}

// On a real host runner: no images, and the rest says the provider keeps
// none.
func TestImagesOnHostRunner(t *testing.T) {
	url, _, _ := serveWorkspaces(t)
	c := client.New(url, conformanceToken)
	defer c.Close()
	ctx := t.Context()
	if list, err := c.ListImages(ctx); err != nil || len(list) != 0 {
		t.Errorf("ListImages = %+v, %v; want none", list, err)
	}
	_, pullErr := c.PullImage(ctx, "python:3.12-slim", sandbox.PullOptions{Progress: func(sandbox.PullProgress) { t.Error("progress from a provider without images") }})
	_, pruneErr := c.PruneImages(ctx)
	for op, err := range map[string]error{"pull_image": pullErr, "remove_image": c.RemoveImage(ctx, "python:3.12-slim"), "prune_images": pruneErr} {
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != op || !strings.Contains(err.Error(), "provider host keeps no images") {
			t.Errorf("%s = %v; want a %s SandboxError saying provider host keeps no images", op, err, op)
		}
	}
}
