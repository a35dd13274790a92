package registrytest

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/tai42/sandbox/internal/flock"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
)

// The realistic image's root filesystem: Debian's minbase of DebianSuite
// with DebianPackages, from this machine's apt sources.
const (
	DebianSuite    = "bookworm"
	DebianPackages = "python3"
)

// What the realistic image's third layer changes in the base: it deletes
// DeletedFile (an OCI whiteout) and makes OpaqueDir opaque (an OCI opaque
// whiteout) with NewFile in it, so the image shows NewFile alone there.
const (
	DeletedFile = "/etc/issue.net"
	OpaqueDir   = "/etc/skel"
	NewFile     = "/etc/skel/registrytest"
	// OtherFile is the second image's own layer's file.
	OtherFile = "/opt/registrytest/other"
)

// layoutVersion is part of the cache key: a change to how the layers are
// cut makes a new cache entry.
const layoutVersion = "2"

// Debian is the realistic image pair made from Debian's packages.
type Debian struct {
	// Python is base, python and top, lowest first.
	Python v1.Image
	// Other shares Python's base, with OtherLayer on top.
	Other v1.Image
	// Base is everything of the root filesystem no python3 package owns;
	// PythonLayer the files of the python3 packages (python3*,
	// libpython3*, per the root filesystem's /var/lib/dpkg/info/*.list);
	// Top the whiteout and the opaque directory; OtherLayer Other's own.
	Base, PythonLayer, Top, OtherLayer v1.Layer
	// Rootfs is mmdebstrap's root filesystem tarball, uncompressed.
	Rootfs string
}

// ErrCannotBuild is matched (errors.Is) by BuildDebian's error when this
// machine cannot build the image (no mmdebstrap, not root); the error
// says which.
var ErrCannotBuild = errors.New("cannot build the Debian image here")

// CacheDir is where the Debian image is kept between runs:
// $TAI42_TEST_CACHE, else /var/cache/tai42-test.
func CacheDir() string {
	if d := os.Getenv("TAI42_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/cache/tai42-test"
}

// DebianPython is the realistic image pair for t, built on a cache miss
// (a minute or two: mmdebstrap downloads and installs the packages), else
// read from CacheDir. It skips t, saying why, where it cannot be built.
func DebianPython(t testing.TB) *Debian {
	t.Helper()
	d, err := BuildDebian(CacheDir())
	if errors.Is(err, ErrCannotBuild) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// BuildDebian returns the realistic image pair, its layers kept as
// gzip files under cache in a directory keyed by the suite, the package
// list, the layout and this machine's apt sources; a miss builds them,
// under a lock, so concurrent test binaries build once.
func BuildDebian(cache string) (*Debian, error) {
	sources := aptSources()
	dir := filepath.Join(cache, "debian-python-"+debianKey(sources))
	if !complete(dir) {
		if err := buildLocked(cache, dir, sources); err != nil {
			return nil, err
		}
	}
	return loadDebian(dir)
}

// aptSources is this machine's apt sources file, so mmdebstrap reaches
// the mirror apt does; "" for mmdebstrap's default.
func aptSources() string {
	for _, f := range []string{"/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"} {
		if st, err := os.Stat(f); err == nil && st.Size() > 0 {
			return f
		}
	}
	return ""
}

func debianKey(sources string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", DebianSuite, DebianPackages, layoutVersion)
	if sources != "" {
		b, _ := os.ReadFile(sources)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

var layerFiles = []string{"base.tar.gz", "python.tar.gz", "top.tar.gz", "other.tar.gz"}

func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "done"))
	return err == nil
}

func buildLocked(cache, dir, sources string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: mmdebstrap needs root to make the root filesystem (the cache %s has no build of it)", ErrCannotBuild, cache)
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return fmt.Errorf("%w: mmdebstrap is missing (apt-get install -y mmdebstrap)", ErrCannotBuild)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := flock.Lock(lock, syscall.LOCK_EX); err != nil {
		return err
	}
	if complete(dir) { // another process built it meanwhile
		return nil
	}
	tmp, err := os.MkdirTemp(cache, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := build(tmp, sources); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "done"), nil, 0o644); err != nil {
		return err
	}
	// Readable by all, as a cache is: a test run as another user reads it.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	_ = os.RemoveAll(dir)
	return os.Rename(tmp, dir)
}

// build makes rootfs.tar with mmdebstrap and cuts it into the layers.
func build(dir, sources string) error {
	rootfs := filepath.Join(dir, "rootfs.tar")
	// Manuals, documentation and translations are left out, as in
	// python/tests/inspect/mkimage.sh: the image stays near 100 MB.
	args := []string{"--quiet", "--variant=minbase", "--include=" + DebianPackages,
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		DebianSuite, rootfs}
	if sources != "" {
		args = append(args, sources)
	}
	cmd := exec.Command("mmdebstrap", args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mmdebstrap: %w: %s", err, tail(out))
	}
	python, err := pythonFiles(rootfs)
	if err != nil {
		return err
	}
	return cutLayers(rootfs, dir, python)
}

func tail(b []byte) []byte {
	if len(b) > 2048 {
		return b[len(b)-2048:]
	}
	return b
}

// isPythonList says whether a dpkg file list is one of a python3
// package: python3, python3.11, python3-minimal, libpython3.11-stdlib...
func isPythonList(name string) bool {
	base := path.Base(name)
	return path.Dir(name) == "var/lib/dpkg/info" && strings.HasSuffix(base, ".list") &&
		(strings.HasPrefix(base, "python3") || strings.HasPrefix(base, "libpython3"))
}

// pythonFiles is the set of paths (relative, no "./") the python3
// packages' file lists name.
func pythonFiles(rootfs string) (map[string]bool, error) {
	set := map[string]bool{}
	err := eachEntry(rootfs, func(h *tar.Header, r io.Reader) error {
		if !isPythonList(clean(h.Name)) {
			return nil
		}
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if p := clean(sc.Text()); p != "" {
				set[p] = true
			}
		}
		return sc.Err()
	})
	if err == nil && len(set) == 0 {
		err = fmt.Errorf("the root filesystem %s lists no file of a python3 package", rootfs)
	}
	return set, err
}

// clean is a tar or dpkg path as a relative clean path, "" for the root.
func clean(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	return p
}

func eachEntry(file string, fn func(*tar.Header, io.Reader) error) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if err := fn(h, tr); err != nil {
			return err
		}
	}
}

// gzTar is a layer file being written.
type gzTar struct {
	f    *os.File
	gz   *gzip.Writer
	tw   *tar.Writer
	dirs map[string]bool // directories written
}

func newGzTar(file string) (*gzTar, error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	// Fastest: the layers live on this machine and are read often.
	gz, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	return &gzTar{f: f, gz: gz, tw: tar.NewWriter(gz), dirs: map[string]bool{}}, nil
}

// add writes h (and r's content) under name.
func (g *gzTar) add(name string, h *tar.Header, r io.Reader) error {
	h = cloneHeader(h)
	h.Name = name
	if h.Typeflag == tar.TypeDir {
		h.Name += "/"
		g.dirs[name] = true
	}
	if err := g.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if r != nil && h.Size > 0 {
		if _, err := io.Copy(g.tw, r); err != nil {
			return err
		}
	}
	return nil
}

// parents writes the directories above name that g lacks, with their
// headers from dirs (the base's).
func (g *gzTar) parents(name string, dirs map[string]*tar.Header) error {
	var missing []string
	for d := path.Dir(name); d != "." && !g.dirs[d]; d = path.Dir(d) {
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		h := dirs[missing[i]]
		if h == nil {
			h = &tar.Header{Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}
		}
		if err := g.add(missing[i], h, nil); err != nil {
			return err
		}
	}
	return nil
}

func (g *gzTar) close() error {
	return errors.Join(g.tw.Close(), g.gz.Close(), g.f.Close())
}

// epoch dates the entries the harness makes.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func cloneHeader(h *tar.Header) *tar.Header {
	c := *h
	c.Format = tar.FormatPAX
	return &c
}

// cutLayers writes base, python, top and other into dir.
func cutLayers(rootfs, dir string, python map[string]bool) error {
	var ws []*gzTar
	for _, f := range layerFiles {
		w, err := newGzTar(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		ws = append(ws, w)
	}
	base, py, top, other := ws[0], ws[1], ws[2], ws[3]
	dirs := map[string]*tar.Header{}
	inPython := map[string]bool{} // what the python layer holds, for hard links
	var sawDeleted, sawOpaque bool
	err := eachEntry(rootfs, func(h *tar.Header, r io.Reader) error {
		name := clean(h.Name)
		if name == "" {
			return nil // the root itself: its mode is the runtime's
		}
		switch name {
		case clean(DeletedFile):
			sawDeleted = true
		case clean(OpaqueDir):
			sawOpaque = h.Typeflag == tar.TypeDir
		}
		if h.Typeflag == tar.TypeDir {
			dirs[name] = cloneHeader(h)
			return base.add(name, h, nil)
		}
		// A hard link goes where its target went: a layer cannot link to
		// a file of another.
		mine := python[name]
		if h.Typeflag == tar.TypeLink {
			mine = inPython[clean(h.Linkname)]
		}
		if !mine {
			return base.add(name, h, r)
		}
		inPython[name] = true
		if err := py.parents(name, dirs); err != nil {
			return err
		}
		return py.add(name, h, r)
	})
	if err == nil && (!sawDeleted || !sawOpaque) {
		err = fmt.Errorf("the root filesystem lacks %s or the directory %s, which the top layer changes", DeletedFile, OpaqueDir)
	}
	if err == nil {
		err = writeTop(top, dirs)
	}
	if err == nil {
		err = writeOther(other, dirs)
	}
	for _, w := range ws {
		err = errors.Join(err, w.close())
	}
	return err
}

// writeTop writes the third layer: DeletedFile's whiteout, OpaqueDir
// made opaque with NewFile in it, and the tag file /etc/registrytest.
func writeTop(w *gzTar, dirs map[string]*tar.Header) error {
	del := clean(DeletedFile)
	wh := path.Join(path.Dir(del), ".wh."+path.Base(del))
	opq := clean(OpaqueDir)
	for _, e := range []struct {
		name string
		data string
	}{
		{wh, ""},
		{opq + "/.wh..wh..opq", ""},
		{clean(NewFile), "new in the top layer\n"},
	} {
		if err := w.parents(e.name, dirs); err != nil {
			return err
		}
		if e.name == clean(NewFile) && !w.dirs[opq] {
			return fmt.Errorf("%s was not written before %s", opq, e.name)
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}
		if err := w.add(e.name, h, strings.NewReader(e.data)); err != nil {
			return err
		}
	}
	return nil
}

func writeOther(w *gzTar, dirs map[string]*tar.Header) error {
	name := clean(OtherFile)
	if err := w.parents(name, dirs); err != nil {
		return err
	}
	data := "the other image's own layer\n"
	return w.add(name, &tar.Header{Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}, strings.NewReader(data))
}

// loadDebian makes the images of the layer files in dir.
func loadDebian(dir string) (*Debian, error) {
	var ls []v1.Layer
	for _, f := range layerFiles {
		file := filepath.Join(dir, f)
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(file) })
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		ls = append(ls, l)
	}
	d := &Debian{Base: ls[0], PythonLayer: ls[1], Top: ls[2], OtherLayer: ls[3], Rootfs: filepath.Join(dir, "rootfs.tar")}
	var err error
	if d.Python, err = ImageOf([]string{"python3"}, d.Base, d.PythonLayer, d.Top); err != nil {
		return nil, err
	}
	if d.Other, err = ImageOf([]string{"/bin/sh"}, d.Base, d.OtherLayer); err != nil {
		return nil, err
	}
	return d, nil
}

// ImageOf is an image of layers (lowest first) for this machine's
// platform, Debian's PATH and cmd as its command.
func ImageOf(cmd []string, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{imagestoretest.DebianPath}
	cf.Config.Cmd = cmd
	cf.Created = v1.Time{Time: epoch}
	return mutate.ConfigFile(img, cf)
}

// SplitRootfs cuts the root filesystem tarball rootfs into n layers of
// about equal size, written as dir/layer-I.tar.gz (lowest first): every
// directory in the first, each file (and its hard links) in one, with its
// parent directories, so that the layers stacked are rootfs again. It is
// the many-layer image of a benchmark beside rootfs as one layer.
func SplitRootfs(rootfs, dir string, n int) ([]v1.Layer, error) {
	st, err := os.Stat(rootfs)
	if err != nil {
		return nil, err
	}
	var ws []*gzTar
	for i := range n {
		w, err := newGzTar(filepath.Join(dir, fmt.Sprintf("layer-%d.tar.gz", i)))
		if err != nil {
			return nil, err
		}
		ws = append(ws, w)
	}
	dirs := map[string]*tar.Header{}
	where := map[string]int{} // file -> its layer, for hard links
	var seen int64
	err = eachEntry(rootfs, func(h *tar.Header, r io.Reader) error {
		name := clean(h.Name)
		if name == "" {
			return nil
		}
		if h.Typeflag == tar.TypeDir {
			dirs[name] = cloneHeader(h)
			return ws[0].add(name, h, nil)
		}
		i := min(n-1, int(seen*int64(n)/st.Size()))
		if h.Typeflag == tar.TypeLink {
			i = where[clean(h.Linkname)]
		}
		seen += h.Size + 512
		where[name] = i
		if err := ws[i].parents(name, dirs); err != nil {
			return err
		}
		return ws[i].add(name, h, r)
	})
	for _, w := range ws {
		err = errors.Join(err, w.close())
	}
	if err != nil {
		return nil, err
	}
	var ls []v1.Layer
	for _, w := range ws {
		file := w.f.Name()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(file) })
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}
