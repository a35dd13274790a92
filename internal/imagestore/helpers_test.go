package imagestore

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helperProcess()
		return
	}
	if os.Getenv(importHelperEnv) != "" {
		importHelperProcess()
		return
	}
	goleak.VerifyTestMain(m)
}

// tent is one entry of a hand-made tar.
type tent struct {
	name     string
	typ      byte
	mode     int64
	linkname string
	data     string
	size     int64 // a zero-filled file of this size when data is ""
	uid, gid int
	mtime    time.Time
}

// mkTar writes entries as a tar.
func mkTar(t testing.TB, ents ...tent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		mt := e.mtime
		if mt.IsZero() {
			mt = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
		}
		size := int64(len(e.data))
		if typ == tar.TypeReg && e.data == "" {
			size = e.size
		}
		if typ != tar.TypeReg {
			size = 0
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.linkname, Size: size,
			Uid: e.uid, Gid: e.gid, ModTime: mt, Format: tar.FormatPAX}
		if typ == tar.TypeChar || typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if size > 0 {
			var r io.Reader = bytes.NewReader([]byte(e.data))
			if e.data == "" {
				r = io.LimitReader(zeros{}, size)
			}
			if _, err := io.Copy(tw, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// mkImage builds an image (docker media types) from layer tars, with env.
func mkImage(t testing.TB, env []string, layers ...[]byte) v1.Image {
	t.Helper()
	// One append of every layer: an append per layer nests an image per
	// layer, each asking the one below for its config, which made a
	// 129-layer image cost minutes of JSON under -race.
	ls := make([]v1.Layer, len(layers))
	for i, b := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = env
	cf.Config.WorkingDir = "/workspace"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// named pairs an image with the ref name annotation it gets in a layout.
type named struct {
	name string
	img  v1.Image
}

// mkLayout writes an OCI layout holding imgs into a new directory.
func mkLayout(t testing.TB, imgs ...named) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range imgs {
		img := mutate.ConfigMediaType(mutate.MediaType(n.img, types.OCIManifestSchema1), types.OCIConfigJSON)
		var opts []layout.Option
		if n.name != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{annotationRefName: n.name}))
		}
		if err := p.AppendImage(img, opts...); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// layoutOf is mkLayout of one image made of layer tars.
func layoutOf(t testing.TB, name string, layers ...[]byte) string {
	t.Helper()
	return mkLayout(t, named{name, mkImage(t, []string{"PATH=/bin"}, layers...)})
}

// tarDir writes the tree at dir as a tar file (gzip-compressed when gz).
func tarDir(t testing.TB, dir string, gz bool) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "layout.tar")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	var w io.Writer = f
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(f)
		w = zw
	}
	tw := tar.NewWriter(w)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return file
}

// gzipFile compresses file into a new file.
func gzipFile(t testing.TB, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(b)
	zw.Close()
	out := file + ".gz"
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// openStore opens a store in a new directory.
func openStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// assertClean checks that the store holds exactly the image versions of
// its index, each indexed layer whole, and no import or removal
// leftovers.
func assertClean(t testing.TB, s *Store) {
	t.Helper()
	for _, sub := range []string{tmpDirName, trashDirName} {
		ents, err := os.ReadDir(filepath.Join(s.dir, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			t.Errorf("leftover %s/%s", sub, e.Name())
		}
	}
	ix, err := s.readIndex()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range ix.Images {
		want = append(want, e.Dir)
		for _, k := range e.Layers {
			for _, p := range []string{layerFSDir, layerMetaFile} {
				if _, err := os.Stat(filepath.Join(s.layerPath(k), p)); err != nil {
					t.Errorf("image %s: layer %s: %v", e.Name, k, err)
				}
			}
		}
	}
	got := dirNames(t, filepath.Join(s.dir, imagesDirName))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("image versions %v, index names %v", got, want)
	}
	for _, n := range dirNames(t, s.dir) {
		if imageDirPattern().MatchString(n) {
			t.Errorf("a version-1 image directory %s left at the top", n)
		}
	}
}

// assertNoUnusedLayers checks that every layer of the store is one of an
// indexed image.
func assertNoUnusedLayers(t testing.TB, s *Store) {
	t.Helper()
	ix, err := s.readIndex()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range ix.Images {
		for _, k := range e.Layers {
			want = append(want, keyDir(k))
		}
	}
	slices.Sort(want)
	want = slices.Compact(want)
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); !slices.Equal(got, want) {
		t.Errorf("layers %v, the indexed images use %v", got, want)
	}
}

// dirNames lists the directories in dir, sorted.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

// mustImport imports file under name and fails the test on an error.
func mustImport(t testing.TB, s *Store, file, name string) Image {
	t.Helper()
	img, err := s.Import(context.Background(), file, name)
	if err != nil {
		t.Fatalf("import %s: %v", file, err)
	}
	return img
}

// importErr imports file, wants an error matching target, and checks
// that the failed import left nothing.
func importErr(t testing.TB, s *Store, file, name string, target error) error {
	t.Helper()
	_, err := s.Import(context.Background(), file, name)
	if err == nil {
		t.Fatalf("import %s (name %q): no error", file, name)
	}
	if !errors.Is(err, target) {
		t.Fatalf("import %s: error %q does not match %v", file, err, target)
	}
	assertClean(t, s)
	return err
}

// runtimeMem samples the bytes allocated so far.
type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.total = ms.TotalAlloc
}
