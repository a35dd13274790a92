package imagestore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
)

// busyboxID is the ID the busybox test image has.
func busyboxID(t *testing.T) string {
	t.Helper()
	img, err := imagestoretest.BusyboxImage()
	if errors.Is(err, imagestoretest.ErrNoBusybox) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	id, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// oneLayer is the layer of a one-layer image, checked to be an absolute
// path of the store's without ':' or ','.
func oneLayer(t *testing.T, img Image) string {
	t.Helper()
	if len(img.Layers) != 1 {
		t.Fatalf("image %s has layers %q, want one", img.Name, img.Layers)
	}
	l := img.Layers[0]
	if strings.ContainsAny(l, ":,") || !filepath.IsAbs(l) || filepath.Base(l) != layerFSDir {
		t.Errorf("layer %q: want an absolute path to a layer's fs, without ':' or ','", l)
	}
	return l
}

// checkBusybox checks an imported busybox image.
func checkBusybox(t *testing.T, img Image, wantName string) {
	t.Helper()
	if img.Name != wantName {
		t.Errorf("name %q, want %q", img.Name, wantName)
	}
	if want := busyboxID(t); img.ID != want {
		t.Errorf("ID %s, want the config digest %s", img.ID, want)
	}
	if !slices.Equal(img.Env, []string{imagestoretest.Path}) {
		t.Errorf("env %q", img.Env)
	}
	rootfs := oneLayer(t, img)
	if want := "linux/" + runtime.GOARCH; img.Platform != want {
		t.Errorf("platform %q, want %q", img.Platform, want)
	}
	host, err := os.ReadFile(imagestoretest.Busybox)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(rootfs, "bin/busybox"))
	if err != nil || !bytes.Equal(got, host) {
		t.Fatalf("bin/busybox differs from %s (%v)", imagestoretest.Busybox, err)
	}
	if img.Size < int64(len(host)) || img.Size > 4*int64(len(host))+1<<20 {
		t.Errorf("size %d, busybox alone is %d", img.Size, len(host))
	}
	if l, err := os.Readlink(filepath.Join(rootfs, "bin/sh")); err != nil || l != "busybox" {
		t.Errorf("bin/sh -> %q (%v), want busybox", l, err)
	}
	for path, mode := range map[string]os.FileMode{
		"bin/busybox": 0o755, "tmp": 0o777 | os.ModeSticky | os.ModeDir, "proc": 0o555 | os.ModeDir,
		"root": 0o700 | os.ModeDir, "workspace": 0o755 | os.ModeDir, "etc/passwd": 0o644,
	} {
		fi, err := os.Lstat(filepath.Join(rootfs, path))
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), mode)
		}
		if want := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC); !fi.ModTime().Equal(want) {
			t.Errorf("%s: mtime %v, want %v", path, fi.ModTime(), want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "bin/ls")); err != nil || fi.ModTime().Year() != 2000 {
		t.Errorf("bin/ls symlink: %v, mtime want 2000", err)
	}
}

func TestImportLayout(t *testing.T) {
	s := openStore(t)
	dir := imagestoretest.BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "busybox:test")
	img := mustImport(t, s, dir, "")
	checkBusybox(t, img, "busybox:test")
	if img.SharedSize != 0 {
		t.Errorf("shared size %d of an image alone in its store", img.SharedSize)
	}
	if time.Since(img.Pulled) > time.Minute {
		t.Errorf("imported %v", img.Pulled)
	}
	got, err := s.Get("busybox:test")
	if err != nil || !slices.Equal(got.Layers, img.Layers) || got.ID != img.ID || got.Size != img.Size {
		t.Errorf("Get: %+v, %v; import returned %+v", got, err, img)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Name != "busybox:test" {
		t.Errorf("List: %+v, %v", list, err)
	}
	assertClean(t, s)
}

func TestImportDockerSave(t *testing.T) {
	s := openStore(t)
	file := imagestoretest.BusyboxDockerSave(t, filepath.Join(t.TempDir(), "busybox.tar"), "busybox:saved")
	checkBusybox(t, mustImport(t, s, file, ""), "busybox:saved")
	// gzip-compressed, under another name.
	checkBusybox(t, mustImport(t, s, gzipFile(t, file), "other"), "other:latest")
	// The same image under two names: its layer is stored once, shared.
	list, err := s.List()
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %+v %v", list, err)
	}
	for _, img := range list {
		if img.SharedSize != img.Size || !slices.Equal(img.Layers, list[0].Layers) {
			t.Errorf("%s: size %d shared %d layers %v, want one shared layer", img.Name, img.Size, img.SharedSize, img.Layers)
		}
	}
	assertClean(t, s)
}

func TestImportLayoutTar(t *testing.T) {
	s := openStore(t)
	dir := imagestoretest.BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "docker.io/library/busybox:tar")
	checkBusybox(t, mustImport(t, s, tarDir(t, dir, false), ""), "busybox:tar")
	checkBusybox(t, mustImport(t, s, tarDir(t, dir, true), "busybox:targz"), "busybox:targz")
	assertClean(t, s)
}

func TestNameSpellings(t *testing.T) {
	s := openStore(t)
	dir := imagestoretest.BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "")
	err := importErr(t, s, dir, "", ErrNeedName)
	if !strings.Contains(err.Error(), "give it a name") || !strings.Contains(err.Error(), dir) {
		t.Errorf("error %q: want it to name the file and ask for a name", err)
	}
	img := mustImport(t, s, dir, "busybox")
	if img.Name != "busybox:latest" {
		t.Errorf("name %q", img.Name)
	}
	for _, n := range []string{"busybox", "busybox:latest", "docker.io/library/busybox", "index.docker.io/library/busybox:latest"} {
		if got, err := s.Get(n); err != nil || got.Name != "busybox:latest" {
			t.Errorf("Get(%q): %v %v", n, got.Name, err)
		}
	}
	if _, err := s.Get("busybox:other"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "busybox:other") {
		t.Errorf("Get of a missing tag: %v", err)
	}
	if _, err := s.Get("Bad Name"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("Get of an invalid name: %v", err)
	}
	_ = importErr(t, s, dir, "host", ErrInvalidName)
	_ = importErr(t, s, dir, "UPPER", ErrInvalidName)
}

func TestSeveralImages(t *testing.T) {
	s := openStore(t)
	a := mkImage(t, []string{"WHO=a"}, mkTar(t, tent{name: "a", data: "a"}))
	b := mkImage(t, []string{"WHO=b"}, mkTar(t, tent{name: "b", data: "b"}))
	dir := mkLayout(t, named{"tools/a:1", a}, named{"tools/b:1", b})

	err := importErr(t, s, dir, "", ErrNeedName)
	if !errors.Is(err, ErrInvalidImage) {
		t.Errorf("error %q does not match ErrInvalidImage", err)
	}
	for _, want := range []string{"2 images", "tools/a:1", "tools/b:1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	err = importErr(t, s, dir, "tools/c:1", ErrNeedName)
	if !strings.Contains(err.Error(), "none is named tools/c:1") || !strings.Contains(err.Error(), "tools/a:1") {
		t.Errorf("error %q", err)
	}
	img := mustImport(t, s, dir, "tools/b:1")
	if !slices.Equal(img.Env, []string{"WHO=b"}) || img.WorkingDir != "/workspace" {
		t.Errorf("selected %+v", img)
	}
	if _, err := os.Stat(filepath.Join(oneLayer(t, img), "b")); err != nil {
		t.Error(err)
	}

	// A docker save tarball with two tagged images.
	file := filepath.Join(t.TempDir(), "two.tar")
	ta, _ := name.NewTag("tools/a:1")
	tb, _ := name.NewTag("tools/b:1")
	if err := tarball.MultiWriteToFile(file, map[name.Tag]v1.Image{ta: a, tb: b}); err != nil {
		t.Fatal(err)
	}
	_ = importErr(t, s, file, "", ErrNeedName)
	img = mustImport(t, s, file, "tools/a:1")
	if !slices.Equal(img.Env, []string{"WHO=a"}) {
		t.Errorf("selected %+v", img)
	}
	assertClean(t, s)
}

func TestReplaceKeepsAcquiredVersion(t *testing.T) {
	s := openStore(t)
	v1dir := layoutOf(t, "tool", mkTar(t, tent{name: "version", data: "1"}))
	v2dir := layoutOf(t, "tool", mkTar(t, tent{name: "version", data: "2"}))
	mustImport(t, s, v1dir, "")
	old, release, err := s.Acquire("tool")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	img := mustImport(t, s, v2dir, "")
	if oneLayer(t, img) == oneLayer(t, old) || img.ID == old.ID {
		t.Fatalf("the replacement has the old layer or ID: %+v", img)
	}
	for rootfs, want := range map[string]string{old.Layers[0]: "1", img.Layers[0]: "2"} {
		if b, err := os.ReadFile(filepath.Join(rootfs, "version")); err != nil || string(b) != want {
			t.Errorf("%s/version: %q %v, want %q", rootfs, b, err, want)
		}
	}
	if got, _ := s.Get("tool"); !slices.Equal(got.Layers, img.Layers) {
		t.Errorf("Get gives %s, want the replacement", got.Layers)
	}
	list, _ := s.List()
	if len(list) != 1 {
		t.Errorf("List: %+v", list)
	}
	release()
	release() // twice is fine
	if _, err := os.Stat(filepath.Dir(old.Layers[0])); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the replaced version's own layer outlived its last release: %v", err)
	}
	assertNoUnusedLayers(t, s)
	assertClean(t, s)
}

func TestRemove(t *testing.T) {
	s := openStore(t)
	dir := layoutOf(t, "tool:1", mkTar(t, tent{name: "f", data: "x"}))
	img := mustImport(t, s, dir, "")
	_, release, err := s.Acquire("tool:1")
	if err != nil {
		t.Fatal(err)
	}
	err = s.Remove("tool:1")
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "tool:1") {
		t.Fatalf("Remove of an acquired image: %v", err)
	}
	if _, err := s.Get("tool:1"); err != nil {
		t.Errorf("a refused Remove removed it: %v", err)
	}
	release()
	if err := s.Remove("tool:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(oneLayer(t, img))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("layer left: %v", err)
	}
	assertNoUnusedLayers(t, s)
	if _, err := s.Get("tool:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	err = s.Remove("tool:1")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "tool:1") {
		t.Errorf("Remove of a missing image: %v", err)
	}
	if _, _, err := s.Acquire("tool:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Acquire of a missing image: %v", err)
	}
	assertClean(t, s)
}

// helperEnv makes the test binary a helper process that acquires an
// image (see helperProcess).
const helperEnv = "TAI42_IMAGESTORE_HELPER"

// helperProcess acquires the image $TAI42_IMAGESTORE_HELPER names
// ("DIR|NAME"), says "acquired", and holds it until stdin closes.
func helperProcess() {
	dir, name, _ := strings.Cut(os.Getenv(helperEnv), "|")
	s, err := Open(dir)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	_, release, err := s.Acquire(name)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("acquired")
	_, _ = io.Copy(io.Discard, os.Stdin)
	release()
	os.Exit(0)
}

func TestAcquireAcrossProcesses(t *testing.T) {
	s := openStore(t)
	mustImport(t, s, layoutOf(t, "tool", mkTar(t, tent{name: "f", data: "x"})), "")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+s.Dir()+"|tool")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "acquired\n" {
		t.Fatalf("helper: %q", line)
	}
	if err := s.Remove("tool"); !errors.Is(err, ErrInUse) {
		t.Fatalf("Remove while another process holds it: %v", err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("tool"); err != nil {
		t.Fatalf("Remove after the other process released it: %v", err)
	}
	assertClean(t, s)
}

func TestBadFiles(t *testing.T) {
	s := openStore(t)
	tmp := t.TempDir()
	garbage := filepath.Join(tmp, "garbage.bin")
	_ = os.WriteFile(garbage, bytes.Repeat([]byte("not a tar "), 100), 0o644)
	plainTar := filepath.Join(tmp, "plain.tar")
	_ = os.WriteFile(plainTar, mkTar(t, tent{name: "hello.txt", data: "hi"}), 0o644)
	emptyDir := filepath.Join(tmp, "empty")
	_ = os.Mkdir(emptyDir, 0o755)
	badGzip := filepath.Join(tmp, "bad.gz")
	_ = os.WriteFile(badGzip, []byte{0x1f, 0x8b, 1, 2, 3}, 0o644)
	fifo := filepath.Join(tmp, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		file   string
		target error
		want   string
	}{
		{filepath.Join(tmp, "missing.tar"), fs.ErrNotExist, "no such file"},
		{garbage, ErrInvalidImage, "neither an OCI image layout directory nor a tar archive"},
		{plainTar, ErrInvalidImage, "neither a docker save tarball"},
		{emptyDir, ErrInvalidImage, "not an OCI image layout"},
		{badGzip, ErrInvalidImage, "gzip"},
		{fifo, ErrInvalidImage, "not a regular file"},
	} {
		err := importErr(t, s, c.file, "x", c.target)
		if !strings.Contains(err.Error(), c.file) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %q: want the file's name and %q", err, c.want)
		}
	}
}

func TestCorruptLayer(t *testing.T) {
	s := openStore(t)
	dir := layoutOf(t, "tool", mkTar(t, tent{name: "f", data: "genuine"}))
	// Swap the layer blob's content for another layer, keeping its name:
	// the layer no longer matches the config's diff ID.
	img := mkImage(t, nil, mkTar(t, tent{name: "f", data: "genuine"}))
	layers, _ := img.Layers()
	dig, _ := layers[0].Digest()
	other := mkImage(t, nil, mkTar(t, tent{name: "f", data: "forged!"}))
	ol, _ := other.Layers()
	rc, _ := ol[0].Compressed()
	forged, _ := io.ReadAll(rc)
	rc.Close()
	blob := filepath.Join(dir, "blobs", dig.Algorithm, dig.Hex)
	if _, err := os.Stat(blob); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blob, forged, 0o644); err != nil {
		t.Fatal(err)
	}
	err := importErr(t, s, dir, "", ErrInvalidImage)
	if !strings.Contains(err.Error(), "does not match its digest") {
		t.Errorf("error %q", err)
	}
}

func TestCancelledImport(t *testing.T) {
	s := openStore(t)
	dir := layoutOf(t, "big", mkTar(t, tent{name: "big", size: 1 << 20}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Import(ctx, dir, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("import under a cancelled context: %v", err)
	}
	assertClean(t, s)
	if list, _ := s.List(); len(list) != 0 {
		t.Errorf("List: %+v", list)
	}
}

// TestStreamsLargeFiles imports a layer with a 64 MiB file and checks that
// the import never held it in memory.
func TestStreamsLargeFiles(t *testing.T) {
	s := openStore(t)
	const size = 64 << 20
	dir := layoutOf(t, "big", mkTar(t, tent{name: "big", size: size}))
	var before, after runtimeMem
	before.read()
	img := mustImport(t, s, dir, "")
	after.read()
	if alloc := after.total - before.total; alloc > size/2 {
		t.Errorf("import allocated %d MiB for a %d MiB file", alloc>>20, size>>20)
	}
	fi, err := os.Stat(filepath.Join(oneLayer(t, img), "big"))
	if err != nil || fi.Size() != size {
		t.Fatalf("big: %v %v", fi, err)
	}
}

func TestConcurrentImports(t *testing.T) {
	s := openStore(t)
	dirs := make([]string, 4)
	for i := range dirs {
		dirs[i] = layoutOf(t, "tool", mkTar(t, tent{name: "n", data: fmt.Sprint(i)}))
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(dirs)*3)
	for _, d := range dirs {
		wg.Go(func() {
			_, err := s.Import(context.Background(), d, "")
			errs <- err
		})
		wg.Go(func() {
			if _, err := s.List(); err != nil {
				errs <- err
			}
		})
		wg.Go(func() {
			_, release, err := s.Acquire("tool")
			if err == nil {
				release()
			} else if !errors.Is(err, ErrNotFound) {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	list, err := s.List()
	if err != nil || len(list) != 1 {
		t.Fatalf("List: %+v %v", list, err)
	}
	assertClean(t, s)
}

func TestOpenRefusesOverlaySeparators(t *testing.T) {
	for _, bad := range []string{"a:b", "a,b"} {
		if _, err := Open(filepath.Join(t.TempDir(), bad)); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("Open(%q): %v", bad, err)
		}
	}
}

// TestOpenSweeps checks that Open removes what a crashed import and an
// unreferenced image directory left.
func TestOpenSweeps(t *testing.T) {
	s := openStore(t)
	_ = os.MkdirAll(filepath.Join(s.dir, tmpDirName, "stage-crashed", "layer-123", layerFSDir), 0o755)
	_ = os.WriteFile(filepath.Join(s.dir, tmpDirName, "stage-crashed", imageLockFile), nil, 0o600)
	_ = os.MkdirAll(filepath.Join(s.dir, tmpDirName, "stage-unlocked"), 0o755)
	orphan := "sha256-" + strings.Repeat("ab", 32) + "-0123456789abcdef"
	_ = os.MkdirAll(filepath.Join(s.dir, imagesDirName, orphan), 0o755)
	_ = os.WriteFile(filepath.Join(s.dir, imagesDirName, orphan, imageLockFile), nil, 0o600)
	_ = os.MkdirAll(filepath.Join(s.dir, orphan, v1RootfsDir), 0o755) // a version-1 orphan
	_ = os.MkdirAll(filepath.Join(s.dir, trashDirName, "half-deleted"), 0o755)
	if _, err := Open(s.dir); err != nil {
		t.Fatal(err)
	}
	assertClean(t, s)
}

// testDigest is a well-formed digest.
var testDigest = "sha256:" + strings.Repeat("a", 64)

func TestValidName(t *testing.T) {
	for in, want := range map[string]string{
		"busybox":                                  "busybox:latest",
		"busybox:1.35":                             "busybox:1.35",
		"ghcr.io/x/y:tag":                          "ghcr.io/x/y:tag",
		"localhost:5000/team/tool":                 "localhost:5000/team/tool:latest",
		"docker.io/library/busybox:1":              "busybox:1",
		"docker.io/me/tool":                        "me/tool:latest",
		"registry.example.com/a/b/c:v1.2-3":        "registry.example.com/a/b/c:v1.2-3",
		"a__b/c-d.e:TAG_1":                         "a__b/c-d.e:TAG_1",
		"library/a/b":                              "library/a/b:latest",
		"localhost:5000/r@" + testDigest:           "localhost:5000/r@" + testDigest,
		"docker.io/library/busybox@" + testDigest:  "busybox@" + testDigest,
		"busybox:1.36@" + testDigest:               "busybox@" + testDigest,
		"index.docker.io/me/tool:v1@" + testDigest: "me/tool@" + testDigest,
	} {
		got, err := CanonicalName(in)
		if err != nil || got != want {
			t.Errorf("CanonicalName(%q) = %q, %v; want %q", in, got, err, want)
		}
		if err := ValidName(in); err != nil {
			t.Errorf("ValidName(%q): %v", in, err)
		}
	}
	for _, bad := range []string{
		"", "host", "host:latest", "host:1", "docker.io/library/host", "Busybox", "bus box", "a:b:c",
		"busybox@sha256:" + strings.Repeat("a", 63), "busybox@md5:" + strings.Repeat("a", 32), "busybox@", "a@b@" + testDigest,
		"host@" + testDigest, "Busybox@" + testDigest, "busybox:", ":tag", "a//b", "/abs", "a/", "-a",
		"busybox:-x", "a:b/c", strings.Repeat("a", 300),
	} {
		if err := ValidName(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidName(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	if err := ValidName("host"); !strings.Contains(err.Error(), "reserved") {
		t.Errorf("ValidName(host): %v", err)
	}
}

func openFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	var fds []string
	for _, e := range ents {
		l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		fds = append(fds, e.Name()+" -> "+l)
	}
	return fds
}

// TestNoFDLeak runs every operation, failing ones too, and checks that no
// file descriptor stays open.
func TestNoFDLeak(t *testing.T) {
	s := openStore(t)
	oci := layoutOf(t, "tool", mkTar(t, tent{name: "f", data: "x"}))
	saved := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("saved:1")
	if err := tarball.WriteToFile(saved, tag, mkImage(t, nil, mkTar(t, tent{name: "g", data: "y"}))); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(t.TempDir(), "garbage")
	_ = os.WriteFile(garbage, []byte("garbage"), 0o644)
	hostile := layoutOf(t, "bad", mkTar(t, tent{name: "h", typ: tar.TypeLink, linkname: "/etc/passwd"}))

	before := openFDs(t)
	mustImport(t, s, oci, "")
	mustImport(t, s, gzipFile(t, saved), "")
	mustImport(t, s, tarDir(t, oci, false), "tool:2")
	_, _ = s.Import(context.Background(), garbage, "x")
	_, _ = s.Import(context.Background(), hostile, "")
	_, release, err := s.Acquire("tool")
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Remove("tool")
	release()
	_, _ = s.List()
	_, _ = s.Get("saved:1")
	_, _ = add(context.Background(), t, s, addRequest{Name: "failed:1", Image: onBase(t, "f"),
		Fetch: func(v1.Layer) (io.ReadCloser, error) { return nil, errRegistryGone }})
	_, _ = s.Import(context.Background(), mkLayout(t, named{"shared:1", onBase(t, "s")}), "")
	_, _ = s.Prune(context.Background())
	for _, n := range []string{"tool", "saved:1", "tool:2", "shared:1"} {
		_ = s.Remove(n)
	}
	if after := openFDs(t); len(after) > len(before) {
		t.Errorf("file descriptors leaked:\nbefore %v\nafter  %v", before, after)
	}
	assertClean(t, s)
}

// TestPlatforms imports a multi-platform index (this machine's image is
// chosen) and refuses an image for another architecture.
func TestPlatforms(t *testing.T) {
	s := openStore(t)
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
	dir := filepath.Join(t.TempDir(), "multi")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: "multi:1"})); err != nil {
		t.Fatal(err)
	}
	img := mustImport(t, s, dir, "")
	if img.Name != "multi:1" || !slices.Equal(img.Env, []string{"ARCH=mine"}) {
		t.Errorf("imported %+v, want this machine's image", img)
	}

	single := mkLayout(t, named{"foreign", foreign})
	err = importErr(t, s, single, "", ErrInvalidImage)
	if !strings.Contains(err.Error(), "linux/"+other) {
		t.Errorf("error %q", err)
	}
}
