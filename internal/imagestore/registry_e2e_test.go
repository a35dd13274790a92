package imagestore_test

// End-to-end pulls against a real registry (Debian's docker-registry on
// loopback, see registrytest): the realistic Debian image by tag and by
// digest, over plain HTTP, TLS with basic auth and the token flow, the
// second image on the same base, and hostile registries and layers.

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/imagestore/registrytest"
)

// e2eTimeout bounds one pull of a test.
const e2eTimeout = 3 * time.Minute

// password is distinctive, so a test can look for it in every output.
const password = "pw-registrytest-7f3a9c"

var users = map[string]string{"alice": password}

// plain is how a pull reaches r over plain HTTP: r listed as insecure.
func plain(r *registrytest.Registry) imagestore.RegistryOptions {
	return imagestore.RegistryOptions{Insecure: []string{r.Host()}}
}

// trusted is how a pull reaches r over TLS, its CA trusted, as user: r
// (and its token server) listed, as they are on loopback.
func trusted(r *registrytest.Registry, user string) imagestore.RegistryOptions {
	o := imagestore.RegistryOptions{Transport: r.Transport(), Registries: listed(r)}
	if user != "" {
		o.Keychain = r.Keychain(user)
	}
	return o
}

// listed is r's host, and its token server's, for Registries.
func listed(r *registrytest.Registry) []string {
	if th := r.TokenHost(); th != "" {
		return []string{r.Host(), th}
	}
	return []string{r.Host()}
}

func openStore(t *testing.T) *imagestore.Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("pulls unpack layers as they are (owners kept, whiteouts as 0:0 character devices): that needs root")
	}
	s, err := imagestore.Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pull(t *testing.T, s *imagestore.Store, ref string, reg imagestore.RegistryOptions) (imagestore.Image, imagestore.PullStats, error) {
	t.Helper()
	timeout := e2eTimeout
	if reg.StallTimeout > 0 {
		// A stall test: the watchdog, not this, must end the pull.
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.Pull(ctx, ref, imagestore.PullOptions{Registry: reg})
}

func mustPull(t *testing.T, s *imagestore.Store, ref string, reg imagestore.RegistryOptions) (imagestore.Image, imagestore.PullStats) {
	t.Helper()
	img, stats, err := pull(t, s, ref, reg)
	if err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	return img, stats
}

// wantPullError checks that err is an *imagestore.PullError of one of
// reasons, and that no credential is in its text.
func wantPullError(t *testing.T, err error, reasons ...sandbox.PullReason) *imagestore.PullError {
	t.Helper()
	if err == nil {
		t.Fatalf("the pull succeeded, want an error of reason %v", reasons)
	}
	var pe *imagestore.PullError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T), want an *imagestore.PullError of reason %v", err, err, reasons)
	}
	if !slices.Contains(reasons, pe.Reason) {
		t.Fatalf("reason %s (%v), want one of %v", pe.Reason, err, reasons)
	}
	if strings.Contains(err.Error(), password) {
		t.Fatalf("the error text holds the password: %v", err)
	}
	return pe
}

func digestOf(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func layerDigest(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// layerHas says whether one of img's unpacked layers holds rel.
func layerHas(img imagestore.Image, rel string) bool {
	for _, l := range img.Layers {
		if _, err := os.Lstat(filepath.Join(l, rel)); err == nil {
			return true
		}
	}
	return false
}

func TestE2EPullDebian(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{})
	d := registrytest.DebianPython(t)
	ref := r.Ref("debian/python", "v1")
	r.Push(t, ref, d.Python)
	s := openStore(t)

	var img imagestore.Image
	var stats imagestore.PullStats
	t.Run("by-tag", func(t *testing.T) {
		img, stats = mustPull(t, s, ref, plain(r))
		canon, _ := imagestore.CanonicalName(ref)
		if img.Name != canon {
			t.Errorf("Name %q, want %q", img.Name, canon)
		}
		if !layerHas(img, "usr/bin/python3") || !layerHas(img, "usr/bin/dpkg") {
			t.Errorf("the pulled layers %v lack python3 or dpkg", img.Layers)
		}
	})
	if img.ID == "" {
		t.Fatal("no image to go on with")
	}
	base := layerDigest(t, d.Base)
	t.Run("layers", func(t *testing.T) {
		if want := digestOf(t, d.Python).String(); img.Digest != want {
			t.Errorf("Digest %q, want the manifest's %q", img.Digest, want)
		}
		if len(img.Layers) != 3 {
			t.Errorf("%d layers, want the image's 3, each unpacked on its own", len(img.Layers))
		}
		if stats.Fetched != 3 || stats.Existing != 0 || stats.Bytes <= 0 {
			t.Errorf("stats %+v, want 3 layers fetched", stats)
		}
		if n := r.BlobGETs(t, base); n != 1 {
			t.Errorf("the base was fetched %d times by the first pull, want 1", n)
		}
	})
	t.Run("by-digest", func(t *testing.T) {
		// The same image, nothing fetched again.
		byDigest := r.Host() + "/debian/python@" + digestOf(t, d.Python).String()
		before := r.BlobGETs(t, base)
		img2, _ := mustPull(t, s, byDigest, plain(r))
		if img2.ID != img.ID {
			t.Errorf("by digest: ID %s, by tag %s", img2.ID, img.ID)
		}
		if n := r.BlobGETs(t, base); n != before {
			t.Errorf("the pull by digest fetched the base again (%d GETs, %d before)", n, before)
		}
	})
	t.Run("shared-base", func(t *testing.T) {
		// The second image on the same base fetches only its own layer.
		other := r.Ref("debian/other", "v1")
		r.Push(t, other, d.Other)
		before := r.BlobGETs(t, base)
		oimg, ostats := mustPull(t, s, other, plain(r))
		if n := r.BlobGETs(t, base); n != before {
			t.Errorf("the second image fetched the shared base (%d GETs, %d before)", n, before)
		}
		if n := r.BlobGETs(t, layerDigest(t, d.OtherLayer)); n != 1 {
			t.Errorf("the second image's own layer was fetched %d times, want 1", n)
		}
		if ostats.Fetched != 1 || ostats.Existing != 1 {
			t.Errorf("the second image's stats %+v, want 1 fetched and 1 existing", ostats)
		}
		if len(oimg.Layers) != 2 || len(img.Layers) != 3 || oimg.Layers[0] != img.Layers[0] {
			t.Errorf("the images do not share the base's directory: %v and %v", oimg.Layers, img.Layers)
		}
	})
}

// small is a two-layer image, quick to push and pull.
func small(t *testing.T) v1.Image {
	t.Helper()
	l1, err := registrytest.LayerOf(registrytest.Dir("etc"), registrytest.File("etc/hello", "hello\n"))
	if err != nil {
		t.Fatal(err)
	}
	l2, err := registrytest.LayerOf(registrytest.Dir("opt"), registrytest.File("opt/two", strings.Repeat("two\n", 50000)))
	if err != nil {
		t.Fatal(err)
	}
	img, err := registrytest.ImageOf([]string{"/bin/sh"}, l1, l2)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestE2ETLSBasicAuth(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{TLS: true, Users: users})
	ref := r.Ref("private/small", "v1")
	r.Push(t, ref, small(t))

	t.Run("trusted", func(t *testing.T) {
		img, _ := mustPull(t, openStore(t), ref, trusted(r, "alice"))
		if !layerHas(img, "etc/hello") {
			t.Errorf("layers %v lack etc/hello", img.Layers)
		}
	})
	t.Run("no-credentials", func(t *testing.T) {
		s := openStore(t)
		_, _, err := pull(t, s, ref, trusted(r, ""))
		wantPullError(t, err, sandbox.PullUnauthorized)
		checkNothingKept(t, s)
	})
	t.Run("wrong-password", func(t *testing.T) {
		s := openStore(t)
		reg := trusted(r, "")
		reg.Keychain = r.KeychainFor("alice", "wrong-"+password)
		_, _, err := pull(t, s, ref, reg)
		wantPullError(t, err, sandbox.PullUnauthorized)
		checkNothingKept(t, s)
	})
	t.Run("untrusted", func(t *testing.T) {
		s := openStore(t)
		_, _, err := pull(t, s, ref, imagestore.RegistryOptions{Keychain: r.Keychain("alice"), Registries: listed(r)})
		wantPullError(t, err, sandbox.PullUnreachable)
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("the error does not say the certificate was refused: %v", err)
		}
		checkNothingKept(t, s)
	})
	t.Run("insecure", func(t *testing.T) {
		// --insecure-registry: TLS without verifying the certificate.
		reg := imagestore.RegistryOptions{Insecure: []string{r.Host()}, Keychain: r.Keychain("alice")}
		mustPull(t, openStore(t), ref, reg)
	})
}

func TestE2EToken(t *testing.T) {
	for _, tls := range []bool{false, true} {
		name := "http"
		if tls {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			r := registrytest.Start(t, registrytest.Options{TLS: tls, Token: true, Users: users})
			ref := r.Ref("private/small", "v1")
			r.Push(t, ref, small(t))
			reg := func(user string) imagestore.RegistryOptions {
				if tls {
					return trusted(r, user)
				}
				// A plain HTTP token server is reached only when listed
				// as insecure too.
				o := imagestore.RegistryOptions{Insecure: []string{r.Host(), r.TokenHost()}}
				if user != "" {
					o.Keychain = r.Keychain(user)
				}
				return o
			}
			mustPull(t, openStore(t), ref, reg("alice"))
			_, _, err := pull(t, openStore(t), ref, reg(""))
			wantPullError(t, err, sandbox.PullUnauthorized)
		})
	}
}

// sentinel is a directory outside the store that a hostile layer aims
// at; check says it is as it was.
type sentinel struct{ dir string }

func newSentinel(t *testing.T) sentinel {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sentinel")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("untouched\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return sentinel{dir}
}

func (s sentinel) check(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "secret" {
		t.Errorf("the sentinel directory %s was written to: %v", s.dir, ents)
	}
	st, err := os.Lstat(filepath.Join(s.dir, "secret"))
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o644 {
		t.Errorf("the sentinel file changed: %v %v", st, err)
	}
	if b, err := os.ReadFile(filepath.Join(s.dir, "secret")); err != nil || string(b) != "untouched\n" {
		t.Errorf("the sentinel file's content changed: %q %v", b, err)
	}
}

// checkNothingKept checks that a failed pull left nothing partial: no
// stage in tmp/, nothing in trash/, no image, and no directory of the
// failed layers; with none given, no layer directory at all. (Layers
// verified before the failure may stay: a pull started again does not
// fetch them again.)
func checkNothingKept(t *testing.T, s *imagestore.Store, failed ...v1.Layer) {
	t.Helper()
	for _, sub := range []string{"tmp", "trash"} {
		ents, err := os.ReadDir(filepath.Join(s.Dir(), sub))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for _, e := range ents {
			t.Errorf("the failed pull left %s/%s", sub, e.Name())
		}
	}
	got := layerDirs(t, s)
	if len(failed) == 0 && len(got) > 0 {
		t.Errorf("layer directories after the failed pull %v, want none", got)
	}
	for _, l := range failed {
		d, err := l.DiffID()
		if err != nil {
			t.Fatal(err)
		}
		if holdsLayer(t, s, d) {
			t.Errorf("the failed layer %s was kept", d)
		}
	}
	imgs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 0 {
		t.Errorf("the failed pull left images %v", imgs)
	}
}

// holdsLayer reports whether the store has a layer directory of the
// layer diffID, whatever its key: its meta.json names its diffID.
func holdsLayer(t *testing.T, s *imagestore.Store, diffID v1.Hash) bool {
	t.Helper()
	for _, d := range layerDirs(t, s) {
		b, err := os.ReadFile(filepath.Join(s.Dir(), "layers", d, "meta.json"))
		if err != nil {
			t.Fatalf("layer %s: %v", d, err)
		}
		var m struct {
			DiffID string `json:"diff_id"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("layer %s: %v", d, err)
		}
		if m.DiffID == diffID.String() {
			return true
		}
	}
	return false
}

// layerDirs are the store's unpacked layers, sorted.
func layerDirs(t *testing.T, s *imagestore.Store) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.Dir(), "layers"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

func TestE2EHostileRegistry(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{})
	t.Run("digest-mismatch", func(t *testing.T) {
		img := small(t)
		ref := r.Ref("hostile/corrupt", "v1")
		r.Push(t, ref, img)
		ls, _ := img.Layers()
		r.CorruptBlob(t, layerDigest(t, ls[1]))
		s := openStore(t)
		_, _, err := pull(t, s, ref, plain(r))
		// The corruption is found by the first reader of the bytes (gzip,
		// tar, or the digest at the blob's end): any is an invalid image
		// naming the layer.
		wantPullError(t, err, sandbox.PullInvalidImage)
		if !strings.Contains(err.Error(), "layer") {
			t.Errorf("the error does not name the layer: %v", err)
		}
		checkNothingKept(t, s, ls[1])
	})
	t.Run("missing-blob", func(t *testing.T) {
		img := small(t)
		ref := r.Ref("hostile/missing", "v1")
		r.Push(t, ref, img)
		ls, _ := img.Layers()
		r.DeleteBlob(t, layerDigest(t, ls[1]))
		s := openStore(t)
		_, _, err := pull(t, s, ref, plain(r))
		wantPullError(t, err, sandbox.PullNotFound, sandbox.PullInvalidImage)
		checkNothingKept(t, s, ls[1])
	})
	t.Run("stall", func(t *testing.T) {
		big, err := registrytest.LayerOf(registrytest.File("big", randomText(4<<20)))
		if err != nil {
			t.Fatal(err)
		}
		img, err := registrytest.ImageOf(nil, big)
		if err != nil {
			t.Fatal(err)
		}
		r.Push(t, r.Ref("hostile/stall", "v1"), img)
		front := r.StallingFront(t)
		s := openStore(t)
		reg := imagestore.RegistryOptions{Insecure: []string{front.Host()}, StallTimeout: 2 * time.Second}
		start := time.Now()
		_, _, err = pull(t, s, front.Host()+"/hostile/stall:v1", reg)
		wantPullError(t, err, sandbox.PullUnreachable)
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("the stalled pull took %s to give up with a StallTimeout of 2s", d)
		}
		checkNothingKept(t, s, big)
	})
	t.Run("no-platform", func(t *testing.T) {
		arch := "arm64"
		if runtime.GOARCH == "arm64" {
			arch = "s390x"
		}
		img := small(t)
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.Architecture = arch
		img, err := mutate.ConfigFile(img, cf)
		if err != nil {
			t.Fatal(err)
		}
		idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
		ref := r.Ref("hostile/foreign", "v1")
		r.PushIndex(t, ref, idx)
		s := openStore(t)
		_, _, err = pull(t, s, ref, plain(r))
		wantPullError(t, err, sandbox.PullNoPlatform)
		if !strings.Contains(err.Error(), arch) || !strings.Contains(err.Error(), runtime.GOARCH) {
			t.Errorf("the error does not name the platform asked for and the one offered: %v", err)
		}
		checkNothingKept(t, s)
	})
}

func randomText(n int) string {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = 'a' + byte(x%26)
	}
	return string(b)
}

// Hostile layers: each pull fails as an invalid image, the sentinel
// outside the store is as it was, the store keeps nothing of the image
// (the good base layer below may stay, shared layers being the store's
// to keep).
func TestE2EHostileLayers(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{})
	sent := newSentinel(t)
	up := strings.Repeat("../", 32) + strings.TrimPrefix(sent.dir, "/")
	for _, tc := range []struct {
		name    string
		entries []registrytest.Entry
		// skipped: the store may take the layer and leave the entry out
		// (device nodes: the extractor skips them) instead of failing.
		skipped string
	}{
		{"dotdot", []registrytest.Entry{registrytest.File(up+"/pwned", "pwned\n")}, ""},
		{"dotdot-inner", []registrytest.Entry{registrytest.Dir("a"), registrytest.File("a/../../pwned", "pwned\n")}, ""},
		{"absolute-symlink-out", []registrytest.Entry{
			{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "escape", Linkname: sent.dir, Mode: 0o777}},
			registrytest.File("escape/pwned", "pwned\n"),
		}, ""},
		{"relative-symlink-out", []registrytest.Entry{
			{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "escape", Linkname: up, Mode: 0o777}},
			registrytest.File("escape/pwned", "pwned\n"),
		}, ""},
		{"hardlink-out-absolute", []registrytest.Entry{
			{Header: tar.Header{Typeflag: tar.TypeLink, Name: "stolen", Linkname: filepath.Join(sent.dir, "secret")}},
		}, ""},
		{"hardlink-out-dotdot", []registrytest.Entry{
			{Header: tar.Header{Typeflag: tar.TypeLink, Name: "stolen", Linkname: up + "/secret"}},
		}, ""},
		{"char-device", []registrytest.Entry{
			{Header: tar.Header{Typeflag: tar.TypeChar, Name: "mem", Devmajor: 1, Devminor: 1, Mode: 0o666}},
		}, "mem"},
		{"block-device", []registrytest.Entry{
			{Header: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8, Devminor: 0, Mode: 0o660}},
		}, "sda"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good, err := registrytest.LayerOf(registrytest.Dir("etc"), registrytest.File("etc/good", "good\n"))
			if err != nil {
				t.Fatal(err)
			}
			bad, err := registrytest.LayerOf(tc.entries...)
			if err != nil {
				t.Fatal(err)
			}
			img, err := registrytest.ImageOf(nil, good, bad)
			if err != nil {
				t.Fatal(err)
			}
			ref := r.Ref("hostile/"+tc.name, "v1")
			r.Push(t, ref, img)
			s := openStore(t)
			pulled, _, err := pull(t, s, ref, plain(r))
			sent.check(t) // first: it matters most, and a Fatal below would skip it
			if tc.skipped != "" && err == nil {
				for _, l := range pulled.Layers {
					if _, err := os.Lstat(filepath.Join(l, tc.skipped)); err == nil {
						t.Fatalf("the device node %s was made in layer %s", tc.skipped, l)
					}
				}
				if !layerHas(pulled, "etc/good") {
					t.Fatalf("the layers %v lack the good layer's file", pulled.Layers)
				}
				return
			}
			wantPullError(t, err, sandbox.PullInvalidImage)
			diffID, err := bad.DiffID()
			if err != nil {
				t.Fatal(err)
			}
			if holdsLayer(t, s, diffID) {
				t.Errorf("the hostile layer was kept in the store")
			}
			for _, sub := range []string{"tmp", "trash"} {
				ents, _ := os.ReadDir(filepath.Join(s.Dir(), sub))
				for _, e := range ents {
					t.Errorf("the failed pull left %s/%s", sub, e.Name())
				}
			}
			if imgs, _ := s.List(); len(imgs) != 0 {
				t.Errorf("the failed pull left images %v", imgs)
			}
		})
	}
}

// A layer of a 10 GiB sparse file (a few kilobytes on the wire) is
// refused by a store whose maximum image size is 1 GiB, before it is
// written: the size budget counts a file's apparent size.
func TestE2ESparseOverMaxImageSize(t *testing.T) {
	r := registrytest.Start(t, registrytest.Options{})
	sparse, err := registrytest.SparseLayer("big", 10<<30)
	if err != nil {
		t.Fatal(err)
	}
	img, err := registrytest.ImageOf(nil, sparse)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Ref("hostile/sparse", "v1")
	r.Push(t, ref, img)
	openStore(t) // skips as non-root
	s, err := imagestore.Open(filepath.Join(t.TempDir(), "images"), imagestore.WithMaxImageSize(1<<30))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, _, err = pull(t, s, ref, plain(r))
	wantPullError(t, err, sandbox.PullInvalidImage)
	if !errors.Is(err, imagestore.ErrTooLarge) {
		t.Errorf("%v: want an error matching ErrTooLarge", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("refusing the sparse file took %s: was it written?", d)
	}
	checkNothingKept(t, s, sparse)
}
