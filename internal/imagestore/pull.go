package imagestore

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"time"

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
	// Registry is how registries are reached.
	Registry RegistryOptions
}

// RegistryOptions say how registries are reached: the daemon's settings,
// the same for every pull.
type RegistryOptions struct {
	// Mirrors are Docker Hub's mirrors, "host[:port]" or an http(s) URL,
	// tried in order before Docker Hub itself.
	Mirrors []string
	// Insecure are the registries ("host[:port]") reached over plain HTTP,
	// or over TLS without verifying the certificate; never any by default.
	Insecure []string
	// Keychain finds credentials; nil is the docker config's
	// ($DOCKER_CONFIG, ~/.docker/config.json: auths and credential
	// helpers).
	Keychain authn.Keychain
	// StallTimeout ends a pull when a registry sends nothing for this
	// long; 0 is DefaultStallTimeout.
	StallTimeout time.Duration
	// Transport carries the requests; nil is a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
}

// DefaultStallTimeout is how long a registry may send nothing before a
// pull gives up on it.
const DefaultStallTimeout = 60 * time.Second

// PullStats is what a Pull fetched.
type PullStats struct {
	Bytes    int64         // bytes fetched from the registry
	Fetched  int           // layers fetched
	Existing int           // layers the store had already
	Duration time.Duration // from the first request to the image committed
}

// Pull fetches ref from its registry and adds it to the store under its
// canonical name, credentials from the docker config ($DOCKER_CONFIG,
// ~/.docker/config.json).
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (Image, PullStats, error) {
	start := time.Now()
	img, err := s.pull(ctx, ref, opts)
	return img, PullStats{Duration: time.Since(start)}, err
}

func (s *Store) pull(ctx context.Context, ref string, opts PullOptions) (Image, error) {
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
