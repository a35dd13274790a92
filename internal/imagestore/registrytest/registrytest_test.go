package registrytest_test

import (
	"archive/tar"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"go.uber.org/goleak"

	"github.com/tai42/sandbox/internal/imagestore/registrytest"
)

// The harness leaves no goroutine behind (its tests' packages check it
// too): the registry's waiter, the token server, the fronts, and the
// transports it hands out.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The harness's own checks: each mode of the registry takes a push and
// serves it back, counts the blobs it served, and refuses who it should.
func TestModes(t *testing.T) {
	users := map[string]string{"alice": "s3cret-registrytest"}
	for _, tc := range []struct {
		name string
		opts registrytest.Options
	}{
		{"http", registrytest.Options{}},
		{"tls-htpasswd", registrytest.Options{TLS: true, Users: users}},
		{"http-htpasswd", registrytest.Options{Users: users}},
		{"token", registrytest.Options{Token: true, Users: users}},
		{"tls-token", registrytest.Options{TLS: true, Token: true, Users: users}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := registrytest.Start(t, tc.opts)
			img, err := random.Image(4096, 2)
			if err != nil {
				t.Fatal(err)
			}
			ref := r.Ref("test/img", "v1")
			r.Push(t, ref, img)
			var nopts []name.Option
			if !tc.opts.TLS {
				nopts = append(nopts, name.Insecure)
			}
			nr, err := name.ParseReference(ref, nopts...)
			if err != nil {
				t.Fatal(err)
			}
			ropts := []remote.Option{remote.WithTransport(r.Transport())}
			if len(tc.opts.Users) > 0 {
				// Refused without credentials and with wrong ones.
				for _, kc := range []remote.Option{remote.WithAuthFromKeychain(r.KeychainFor("alice", "wrong")), remote.WithAuthFromKeychain(r.KeychainFor("", ""))} {
					_, err := remote.Image(nr, append(ropts, kc)...)
					var terr *transport.Error
					if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
						t.Fatalf("pull with bad credentials: %v, want a 401", err)
					}
				}
				ropts = append(ropts, remote.WithAuthFromKeychain(r.Keychain("alice")))
			}
			got, err := remote.Image(nr, ropts...)
			if err != nil {
				t.Fatal(err)
			}
			layers, err := got.Layers()
			if err != nil {
				t.Fatal(err)
			}
			d, err := layers[0].Digest()
			if err != nil {
				t.Fatal(err)
			}
			if n := r.BlobGETs(t, d); n != 0 {
				t.Fatalf("BlobGETs before any read = %d", n)
			}
			rc, err := layers[0].Compressed()
			if err != nil {
				t.Fatal(err)
			}
			rc.Close()
			if n := r.BlobGETs(t, d); n != 1 {
				t.Fatalf("BlobGETs after one read = %d, want 1", n)
			}
		})
	}
}

func TestUntrustedTLS(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{TLS: true})
	resp, err := http.Get(r.URL() + "/v2/")
	if err == nil {
		resp.Body.Close()
		t.Fatal("the registry's certificate was trusted without its CA")
	}
	if len(r.CAPEM()) == 0 {
		t.Fatal("no CA PEM")
	}
}

func TestCorruptAndDelete(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{})
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Ref("test/img", "v1")
	r.Push(t, ref, img)
	layers, _ := img.Layers()
	d0, _ := layers[0].Digest()
	d1, _ := layers[1].Digest()
	r.CorruptBlob(t, d0)
	r.DeleteBlob(t, d1)
	get := func(d v1.Hash) (int, v1.Hash) {
		resp, err := http.Get(r.URL() + "/v2/test/img/blobs/" + d.String())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		h, _, err := v1.SHA256(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, h
	}
	if code, got := get(d0); code != http.StatusOK || got == d0 {
		t.Fatalf("the corrupted blob: %d, content %s; want 200 with content not of its digest", code, got)
	}
	if code, _ := get(d1); code != http.StatusNotFound {
		t.Fatalf("the deleted blob: %d, want 404", code)
	}
}

// The registry is stopped when its test ends.
func TestStopsRegistry(t *testing.T) {
	var host string
	t.Run("inner", func(t *testing.T) {
		host = registrytest.Start(t, registrytest.Options{}).Host()
	})
	if _, err := http.Get("http://" + host + "/v2/"); err == nil {
		t.Fatal("the registry still answers after its test ended")
	}
}

// Go's tar reader sees the sparse layer's file at its full size, the
// hole as zeros and the last byte as written.
func TestSparseLayer(t *testing.T) {
	const size = 10 << 30
	l, err := registrytest.SparseLayer("big", size)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := l.Size(); n > 64<<10 {
		t.Fatalf("the compressed layer is %d bytes", n)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "big" || h.Size != size || h.Typeflag != tar.TypeReg {
		t.Fatalf("header %q size %d type %c", h.Name, h.Size, h.Typeflag)
	}
	if _, err := io.CopyN(io.Discard, tr, size-1); err != nil {
		t.Fatal(err)
	}
	last, err := io.ReadAll(tr)
	if err != nil || string(last) != "x" {
		t.Fatalf("last byte %q, %v", last, err)
	}
}

// The stalling front passes StallAfter bytes of a blob, then nothing.
func TestStallingFront(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{})
	img, err := random.Image(1<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	r.Push(t, r.Ref("test/img", "v1"), img)
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	front := r.StallingFront(t)
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + front.Host() + "/v2/test/img/blobs/" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil || n != registrytest.StallAfter {
		t.Fatalf("read %d bytes, %v; want %d and then a timeout", n, err, registrytest.StallAfter)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("the read took %s", time.Since(start))
	}
	c.CloseIdleConnections()
}
