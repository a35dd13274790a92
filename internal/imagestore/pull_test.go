package imagestore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/tai42/sandbox"
)

// testRegistry is go-containerregistry's in-process registry on
// 127.0.0.1, served through wrap (fault injection, auth); images are
// pushed to it around wrap.
type testRegistry struct {
	host     string // host:port of the wrapped server
	pushHost string
	srv      *httptest.Server
}

func newTestRegistry(t *testing.T, tls bool, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	push := httptest.NewServer(reg)
	t.Cleanup(push.Close)
	h := reg
	if wrap != nil {
		h = wrap(reg)
	}
	var srv *httptest.Server
	if tls {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return &testRegistry{host: srv.Listener.Addr().String(), pushHost: push.Listener.Addr().String(), srv: srv}
}

func (r *testRegistry) push(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.pushHost+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return d.String()
}

func (r *testRegistry) pushIndex(t *testing.T, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref, err := name.ParseReference(r.pushHost+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	return d.String()
}

// dials records the hosts a test's transport refused: every one but
// 127.0.0.1 and names under .invalid (which resolve to nothing), so that
// no test ever contacts Docker Hub or another real registry.
type dials struct {
	mu      sync.Mutex
	refused []string
}

func (d *dials) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.refused)
}

func testTransport(t *testing.T) (*http.Transport, *dials) {
	d := &dials{}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			if host == "127.0.0.1" || strings.HasSuffix(host, ".invalid") {
				return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
			}
			d.mu.Lock()
			d.refused = append(d.refused, addr)
			d.mu.Unlock()
			// As a real dial failure is: a *net.OpError.
			return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("test transport: refusing to dial %s", addr)}
		},
		ForceAttemptHTTP2: false,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr, d
}

// pullOpts are options reaching hosts over plain HTTP through the test
// transport, with an empty docker config (no credentials).
func pullOpts(t *testing.T, insecure ...string) (PullOptions, *dials) {
	tr, d := testTransport(t)
	return PullOptions{Registry: RegistryOptions{Insecure: insecure, Transport: tr, StallTimeout: 10 * time.Second}}, d
}

// emptyDockerConfig points $DOCKER_CONFIG at a directory with config,
// and $HOME away from the user's.
func dockerConfig(t *testing.T, config any) {
	dir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", dir)
	t.Setenv("HOME", dir)
	b, err := json.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// events records a Progress callback's events, failing the test on two
// calls at once or a call after Pull returned.
type events struct {
	t        *testing.T
	mu       sync.Mutex
	evs      []sandbox.PullProgress
	inCall   atomic.Int32
	returned atomic.Bool
}

func (e *events) fn(p sandbox.PullProgress) {
	if e.inCall.Add(1) != 1 {
		e.t.Error("two Progress calls at once")
	}
	defer e.inCall.Add(-1)
	if e.returned.Load() {
		e.t.Errorf("Progress called after Pull returned: %+v", p)
	}
	time.Sleep(time.Millisecond) // widen the window two concurrent calls would overlap in
	e.mu.Lock()
	e.evs = append(e.evs, p)
	e.mu.Unlock()
}

func (e *events) all() []sandbox.PullProgress {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.evs)
}

// checkEvents checks an event stream of a pull of img resolved to digest:
// resolved first, complete last, each layer's fetching events growing and
// then done (or exists).
func checkEvents(t *testing.T, evs []sandbox.PullProgress, ref, digest string, img v1.Image) {
	t.Helper()
	if len(evs) < 2 || evs[0].Status != sandbox.PullResolved || evs[0].Digest != digest ||
		evs[len(evs)-1].Status != sandbox.PullComplete || evs[len(evs)-1].Digest != digest {
		t.Fatalf("events %+v: want resolved %s first and complete last", evs, digest)
	}
	m, _ := img.Manifest()
	for _, l := range m.Layers {
		var last int64
		ended := false
		for _, ev := range evs {
			if ev.Ref != ref {
				t.Errorf("event %+v: Ref want %q", ev, ref)
			}
			if ev.Layer != l.Digest.String() {
				continue
			}
			if ended {
				t.Errorf("event %+v after the layer ended", ev)
			}
			if ev.Total != l.Size {
				t.Errorf("event %+v: Total want %d", ev, l.Size)
			}
			switch ev.Status {
			case sandbox.PullLayerFetching:
				if ev.Done < last || ev.Done > l.Size {
					t.Errorf("fetching %d after %d of %d", ev.Done, last, l.Size)
				}
				last = ev.Done
			case sandbox.PullLayerDone, sandbox.PullLayerExists:
				ended = true
			default:
				t.Errorf("event %+v", ev)
			}
		}
		if !ended {
			t.Errorf("layer %s: no done or exists event in %+v", l.Digest, evs)
		}
	}
}

// bigLayer is a layer tar of n bytes of incompressible content.
func bigLayer(t *testing.T, path string, n int) []byte {
	data := make([]byte, n)
	_, _ = rand32(data)
	return mkTar(t, tent{name: path, data: string(data)})
}

// rand32 fills b with a xorshift stream (deterministic, incompressible).
func rand32(b []byte) (int, error) { return randSeed(b, 2463534242) }

func randSeed(b []byte, x uint32) (int, error) {
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return len(b), nil
}

func mustPull(t *testing.T, s *Store, ref string, opts PullOptions) (Image, PullStats) {
	t.Helper()
	img, st, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatalf("Pull(%s): %v", ref, err)
	}
	return img, st
}

// pullErr pulls ref, wants a *PullError of reason matching target, and
// checks that nothing partial is left in the store.
func pullErr(t *testing.T, s *Store, ref string, opts PullOptions, reason sandbox.PullReason, target error) *PullError {
	t.Helper()
	_, _, err := s.Pull(context.Background(), ref, opts)
	var pe *PullError
	if !errors.As(err, &pe) {
		t.Fatalf("Pull(%s) = %v, want a *PullError", ref, err)
	}
	if pe.Reason != reason || (target != nil && !errors.Is(err, target)) {
		t.Errorf("Pull(%s): %v (reason %s), want reason %s matching %v", ref, err, pe.Reason, reason, target)
	}
	if !strings.Contains(err.Error(), ref) {
		t.Errorf("error %q does not name the reference %s", err, ref)
	}
	assertClean(t, s)
	return pe
}

func TestPullByTagAndDigest(t *testing.T) {
	s := openStore(t)
	r := newTestRegistry(t, false, nil)
	img := mkImage(t, []string{"WHO=pulled"}, bigLayer(t, "big", 3<<20), mkTar(t, tent{name: "small", data: "s"}))
	digest := r.push(t, "team/tool:1", img)
	opts, d := pullOpts(t, r.host)
	ev := &events{t: t}
	opts.Progress = ev.fn

	ref := r.host + "/team/tool:1"
	got, st := mustPull(t, s, ref, opts)
	ev.returned.Store(true)
	id, _ := img.ConfigName()
	if got.Name != ref || got.ID != id.String() || !slices.Equal(got.Env, []string{"WHO=pulled"}) {
		t.Errorf("pulled %+v", got)
	}
	if b, err := os.ReadFile(filepath.Join(got.Layers[len(got.Layers)-1], "small")); err != nil || string(b) != "s" {
		t.Errorf("small: %q %v", b, err)
	}
	m, _ := img.Manifest()
	var size int64
	for _, l := range m.Layers {
		size += l.Size
	}
	if st.Bytes != size || st.Fetched != 2 || st.Existing != 0 || st.Duration <= 0 {
		t.Errorf("stats %+v, want %d bytes of 2 layers fetched", st, size)
	}
	evs := ev.all()
	checkEvents(t, evs, ref, digest, img)
	fetching := 0
	for _, e := range evs {
		if e.Status == sandbox.PullLayerFetching {
			fetching++
		}
	}
	// 3 MiB in steps of at most 256 KiB: at least 12 events, and not one
	// per read.
	if fetching < 12 || fetching > 200 {
		t.Errorf("%d fetching events for %d bytes", fetching, size)
	}

	byDigest := r.host + "/team/tool@" + digest
	got2, _ := mustPull(t, s, byDigest, PullOptions{Registry: opts.Registry})
	if got2.Name != byDigest || got2.ID != got.ID {
		t.Errorf("by digest: %+v", got2)
	}
	// A tag beside a digest is the digest's image.
	got3, _ := mustPull(t, s, r.host+"/team/tool:other@"+digest, PullOptions{Registry: opts.Registry})
	if got3.Name != byDigest {
		t.Errorf("tag@digest: %+v", got3)
	}
	if list := d.list(); len(list) != 0 {
		t.Errorf("dialed %v", list)
	}
	assertClean(t, s)
}

func TestPullPlatforms(t *testing.T) {
	s := openStore(t)
	r := newTestRegistry(t, false, nil)
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	mine := mkImage(t, []string{"ARCH=mine"}, mkTar(t, tent{name: "arch", data: "mine"}))
	cf, _ := mine.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = other
	cf.Config.Env = []string{"ARCH=other"}
	foreign, err := mutate.ConfigFile(mine, cf)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: other}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	idxDigest := r.pushIndex(t, "multi:1", idx)
	opts, _ := pullOpts(t, r.host)
	ev := &events{t: t}
	opts.Progress = ev.fn

	got, _ := mustPull(t, s, r.host+"/multi:1", opts)
	if !slices.Equal(got.Env, []string{"ARCH=mine"}) {
		t.Errorf("pulled %+v, want this machine's image", got)
	}
	if evs := ev.all(); evs[0].Digest != idxDigest {
		t.Errorf("resolved %+v, want the index's digest %s", evs[0], idxDigest)
	}

	// Asked for explicitly, another architecture's image is pulled and
	// kept (the provider refuses to run it).
	got, _ = mustPull(t, s, r.host+"/multi:1", PullOptions{Platform: other, Registry: opts.Registry})
	fid, _ := foreign.ConfigName()
	if got.ID != fid.String() || !slices.Equal(got.Env, []string{"ARCH=other"}) {
		t.Errorf("--platform %s pulled %+v", other, got)
	}

	pe := pullErr(t, s, r.host+"/multi:1", PullOptions{Platform: "linux/s390x", Registry: opts.Registry}, sandbox.PullNoPlatform, ErrNoPlatform)
	for _, want := range []string{"linux/s390x", "linux/amd64", "linux/arm64"} {
		if !strings.Contains(pe.Error(), want) {
			t.Errorf("error %q lacks %q", pe, want)
		}
	}
	// A single image for another architecture, not asked for.
	r.push(t, "foreign:1", foreign)
	pe = pullErr(t, s, r.host+"/foreign:1", PullOptions{Registry: opts.Registry}, sandbox.PullNoPlatform, ErrNoPlatform)
	if !strings.Contains(pe.Error(), "linux/"+other) {
		t.Errorf("error %q", pe)
	}
	_ = pullErr(t, s, r.host+"/multi:1", PullOptions{Platform: "linux/arm/v7/x", Registry: opts.Registry}, sandbox.PullInvalidReference, ErrInvalidName)
}

func TestPlatformMatch(t *testing.T) {
	p := func(s string) v1.Platform {
		x, err := parsePlatform(s)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	idx := &v1.IndexManifest{}
	for _, s := range []string{"linux/arm/v6", "linux/arm/v7", "linux/arm64", "linux/amd64", "unknown/unknown"} {
		pl := p(s)
		if s == "unknown/unknown" {
			pl = v1.Platform{OS: "unknown", Architecture: "unknown"}
		}
		idx.Manifests = append(idx.Manifests, v1.Descriptor{MediaType: "application/vnd.oci.image.manifest.v1+json", Platform: &pl, Size: int64(len(s))})
	}
	for want, size := range map[string]int{
		"linux/arm/v7": len("linux/arm/v7"), "linux/arm/v8": len("linux/arm/v7"), "linux/arm/v6": len("linux/arm/v6"),
		"arm": len("linux/arm/v7"), "linux/arm64/v8": len("linux/arm64"), "linux/aarch64": len("linux/arm64"), "amd64": len("linux/amd64"),
	} {
		d, err := pickPlatform(idx, p(want))
		if err != nil || d.Size != int64(size) {
			t.Errorf("%s: picked %v %v", want, d.Platform, err)
		}
	}
	for _, want := range []string{"linux/arm/v5", "linux/riscv64", "windows/amd64"} {
		if _, err := pickPlatform(idx, p(want)); !errors.Is(err, ErrNoPlatform) || !strings.Contains(err.Error(), "linux/arm/v6, linux/arm, linux/arm64, linux/amd64") {
			t.Errorf("%s: %v", want, err)
		}
	}
}

// blobFault serves the blobs digest with fault instead of the registry.
func blobFault(digest string, fault func(w http.ResponseWriter, r *http.Request, next http.Handler)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+digest) {
				fault(w, r, next)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func layerDigest(t *testing.T, img v1.Image, i int) (string, int64) {
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	return m.Layers[i].Digest.String(), m.Layers[i].Size
}

func TestPullHostileRegistry(t *testing.T) {
	img := mkImage(t, nil, bigLayer(t, "big", 1<<20), mkTar(t, tent{name: "b", data: "b"}))
	digest, size := layerDigest(t, img, 0)

	// Another layer of the same size: a valid gzip of a valid tar, whose
	// digest is not the one asked for.
	var evilLayer v1.Layer
	for seed := uint32(1); evilLayer == nil && seed < 200; seed++ {
		data := make([]byte, 1<<20)
		_, _ = randSeed(data, seed)
		evil := mkImage(t, nil, mkTar(t, tent{name: "big", data: string(data)}))
		if d, sz := layerDigest(t, evil, 0); sz == size {
			evilLayer, _ = evil.LayerByDigest(v1.Hash{Algorithm: "sha256", Hex: strings.TrimPrefix(d, "sha256:")})
		}
	}
	if evilLayer == nil {
		t.Fatal("no layer of the same size")
	}
	t.Run("digest mismatch", func(t *testing.T) {
		s := openStore(t)
		r := newTestRegistry(t, false, blobFault(digest, func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
			w.Header().Set("Content-Length", fmt.Sprint(size))
			rc, err := evilLayer.Compressed()
			if err != nil {
				t.Error(err)
				return
			}
			defer rc.Close()
			_, _ = io.Copy(w, rc)
		}))
		r.push(t, "bad:1", img)
		opts, _ := pullOpts(t, r.host)
		pe := pullErr(t, s, r.host+"/bad:1", opts, sandbox.PullInvalidImage, ErrInvalidImage)
		if !strings.Contains(pe.Error(), digest) {
			t.Errorf("error %q does not name the layer", pe)
		}
	})
	t.Run("missing blob", func(t *testing.T) {
		s := openStore(t)
		r := newTestRegistry(t, false, blobFault(digest, func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}`)
		}))
		r.push(t, "bad:1", img)
		opts, _ := pullOpts(t, r.host)
		pe := pullErr(t, s, r.host+"/bad:1", opts, sandbox.PullInvalidImage, nil)
		if !strings.Contains(pe.Error(), digest) || !strings.Contains(pe.Error(), "BLOB_UNKNOWN") {
			t.Errorf("error %q", pe)
		}
	})
	t.Run("stall", func(t *testing.T) {
		s := openStore(t)
		r := newTestRegistry(t, false, blobFault(digest, func(w http.ResponseWriter, req *http.Request, next http.Handler) {
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, req)
			w.Header().Set("Content-Length", fmt.Sprint(size))
			_, _ = w.Write(rec.Body.Bytes()[:size/2])
			w.(http.Flusher).Flush()
			<-req.Context().Done() // hang until the client gives up
		}))
		r.push(t, "stall:1", img)
		opts, _ := pullOpts(t, r.host)
		opts.Registry.StallTimeout = 300 * time.Millisecond
		start := time.Now()
		pe := pullErr(t, s, r.host+"/stall:1", opts, sandbox.PullUnreachable, ErrStalled)
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("the stall ended the pull after %v", el)
		}
		// The text is the one of every registry that cannot be reached
		// (see TestPullPortScan); the stall is in the error's chain.
		if !strings.Contains(pe.Error(), r.host) || !errors.Is(pe, ErrUnreachable) {
			t.Errorf("error %q does not name the registry", pe)
		}
	})
	t.Run("connection cut", func(t *testing.T) {
		s := openStore(t)
		r := newTestRegistry(t, false, blobFault(digest, func(w http.ResponseWriter, req *http.Request, next http.Handler) {
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, req)
			w.Header().Set("Content-Length", fmt.Sprint(size))
			_, _ = w.Write(rec.Body.Bytes()[:size/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection is closed mid-blob
		}))
		r.push(t, "cut:1", img)
		opts, _ := pullOpts(t, r.host)
		_ = pullErr(t, s, r.host+"/cut:1", opts, sandbox.PullUnreachable, nil)
	})
	t.Run("not found", func(t *testing.T) {
		s := openStore(t)
		r := newTestRegistry(t, false, nil)
		opts, _ := pullOpts(t, r.host)
		_ = pullErr(t, s, r.host+"/nosuch:1", opts, sandbox.PullNotFound, nil)
	})
}

func TestPullUnreachable(t *testing.T) {
	s := openStore(t)
	opts, _ := pullOpts(t)
	pe := pullErr(t, s, "registry.nosuch.invalid/r:1", opts, sandbox.PullUnreachable, nil)
	if !strings.Contains(pe.Error(), "registry.nosuch.invalid") {
		t.Errorf("error %q", pe)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	opts, _ = pullOpts(t, addr)
	pe = pullErr(t, s, addr+"/r:1", opts, sandbox.PullUnreachable, ErrUnreachable)
	if !strings.Contains(pe.Error(), "could not be reached") || !errors.Is(pe, syscall.ECONNREFUSED) {
		t.Errorf("error %q", pe)
	}
	_ = pullErr(t, s, "Bad Name", opts, sandbox.PullInvalidReference, ErrInvalidName)
}

func TestPullInsecureRegistries(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, nil, mkTar(t, tent{name: "f", data: "f"}))
	plain := newTestRegistry(t, false, nil)
	plain.push(t, "r:1", img)
	tlsReg := newTestRegistry(t, true, nil)
	tlsReg.push(t, "r:1", img)

	opts, _ := pullOpts(t) // none insecure, both allowed (they are on loopback)
	opts.Registry.Registries = []string{plain.host, tlsReg.host}
	for _, r := range []*testRegistry{plain, tlsReg} {
		pe := pullErr(t, s, r.host+"/r:1", opts, sandbox.PullUnreachable, nil)
		if !strings.Contains(pe.Error(), "--insecure-registry "+r.host) {
			t.Errorf("error %q does not say to add --insecure-registry %s", pe, r.host)
		}
	}
	opts, _ = pullOpts(t, plain.host, tlsReg.host)
	mustPull(t, s, plain.host+"/r:1", opts)
	mustPull(t, s, tlsReg.host+"/r:1", opts)
	// Listing one host does not make another insecure.
	opts, _ = pullOpts(t, plain.host)
	opts.Registry.Registries = []string{tlsReg.host}
	_ = pullErr(t, s, tlsReg.host+"/r:1", opts, sandbox.PullUnreachable, nil)
}

func TestPullMirrors(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, []string{"FROM=mirror"}, mkTar(t, tent{name: "f", data: "f"}))
	mirror := newTestRegistry(t, false, nil)
	mirror.push(t, "library/busybox:latest", img)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	dockerConfig(t, map[string]any{})

	opts, d := pullOpts(t)
	opts.Registry.Mirrors = []string{"http://" + down, "http://" + mirror.host}
	got, _ := mustPull(t, s, "busybox", opts)
	if got.Name != "busybox:latest" || !slices.Equal(got.Env, []string{"FROM=mirror"}) {
		t.Errorf("pulled %+v", got)
	}
	if list := d.list(); len(list) != 0 {
		t.Errorf("Docker Hub contacted: %v", list)
	}
	// No mirror has it: Docker Hub is asked last (the test transport
	// refuses it).
	opts.Registry.Mirrors = []string{"http://" + down}
	pe := pullErr(t, s, "docker.io/library/other:1", opts, sandbox.PullUnreachable, nil)
	if list := d.list(); !slices.Equal(list, []string{"index.docker.io:443"}) {
		t.Errorf("dialed %v, want Docker Hub after the mirror", list)
	}
	if !strings.Contains(pe.Error(), down) {
		t.Errorf("error %q does not say the mirror failed", pe)
	}
	opts.Registry.Mirrors = []string{"ftp://x/y"}
	_ = pullErr(t, s, "busybox", opts, sandbox.PullUnreachable, nil)
}

const (
	testUser   = "tai42user"
	testSecret = "s3cr3t-Z9qX-pw"
	testToken  = "tok-7f3e9a-bearer"
)

// basicAuth requires user:secret on every request.
func basicAuth(user, secret string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != secret {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// tokenAuth is the registry token flow: /token gives testToken for
// user:secret (basic auth), the registry wants it as a bearer token.
func tokenAuth(user, secret string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/token" {
				u, p, ok := r.BasicAuth()
				if !ok || u != user || p != secret || !strings.HasPrefix(r.URL.Query().Get("scope"), "repository:") {
					http.Error(w, "bad credentials", http.StatusUnauthorized)
					return
				}
				_ = json.NewEncoder(w).Encode(map[string]any{"token": testToken, "expires_in": 300})
				return
			}
			if r.Header.Get("Authorization") != "Bearer "+testToken {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s/token",service="test"`, r.Host))
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// noSecrets fails the test if s holds a credential, in any spelling.
func noSecrets(t *testing.T, what, s string) {
	t.Helper()
	for _, secret := range []string{testSecret, testToken, base64.StdEncoding.EncodeToString([]byte(testUser + ":" + testSecret)), base64.StdEncoding.EncodeToString([]byte(testUser + ":wrong-" + testSecret))} {
		if strings.Contains(s, secret) {
			t.Errorf("%s holds a credential %q: %s", what, secret, s)
		}
	}
}

func TestPullCredentials(t *testing.T) {
	img := mkImage(t, nil, mkTar(t, tent{name: "f", data: "f"}))
	auth := func(user, secret string) map[string]any {
		return map[string]any{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + secret))}
	}
	// pull pulls from r with the docker config config, checking that
	// neither the error nor the events hold a credential.
	pull := func(t *testing.T, r *testRegistry, config map[string]any) error {
		t.Helper()
		dockerConfig(t, config)
		s := openStore(t)
		opts, _ := pullOpts(t, r.host)
		ev := &events{t: t}
		opts.Progress = ev.fn
		_, _, err := s.Pull(context.Background(), r.host+"/private:1", opts)
		if err != nil {
			noSecrets(t, "the error", err.Error())
			var pe *PullError
			if !errors.As(err, &pe) || pe.Reason != sandbox.PullUnauthorized || !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "registry "+r.host) {
				t.Errorf("error %v: want unauthorized, matching ErrUnauthorized, naming the registry", err)
			}
			assertClean(t, s)
		}
		b, _ := json.Marshal(ev.all())
		noSecrets(t, "the events", string(b))
		return err
	}
	for _, tc := range []struct {
		name string
		wrap func(string, string) func(http.Handler) http.Handler
	}{{"basic", basicAuth}, {"token", tokenAuth}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRegistry(t, false, tc.wrap(testUser, testSecret))
			r.push(t, "private:1", img)
			if err := pull(t, r, map[string]any{"auths": map[string]any{r.host: auth(testUser, testSecret)}}); err != nil {
				t.Errorf("with the right credentials: %v", err)
			}
			err := pull(t, r, map[string]any{"auths": map[string]any{r.host: auth(testUser, "wrong-"+testSecret)}})
			if err == nil || !strings.Contains(err.Error(), "were refused") {
				t.Errorf("with a wrong secret: %v", err)
			}
			err = pull(t, r, map[string]any{})
			if err == nil || !strings.Contains(err.Error(), "docker login "+r.host) {
				t.Errorf("without credentials: %v", err)
			}
		})
	}
	t.Run("credential helper", func(t *testing.T) {
		r := newTestRegistry(t, false, tokenAuth(testUser, testSecret))
		r.push(t, "private:1", img)
		bin := t.TempDir()
		script := fmt.Sprintf("#!/bin/sh\nread server\necho '{\"ServerURL\":\"'$server'\",\"Username\":\"%s\",\"Secret\":\"%s\"}'\n", testUser, testSecret)
		if err := os.WriteFile(filepath.Join(bin, "docker-credential-tai42test"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		if err := pull(t, r, map[string]any{"credHelpers": map[string]any{r.host: "tai42test"}}); err != nil {
			t.Errorf("through the credential helper: %v", err)
		}
		bad := strings.Replace(script, testSecret, "wrong-"+testSecret, 1)
		if err := os.WriteFile(filepath.Join(bin, "docker-credential-tai42test"), []byte(bad), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := pull(t, r, map[string]any{"credsStore": "tai42test"}); err == nil {
			t.Error("a wrong secret from the credential store was accepted")
		}
	})
}

// TestPullShared runs concurrent pulls of one reference: one manifest GET,
// every caller told of the events and given the image; a caller that
// gives up returns at once and does not end the others' pull.
func TestPullShared(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, nil, bigLayer(t, "big", 1<<20))
	digest, _ := layerDigest(t, img, 0)
	var manifests atomic.Int32
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(release)
	r := newTestRegistry(t, false, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/manifests/") {
				manifests.Add(1)
			}
			if strings.HasSuffix(req.URL.Path, "/blobs/"+digest) {
				<-gate
			}
			next.ServeHTTP(w, req)
		})
	})
	manifestDigest := r.push(t, "shared:1", img)
	opts, _ := pullOpts(t, r.host)
	ref := r.host + "/shared:1"
	key := flightKey{store: s.dir, name: ref, platform: platformString(normPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))}

	const n = 4
	var wg sync.WaitGroup
	evs := make([]*events, n)
	imgs := make([]Image, n)
	errs := make([]error, n)
	quitter, quit := context.WithCancel(context.Background())
	defer quit()
	for i := range n + 1 {
		ctx := context.Background()
		if i == n {
			ctx = quitter // one more caller, who gives up
		}
		var o PullOptions
		o.Registry = opts.Registry
		if i < n {
			evs[i] = &events{t: t}
			o.Progress = evs[i].fn
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, _, err := s.Pull(ctx, ref, o)
			if i < n {
				evs[i].returned.Store(true)
				imgs[i], errs[i] = got, err
			} else if !errors.Is(err, context.Canceled) {
				t.Errorf("the caller who gave up: %v", err)
			}
		}()
	}
	waitFor(t, func() bool {
		flights.mu.Lock()
		defer flights.mu.Unlock()
		f := flights.m[key]
		return f != nil && f.waiters == n+1
	})
	quit()
	waitFor(t, func() bool {
		flights.mu.Lock()
		defer flights.mu.Unlock()
		return flights.m[key].waiters == n
	})
	release()
	wg.Wait()
	if got := manifests.Load(); got != 1 {
		t.Errorf("%d manifest GETs for %d concurrent pulls, want 1", got, n+1)
	}
	for i := range n {
		if errs[i] != nil || imgs[i].Name != ref {
			t.Errorf("caller %d: %+v %v", i, imgs[i], errs[i])
			continue
		}
		checkEvents(t, evs[i].all(), ref, manifestDigest, img)
	}
	assertClean(t, s)
}

// TestPullCancelled cancels a pull mid-blob: ctx's error, nothing left.
func TestPullCancelled(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, nil, bigLayer(t, "big", 1<<20))
	digest, size := layerDigest(t, img, 0)
	started := make(chan struct{})
	r := newTestRegistry(t, false, blobFault(digest, func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		w.Header().Set("Content-Length", fmt.Sprint(size))
		_, _ = w.Write(rec.Body.Bytes()[:size/2])
		w.(http.Flusher).Flush()
		close(started)
		<-req.Context().Done()
	}))
	r.push(t, "slow:1", img)
	opts, _ := pullOpts(t, r.host)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	_, _, err := s.Pull(ctx, r.host+"/slow:1", opts)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Pull: %v, want context.Canceled", err)
	}
	assertClean(t, s)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

// TestPullReasons classifies the failures the registry tests do not make.
func TestPullReasons(t *testing.T) {
	blobReq := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/v2/r/blobs/sha256:00"}}
	manReq := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/v2/r/manifests/1"}}
	for err, want := range map[error]sandbox.PullReason{
		&fs.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}:                                                                sandbox.PullStorage,
		fmt.Errorf("%w: unpacking: %w", ErrInvalidImage, &fs.PathError{Op: "write", Err: syscall.EDQUOT}):                          sandbox.PullStorage,
		&fs.PathError{Op: "rename", Path: "/x", Err: syscall.EIO}:                                                                  sandbox.PullStorage,
		&transport.Error{StatusCode: 404, Request: manReq}:                                                                         sandbox.PullUnreachable, // no registry's answer
		&transport.Error{StatusCode: 404, Errors: []transport.Diagnostic{{Code: transport.NameUnknownErrorCode}}, Request: manReq}: sandbox.PullNotFound,
		&transport.Error{StatusCode: 404, Request: blobReq}:                                                                        sandbox.PullInvalidImage,
		&transport.Error{StatusCode: 403, Errors: []transport.Diagnostic{{Code: transport.DeniedErrorCode}}, Request: manReq}:      sandbox.PullUnauthorized,
		fmt.Errorf("%w: reading: %w", ErrInvalidImage, &transport.Error{StatusCode: 503, Request: blobReq}):                        sandbox.PullUnreachable,
		fmt.Errorf("%w: reading: %w", ErrInvalidImage, &net.OpError{Op: "read", Err: syscall.ECONNRESET}):                          sandbox.PullUnreachable,
		&net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}:                                                    sandbox.PullUnreachable,
		fmt.Errorf("%w: layer 1 does not match its digest", ErrInvalidImage):                                                       sandbox.PullInvalidImage,
		errors.New("unsupported MediaType: application/vnd.docker.distribution.manifest.v1+prettyjws"):                             sandbox.PullInvalidImage,
	} {
		if got := pullError("r:1", err).Reason; got != want {
			t.Errorf("%v: %s, want %s", err, got, want)
		}
	}
}

// TestProgressThrottled feeds a layer's bytes in small reads: fetching
// events every fetchingStep bytes (the reads are quicker than
// fetchingEvery), and at the end.
func TestProgressThrottled(t *testing.T) {
	var evs []sandbox.PullProgress
	p := &progress{emit: func(ev sandbox.PullProgress) { evs = append(evs, ev) }}
	const total = 1 << 20
	p.layers = map[string]*layerProgress{"sha256:l": {total: total, shownAt: time.Now()}}
	p.order = []string{"sha256:l"}
	for range total / 1024 {
		p.fetched("sha256:l", 1024)
	}
	p.fetched("sha256:config", 100)
	if n := len(evs); n < total/fetchingStep || n > total/fetchingStep+2 || evs[n-1].Done != total {
		t.Errorf("%d events for %d bytes in 1 KiB reads (last %+v), want %d", n, total, evs[n-1], total/fetchingStep)
	}
	st := p.finish()
	if st.Bytes != total || st.Fetched != 1 || evs[len(evs)-1].Status != sandbox.PullLayerDone {
		t.Errorf("stats %+v, last event %+v", st, evs[len(evs)-1])
	}
}

// TestPullSharedSpellings runs two spellings of one Docker Hub name at
// once (through a mirror): one pull, each caller's events and error
// naming its own spelling.
func TestPullSharedSpellings(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, nil, bigLayer(t, "big", 1<<20))
	digest, _ := layerDigest(t, img, 0)
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(release)
	mirror := newTestRegistry(t, false, blobFault(digest, func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
		<-gate
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}`)
	}))
	mirror.push(t, "library/busybox:latest", img)
	dockerConfig(t, map[string]any{})
	opts, d := pullOpts(t)
	opts.Registry.Mirrors = []string{"http://" + mirror.host}
	key := flightKey{store: s.dir, name: "busybox:latest", platform: platformString(normPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))}

	spellings := []string{"busybox", "docker.io/library/busybox:latest"}
	errs := make([]error, len(spellings))
	evs := make([]*events, len(spellings))
	var wg sync.WaitGroup
	for i, ref := range spellings {
		evs[i] = &events{t: t}
		o := PullOptions{Registry: opts.Registry, Progress: evs[i].fn}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = s.Pull(context.Background(), ref, o)
		}()
	}
	waitFor(t, func() bool {
		flights.mu.Lock()
		defer flights.mu.Unlock()
		f := flights.m[key]
		return f != nil && f.waiters == len(spellings)
	})
	release()
	wg.Wait()
	for i, ref := range spellings {
		var pe *PullError
		if !errors.As(errs[i], &pe) || pe.Ref != ref || pe.Reason != sandbox.PullInvalidImage || !strings.HasPrefix(pe.Error(), "pulling "+ref+": ") {
			t.Errorf("%s: %v", ref, errs[i])
		}
		for _, ev := range evs[i].all() {
			if ev.Ref != ref {
				t.Errorf("%s: event %+v", ref, ev)
			}
		}
	}
	if list := d.list(); len(list) != 0 {
		t.Errorf("dialed %v", list)
	}
	assertClean(t, s)
}
