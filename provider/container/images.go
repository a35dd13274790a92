package container

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
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
		return reject("%v (pull policy %s%s)", err, p.opts.Pull, why)
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
	img = p.testedImage(img)
	if err != nil {
		if errors.Is(err, imagestore.ErrNotFound) && p.opts.Pull == PullNever {
			return imagestore.Image{}, nil, reject("%v, and the pull policy is %s: pull it first (`tai42 image pull %s`) or import it", err, PullNever, name)
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
// store's, logged once. Its error is a *sandbox.ImagePullError.
func (p *provider) pull(ctx context.Context, ref string, opts sandbox.PullOptions, why string) (imagestore.Image, error) {
	img, st, err := p.images.Pull(ctx, ref, imagestore.PullOptions{
		Platform: opts.Platform,
		Progress: opts.Progress,
		Registry: p.opts.Registry,
	})
	if err != nil {
		perr := pullError(ref, err)
		p.log.Warn("container: image pull failed", "ref", ref, "for", why, "reason", string(perr.Reason), "err", perr.Message, "duration", st.Duration)
		return imagestore.Image{}, perr
	}
	p.log.Info("container: image pulled", "ref", ref, "for", why, "name", img.Name, "digest", img.Digest,
		"bytes", st.Bytes, "layers_fetched", st.Fetched, "layers_existing", st.Existing, "duration", st.Duration)
	return img, nil
}

// pullError is err of the store's Pull of ref as the contract reports it:
// the store's reason when it gives one, or one read from the error chain.
// Its Message is the store's text, which names the registry's answer and
// never a credential.
func pullError(ref string, err error) *sandbox.ImagePullError {
	var perr *sandbox.ImagePullError
	if errors.As(err, &perr) {
		return perr
	}
	return &sandbox.ImagePullError{Ref: ref, Reason: pullReason(err), Message: err.Error()}
}

// pullReason classifies a pull's failure by the error's chain.
func pullReason(err error) sandbox.PullReason {
	var terr *transport.Error
	var nerr net.Error
	switch {
	case errors.Is(err, imagestore.ErrInvalidName):
		return sandbox.PullInvalidReference
	case errors.As(err, &terr):
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden || hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return sandbox.PullUnauthorized
		case terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return sandbox.PullNotFound
		}
		return sandbox.PullUnreachable
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EIO), errors.Is(err, syscall.EDQUOT):
		return sandbox.PullStorage
	case errors.As(err, &nerr), errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ECONNREFUSED):
		return sandbox.PullUnreachable
	case strings.Contains(err.Error(), "no child with platform"):
		// go-containerregistry's remote says so, untyped, of an index
		// without the platform asked.
		return sandbox.PullNoPlatform
	}
	return sandbox.PullInvalidImage
}

// hasCode reports whether the registry's answer carries one of codes.
func hasCode(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// PullImage implements sandbox.ImageManager.
func (p *provider) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	img, err := p.pull(ctx, ref, opts, "pull")
	if err != nil {
		return sandbox.ImageInfo{}, err
	}
	return imageInfo(img), nil
}

// ListImages implements sandbox.ImageManager: the store's images (the host
// image is not one).
func (p *provider) ListImages(context.Context) ([]sandbox.ImageInfo, error) {
	imgs, err := p.images.List()
	if err != nil {
		return nil, sandbox.WrapError("list_images", "cannot read the image store", err)
	}
	out := make([]sandbox.ImageInfo, len(imgs))
	for i, img := range imgs {
		out[i] = imageInfo(img)
	}
	return out, nil
}

// RemoveImage implements sandbox.ImageManager.
func (p *provider) RemoveImage(_ context.Context, name string) error {
	err := p.images.Remove(name)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, imagestore.ErrNotFound), errors.Is(err, imagestore.ErrInvalidName):
		return &sandbox.ImageNotFoundError{Name: name}
	case errors.Is(err, imagestore.ErrInUse):
		return sandbox.Errorf("remove_image", "image %s is used by a live session: destroy the sessions of it first (%v)", name, err)
	}
	return sandbox.WrapError("remove_image", "cannot remove image "+name, err)
}

// imageInfo is img as the contract shows it.
func imageInfo(img imagestore.Image) sandbox.ImageInfo {
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

// testedImage is img as a test has its sessions see it (more layers, a
// config the store does not keep yet); img itself in production.
func (p *provider) testedImage(img imagestore.Image) imagestore.Image {
	if p.testImage != nil {
		return p.testImage(img)
	}
	return img
}

// pullGroup shares one pull per reference among a provider's creates.
type pullGroup = singleflight.Group

// PruneImages implements sandbox.ImageManager: the store removes the layers
// no image version (named, or still held by a session) and no pull under
// way uses.
func (p *provider) PruneImages(ctx context.Context) (sandbox.PruneResult, error) {
	pr, ok := any(p.images).(storePruner)
	if !ok {
		return sandbox.PruneResult{}, sandbox.Errorf("prune_images", "the image store %s keeps no layers apart from its images, so there is nothing to prune: removing an image removes its files", p.images.Dir())
	}
	layers, bytes, err := pr.Prune(ctx)
	if err != nil {
		return sandbox.PruneResult{}, sandbox.WrapError("prune_images", "cannot prune the image store", err)
	}
	return sandbox.PruneResult{Layers: layers, Bytes: bytes}, nil
}

// storePruner is the layered store's Prune.
type storePruner interface {
	Prune(ctx context.Context) (layers int, bytes int64, err error)
}
