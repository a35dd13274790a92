package imagestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/tai42/sandbox"
)

// PullOptions are the options of a Pull.
type PullOptions struct {
	// Platform chooses from a multi-platform index, "os/arch[/variant]"
	// or "arch" (linux/arch); "" is linux/GOARCH. An image for another
	// architecture is pulled only when asked for here: the store keeps it,
	// and the provider refuses to run it.
	Platform string
	// Progress, when set, is told of the pull's events, one call at a
	// time, in order, never after Pull returns.
	Progress func(sandbox.PullProgress)
	// Registry is how registries are reached.
	Registry RegistryOptions
}

// RegistryOptions say how registries are reached: the daemon's settings,
// the same for every pull.
type RegistryOptions struct {
	// Mirrors are Docker Hub's mirrors, "host[:port]" or an http(s) URL,
	// tried in order before Docker Hub itself. An http:// mirror is reached
	// over plain HTTP.
	Mirrors []string
	// Insecure are the registries ("host[:port]", or "host" for any of its
	// ports) reached over plain HTTP, or over TLS without verifying the
	// certificate; never any by default, loopback included.
	Insecure []string
	// Keychain finds credentials; nil is the docker config's
	// ($DOCKER_CONFIG, ~/.docker/config.json: auths, credHelpers and
	// credsStore).
	Keychain authn.Keychain
	// StallTimeout ends a pull when a registry sends nothing for this
	// long; 0 is DefaultStallTimeout.
	StallTimeout time.Duration
	// Registries, when set, are the only registries ("host[:port]", or
	// "host" for any of its ports; docker.io for Docker Hub) a pull may
	// reach; the mirrors and the Insecure registries count as listed.
	// Empty is any registry. Either way a host the operator did not name
	// here, in Insecure or in Mirrors is not reached at a loopback,
	// link-local or unspecified address (see ErrRegistryNotAllowed).
	Registries []string
	// Transport carries the requests; nil is a clone of
	// http.DefaultTransport. An *http.Transport is cloned, without
	// certificate checks, for the Insecure hosts; another RoundTripper
	// carries those too, as it is.
	Transport http.RoundTripper
}

// DefaultStallTimeout is how long a registry may send nothing before a
// pull gives up on it.
const DefaultStallTimeout = 60 * time.Second

// PullStats is what a Pull fetched.
type PullStats struct {
	Bytes    int64         // bytes of layers fetched from the registry
	Fetched  int           // layers fetched
	Existing int           // layers the store had already
	Duration time.Duration // from the first request to the image committed
}

// Pull fetches ref from its registry and adds it to the store under its
// canonical name (see CanonicalName; a digest reference is kept as
// REPO@DIGEST).
//
// A multi-platform index gives the image of opts.Platform, or of this
// machine. Credentials come from opts.Registry.Keychain (the docker
// config by default); a Docker Hub reference is asked of each mirror in
// turn, then of Docker Hub, and the image comes whole from the first that
// has it. A registry that sends nothing for StallTimeout ends the pull.
//
// Pulls of one reference and platform in a process share one pull: a
// caller that joins it is told of its events from the point it joined
// (the events before, but the bytes fetched, are told again first), and
// gets its result. A caller whose ctx ends returns ctx's error at once;
// the pull itself ends when no caller waits for it any more, and leaves
// nothing behind.
//
// Errors are *PullError, classified by Reason, matching ErrInvalidName,
// ErrNoPlatform, ErrUnauthorized, ErrStalled, ErrInvalidImage,
// ErrTooLarge (see MaxLayers), ErrRegistryNotAllowed or ErrUnreachable
// where they apply; a cancelled pull returns ctx's error. A registry that
// cannot be reached, or answers as no registry does, gets one text
// whatever the cause (see ErrUnreachable). Nothing of a failed
// pull is kept but the layers the store committed (which a retry does not
// fetch again).
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (Image, PullStats, error) {
	r, canon, err := parseName(ref)
	if err != nil {
		return Image{}, PullStats{}, pullError(ref, err)
	}
	plat, err := parsePlatform(opts.Platform)
	if err != nil {
		return Image{}, PullStats{}, pullError(ref, err)
	}
	key := flightKey{store: s.dir, name: canon, platform: platformString(plat)}
	f, leader := joinFlight(ctx, key)
	if leader {
		go func() {
			img, st, err := s.pull(f.ctx, f, r, ref, canon, plat, opts.Registry)
			f.finish(key, img, st, err)
		}()
	}
	unsubscribe := f.subscribe(ref, opts.Progress)
	defer unsubscribe()
	select {
	case <-f.done:
		var pe *PullError
		if errors.As(f.err, &pe) && pe.Ref != ref {
			pe = &PullError{Ref: ref, Reason: pe.Reason, Err: pe.Err}
			return f.img, f.stats, pe
		}
		return f.img, f.stats, f.err
	case <-ctx.Done():
		unsubscribe()
		if f.leave(key) {
			<-f.done // the pull cleans up before its last caller returns
		}
		return Image{}, PullStats{}, fmt.Errorf("pulling %s: %w", ref, context.Cause(ctx))
	}
}

// pull is the one pull of a flight.
func (s *Store) pull(ctx context.Context, f *flight, ref name.Reference, label, canon string, plat v1.Platform, ro RegistryOptions) (Image, PullStats, error) {
	start := time.Now()
	fail := func(err error) (Image, PullStats, error) {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
			return Image{}, PullStats{}, fmt.Errorf("pulling %s: %w", label, err)
		}
		return Image{}, PullStats{}, pullError(label, err)
	}
	reg, err := newRegistry(ro)
	if err != nil {
		return Image{}, PullStats{}, &PullError{Ref: label, Reason: sandbox.PullUnreachable, Err: err}
	}
	defer reg.close()
	prog := &progress{emit: f.emit}
	w := &watch{stall: cmp.Or(ro.StallTimeout, DefaultStallTimeout), onBlob: prog.fetched}
	rem := remoteOptions{ctx: ctx, rt: reg.transport(w), keychain: ro.Keychain}
	if rem.keychain == nil {
		rem.keychain = authn.DefaultKeychain
	}
	at, desc, err := rem.resolve(ref, reg)
	if err != nil {
		return fail(err)
	}
	host := at.Context().RegistryStr()
	img, err := imageFor(desc, plat)
	if err != nil {
		return fail(reg.uniform(host, err))
	}
	if err := prog.setLayers(img); err != nil {
		return fail(reg.uniform(host, fmt.Errorf("%w: %w", ErrInvalidImage, err)))
	}
	f.emit(sandbox.PullProgress{Status: sandbox.PullResolved, Digest: desc.Digest.String()})
	st, err := s.newStage()
	if err != nil {
		return fail(err)
	}
	defer st.abort()
	stored, err := s.addImage(ctx, st, addRequest{
		Name:     canon,
		Image:    img,
		Label:    label,
		Digest:   desc.Digest.String(),
		Fetch:    fetchCompressed,
		Events:   prog.event,
		Platform: plat,
	})
	if err != nil {
		return fail(reg.uniform(host, rem.refused(at, err)))
	}
	stats := prog.finish()
	f.emit(sandbox.PullProgress{Status: sandbox.PullComplete, Digest: desc.Digest.String()})
	stats.Duration = time.Since(start)
	return stored, stats, nil
}

// remoteOptions are what go-containerregistry's remote needs of a pull.
type remoteOptions struct {
	ctx      context.Context
	rt       http.RoundTripper
	keychain authn.Keychain
}

func (o remoteOptions) options() []remote.Option {
	return []remote.Option{remote.WithContext(o.ctx), remote.WithTransport(o.rt), remote.WithAuthFromKeychain(o.keychain)}
}

// resolve gets ref's descriptor from the first of its endpoints that has
// it, and says which answered. Of a Docker Hub reference whose mirrors all
// failed, the error is Docker Hub's, the mirrors' said beside it.
func (o remoteOptions) resolve(ref name.Reference, reg *regConfig) (name.Reference, *remote.Descriptor, error) {
	eps, err := reg.endpoints(ref)
	if err != nil {
		return nil, nil, err
	}
	var tried []string
	for i, e := range eps {
		desc, err := remote.Get(e, o.options()...)
		if err == nil {
			err = checkManifestType(desc.MediaType)
		}
		if err == nil {
			return e, desc, nil
		}
		err = reg.uniform(e.Context().RegistryStr(), o.refused(e, err))
		if i == len(eps)-1 || o.ctx.Err() != nil {
			if len(tried) > 0 {
				err = fmt.Errorf("%w (the mirrors failed first: %s)", err, strings.Join(tried, "; "))
			}
			return nil, nil, err
		}
		tried = append(tried, fmt.Sprintf("%s: %v", e.Context().RegistryStr(), err))
	}
	panic("unreachable: a reference has at least one endpoint")
}

// refused makes a registry's refusal of access an error matching
// ErrUnauthorized that names the registry and says whether credentials
// were configured for it.
func (o remoteOptions) refused(at name.Reference, err error) error {
	if !isUnauthorized(err) {
		return err
	}
	auth, kerr := o.keychain.Resolve(at.Context())
	return &authError{
		registry:  at.Context().RegistryStr(),
		repo:      at.Context().RepositoryStr(),
		anonymous: kerr == nil && auth == authn.Anonymous,
		err:       err,
	}
}

// imageFor returns desc's image for want: an index's best match for
// it, or a single image whose config is for it; else an error matching
// ErrNoPlatform.
func imageFor(desc *remote.Descriptor, want v1.Platform) (v1.Image, error) {
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidImage, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("%w: the image index: %w", ErrInvalidImage, err)
		}
		d, err := pickPlatform(im, want)
		if err != nil {
			return nil, err
		}
		if err := checkManifestSize(d); err != nil {
			return nil, err
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		return img, checkManifest(img)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, err
	}
	if err := checkManifest(img); err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	have := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	if cfg.Architecture != "" && platformRank(want, have) == 0 {
		return nil, fmt.Errorf("%w %s: the image is for %s only", ErrNoPlatform, platformString(want), platformString(normPlatform(have)))
	}
	return img, nil
}

// progress turns a pull's bytes and the store's layer events into
// sandbox.PullProgress events, and counts them for PullStats.
type progress struct {
	emit func(sandbox.PullProgress)

	mu       sync.Mutex
	order    []string                  // layer digests, lowest first
	layers   map[string]*layerProgress // by digest
	diffIDs  map[string]string         // diff ID -> digest
	bytes    int64
	existing int
}

type layerProgress struct {
	total, done, shown int64
	shownAt            time.Time
	final              bool // exists or done told
}

// Fetching events of a layer are told every fetchingStep bytes or
// fetchingEvery, whichever comes first, and at its end.
const (
	fetchingStep  = 256 << 10
	fetchingEvery = 100 * time.Millisecond
)

func (p *progress) setLayers(img v1.Image) error {
	m, err := img.Manifest()
	if err != nil {
		return fmt.Errorf("the image manifest: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("the image config: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.layers, p.diffIDs = map[string]*layerProgress{}, map[string]string{}
	for i, l := range m.Layers {
		d := l.Digest.String()
		if p.layers[d] == nil {
			p.order = append(p.order, d)
			p.layers[d] = &layerProgress{total: l.Size}
		}
		if i < len(cfg.RootFS.DiffIDs) {
			p.diffIDs[cfg.RootFS.DiffIDs[i].String()] = d
		}
	}
	return nil
}

// fetched counts n more bytes of blob digest.
func (p *progress) fetched(digest string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.layers[digest]
	if l == nil {
		return // the config, or a manifest: not a layer
	}
	p.bytes += n
	l.done += n
	now := time.Now()
	if l.final || (l.done-l.shown < fetchingStep && now.Sub(l.shownAt) < fetchingEvery && l.done < l.total) {
		return
	}
	l.shown, l.shownAt = l.done, now
	p.emit(sandbox.PullProgress{Status: sandbox.PullLayerFetching, Layer: digest, Done: min(l.done, l.total), Total: l.total})
}

// event is addRequest.Events: the store has layer (a digest or a diff ID)
// already, or has unpacked it.
func (p *progress) event(layer v1.Hash, status string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := layer.String()
	if id, ok := p.diffIDs[d]; ok {
		d = id
	}
	l := p.layers[d]
	if l == nil || l.final {
		return
	}
	l.final = true
	st := sandbox.PullStatus(status)
	ev := sandbox.PullProgress{Status: st, Layer: d, Total: l.total}
	if st == sandbox.PullLayerExists {
		p.existing++
	} else {
		ev.Done = l.total
	}
	p.emit(ev)
}

// finish tells of each layer the store did not report as done (the image
// is committed: all of them are in the store) and returns the counts.
func (p *progress) finish() PullStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.order {
		if l := p.layers[d]; !l.final {
			l.final = true
			p.emit(sandbox.PullProgress{Status: sandbox.PullLayerDone, Layer: d, Done: l.total, Total: l.total})
		}
	}
	return PullStats{Bytes: p.bytes, Fetched: len(p.order) - p.existing, Existing: p.existing}
}

// flightKey identifies the pulls that share one.
type flightKey struct{ store, name, platform string }

// flights are the pulls in progress in this process. golang.org/x/sync's
// singleflight shares a call's result, but not its progress, and runs
// the call in its first caller's context: a pull here runs in its own,
// ended when no caller waits any more.
var flights = struct {
	mu sync.Mutex
	m  map[flightKey]*flight
}{m: map[flightKey]*flight{}}

// flight is one pull and the callers waiting for it.
type flight struct {
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	waiters int // under flights.mu

	// Set before done is closed.
	img   Image
	stats PullStats
	err   error

	mu   sync.Mutex
	subs []*subscriber
	log  []sandbox.PullProgress // the events but fetching, told again to a caller that joins
}

type subscriber struct {
	ref string
	fn  func(sandbox.PullProgress)
}

// joinFlight returns the flight of key, a new one (leader) if none is in
// progress; the new one's context keeps ctx's values, not its end.
func joinFlight(ctx context.Context, key flightKey) (f *flight, leader bool) {
	flights.mu.Lock()
	defer flights.mu.Unlock()
	if f := flights.m[key]; f != nil {
		f.waiters++
		return f, false
	}
	f = &flight{done: make(chan struct{}), waiters: 1}
	f.ctx, f.cancel = context.WithCancel(context.WithoutCancel(ctx))
	flights.m[key] = f
	return f, true
}

// leave is a caller giving up; the last one ends the pull, and is told
// so.
func (f *flight) leave(key flightKey) (last bool) {
	flights.mu.Lock()
	defer flights.mu.Unlock()
	f.waiters--
	if f.waiters > 0 {
		return false
	}
	if flights.m[key] == f {
		delete(flights.m, key)
	}
	f.cancel()
	return true
}

func (f *flight) finish(key flightKey, img Image, stats PullStats, err error) {
	flights.mu.Lock()
	if flights.m[key] == f {
		delete(flights.m, key)
	}
	flights.mu.Unlock()
	f.img, f.stats, f.err = img, stats, err
	f.cancel()
	close(f.done)
}

// subscribe tells fn of the flight's events, with Ref set to ref: those
// so far at once, then each as it happens, until the returned function is
// called.
func (f *flight) subscribe(ref string, fn func(sandbox.PullProgress)) func() {
	if fn == nil {
		return func() {}
	}
	s := &subscriber{ref: ref, fn: fn}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ev := range f.log {
		ev.Ref = ref
		fn(ev)
	}
	f.subs = append(f.subs, s)
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, x := range f.subs {
			if x == s {
				f.subs = append(f.subs[:i:i], f.subs[i+1:]...)
				return
			}
		}
	}
}

// emit tells every subscriber of ev, one call at a time.
func (f *flight) emit(ev sandbox.PullProgress) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev.Status != sandbox.PullLayerFetching {
		f.log = append(f.log, ev)
	}
	for _, s := range f.subs {
		ev.Ref = s.ref
		s.fn(ev)
	}
}
