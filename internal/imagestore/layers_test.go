package imagestore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
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
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/tai42/sandbox"
)

// sharedBase is a base layer several test images are built on: a 256 KiB
// file (not zeros, which an unpacking may leave as a hole), so its size
// stands out from the small layers on top.
func sharedBase(t testing.TB) []byte {
	t.Helper()
	return mkTar(t, tent{name: "etc", typ: tar.TypeDir}, tent{name: "etc/base", data: "base"}, tent{name: "big", data: strings.Repeat("base", 64<<10)})
}

// onBase is an image of sharedBase and one layer holding the file top
// (content top).
func onBase(t testing.TB, top string) v1.Image {
	t.Helper()
	return mkImage(t, []string{"TOP=" + top}, sharedBase(t), mkTar(t, tent{name: top, data: top}))
}

// dockerSave writes img as a docker save tarball tagged tag.
func dockerSave(t testing.TB, img v1.Image, tag string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "saved.tar")
	tg, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(file, tg, img); err != nil {
		t.Fatal(err)
	}
	return file
}

// diffKeys are img's diffIDs, as strings.
func diffKeys(t testing.TB, img v1.Image) []string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, d := range cf.RootFS.DiffIDs {
		keys = append(keys, d.String())
	}
	return keys
}

// storeKeys are the keys the store gives img's layers: their chain IDs.
func storeKeys(t testing.TB, img v1.Image) []string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return chainKeys(cf.RootFS.DiffIDs)
}

// add runs addImage as Import and Pull do, with fetch and events.
func add(ctx context.Context, t testing.TB, s *Store, req addRequest) (Image, error) {
	t.Helper()
	st, err := s.newStage()
	if err != nil {
		t.Fatal(err)
	}
	defer st.abort()
	if req.Label == "" {
		req.Label = req.Name
	}
	return s.addImage(ctx, st, req)
}

func getImage(t testing.TB, s *Store, n string) Image {
	t.Helper()
	img, err := s.Get(n)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func assertFile(t testing.TB, dir, rel, want string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, rel)); err != nil || string(b) != want {
		t.Errorf("%s/%s: %q %v, want %q", dir, rel, b, err, want)
	}
}

// TestSharedBaseStoredOnce imports two images on one base, from two
// formats: the base is unpacked once, both images stack it, and the sizes
// tell the shared part from each image's own.
func TestSharedBaseStoredOnce(t *testing.T) {
	s := openStore(t)
	a, b := onBase(t, "a"), onBase(t, "b")
	mustImport(t, s, mkLayout(t, named{"tool/a:1", a}), "")
	mustImport(t, s, dockerSave(t, b, "tool/b:1"), "")

	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 3 {
		t.Errorf("layers %v, want 3: the base once, a's and b's", got)
	}
	ia, ib := getImage(t, s, "tool/a:1"), getImage(t, s, "tool/b:1")
	if len(ia.Layers) != 2 || len(ib.Layers) != 2 || ia.Layers[0] != ib.Layers[0] || ia.Layers[1] == ib.Layers[1] {
		t.Fatalf("layers of a %v, of b %v: want the base shared, the tops apart", ia.Layers, ib.Layers)
	}
	if want := s.layerFS(storeKeys(t, a)[0]); ia.Layers[0] != want {
		t.Errorf("base layer %s, want %s (named by its chain ID)", ia.Layers[0], want)
	}
	assertFile(t, ia.Layers[0], "etc/base", "base")
	assertFile(t, ia.Layers[1], "a", "a")
	assertFile(t, ib.Layers[1], "b", "b")

	base := s.layerSize(storeKeys(t, a)[0])
	if base < 256<<10 {
		t.Fatalf("base layer size %d", base)
	}
	for img, v := range map[*Image]v1.Image{&ia: a, &ib: b} {
		top := s.layerSize(storeKeys(t, v)[1])
		if top <= 0 || img.SharedSize != base || img.Size != base+top {
			t.Errorf("%s: size %d shared %d; the base is %d, its top %d", img.Name, img.Size, img.SharedSize, base, top)
		}
	}
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
}

// TestRemoveCollectsUnusedLayers checks that Remove deletes the layers
// only the removed image used, and keeps the shared base.
func TestRemoveCollectsUnusedLayers(t *testing.T) {
	s := openStore(t)
	a, b := onBase(t, "a"), onBase(t, "b")
	mustImport(t, s, mkLayout(t, named{"a:1", a}), "")
	mustImport(t, s, mkLayout(t, named{"b:1", b}), "")
	if err := s.Remove("a:1"); err != nil {
		t.Fatal(err)
	}
	want := []string{keyDir(storeKeys(t, b)[0]), keyDir(storeKeys(t, b)[1])}
	slices.Sort(want)
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); !slices.Equal(got, want) {
		t.Errorf("layers after removing a: %v, want b's %v", got, want)
	}
	if ib := getImage(t, s, "b:1"); ib.SharedSize != 0 {
		t.Errorf("b alone shares %d bytes", ib.SharedSize)
	}
	if err := s.Remove("b:1"); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 0 {
		t.Errorf("layers after removing every image: %v", got)
	}
	assertClean(t, s)
}

// TestAcquiredLayersSurvive checks that the layers of an acquired image
// outlive the Remove of another image on the same base, a replacing
// import and a Prune, and go with the last release.
func TestAcquiredLayersSurvive(t *testing.T) {
	s := openStore(t)
	mustImport(t, s, mkLayout(t, named{"a:1", onBase(t, "a")}), "")
	mustImport(t, s, mkLayout(t, named{"b:1", onBase(t, "b")}), "")
	held, release, err := s.Acquire("a:1")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	check := func(when string) {
		t.Helper()
		assertFile(t, held.Layers[0], "etc/base", "base")
		assertFile(t, held.Layers[1], "a", "a")
		if t.Failed() {
			t.Fatalf("after %s", when)
		}
	}
	if err := s.Remove("b:1"); err != nil {
		t.Fatal(err)
	}
	check("removing b")
	repl := mustImport(t, s, mkLayout(t, named{"a:1", onBase(t, "a2")}), "")
	if repl.Layers[0] != held.Layers[0] || repl.Layers[1] == held.Layers[1] {
		t.Fatalf("replacement layers %v, held %v", repl.Layers, held.Layers)
	}
	check("a replacing import")
	res, err := s.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Layers != 0 || res.Bytes != 0 {
		t.Errorf("Prune removed %+v while every layer is in use", res)
	}
	check("Prune")
	release()
	if _, err := os.Stat(held.Layers[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released version's own layer stays: %v", err)
	}
	assertFile(t, repl.Layers[0], "etc/base", "base")
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
}

var errRegistryGone = errors.New("registry gone")

// TestFailedAddResumes fails an add after its first layer is committed
// (the "registry" goes away for the others): no image, no stage, no half
// layer, but the first layer stays, through a restart (Open) and the
// sweep of a crashed stage; the next add fetches only the others.
func TestFailedAddResumes(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, nil, mkTar(t, tent{name: "one", data: "1"}), mkTar(t, tent{name: "two", data: "2"}), mkTar(t, tent{name: "three", data: "3"}))
	keys, diffs := storeKeys(t, img), diffKeys(t, img)
	firstDone := make(chan struct{})
	_, err := add(context.Background(), t, s, addRequest{
		Name:  "tool:1",
		Image: img,
		Fetch: func(l v1.Layer) (io.ReadCloser, error) {
			if d, _ := l.DiffID(); d.String() == diffs[0] {
				return l.Uncompressed()
			}
			<-firstDone
			return nil, errRegistryGone
		},
		Events: func(h v1.Hash, status string) {
			if h.String() == diffs[0] && status == "done" {
				close(firstDone)
			}
		},
	})
	if !errors.Is(err, errRegistryGone) || !strings.Contains(err.Error(), "layer 2") && !strings.Contains(err.Error(), "layer 3") {
		t.Fatalf("add with the registry gone: %v", err)
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); !slices.Equal(got, []string{keyDir(keys[0])}) {
		t.Fatalf("layers after the failure %v, want the first one only", got)
	}
	assertClean(t, s)

	// A crash mid-add: a stage whose process died (its lock file free),
	// with a half-unpacked layer.
	dead := filepath.Join(s.dir, tmpDirName, "stage-dead")
	if err := os.MkdirAll(filepath.Join(dead, "layer-1234", layerFSDir, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(dead, "layer-1234", layerFSDir, "usr", "half"), []byte("ha"), 0o644)
	_ = os.WriteFile(filepath.Join(dead, imageLockFile), nil, 0o600)
	_ = writeJSON(filepath.Join(dead, configFile), versionRecord{ID: "sha256:" + strings.Repeat("0", 64), Layers: keys})
	s, err = Open(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); !slices.Equal(got, []string{keyDir(keys[0])}) {
		t.Fatalf("layers after Open %v, want the committed one kept", got)
	}
	assertClean(t, s)

	// The restart: a pull (Digest set), which names layers by their blob
	// digests.
	var fetched atomic.Int32
	var mu sync.Mutex
	events := map[string]string{}
	got, err := add(context.Background(), t, s, addRequest{
		Name:   "tool:1",
		Image:  img,
		Digest: "sha256:" + strings.Repeat("d", 64),
		Fetch: func(l v1.Layer) (io.ReadCloser, error) {
			fetched.Add(1)
			return l.Uncompressed()
		},
		Events: func(h v1.Hash, status string) {
			mu.Lock()
			defer mu.Unlock()
			events[h.String()] = status
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := fetched.Load(); n != 2 {
		t.Errorf("the restarted add fetched %d layers, want 2 (the first was committed)", n)
	}
	layers, _ := img.Layers()
	for i, l := range layers {
		d, _ := l.Digest()
		want := "done"
		if i == 0 {
			want = "exists"
		}
		if events[d.String()] != want {
			t.Errorf("layer %d (%s): event %q, want %q (events %v)", i+1, d, events[d.String()], want, events)
		}
		var m layerMeta
		if err := readJSON(filepath.Join(s.layerPath(keys[i]), layerMetaFile), &m); err != nil || m.DiffID != diffs[i] ||
			"chain:"+strings.TrimPrefix(m.ChainID, "sha256:") != keys[i] || m.Size <= 0 {
			t.Errorf("layer %d meta %+v %v", i+1, m, err)
		}
		if i > 0 && m.Digest != d.String() {
			t.Errorf("layer %d meta digest %q, want the pulled blob's %s", i+1, m.Digest, d)
		}
	}
	if got.Digest != "sha256:"+strings.Repeat("d", 64) || len(got.Layers) != 3 {
		t.Errorf("image %+v", got)
	}
	for i, f := range []string{"one", "two", "three"} {
		assertFile(t, got.Layers[i], f, fmt.Sprint(i+1))
	}
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
}

// TestCancelMidLayer cancels an add while a layer is being read: nothing
// of it stays.
func TestCancelMidLayer(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, nil, mkTar(t, tent{name: "big", size: 4 << 20}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := add(ctx, t, s, addRequest{Name: "big:1", Image: img, Fetch: func(l v1.Layer) (io.ReadCloser, error) {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		return &cancelMidway{ReadCloser: rc, n: 1 << 20, cancel: cancel}, nil
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("add cancelled mid-layer: %v", err)
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 0 {
		t.Errorf("layers %v after a cancelled add", got)
	}
	assertClean(t, s)
}

// cancelMidway cancels once n bytes were read.
type cancelMidway struct {
	io.ReadCloser
	n      int
	cancel func()
}

func (c *cancelMidway) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if c.n -= n; c.n <= 0 {
		c.cancel()
	}
	return n, err
}

// TestHardLinkToLowerLayer imports an image whose top layer hard-links a
// file of its base: the link is resolved against the committed base,
// however the layers' unpacking interleaves.
func TestHardLinkToLowerLayer(t *testing.T) {
	s := openStore(t)
	base := mkTar(t, tent{name: "big", size: 2 << 20}, tent{name: "orig", data: "shared"})
	top := mkTar(t, tent{name: "hl", typ: tar.TypeLink, linkname: "orig"})
	img := mustImport(t, s, layoutOf(t, "linked", base, top), "")
	assertFile(t, img.Layers[1], "hl", "shared")
	assertClean(t, s)
}

// TestMaxImageSize checks that the store's bound reaches the unpacking.
func TestMaxImageSize(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "images"), WithMaxImageSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Import(context.Background(), layoutOf(t, "big", mkTar(t, tent{name: "big", size: 2 << 20})), "")
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("import beyond the bound: %v", err)
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 0 {
		t.Errorf("layers %v", got)
	}
	assertClean(t, s)
}

// importHelperEnv makes the test binary a helper process that imports an
// image (see importHelperProcess).
const importHelperEnv = "TAI42_IMAGESTORE_IMPORT"

// importHelperProcess imports the file $TAI42_IMAGESTORE_IMPORT names
// ("DIR|FILE|NAME") into the store DIR once stdin closes, and prints
// "imported" or the error.
func importHelperProcess() {
	parts := strings.SplitN(os.Getenv(importHelperEnv), "|", 3)
	_, _ = io.Copy(io.Discard, os.Stdin)
	s, err := Open(parts[0])
	if err == nil {
		_, err = s.Import(context.Background(), parts[1], parts[2])
	}
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("imported")
	os.Exit(0)
}

// TestConcurrentSharedImports imports images sharing a base from several
// goroutines and two other processes at once, with Prunes among them:
// every import lands, the base is stored once, nothing is left over.
func TestConcurrentSharedImports(t *testing.T) {
	s := openStore(t)
	var layouts []string
	for i := range 3 {
		layouts = append(layouts, mkLayout(t, named{"", onBase(t, fmt.Sprint("top", i))}))
	}
	var procs []*exec.Cmd
	var starts []io.WriteCloser
	var outs []*bytes.Buffer
	for i := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), importHelperEnv+"="+s.Dir()+"|"+layouts[i]+"|proc"+fmt.Sprint(i))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out := &bytes.Buffer{}
		cmd.Stdout = out
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
		procs, starts, outs = append(procs, cmd), append(starts, stdin), append(outs, out)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for _, w := range starts {
		w.Close() // the helpers start importing
	}
	for i := range 6 {
		wg.Go(func() {
			_, err := s.Import(context.Background(), layouts[i%3], fmt.Sprint("img", i))
			errs <- err
		})
	}
	for range 2 {
		wg.Go(func() {
			_, err := s.Prune(context.Background())
			errs <- err
		})
	}
	wg.Wait()
	for i, cmd := range procs {
		if err := cmd.Wait(); err != nil || outs[i].String() != "imported\n" {
			t.Errorf("helper %d: %v %q", i, err, outs[i])
		}
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	list, err := s.List()
	if err != nil || len(list) != 8 {
		t.Fatalf("List: %d images, %v", len(list), err)
	}
	for _, img := range list {
		if img.Layers[0] != list[0].Layers[0] || img.SharedSize < s.layerSize(storeKeys(t, onBase(t, "x"))[0]) {
			t.Errorf("%s: layers %v shared %d", img.Name, img.Layers, img.SharedSize)
		}
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 4 {
		t.Errorf("layers %v, want 4: the base once and three tops", got)
	}
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
	for _, img := range list {
		if err := s.Remove(img.Name); err != nil {
			t.Fatal(err)
		}
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 0 {
		t.Errorf("layers %v after removing every image", got)
	}
}

// TestMigrateV1 opens a store written by the version-1 (flattening) code,
// built by hand as it wrote them: every image is kept, as a one-layer
// image whose layer is its old root filesystem; an image a session of
// the old tai42 holds stays held; an interrupted migration finishes.
func TestMigrateV1(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	for _, d := range []string{dir, filepath.Join(dir, tmpDirName), filepath.Join(dir, trashDirName)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	imported := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	mkV1 := func(n int) v1Entry {
		e := v1Entry{
			Name: fmt.Sprintf("tool/v%d:1", n), ID: "sha256:" + strings.Repeat(fmt.Sprint(n), 64),
			Dir:  "sha256-" + strings.Repeat(fmt.Sprint(n), 64) + "-0123456789abcde" + fmt.Sprint(n),
			Size: int64(4096 * n), Imported: imported, Env: []string{"N=" + fmt.Sprint(n)}, WorkingDir: "/w",
		}
		rootfs := filepath.Join(dir, e.Dir, v1RootfsDir)
		if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(rootfs, "bin", "tool"), []byte(e.Name), 0o755)
		_ = os.WriteFile(filepath.Join(dir, e.Dir, imageLockFile), nil, 0o600)
		return e
	}
	entries := []v1Entry{mkV1(1), mkV1(2), mkV1(3)}
	b, _ := json.Marshal(map[string]any{"version": 1, "images": entries})
	_ = os.WriteFile(filepath.Join(dir, indexFile), b, 0o644)
	// An orphan (replaced, released) version-1 directory.
	_ = os.MkdirAll(filepath.Join(dir, "sha256-"+strings.Repeat("9", 64)+"-0123456789abcdef", v1RootfsDir), 0o755)
	// A session of the old tai42 holds image 1.
	held, err := os.Open(filepath.Join(dir, entries[0].Dir, imageLockFile))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	// A migration cut short: image 3's root filesystem moved already.
	k3 := v1KeyPrefix + entries[2].Dir
	_ = os.MkdirAll(filepath.Join(dir, layersDirName, keyDir(k3)), 0o700)
	if err := os.Rename(filepath.Join(dir, entries[2].Dir, v1RootfsDir), filepath.Join(dir, layersDirName, keyDir(k3), layerFSDir)); err != nil {
		t.Fatal(err)
	}

	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	list, err := s.List()
	if err != nil || len(list) != 3 {
		t.Fatalf("List after the migration: %+v %v", list, err)
	}
	for i, img := range list {
		e := entries[i]
		l := oneLayer(t, img)
		if l != s.layerFS(v1KeyPrefix+e.Dir) || strings.HasPrefix(filepath.Base(filepath.Dir(l)), "sha256-") {
			t.Errorf("%s: layer %s, want layers/v1-%s/fs (no diffID's name)", img.Name, l, e.Dir)
		}
		assertFile(t, l, "bin/tool", e.Name)
		if img.Name != e.Name || img.ID != e.ID || img.Size != e.Size || img.SharedSize != 0 || !img.Pulled.Equal(imported) ||
			!slices.Equal(img.Env, e.Env) || img.WorkingDir != "/w" || img.Platform != "linux/"+runtime.GOARCH {
			t.Errorf("migrated %+v from %+v", img, e)
		}
	}
	ix, err := s.readIndex()
	if err != nil || ix.Version != 2 {
		t.Fatalf("index after the migration: %+v %v", ix, err)
	}
	assertClean(t, s)

	// The old session's hold survives the move.
	if err := s.Remove(entries[0].Name); !errors.Is(err, ErrInUse) {
		t.Errorf("Remove of the image an old session holds: %v", err)
	}
	held.Close()
	for _, e := range entries {
		if err := s.Remove(e.Name); err != nil {
			t.Fatal(err)
		}
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 0 {
		t.Errorf("layers %v after removing every migrated image", got)
	}
	if _, err := Open(dir); err != nil {
		t.Fatalf("reopening the migrated store: %v", err)
	}
	assertClean(t, s)
}

// TestPruneCounts checks Prune's figures: it removes the layers a failed
// add left (which Open keeps), and reports them.
func TestPruneCounts(t *testing.T) {
	s := openStore(t)
	img := mkImage(t, nil, mkTar(t, tent{name: "f", data: strings.Repeat("f", 64<<10)}), mkTar(t, tent{name: "g", data: "g"}))
	keys, diffs := storeKeys(t, img), diffKeys(t, img)
	gone := make(chan struct{})
	_, err := add(context.Background(), t, s, addRequest{Name: "x:1", Image: img,
		Fetch: func(l v1.Layer) (io.ReadCloser, error) {
			if d, _ := l.DiffID(); d.String() == diffs[0] {
				return l.Uncompressed()
			}
			<-gone
			return nil, errRegistryGone
		},
		Events: func(_ v1.Hash, status string) {
			if status == "done" {
				close(gone)
			}
		}})
	if !errors.Is(err, errRegistryGone) {
		t.Fatal(err)
	}
	// A live stage that will use the layer (an add that found it
	// committed) keeps it.
	st, err := s.newStage()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.plan(versionRecord{ID: "sha256:" + strings.Repeat("0", 64), Layers: keys[:1]}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Prune(context.Background()); err != nil || res.Layers != 0 {
		t.Errorf("Prune with a live stage using the layer: %+v %v", res, err)
	}
	st.abort()
	size := s.layerSize(keys[0])
	res, err := s.Prune(context.Background())
	if err != nil || res.Layers != 1 || res.Bytes != size || size < 64<<10 {
		t.Errorf("Prune: %+v %v, want 1 layer of %d bytes", res, err, size)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Prune(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Prune under a cancelled context: %v", err)
	}
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
}

// TestAcquireAcrossProcessesKeepsLayers checks that a version held by
// another process keeps its layers through a replacing import and a
// Prune here.
func TestAcquireAcrossProcessesKeepsLayers(t *testing.T) {
	s := openStore(t)
	old := mustImport(t, s, layoutOf(t, "tool", mkTar(t, tent{name: "f", data: "old"})), "")
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
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "acquired\n" {
		t.Fatalf("helper: %q", line)
	}
	mustImport(t, s, layoutOf(t, "tool", mkTar(t, tent{name: "f", data: "new"})), "")
	if _, err := s.Prune(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertFile(t, old.Layers[0], "f", "old")
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old.Layers[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old version's layer outlived the other process's release: %v", err)
	}
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
}

// BenchmarkImportLayers imports an image of four 16 MiB layers (random
// content, gzip-compressed in an OCI layout) into an empty store: the
// fetch, hash, unpack and commit of layers side by side.
func BenchmarkImportLayers(b *testing.B) {
	const n, size = 4, 16 << 20
	var layers [][]byte
	for i := range n {
		data := make([]byte, size)
		_, _ = rand.NewChaCha8([32]byte{byte(i)}).Read(data)
		layers = append(layers, mkTar(b, tent{name: fmt.Sprint("f", i), data: string(data)}))
	}
	dir := layoutOf(b, "bench", layers...)
	b.SetBytes(n * size)
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		s := openStore(b)
		b.StartTimer()
		if _, err := s.Import(context.Background(), dir, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSharedLayerOverDifferentLowers imports two images whose top layer X
// is the same (one diffID) but whose layers below differ: X hard-links
// etc/link to etc/target, which each image's middle layer has with other
// content, and leaves etc implicit, which each middle layer has with
// another mode. Each image must show its own lowers through X: a layer
// stored by its diffID alone carried the first image's target (and etc's
// mode) into the second, so that a session of the second image read the
// first image's file.
func TestSharedLayerOverDifferentLowers(t *testing.T) {
	s := openStore(t)
	x := mkTar(t, tent{name: "etc/link", typ: tar.TypeLink, linkname: "etc/target"})
	middle := func(content string, mode int64) []byte {
		return mkTar(t, tent{name: "etc", typ: tar.TypeDir, mode: mode}, tent{name: "etc/target", data: content})
	}
	evil := mustImport(t, s, layoutOf(t, "evil:1", sharedBase(t), middle("EVIL", 0o777), x), "")
	good := mustImport(t, s, layoutOf(t, "good:1", sharedBase(t), middle("GOOD", 0o750), x), "")
	if evil.Layers[0] != good.Layers[0] {
		t.Errorf("the common base is stored twice: %s and %s", evil.Layers[0], good.Layers[0])
	}
	for _, c := range []struct {
		img     Image
		content string
		mode    os.FileMode
	}{{evil, "EVIL", 0o777}, {good, "GOOD", 0o750}} {
		top := c.img.Layers[2]
		assertFile(t, top, "etc/link", c.content)
		if fi, err := os.Stat(filepath.Join(top, "etc")); err != nil || fi.Mode().Perm() != c.mode {
			t.Errorf("%s: etc in its top layer %v (%v), want mode %v from its own middle layer", c.img.Name, fi.Mode(), err, c.mode)
		}
	}
	if evil.Layers[2] == good.Layers[2] {
		t.Errorf("both images stack one copy of X: %s", good.Layers[2])
	}
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
}

// TestDiffIDKeyedStoreUpgrade opens a store as an older tai42 left it,
// its layers keyed by diffID, one of them X unpacked over another image's
// lowers: its image keeps working, an image with X over other lowers gets
// its own copy (the old one is never reused, even for a bottom layer of
// the same digest), and the old layers go with the last image using them.
func TestDiffIDKeyedStoreUpgrade(t *testing.T) {
	s := openStore(t)
	x := mkTar(t, tent{name: "etc/link", typ: tar.TypeLink, linkname: "etc/target"})
	evilImg := mkImage(t, nil, sharedBase(t), mkTar(t, tent{name: "etc/target", data: "EVIL"}), x)
	mustImport(t, s, mkLayout(t, named{"evil:1", evilImg}), "")
	downgradeKeys(t, s, evilImg)

	s, err := Open(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	evil := getImage(t, s, "evil:1")
	diffs := diffKeys(t, evilImg)
	for i, l := range evil.Layers {
		if want := s.layerFS(diffs[i]); l != want {
			t.Errorf("the old image's layer %d is %s, want its diffID-keyed %s", i+1, l, want)
		}
	}
	assertFile(t, evil.Layers[2], "etc/link", "EVIL")

	good := mustImport(t, s, layoutOf(t, "good:1", sharedBase(t), mkTar(t, tent{name: "etc/target", data: "GOOD"}), x), "")
	assertFile(t, good.Layers[2], "etc/link", "GOOD")
	for i, l := range good.Layers {
		if slices.Contains(evil.Layers, l) {
			t.Errorf("the new image's layer %d reuses the old store's %s", i+1, l)
		}
	}
	assertClean(t, s)
	assertNoUnusedLayers(t, s)
	if err := s.Remove("evil:1"); err != nil {
		t.Fatal(err)
	}
	assertNoUnusedLayers(t, s)
}

// downgradeKeys rewrites the store as an older tai42 wrote it: img's
// layers keyed by their diffIDs, in the index, the image version records
// and the layers' directories and meta files.
func downgradeKeys(t *testing.T, s *Store, img v1.Image) {
	t.Helper()
	keys, diffs := storeKeys(t, img), diffKeys(t, img)
	for i, k := range keys {
		if err := os.Rename(s.layerPath(k), s.layerPath(diffs[i])); err != nil {
			t.Fatal(err)
		}
		m := layerMeta{DiffID: diffs[i], Size: s.layerSize(diffs[i])}
		if err := writeJSON(filepath.Join(s.layerPath(diffs[i]), layerMetaFile), m); err != nil {
			t.Fatal(err)
		}
	}
	old := func(ks []string) []string {
		out := slices.Clone(ks)
		for i, k := range out {
			if j := slices.Index(keys, k); j >= 0 {
				out[i] = diffs[j]
			}
		}
		return out
	}
	ix, err := s.readIndex()
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range ix.Images {
		ix.Images[i].Layers = old(e.Layers)
		dir := s.versionPath(e.Dir)
		rec, err := s.readRecord(dir)
		if err != nil {
			t.Fatal(err)
		}
		rec.Layers = old(rec.Layers)
		if err := writeJSON(filepath.Join(dir, configFile), rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.writeIndex(ix); err != nil {
		t.Fatal(err)
	}
}

// TestPullConfigLyingAboutDiffID pulls an image whose config lists, for
// its one layer, the diffID of another layer: the pull is refused, nothing
// is stored under the key the lie names, and the honest image with that
// layer, pulled next, gets its own content, not the liar's. (The blob's
// digest matches its manifest: only the diffID check against the
// uncompressed stream sees the lie.)
func TestPullConfigLyingAboutDiffID(t *testing.T) {
	good := mkTar(t, tent{name: "etc/target", data: "GOOD"})
	honest := mkImage(t, nil, good)
	liar := mkImage(t, nil, mkTar(t, tent{name: "etc/target", data: "EVIL"}))
	cf, err := liar.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0] = mustDiffID(t, honest, 0)
	if liar, err = mutate.ConfigFile(liar, cf); err != nil {
		t.Fatal(err)
	}
	r := newTestRegistry(t, false, nil)
	r.push(t, "liar:1", liar)
	r.push(t, "honest:1", honest)
	opts, _ := pullOpts(t, r.host)
	s := openStore(t)

	pe := pullErr(t, s, r.host+"/liar:1", opts, sandbox.PullInvalidImage, ErrInvalidImage)
	if !strings.Contains(pe.Error(), "does not match its digest in the image config") {
		t.Errorf("error %q does not say the layer does not match the config", pe)
	}
	if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 0 {
		t.Fatalf("the refused pull stored layers %v (the lie names %s)", got, keyDir(storeKeys(t, honest)[0]))
	}
	img, _ := mustPull(t, s, r.host+"/honest:1", opts)
	assertFile(t, img.Layers[0], "etc/target", "GOOD")
	assertClean(t, s)
}

func mustDiffID(t testing.TB, img v1.Image, i int) v1.Hash {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return cf.RootFS.DiffIDs[i]
}

// TestImageCapsCountEveryInode imports layers that hold little or no
// file data but many directories, long symlinks or extended attributes:
// each is refused against a small cap, by the cap it exceeds (bytes or
// inodes), as the disk space and inodes they take are counted, not only
// the bytes of their regular files.
func TestImageCapsCountEveryInode(t *testing.T) {
	long := strings.Repeat("t", 3000)
	for _, c := range []struct {
		name   string
		opts   []Option
		layer  func(tw *tar.Writer, i int) error
		n      int
		inodes bool // the inode cap is hit, not the size cap
	}{
		{"directories", []Option{WithMaxImageSize(1 << 20)}, func(tw *tar.Writer, i int) error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("d%04d/", i), Mode: 0o755})
		}, 400, false},
		{"symlinks", []Option{WithMaxImageSize(1 << 20)}, func(tw *tar.Writer, i int) error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: fmt.Sprintf("l%04d", i), Linkname: long, Mode: 0o777})
		}, 200, false},
		// 160 empty files are 640 KiB of inodes, under the cap without
		// their 3000-byte xattrs.
		{"xattrs", []Option{WithMaxImageSize(1 << 20)}, func(tw *tar.Writer, i int) error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("f%04d", i), Mode: 0o644, Format: tar.FormatPAX,
				PAXRecords: map[string]string{paxXattrPrefix + "user.x": long}})
		}, 160, false},
		{"inodes", []Option{WithMaxImageInodes(100)}, func(tw *tar.Writer, i int) error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("e%04d", i), Mode: 0o644})
		}, 150, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(filepath.Join(t.TempDir(), "images"), c.opts...)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for i := range c.n {
				if err := c.layer(tw, i); err != nil {
					t.Fatal(err)
				}
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			_, err = s.Import(context.Background(), layoutOf(t, "many:1", buf.Bytes()), "")
			if !errors.Is(err, ErrTooLarge) || errors.Is(err, ErrTooManyInodes) != c.inodes {
				t.Fatalf("import of %d %s: %v; want ErrTooLarge, ErrTooManyInodes %v", c.n, c.name, err, c.inodes)
			}
			flag := "--max-image-size"
			if c.inodes {
				flag = "--max-image-inodes"
			}
			if !strings.Contains(err.Error(), flag) {
				t.Errorf("error %q does not name %s", err, flag)
			}
			if got := dirNames(t, filepath.Join(s.dir, layersDirName)); len(got) != 0 {
				t.Errorf("layers %v", got)
			}
			assertClean(t, s)
		})
	}
}
