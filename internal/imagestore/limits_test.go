package imagestore

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/tai42/sandbox"
)

// hostileRegistry serves one repository, "x", as a hostile registry
// would: a manifest (or index) it was handed, a config blob, and layer
// blobs that are never there; it counts what the pull asked for.
type hostileRegistry struct {
	host         string
	manifest     []byte
	mediaType    types.MediaType
	config       []byte
	configDigest string
	children     map[string][]byte // child manifests of an index, by digest
	chunked      bool              // the manifest sent without its length

	configGETs, blobGETs, childGETs atomic.Int64
}

func newHostileRegistry(t *testing.T, h *hostileRegistry) *hostileRegistry {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(srv.Close)
	h.host = srv.Listener.Addr().String()
	return h
}

func (h *hostileRegistry) serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/v2/":
		w.WriteHeader(http.StatusOK)
	case strings.HasPrefix(p, "/v2/x/manifests/sha256:"):
		d := strings.TrimPrefix(p, "/v2/x/manifests/")
		h.childGETs.Add(1)
		b, ok := h.children[d]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", string(types.OCIManifestSchema1))
		_, _ = w.Write(b)
	case strings.HasPrefix(p, "/v2/x/manifests/"):
		w.Header().Set("Content-Type", string(h.mediaType))
		if !h.chunked {
			w.Header().Set("Content-Length", fmt.Sprint(len(h.manifest)))
		}
		_, _ = w.Write(h.manifest)
	case p == "/v2/x/blobs/"+h.configDigest:
		h.configGETs.Add(1)
		if h.config == nil {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(h.config)
	case strings.HasPrefix(p, "/v2/x/blobs/"):
		h.blobGETs.Add(1)
		http.NotFound(w, r)
	default:
		http.NotFound(w, r)
	}
}

func fakeDigest(i int) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%064x", i)}
}

// hostileImage is a manifest of n layers (that no registry has) and its
// config, whose diff IDs match the layer count; configSize, when > 0, is
// the size the manifest declares for the config instead of its own.
func hostileImage(t *testing.T, n int, configSize int64) *hostileRegistry {
	t.Helper()
	cfg := v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH, RootFS: v1.RootFS{Type: "layers"}}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1}
	for i := range n {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, fakeDigest(i))
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.OCILayer, Size: 1, Digest: fakeDigest(n + i)})
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cb)
	m.Config = v1.Descriptor{MediaType: types.OCIConfigJSON, Size: int64(len(cb)), Digest: v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}}
	if configSize > 0 {
		m.Config.Size = configSize
		cb = nil // never served: the pull must not ask for it
	}
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return newHostileRegistry(t, &hostileRegistry{manifest: mb, mediaType: types.OCIManifestSchema1, config: cb, configDigest: m.Config.Digest.String()})
}

// peakGoroutines samples the number of goroutines until stop is called,
// and returns the highest above the count when it started.
func peakGoroutines() (stop func() int) {
	base := runtime.NumGoroutine()
	var peak atomic.Int64
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			if n := int64(runtime.NumGoroutine() - base); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() int {
		close(done)
		<-finished
		return int(peak.Load())
	}
}

// limitErr pulls ref, which must be refused within a few seconds as too
// large (ErrTooLarge, reason invalid_image) with an error containing
// each of says; nothing may be left in the store and the pull may not
// have run more than a handful of goroutines.
func limitErr(t *testing.T, ref string, says ...string) {
	t.Helper()
	s := openStore(t)
	opts, _ := pullOpts(t, strings.SplitN(ref, "/", 2)[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := peakGoroutines()
	start := time.Now()
	_, _, err := s.Pull(ctx, ref, opts)
	took, peak := time.Since(start), stop()
	var pe *PullError
	if !errors.As(err, &pe) || pe.Reason != sandbox.PullInvalidImage || !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Pull(%s) = %v, want a *PullError of reason %s matching ErrTooLarge", ref, err, sandbox.PullInvalidImage)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	t.Logf("refused in %v: %v", took, err)
	if took > 10*time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if peak > 64 {
		t.Errorf("the pull ran %d goroutines at once", peak)
	}
	assertClean(t, s)
}

// TestPullTooManyLayers: a manifest of 5,000 layers (well under the
// manifest size limit) is refused before any layer is fetched or any
// temporary directory made, naming the limit.
func TestPullTooManyLayers(t *testing.T) {
	h := hostileImage(t, 5000, 0)
	limitErr(t, h.host+"/x:1", "5000 layers", fmt.Sprint(MaxLayers))
	if n := h.blobGETs.Load(); n != 0 {
		t.Errorf("%d layer blobs asked for", n)
	}
}

// TestPullManifestTooLarge: a manifest of 100,000 layers (13 MB) is
// refused as it is read, and its config never asked for; sent without
// its length, it is refused once 4 MiB are read.
func TestPullManifestTooLarge(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprint("chunked=", chunked), func(t *testing.T) {
			h := hostileImage(t, 100_000, 0)
			h.chunked = chunked
			limitErr(t, h.host+"/x:1", "manifest", "4 MiB")
			if n := h.configGETs.Load() + h.blobGETs.Load(); n != 0 {
				t.Errorf("%d blobs asked for", n)
			}
		})
	}
}

// TestPullConfigTooLarge: a config the manifest declares at 1.5 GiB is
// refused without being read.
func TestPullConfigTooLarge(t *testing.T) {
	h := hostileImage(t, 1, 3<<29)
	limitErr(t, h.host+"/x:1", "config", "8 MiB")
	if n := h.configGETs.Load(); n != 0 {
		t.Errorf("the config was asked for %d times", n)
	}
}

// TestPullIndexTooLarge: an index over the manifest limit is refused as
// it is read; an index entry for this platform that declares a manifest
// over the limit is refused without asking for it.
func TestPullIndexTooLarge(t *testing.T) {
	plat := &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	index := func(n int, size int64) []byte {
		im := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
		for i := range n {
			im.Manifests = append(im.Manifests, v1.Descriptor{MediaType: types.OCIManifestSchema1, Size: size, Digest: fakeDigest(i), Platform: plat})
		}
		b, err := json.Marshal(im)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Run("index", func(t *testing.T) {
		h := newHostileRegistry(t, &hostileRegistry{manifest: index(40_000, 500), mediaType: types.OCIImageIndex})
		limitErr(t, h.host+"/x:1", "manifest", "4 MiB")
		if n := h.childGETs.Load(); n != 0 {
			t.Errorf("%d manifests of the index asked for", n)
		}
	})
	t.Run("child", func(t *testing.T) {
		h := newHostileRegistry(t, &hostileRegistry{manifest: index(1, 1<<30), mediaType: types.OCIImageIndex})
		limitErr(t, h.host+"/x:1", "manifest", "4 MiB")
		if n := h.childGETs.Load(); n != 0 {
			t.Errorf("the manifest declared at 1 GiB was asked for %d times", n)
		}
	})
}

// TestPullLayerSlots: the layers of an image under the limit are fetched
// a few at a time, and a layer's temporary directory is made only when
// its turn comes: while the first layer is being fetched, no more than
// maxConcurrentLayers exist.
func TestPullLayerSlots(t *testing.T) {
	s := openStore(t)
	h := hostileImage(t, MaxLayers, 0)
	var most atomic.Int64
	serve := h.serve
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v2/x/blobs/") && r.URL.Path != "/v2/x/blobs/"+h.configDigest {
			tmps, _ := filepath.Glob(filepath.Join(s.dir, tmpDirName, "*", "layer-*"))
			if n := int64(len(tmps)); n > most.Load() {
				most.Store(n)
			}
			time.Sleep(20 * time.Millisecond) // the other layers' turn, were they not waiting for a slot
		}
		serve(w, r)
	}))
	t.Cleanup(srv.Close)
	host := srv.Listener.Addr().String()
	opts, _ := pullOpts(t, host)
	stop := peakGoroutines()
	_ = pullErr(t, s, host+"/x:1", opts, sandbox.PullInvalidImage, nil)
	peak := stop()
	if n := most.Load(); n == 0 || n > maxConcurrentLayers {
		t.Errorf("%d layer directories at once, want 1 to %d", n, maxConcurrentLayers)
	}
	if peak > 64 {
		t.Errorf("the pull of %d layers ran %d goroutines at once", MaxLayers, peak)
	}
}

// TestImportTooManyLayers: an image file of more layers than MaxLayers
// is refused too.
func TestImportTooManyLayers(t *testing.T) {
	s := openStore(t)
	layers := make([][]byte, MaxLayers+1)
	for i := range layers {
		layers[i] = mkTar(t, tent{name: fmt.Sprint("f", i), data: "x"})
	}
	file := layoutOf(t, "many:1", layers...)
	err := importErr(t, s, file, "", ErrTooLarge)
	if !strings.Contains(err.Error(), fmt.Sprint(MaxLayers+1, " layers")) {
		t.Errorf("error %q does not say how many layers", err)
	}
}
