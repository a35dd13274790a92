package imagestore

import (
	"context"
	"fmt"
	"runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/tai42/sandbox"
)

// PullOptions are the options of a Pull.
type PullOptions struct {
	// Platform chooses from a multi-platform index, "os/arch[/variant]";
	// "" is linux/GOARCH.
	Platform string
	// Progress, when set, is told of the pull's events.
	Progress func(sandbox.PullProgress)
}

// Pull fetches ref from its registry and adds it to the store under its
// canonical name, credentials from the docker config ($DOCKER_CONFIG,
// ~/.docker/config.json).
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (Image, error) {
	canon, err := CanonicalName(ref)
	if err != nil {
		return Image{}, err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return Image{}, fmt.Errorf("%w %q: %w", ErrInvalidName, ref, err)
	}
	plat := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if opts.Platform != "" {
		p, err := v1.ParsePlatform(opts.Platform)
		if err != nil {
			return Image{}, fmt.Errorf("platform %q: %w", opts.Platform, err)
		}
		plat = *p
	}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithPlatform(plat), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return Image{}, fmt.Errorf("pulling %s: %w", ref, err)
	}
	st, err := s.newStage()
	if err != nil {
		return Image{}, err
	}
	defer st.abort()
	return s.addImage(ctx, st, addRequest{Name: canon, Image: img, Label: ref})
}
