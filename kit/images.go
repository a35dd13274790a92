package kit

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/tai42/sandbox"
)

var _ sandbox.ImageManager = (*Sandbox)(nil)

// images returns the provider as a [sandbox.ImageManager], or the
// *sandbox.SandboxError for op saying it keeps no images.
func (s *Sandbox) images(op string) (sandbox.ImageManager, error) {
	if im, ok := s.prov.(sandbox.ImageManager); ok {
		return im, nil
	}
	return nil, sandbox.Errorf(op, "provider %s keeps no images: it cannot pull, remove or prune any "+
		"(the host runner runs only the image %q; the container provider pulls images)", s.prov.Name(), sandbox.HostImage)
}

// PullImage implements [sandbox.ImageManager] through the provider's own.
// A provider that keeps no images answers a *sandbox.SandboxError saying
// so; the provider's errors of the family (an *sandbox.ImagePullError) come
// back as they are, any other wrapped in a *sandbox.SandboxError naming the
// provider and the reference.
func (s *Sandbox) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	im, err := s.images("pull_image")
	if err != nil {
		return sandbox.ImageInfo{}, err
	}
	info, err := im.PullImage(ctx, ref, opts)
	if err != nil {
		return sandbox.ImageInfo{}, sandbox.WrapForeign("pull_image", fmt.Sprintf("provider %s could not pull image %q", s.prov.Name(), ref), err)
	}
	if s.pool != nil {
		// The name may now be another image: the sessions made ahead of
		// the one it was are never handed out.
		for _, name := range slices.Compact([]string{info.Name, ref}) {
			s.pool.flush(name, false)
			s.pool.resume(name)
		}
	}
	return info, nil
}

// ListImages implements [sandbox.ImageManager]: the provider's images,
// sorted by name (the kit sorts, whatever the provider's order); an empty (non-nil) list for a provider that keeps none.
func (s *Sandbox) ListImages(ctx context.Context) ([]sandbox.ImageInfo, error) {
	im, ok := s.prov.(sandbox.ImageManager)
	if !ok {
		return []sandbox.ImageInfo{}, nil
	}
	list, err := im.ListImages(ctx)
	if err != nil {
		return nil, sandbox.WrapForeign("list_images", "provider "+s.prov.Name()+" could not list its images", err)
	}
	out := slices.Clone(list)
	if out == nil {
		out = []sandbox.ImageInfo{}
	}
	slices.SortFunc(out, func(a, b sandbox.ImageInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// RemoveImage implements [sandbox.ImageManager] through the provider's
// own (which refuses an image a live session uses, and answers a name it
// does not hold with a *sandbox.ImageNotFoundError). A provider that keeps
// no images answers a *sandbox.SandboxError saying so.
func (s *Sandbox) RemoveImage(ctx context.Context, name string) error {
	im, err := s.images("remove_image")
	if err != nil {
		return err
	}
	if s.pool != nil {
		// The sessions made ahead of it use it: they go first, and none
		// is made again until the image is pulled again.
		s.pool.flush(name, true)
	}
	if err := im.RemoveImage(ctx, name); err != nil {
		if s.pool != nil {
			s.pool.resume(name)
		}
		return sandbox.WrapForeign("remove_image", fmt.Sprintf("provider %s could not remove image %q", s.prov.Name(), name), err)
	}
	return nil
}

// PruneImages implements [sandbox.ImageManager] through the provider's
// own. A provider that keeps no images answers a *sandbox.SandboxError
// saying so.
func (s *Sandbox) PruneImages(ctx context.Context) (sandbox.PruneResult, error) {
	im, err := s.images("prune_images")
	if err != nil {
		return sandbox.PruneResult{}, err
	}
	res, err := im.PruneImages(ctx)
	if err != nil {
		return sandbox.PruneResult{}, sandbox.WrapForeign("prune_images", "provider "+s.prov.Name()+" could not prune its images", err)
	}
	return res, nil
}
