package imagestore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ErrStalled is matched (errors.Is) by a Pull's error when a registry sent
// nothing for RegistryOptions.StallTimeout; the error names the registry
// and what it was sending.
var ErrStalled = errors.New("registry stalled")

// ErrUnauthorized is matched (errors.Is) by a Pull's error when a
// registry refused the credentials, or asked for some and none are
// configured; the error names the registry, never a credential.
var ErrUnauthorized = errors.New("registry refused access")

// ErrNoPlatform is matched (errors.Is) by a Pull's error when the image
// has no manifest for the platform asked; the error lists those it has.
var ErrNoPlatform = errors.New("no image for the platform")

// regConfig is how one pull reaches registries: RegistryOptions made into
// a transport.
type regConfig struct {
	opts     RegistryOptions
	insecure []string // hosts reached over plain HTTP or unverified TLS
	mirrors  []string // Docker Hub's mirrors, host[:port]
	names    []string // the hosts the operator named (see named)
	// closers are the transports this pull made: their idle connections
	// are closed when it ends.
	closers []*http.Transport
}

// newRegistry checks opts and builds what a pull needs of it. An http://
// mirror is reached over plain HTTP: its scheme says so as explicitly as
// --insecure-registry does (as dockerd takes it).
func newRegistry(opts RegistryOptions) (*regConfig, error) {
	r := &regConfig{opts: opts, insecure: slices.Clone(opts.Insecure)}
	for _, m := range opts.Mirrors {
		host, plain, err := parseMirror(m)
		if err != nil {
			return nil, err
		}
		r.mirrors = append(r.mirrors, host)
		if plain {
			r.insecure = append(r.insecure, host)
		}
	}
	r.names = listNames(opts, r.mirrors)
	return r, nil
}

// parseMirror returns the host[:port] of a mirror given as host[:port] or
// an http(s) URL, and whether it is plain HTTP.
func parseMirror(m string) (host string, plain bool, err error) {
	s := m
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || strings.Trim(u.Path, "/") != "" || u.User != nil || u.RawQuery != "" {
		return "", false, fmt.Errorf("registry mirror %q: want host[:port] or http(s)://host[:port] (no path)", m)
	}
	return u.Host, u.Scheme == "http", nil
}

// isInsecure reports whether host ("host[:port]", as in a URL) is one the
// operator allowed plain HTTP or unverified TLS for: listed as it is, or
// its host name listed without a port.
func (r *regConfig) isInsecure(host string) bool {
	hn := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		hn = h
	}
	return slices.Contains(r.insecure, host) || slices.Contains(r.insecure, hn)
}

// endpoints returns the references to ask in order for ref: for a Docker
// Hub reference each mirror, then Docker Hub itself (as dockerd does);
// for another registry ref itself.
func (r *regConfig) endpoints(ref name.Reference) ([]name.Reference, error) {
	regs := []string{ref.Context().RegistryStr()}
	if err := r.allow(regs[0]); err != nil {
		return nil, err
	}
	if regs[0] == dockerHub {
		regs = append(slices.Clone(r.mirrors), dockerHub)
	}
	var out []name.Reference
	for _, reg := range regs {
		var opts []name.Option
		if r.isInsecure(reg) {
			opts = append(opts, name.Insecure)
		}
		s := reg + "/" + ref.Context().RepositoryStr()
		var e name.Reference
		var err error
		if d, ok := ref.(name.Digest); ok {
			e, err = name.NewDigest(s+"@"+d.DigestStr(), opts...)
		} else {
			e, err = name.NewTag(s+":"+ref.Identifier(), opts...)
		}
		if err != nil {
			return nil, fmt.Errorf("%w %q: registry %s: %w", ErrInvalidName, ref, reg, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// transport returns the transport of a pull: requests go through
// opts.Transport (or a clone of http.DefaultTransport), with unverified
// TLS and plain HTTP for the insecure hosts only, kept off the addresses
// the operator did not allow (see guard), each one watched for stalls
// (see watch).
func (r *regConfig) transport(w *watch) http.RoundTripper {
	w.next = r.route(true)
	return w
}

// route is the transport of regConfig's requests but the stall watch;
// guarded, its connections are checked by a guard.
func (r *regConfig) route(guarded bool) *route {
	base := r.opts.Transport
	own := base == nil
	if own {
		base = http.DefaultTransport
	}
	rt := &route{r: r, secure: base}
	t, ok := base.(*http.Transport)
	if !ok {
		if guarded {
			rt.precheck = &guard{r: r}
		}
		return rt
	}
	c := t.Clone()
	if guarded {
		g := &guard{r: r}
		g.install(c, own)
		rt.proxied = g
	}
	r.closers = append(r.closers, c)
	rt.secure = c
	if len(r.insecure) > 0 {
		skip := c.Clone()
		skip.TLSClientConfig = skip.TLSClientConfig.Clone()
		if skip.TLSClientConfig == nil {
			skip.TLSClientConfig = &tls.Config{}
		}
		skip.TLSClientConfig.InsecureSkipVerify = true // only for the hosts the operator listed (route)
		r.closers = append(r.closers, skip)
		rt.skipVerify = skip
	}
	return rt
}

// Transport is a transport that reaches registries as a pull does: over
// verified HTTPS, plain HTTP and unverified TLS for opts.Insecure alone,
// an untrusted certificate an error saying what to do; for requests of
// the caller's own (a push). insecure says whether a host (a reference's
// registry) is one of opts' insecure ones, to parse its references with
// name.Insecure; done releases the transport's idle connections.
func Transport(opts RegistryOptions) (rt http.RoundTripper, insecure func(host string) bool, done func(), err error) {
	r, err := newRegistry(opts)
	if err != nil {
		return nil, nil, nil, err
	}
	// A push goes where the operator's own command says: not guarded.
	return r.route(false), r.isInsecure, r.close, nil
}

// close releases the connections the pull's transports keep.
func (r *regConfig) close() {
	for _, t := range r.closers {
		t.CloseIdleConnections()
	}
}

// route sends a request to an insecure host through the transport that
// does not verify certificates, refuses plain HTTP to any other host
// (go-containerregistry would fall back to it for loopback and private
// addresses), and turns an untrusted certificate into an error saying
// what to do.
type route struct {
	r          *regConfig
	secure     http.RoundTripper
	skipVerify http.RoundTripper
	precheck   *guard // for a transport whose connections no guard sees
	proxied    *guard // checks the requests that go through a proxy
}

func (t *route) RoundTrip(req *http.Request) (*http.Response, error) {
	host := req.URL.Host
	g := t.precheck
	viaProxy := t.proxied != nil && t.proxied.proxied(req)
	if viaProxy {
		g = t.proxied
	}
	if g != nil {
		if err := g.precheck(req.Context(), host); err != nil {
			return nil, err
		}
	}
	insecure := t.r.isInsecure(host)
	if req.URL.Scheme == "http" && !insecure {
		return nil, &routeError{msg: fmt.Sprintf("registry %s is not reached over plain HTTP unless the operator allows it: add --insecure-registry %s", host, host)}
	}
	next := t.secure
	if insecure && t.skipVerify != nil {
		next = t.skipVerify
	}
	resp, err := next.RoundTrip(req)
	switch {
	case err != nil && !insecure && isCertError(err):
		return nil, &routeError{msg: fmt.Sprintf("the TLS certificate of registry %s is not trusted (%v): if it is self-signed and you trust the registry, add --insecure-registry %s", host, err, host), err: err}
	case err != nil && viaProxy && !errors.As(err, new(net.Error)):
		// A proxy refusing the connection (its CONNECT answered 502) is
		// an untyped error: it is the network failing all the same.
		return nil, &net.OpError{Op: "proxy", Net: "tcp", Err: err}
	}
	return resp, err
}

// routeError is route refusing a request the operator did not allow.
type routeError struct {
	msg string
	err error
}

func (e *routeError) Error() string { return e.msg }
func (e *routeError) Unwrap() error { return e.err }

func isCertError(err error) bool {
	var ve *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &ve) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci)
}

// watch is the outermost transport of a pull: it ends a request whose
// registry sends nothing (no response, no byte of its body) for stall,
// and counts the bytes of each blob as they arrive.
type watch struct {
	next  http.RoundTripper
	stall time.Duration
	// onBlob is told of n more bytes of blob digest; called from the
	// goroutines reading the bodies.
	onBlob func(digest string, n int64)
}

func (w *watch) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	var stalled atomic.Bool
	timer := time.AfterFunc(w.stall, func() {
		stalled.Store(true)
		cancel()
	})
	what, blob := describe(req)
	stallErr := func() error {
		return &stallError{host: req.URL.Host, what: what, after: w.stall}
	}
	resp, err := w.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		cancel()
		if stalled.Load() {
			return nil, stallErr()
		}
		return nil, err
	}
	if strings.HasPrefix(what, "manifest ") && resp.StatusCode == http.StatusOK {
		body, err := limitManifest(resp.Body, resp.ContentLength)
		if err != nil {
			timer.Stop()
			cancel()
			return nil, err
		}
		resp.Body = body
	}
	resp.Body = &watchedBody{body: resp.Body, timer: timer, stall: w.stall, cancel: cancel, stalled: &stalled, stallErr: stallErr, count: func(n int64) {
		if blob != "" && w.onBlob != nil {
			w.onBlob(blob, n)
		}
	}}
	return resp, nil
}

// describe names what req asks for ("blob sha256:...", "manifest
// 1.36"), and the blob's digest when it is one; a redirected request is
// named by the registry request it follows.
func describe(req *http.Request) (what, blob string) {
	for r := req; r != nil; {
		parts := strings.Split(r.URL.Path, "/")
		if len(parts) >= 4 && parts[1] == "v2" {
			kind, id := parts[len(parts)-2], parts[len(parts)-1]
			switch kind {
			case "blobs":
				return "blob " + id, id
			case "manifests":
				return "manifest " + id, ""
			}
		}
		if r.Response == nil {
			break
		}
		r = r.Response.Request
	}
	return req.URL.Path, ""
}

type watchedBody struct {
	body     io.ReadCloser
	timer    *time.Timer
	stall    time.Duration
	cancel   context.CancelFunc
	stalled  *atomic.Bool
	stallErr func() error
	count    func(int64)
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if n > 0 {
		b.timer.Reset(b.stall)
		b.count(int64(n))
	}
	if err != nil && b.stalled.Load() {
		return n, b.stallErr()
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.timer.Stop()
	b.cancel()
	return b.body.Close()
}

type stallError struct {
	host, what string
	after      time.Duration
}

func (e *stallError) Error() string {
	return fmt.Sprintf("registry %s sent nothing for %s while sending %s", e.host, e.after, e.what)
}
func (e *stallError) Is(t error) bool { return t == ErrStalled }

// parsePlatform parses "os/arch[/variant]", or "arch" for linux/arch; ""
// is this machine's, linux/GOARCH.
func parsePlatform(s string) (v1.Platform, error) {
	if s == "" {
		return normPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}), nil
	}
	if !strings.Contains(s, "/") {
		s = "linux/" + s
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" || strings.Count(s, "/") > 2 || strings.Contains(s, ":") {
		return v1.Platform{}, fmt.Errorf("%w: platform %q: want os/arch[/variant], e.g. linux/arm64 or linux/arm/v7", ErrInvalidName, s)
	}
	return normPlatform(*p), nil
}

// normPlatform spells p the way containerd (and so docker) compares
// platforms: architecture aliases resolved, the default variant of arm
// (v7), arm64 (v8) and amd64 (v1) made explicit.
func normPlatform(p v1.Platform) v1.Platform {
	p.OS = strings.ToLower(p.OS)
	p.Architecture = strings.ToLower(p.Architecture)
	p.Variant = strings.ToLower(p.Variant)
	switch p.Architecture {
	case "aarch64":
		p.Architecture = "arm64"
	case "x86_64", "x86-64":
		p.Architecture = "amd64"
	case "armhf":
		p.Architecture, p.Variant = "arm", "v7"
	case "armel":
		p.Architecture, p.Variant = "arm", "v6"
	}
	if p.Variant == "" {
		p.Variant = map[string]string{"arm": "v7", "arm64": "v8", "amd64": "v1"}[p.Architecture]
	}
	return v1.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}
}

// platformString is "os/arch[/variant]", the variant left out when it is
// the architecture's default.
func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" && p.Variant != normPlatform(v1.Platform{OS: p.OS, Architecture: p.Architecture}).Variant {
		s += "/" + p.Variant
	}
	return s
}

// platformRank says how well have serves want, as containerd's
// platforms.Only does: 0 not at all; otherwise higher is better. An
// arm/vN (or amd64/vN) machine runs vN and the older variants, preferring
// the newest.
func platformRank(want, have v1.Platform) int {
	want, have = normPlatform(want), normPlatform(have)
	if want.OS != have.OS || want.Architecture != have.Architecture {
		return 0
	}
	if want.Variant == have.Variant {
		return 100
	}
	wv, wok := variantLevel(want.Variant)
	hv, hok := variantLevel(have.Variant)
	if want.Architecture != "arm" && want.Architecture != "amd64" || !wok || !hok || hv > wv {
		return 0
	}
	return 1 + hv
}

func variantLevel(v string) (int, bool) {
	var n int
	if _, err := fmt.Sscanf(v, "v%d", &n); err != nil || fmt.Sprintf("v%d", n) != v {
		return 0, false
	}
	return n, true
}

// pickPlatform returns the descriptor of idx's best image for want, or an
// error matching ErrNoPlatform listing the platforms it has.
func pickPlatform(im *v1.IndexManifest, want v1.Platform) (v1.Descriptor, error) {
	best, rank := -1, 0
	var have []string
	for i, d := range im.Manifests {
		if d.Platform == nil || !d.MediaType.IsImage() || d.Platform.OS == "unknown" {
			continue // attestations and the like are not images to run
		}
		have = append(have, platformString(normPlatform(*d.Platform)))
		if r := platformRank(want, *d.Platform); r > rank {
			best, rank = i, r
		}
	}
	if best < 0 {
		list := "none"
		if len(have) > 0 {
			list = strings.Join(have, ", ")
		}
		return v1.Descriptor{}, fmt.Errorf("%w %s: the image's index has %s (choose one with --platform)", ErrNoPlatform, platformString(want), list)
	}
	return im.Manifests[best], nil
}
