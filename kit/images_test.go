package kit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// imageProvider is a fakeProvider that keeps images (a
// sandbox.ImageManager): it answers with what its fields say and records
// what it was asked.
type imageProvider struct {
	*fakeProvider
	list     []sandbox.ImageInfo
	pulled   sandbox.ImageInfo
	events   []sandbox.PullProgress
	pruned   sandbox.PruneResult
	err      error // every call's, when set
	asked    []string
	platform string
}

var _ sandbox.ImageManager = (*imageProvider)(nil)

func (p *imageProvider) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	p.asked = append(p.asked, "pull "+ref)
	p.platform = opts.Platform
	for _, ev := range p.events {
		if opts.Progress != nil {
			opts.Progress(ev)
		}
	}
	if p.err != nil {
		return sandbox.ImageInfo{}, p.err
	}
	return p.pulled, ctx.Err()
}

func (p *imageProvider) ListImages(context.Context) ([]sandbox.ImageInfo, error) {
	p.asked = append(p.asked, "list")
	return p.list, p.err
}

func (p *imageProvider) RemoveImage(_ context.Context, name string) error {
	p.asked = append(p.asked, "rm "+name)
	return p.err
}

func (p *imageProvider) PruneImages(context.Context) (sandbox.PruneResult, error) {
	p.asked = append(p.asked, "prune")
	return p.pruned, p.err
}

// The kit hands each call to the provider's ImageManager and its answer
// back: the list sorted by name, the pull's events in order.
func TestImagesForwarded(t *testing.T) {
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := &imageProvider{
		fakeProvider: &fakeProvider{iso: "none"},
		list:         []sandbox.ImageInfo{{Name: "zeta:1"}, {Name: "alpha:2"}, {Name: "ghcr.io/o/r:tag"}},
		pulled:       sandbox.ImageInfo{Name: "python:3.12-slim", ID: "sha256:c0", Digest: "sha256:d1", Platform: "linux/amd64", Size: 100, SharedSize: 40, Layers: 3, Pulled: when},
		events: []sandbox.PullProgress{
			{Ref: "python:3.12-slim", Status: sandbox.PullResolved, Digest: "sha256:d1"},
			{Ref: "python:3.12-slim", Status: sandbox.PullLayerFetching, Layer: "sha256:l1", Done: 5, Total: 10},
			{Ref: "python:3.12-slim", Status: sandbox.PullComplete, Digest: "sha256:d1"},
		},
		pruned: sandbox.PruneResult{Layers: 2, Bytes: 4096},
	}
	sb := newKit(t, p, open, -1)
	var im sandbox.ImageManager = sb
	ctx := context.Background()

	var got []sandbox.PullProgress
	info, err := im.PullImage(ctx, "python:3.12-slim", sandbox.PullOptions{Platform: "linux/arm64/v8", Progress: func(ev sandbox.PullProgress) { got = append(got, ev) }})
	if err != nil || info != p.pulled {
		t.Fatalf("PullImage = %+v, %v; want %+v", info, err, p.pulled)
	}
	if fmt.Sprint(got) != fmt.Sprint(p.events) || p.platform != "linux/arm64/v8" {
		t.Errorf("the pull's events %v, platform %q; want %v, linux/arm64/v8", got, p.platform, p.events)
	}
	list, err := im.ListImages(ctx)
	if err != nil || len(list) != 3 || list[0].Name != "alpha:2" || list[1].Name != "ghcr.io/o/r:tag" || list[2].Name != "zeta:1" {
		t.Errorf("ListImages = %+v, %v; want alpha:2, ghcr.io/o/r:tag, zeta:1", list, err)
	}
	if p.list[0].Name != "zeta:1" {
		t.Error("the kit sorted the provider's own slice")
	}
	if err := im.RemoveImage(ctx, "127.0.0.1:5000/r@sha256:abc"); err != nil {
		t.Errorf("RemoveImage: %v", err)
	}
	if res, err := im.PruneImages(ctx); err != nil || res != p.pruned {
		t.Errorf("PruneImages = %+v, %v; want %+v", res, err, p.pruned)
	}
	want := "[pull python:3.12-slim list rm 127.0.0.1:5000/r@sha256:abc prune]"
	if fmt.Sprint(p.asked) != want {
		t.Errorf("the provider was asked %v; want %s", p.asked, want)
	}
	p.list = nil
	if list, err := im.ListImages(ctx); err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListImages of a provider answering nil = %#v, %v; want an empty, non-nil list", list, err)
	}
}

// The provider's errors of the family reach the caller as they are; any
// other is a *SandboxError of the call's op naming the provider and what
// was asked.
func TestImageErrors(t *testing.T) {
	p := &imageProvider{fakeProvider: &fakeProvider{iso: "none"}}
	sb := newKit(t, p, open, -1)
	ctx := context.Background()

	pullErr := &sandbox.ImagePullError{Ref: "ghcr.io/o/r:tag", Reason: sandbox.PullUnauthorized, Message: "the registry refused the credentials"}
	p.err = pullErr
	_, err := sb.PullImage(ctx, "ghcr.io/o/r:tag", sandbox.PullOptions{})
	var pe *sandbox.ImagePullError
	if !errors.As(err, &pe) || pe != pullErr {
		t.Errorf("a pull error came back as %#v; want the provider's own", err)
	}
	nf := &sandbox.ImageNotFoundError{Name: "gone:1"}
	p.err = nf
	if err := sb.RemoveImage(ctx, "gone:1"); !errors.Is(err, sandbox.ErrImageNotFound) || err != error(nf) {
		t.Errorf("a removal of an image not held = %v; want the provider's ImageNotFoundError", err)
	}

	p.err = errors.New("disk on fire")
	for _, c := range []struct {
		op   string
		call func() error
		says string
	}{
		{"pull_image", func() error { _, err := sb.PullImage(ctx, "a:1", sandbox.PullOptions{}); return err }, `"a:1"`},
		{"list_images", func() error { _, err := sb.ListImages(ctx); return err }, "list"},
		{"remove_image", func() error { return sb.RemoveImage(ctx, "b:2") }, `"b:2"`},
		{"prune_images", func() error { _, err := sb.PruneImages(ctx); return err }, "prune"},
	} {
		err := c.call()
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != c.op || !strings.Contains(err.Error(), "disk on fire") ||
			!strings.Contains(err.Error(), "provider fake") || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s with a failing provider: %v; want a %s SandboxError naming provider fake, %s and the cause", c.op, err, c.op, c.says)
		}
	}
}

// A provider without an ImageManager keeps no images: the list is empty,
// and pull, remove and prune say so without touching anything.
func TestImagesWithoutManager(t *testing.T) {
	sb := newKit(t, &fakeProvider{iso: "none"}, open, -1)
	ctx := context.Background()
	list, err := sb.ListImages(ctx)
	if err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListImages = %#v, %v; want an empty, non-nil list", list, err)
	}
	called := false
	_, pullErr := sb.PullImage(ctx, "python:3.12-slim", sandbox.PullOptions{Progress: func(sandbox.PullProgress) { called = true }})
	_, pruneErr := sb.PruneImages(ctx)
	for op, err := range map[string]error{
		"pull_image":   pullErr,
		"remove_image": sb.RemoveImage(ctx, "python:3.12-slim"),
		"prune_images": pruneErr,
	} {
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || se.Op != op || !strings.Contains(err.Error(), "provider fake keeps no images") || !strings.Contains(err.Error(), `"host"`) {
			t.Errorf("%s: %v; want a %s SandboxError saying provider fake keeps no images (the host runner runs only \"host\")", op, err, op)
		}
		if errors.Is(err, sandbox.ErrImageNotFound) || errors.Is(err, sandbox.ErrImagePull) {
			t.Errorf("%s: %v is a kind of its own; want the plain SandboxError", op, err)
		}
	}
	if called {
		t.Error("a provider without images reported progress")
	}
}

// kit.Provider has no image methods: a provider opts in by implementing
// sandbox.ImageManager, found with a type assertion.
var _ kit.Provider = (*imageProvider)(nil)
