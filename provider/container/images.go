package container

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/singleflight"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
)

var _ sandbox.ImageManager = (*provider)(nil)

// validPull checks a pull policy of Options; "" is PullMissing.
func validPull(pull PullPolicy) (PullPolicy, error) {
	switch pull {
	case "":
		return PullMissing, nil
	case PullMissing, PullAlways, PullNever:
		return pull, nil
	}
	return "", fmt.Errorf("pull policy %q: want %q, %q or %q", pull, PullMissing, PullAlways, PullNever)
}

// acquireImage holds image name of a session spec for its create, pulling
// it first as the pull policy says: when the store lacks it (missing), on
// every create (always), never (never). Concurrent creates of one name
// share one pull. Every failure is a *sandbox.SpecRejectedError of field
// "image" naming the image, but the end of the create's own context
// during a pull (a *createGaveUp, matching the context's error).
func (p *provider) acquireImage(ctx context.Context, name string) (imagestore.Image, func(), error) {
	reject := func(format string, args ...any) error {
		return &sandbox.SpecRejectedError{Field: "image", Reason: sandbox.ReasonUnenforceable, Message: fmt.Sprintf(format, args...)}
	}
	pullErr := func(err error, why string) error {
		var gave *createGaveUp
		if errors.As(err, &gave) {
			return gave // the create's own end, not the spec's fault
		}
		return reject("%v (--pull %s%s)", err, p.opts.Pull, why)
	}
	if p.opts.Pull == PullAlways {
		if err := p.pullShared(ctx, name); err != nil {
			return imagestore.Image{}, nil, pullErr(err, "")
		}
	}
	img, release, err := p.images.Acquire(name)
	if errors.Is(err, imagestore.ErrNotFound) && p.opts.Pull == PullMissing {
		if err := p.pullShared(ctx, name); err != nil {
			return imagestore.Image{}, nil, pullErr(err, ": the store lacked it")
		}
		img, release, err = p.images.Acquire(name)
	}
	if err != nil {
		if errors.Is(err, imagestore.ErrNotFound) && p.opts.Pull == PullNever {
			return imagestore.Image{}, nil, reject("%v, and pulls are off (--pull %s): pull it first (`tai42 image pull %s`) or import it", err, PullNever, name)
		}
		return imagestore.Image{}, nil, reject("%v", err)
	}
	if err := sandbox.ValidUser(img.User); err != nil {
		release()
		return imagestore.Image{}, nil, reject("image %s: its config's User %q cannot be an exec's user (%v): exec as a user takes a name, a uid or uid:gid", img.Name, img.User, err)
	}
	return img, release, nil
}

// pullShared pulls ref for a create: one pull per reference at a time in
// this process, which every create asking meanwhile waits for. The pull
// goes on when the create that began it gives up (the others may still
// want it), bounded by the registry's stall timeout and the provider's
// Close.
func (p *provider) pullShared(ctx context.Context, ref string) error {
	key := ref
	if canon, err := imagestore.CanonicalName(ref); err == nil {
		key = canon
	}
	ch := p.pulls.DoChan(key, func() (any, error) {
		if p.opts.Pull == PullMissing {
			// A create that found the store lacking it may come once the
			// pull that got it is over: that one was the pull.
			if _, err := p.images.Get(ref); err == nil {
				return nil, nil
			}
		}
		_, err := p.pull(p.pullCtx, ref, sandbox.PullOptions{}, "create")
		return nil, err
	})
	select {
	case res := <-ch:
		var perr *sandbox.ImagePullError
		if errors.As(res.Err, &perr) {
			return fmt.Errorf("pulling image %s failed (%s): %s", ref, perr.Reason, perr.Message)
		}
		return res.Err
	case <-ctx.Done():
		return &createGaveUp{ref: ref, err: ctx.Err()}
	}
}

// createGaveUp is a create's context ending while its image was pulled:
// the pull goes on for the others that wait for it.
type createGaveUp struct {
	ref string
	err error
}

func (e *createGaveUp) Error() string {
	return fmt.Sprintf("the create ended while its image %s was pulled (the pull goes on): %v", e.ref, e.err)
}
func (e *createGaveUp) Unwrap() error { return e.err }

// pull is every pull of the provider (a create's, PullImage's): the
// store's, logged once (the Manager's Pulled). Its error is a
// *sandbox.ImagePullError.
func (p *provider) pull(ctx context.Context, ref string, opts sandbox.PullOptions, why string) (imagestore.Image, error) {
	m := p.imageManager()
	m.Pulled = func(ref string, img imagestore.Image, st imagestore.PullStats, perr *sandbox.ImagePullError) {
		if perr != nil {
			p.log.Warn("container: image pull failed", "ref", ref, "for", why, "reason", string(perr.Reason), "err", perr.Message, "duration", st.Duration)
			return
		}
		p.log.Info("container: image pulled", "ref", ref, "for", why, "name", img.Name, "digest", img.Digest,
			"bytes", st.Bytes, "layers_fetched", st.Fetched, "layers_existing", st.Existing, "duration", st.Duration)
	}
	return m.Pull(ctx, ref, opts)
}

// imageManager is the provider's store as the contract's ImageManager.
func (p *provider) imageManager() imagestore.Manager {
	return imagestore.Manager{Store: p.images, Registry: p.opts.Registry}
}

// PullImage implements sandbox.ImageManager.
func (p *provider) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	img, err := p.pull(ctx, ref, opts, "pull")
	if err != nil {
		return sandbox.ImageInfo{}, err
	}
	return imagestore.Info(img), nil
}

// ListImages implements sandbox.ImageManager: the store's images (the host
// image is not one).
func (p *provider) ListImages(ctx context.Context) ([]sandbox.ImageInfo, error) {
	return p.imageManager().ListImages(ctx)
}

// RemoveImage implements sandbox.ImageManager.
func (p *provider) RemoveImage(ctx context.Context, name string) error {
	return p.imageManager().RemoveImage(ctx, name)
}

// PruneImages implements sandbox.ImageManager: the store removes the layers
// no image version (named, or still held by a session) and no pull under
// way uses.
func (p *provider) PruneImages(ctx context.Context) (sandbox.PruneResult, error) {
	return p.imageManager().PruneImages(ctx)
}

// pullGroup shares one pull per reference among a provider's creates.
type pullGroup = singleflight.Group
