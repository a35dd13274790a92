package imagestore

import (
	"context"
	"errors"

	"github.com/tai42/sandbox"
)

// Manager is a Store as a sandbox.ImageManager, pulling through Registry:
// the one mapping of the store's images and errors to the contract's, which
// the container provider serves and "tai42 image" uses on a local store.
type Manager struct {
	Store    *Store
	Registry RegistryOptions
	// Pulled, when set, is told of every pull's outcome (err nil on
	// success), for the one log line a pull gets.
	Pulled func(ref string, img Image, st PullStats, err *sandbox.ImagePullError)
}

var _ sandbox.ImageManager = Manager{}

// Pull pulls ref as PullImage does and returns the store's image. Its
// error is a *sandbox.ImagePullError, or ctx's error (wrapped in a
// *sandbox.SandboxError) when ctx ended it.
func (m Manager) Pull(ctx context.Context, ref string, opts sandbox.PullOptions) (Image, error) {
	img, st, err := m.Store.Pull(ctx, ref, PullOptions{Platform: opts.Platform, Progress: opts.Progress, Registry: m.Registry})
	var perr *sandbox.ImagePullError
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return Image{}, sandbox.WrapError("pull_image", "the pull of "+ref+" was cancelled", err)
		}
		perr = ImagePullError(ref, err)
	}
	if m.Pulled != nil {
		m.Pulled(ref, img, st, perr)
	}
	if perr != nil {
		return Image{}, perr
	}
	return img, nil
}

// ImagePullError is err, a failure of pulling ref, as the contract reports
// it: the store's reason and text (which names the registry's answer and
// never a credential).
func ImagePullError(ref string, err error) *sandbox.ImagePullError {
	if perr, ok := errors.AsType[*sandbox.ImagePullError](err); ok {
		return perr
	}
	pe := pullError(ref, err)
	return &sandbox.ImagePullError{Ref: ref, Reason: pe.Reason, Message: pe.Err.Error()}
}

// PullImage implements sandbox.ImageManager.
func (m Manager) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	img, err := m.Pull(ctx, ref, opts)
	if err != nil {
		return sandbox.ImageInfo{}, err
	}
	return Info(img), nil
}

// ListImages implements sandbox.ImageManager.
func (m Manager) ListImages(context.Context) ([]sandbox.ImageInfo, error) {
	imgs, err := m.Store.List()
	if err != nil {
		return nil, sandbox.WrapError("list_images", "cannot read the image store", err)
	}
	out := make([]sandbox.ImageInfo, len(imgs))
	for i, img := range imgs {
		out[i] = Info(img)
	}
	return out, nil
}

// RemoveImage implements sandbox.ImageManager: a name not held is a
// *sandbox.ImageNotFoundError, one that is not a name a *sandbox.SandboxError
// saying why, an image a session holds a
// *sandbox.SandboxError saying so.
func (m Manager) RemoveImage(_ context.Context, name string) error {
	err := m.Store.Remove(name)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotFound):
		return &sandbox.ImageNotFoundError{Name: name}
	case errors.Is(err, ErrInvalidName):
		// No image has such a name; the text says why it is not one.
		return sandbox.WrapError("remove_image", err.Error(), err)
	case errors.Is(err, ErrInUse):
		return sandbox.Errorf("remove_image", "image %s is used by a live session: destroy the sessions of it first (%v)", name, err)
	}
	return sandbox.WrapError("remove_image", "cannot remove image "+name, err)
}

// PruneImages implements sandbox.ImageManager.
func (m Manager) PruneImages(ctx context.Context) (sandbox.PruneResult, error) {
	res, err := m.Store.Prune(ctx)
	if err != nil {
		return sandbox.PruneResult{}, sandbox.WrapError("prune_images", "cannot prune the image store", err)
	}
	return res, nil
}

// Info is img as the contract shows an image; never its Env (an image's
// ENV may carry credentials).
func Info(img Image) sandbox.ImageInfo {
	return sandbox.ImageInfo{
		Name:       img.Name,
		ID:         img.ID,
		Digest:     img.Digest,
		Platform:   img.Platform,
		Size:       img.Size,
		SharedSize: img.SharedSize,
		Layers:     len(img.Layers),
		Pulled:     img.Pulled,
	}
}
