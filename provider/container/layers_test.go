package container_test

// The tests of images of many layers: the overlay mount itself (both
// ways it is made), and sessions, remapped or not, on a three-layer image
// with a whiteout and an opaque directory, their recovery and their
// leaks.

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// handFile is one entry of a hand-made layer in overlayfs's format.
type handFile struct {
	path     string
	content  string // a regular file's
	dir      bool
	opaque   bool // a directory hiding what the layers below have there
	whiteout bool // a 0:0 character device: the path is deleted
	uid      int
}

// writeHandLayer makes dir a layer of files.
func writeHandLayer(t testing.TB, dir string, files []handFile) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case f.whiteout:
			err = unix.Mknod(p, unix.S_IFCHR, int(unix.Mkdev(0, 0)))
		case f.dir:
			if err = os.Mkdir(p, 0o755); err == nil && f.opaque {
				err = unix.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0)
			}
		default:
			err = os.WriteFile(p, []byte(f.content), 0o644)
		}
		if err == nil && f.uid != 0 {
			err = os.Lchown(p, f.uid, f.uid)
		}
		if err != nil {
			t.Fatalf("layer %s: %s: %v", dir, f.path, err)
		}
	}
}

// The two layers the tests put over a base: the second deletes a file of
// the first (and one of the base, /bin/yes: busybox's image has it too),
// and makes /opt/opq opaque, hiding the first's /opt/opq/old.
var (
	handLayer1 = []handFile{
		{path: "etc/layer1", content: "one"},
		{path: "etc/gone", content: "deleted above"},
		{path: "opt/opq/old", content: "hidden above"},
		{path: "opt/owned", content: "uid 1000", uid: 1000},
	}
	handLayer2 = []handFile{
		{path: "etc/layer2", content: "two"},
		{path: "etc/gone", whiteout: true},
		{path: "bin/yes", whiteout: true},
		{path: "opt/opq", dir: true, opaque: true},
		{path: "opt/opq/new", content: "new"},
	}
	// handBase is what a hand-made base holds.
	handBase = []handFile{
		{path: "etc/base", content: "zero"},
		{path: "bin/yes", content: "deleted above"},
		{path: "etc/layer1", content: "overwritten above"},
	}
)

// layeredView is what a root of busybox, handLayer1 and handLayer2 shows:
// the check's script and the output it must print.
const (
	layeredScript = `cat /etc/layer1 /etc/layer2; echo; ls -a /etc | grep -c gone; ls -a /bin | grep -cx yes; ls -a /opt/opq; stat -c %u:%g /etc/layer2 /opt/owned`
	layeredWant   = "onetwo\n0\n0\n.\n..\nnew\n0:0\n1000:1000\n"
)

// TestMountOverlayLayers: an overlay of three hand-made layers, made with
// the new mount API (lowerdir+) and with mount(2)'s option string, applies
// the whiteouts and the opaque directory and stacks the layers in order;
// forty layers of long paths, past mount(2)'s page of options, mount with
// the new API and are refused with the old one saying why.
func TestMountOverlayLayers(t *testing.T) {
	containertest.Require(t)
	for _, m := range []struct {
		name  string
		mount func(lowers []string, upper, work, target string) error
	}{{"lowerdir+", container.MountOverlay}, {"options", container.MountOverlayOptions}} {
		t.Run(m.name, func(t *testing.T) {
			dir := t.TempDir()
			lowers := []string{filepath.Join(dir, "l0"), filepath.Join(dir, "l1"), filepath.Join(dir, "l2")}
			for i, files := range [][]handFile{handBase, handLayer1, handLayer2} {
				writeHandLayer(t, lowers[i], files)
			}
			root := mountTest(t, dir, lowers, m.mount)
			if b, err := os.ReadFile(filepath.Join(root, "etc/layer1")); err != nil || string(b) != "one" {
				t.Errorf("etc/layer1: %q, %v; want the upper layer's \"one\"", b, err)
			}
			if b, err := os.ReadFile(filepath.Join(root, "etc/base")); err != nil || string(b) != "zero" {
				t.Errorf("etc/base: %q, %v; want the base's \"zero\"", b, err)
			}
			for _, gone := range []string{"etc/gone", "bin/yes", "opt/opq/old"} {
				if _, err := os.Lstat(filepath.Join(root, gone)); !os.IsNotExist(err) {
					t.Errorf("%s: %v; want it deleted by the top layer", gone, err)
				}
			}
			if ents, err := os.ReadDir(filepath.Join(root, "opt/opq")); err != nil || len(ents) != 1 || ents[0].Name() != "new" {
				t.Errorf("opt/opq: %v, %v; want only \"new\" (opaque)", ents, err)
			}
		})
	}
	t.Run("many", func(t *testing.T) {
		dir := t.TempDir()
		long := strings.Repeat("d", 120)
		var lowers []string
		for i := range 40 {
			l := filepath.Join(dir, fmt.Sprintf("%s-%02d", long, i))
			writeHandLayer(t, l, []handFile{{path: "top", content: fmt.Sprint(i)}, {path: fmt.Sprintf("f%02d", i), content: "x"}})
			lowers = append(lowers, l)
		}
		err := container.MountOverlayOptions(lowers, filepath.Join(dir, "u"), filepath.Join(dir, "w"), dir)
		if err == nil || !strings.Contains(err.Error(), "lowerdir+") {
			t.Errorf("mount(2) of 40 layers of %d-byte paths: %v; want it refused, naming lowerdir+", len(lowers[0]), err)
		}
		root := mountTest(t, dir, lowers, container.MountOverlay)
		if b, err := os.ReadFile(filepath.Join(root, "top")); err != nil || string(b) != "39" {
			t.Errorf("top: %q, %v; want the top layer's \"39\"", b, err)
		}
		ents, err := os.ReadDir(root)
		if err != nil || len(ents) != 41 {
			t.Errorf("the root holds %d entries, %v; want every layer's own file and top", len(ents), err)
		}
	})
}

// mountTest mounts an overlay of lowers with mount in dir, unmounted at
// the end of t, and returns its root.
func mountTest(t *testing.T, dir string, lowers []string, mount func(lowers []string, upper, work, target string) error) string {
	t.Helper()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := mount(lowers, filepath.Join(dir, "upper"), filepath.Join(dir, "work"), root); err != nil {
		t.Fatalf("mounting the overlay of %d layers: %v", len(lowers), err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", root, err)
		}
	})
	return root
}

// layeredName is the name the tests import their three-layer image under.
const layeredName = "layered:test"

// layeredLayers is how many layers layeredName has: busybox's and two.
const layeredLayers = 3

// layeredImage imports layeredName into the store of a provider of opts
// (once per store and process: a store is shared by the tests) and
// returns its name. The image is busybox with handLayer1 and handLayer2
// appended as OCI layers, which the store unpacks layer by layer.
func layeredImage(t testing.TB, opts container.Options) string {
	t.Helper()
	dir := opts.Images
	if dir == "" {
		dir = filepath.Join(opts.StateDir, "images")
	}
	layered.Lock()
	defer layered.Unlock()
	if layered.imported[dir] {
		return layeredName
	}
	base, err := imagestoretest.BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, ociLayer(t, handLayer1), ociLayer(t, handLayer2))
	if err != nil {
		t.Fatal(err)
	}
	oci := ociLayout(t, img)
	store, err := imagestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.Import(ctxFor(t), oci, layeredName)
	if err != nil {
		t.Fatalf("importing the layered image: %v", err)
	}
	if len(got.Layers) != layeredLayers {
		t.Fatalf("the layered image has %d layers in the store: %v; want %d, one per layer of the image", len(got.Layers), got.Layers, layeredLayers)
	}
	if layered.imported == nil {
		layered.imported = map[string]bool{}
	}
	layered.imported[dir] = true
	return layeredName
}

// layered is which stores layeredImage imported the image into.
var layered struct {
	sync.Mutex
	imported map[string]bool
}

// ociLayer is files as an image layer carries them: a whiteout is an
// empty .wh.NAME beside the deleted path, an opaque directory holds
// .wh..wh..opq; parents come first, as directories of root.
func ociLayer(t testing.TB, files []handFile) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	made := map[string]bool{}
	write := func(h *tar.Header, content string) {
		h.ModTime, h.Size, h.Format = time.Unix(1, 0), int64(len(content)), tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, content); err != nil {
			t.Fatal(err)
		}
	}
	var mkdir func(dir string, uid int)
	mkdir = func(dir string, uid int) {
		if dir == "." || made[dir] {
			return
		}
		mkdir(filepath.Dir(dir), 0)
		made[dir] = true
		write(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: uid, Gid: uid}, "")
	}
	for _, f := range files {
		mkdir(filepath.Dir(f.path), 0)
		switch {
		case f.whiteout:
			write(&tar.Header{Name: filepath.Join(filepath.Dir(f.path), ".wh."+filepath.Base(f.path)), Typeflag: tar.TypeReg, Mode: 0o644}, "")
		case f.dir:
			mkdir(f.path, f.uid)
			if f.opaque {
				write(&tar.Header{Name: f.path + "/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644}, "")
			}
		default:
			write(&tar.Header{Name: f.path, Typeflag: tar.TypeReg, Mode: 0o644, Uid: f.uid, Gid: f.uid}, f.content)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return tarLayer(t, buf.Bytes())
}

// TestLayeredSession: a session on a three-layer image (busybox and two
// layers) sees the layers stacked, the whiteouts and the opaque directory
// applied; its files are the host's owners (host root's are root's, uid
// 1000's uid 1000's), remapped or not; when remapped, each layer is
// idmapped on its own in the bundle, and every one of those mounts is gone
// after the destroy.
func TestLayeredSession(t *testing.T) {
	forEachRuntimeMode(t, func(t *testing.T, p *testProvider) {
		sess := p.session(t, spec(layeredImage(t, p.opts), sandbox.NetworkNone))
		if out := mustSh(t, sess, layeredScript); out != layeredWant {
			t.Errorf("the layered root shows %q; want %q", out, layeredWant)
		}
		// Writes go to the session's upper layer, deleting through the
		// layers included.
		mustSh(t, sess, `rm /etc/layer1 && echo x > /opt/opq/old && rm -r /opt/opq/new`)
		if out := mustSh(t, sess, `ls /opt/opq; test -e /etc/layer1 || echo deleted`); out != "old\ndeleted\n" {
			t.Errorf("after writes: %q", out)
		}
		lower := filepath.Join(p.bundle(sess.ID()), "lower")
		mounted := unsMountsUnder(t, lower)
		if container.RemapsUsers(p.sb) {
			var want []string
			for i := range layeredLayers {
				want = append(want, filepath.Join(lower, fmt.Sprint(i)))
			}
			slices.Sort(mounted)
			if !slices.Equal(mounted, want) {
				t.Errorf("the idmapped layers mounted: %v; want %v", mounted, want)
			}
		} else if len(mounted) > 0 {
			t.Errorf("a session without a user namespace has idmapped layers: %v", mounted)
		}
		if err := sess.Destroy(ctxFor(t)); err != nil {
			t.Fatal(err)
		}
		if m := unsMountsUnder(t, p.bundle(sess.ID())); len(m) > 0 {
			t.Errorf("mounts left after the destroy: %v", m)
		}
	})
}

// TestLayeredRecover: a layered session comes back after a crash, its
// layers as they were, and its destroy unmounts them all; a layered
// session the new provider does not keep is removed with every one of its
// mounts.
func TestLayeredRecover(t *testing.T) {
	containertest.Require(t)
	for _, rt := range runtimes {
		for _, mode := range userNSModes {
			t.Run(rt+"/userns-"+string(mode), func(t *testing.T) {
				opts := recoverOptions(t, rt, mode)
				sbA, ledger, crash := crashable(t, opts)
				image := layeredImage(t, opts)
				kept := &crashSession{name: "kept", spec: spec(image, sandbox.NetworkNone)}
				makeCrashSession(t, sbA, kept)
				crash()

				sb, crashB := recoverWith(t, opts, ledger)
				sess, err := sb.GetSession(ctxFor(t), kept.id)
				if err != nil {
					t.Fatalf("GetSession after the recovery: %v", err)
				}
				if out := mustSh(t, sess, layeredScript); out != layeredWant {
					t.Errorf("the recovered root shows %q; want %q", out, layeredWant)
				}
				if err := sess.Destroy(ctxFor(t)); err != nil {
					t.Fatal(err)
				}
				if m := unsMountsUnder(t, filepath.Join(opts.StateDir, "container", "sessions", kept.id)); len(m) > 0 {
					t.Errorf("mounts left after the recovered session's destroy: %v", m)
				}
				// A layered session the next provider does not keep.
				left, err := sb.CreateSession(ctxFor(t), spec(image, sandbox.NetworkNone))
				if err != nil {
					t.Fatal(err)
				}
				leftID := left.ID()
				crashB()
				swept, err := container.New(opts) // no ledger: every session is removed
				if err != nil {
					t.Fatal(err)
				}
				if err := swept.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				bundle := filepath.Join(opts.StateDir, "container", "sessions", leftID)
				if m := unsMountsUnder(t, bundle); len(m) > 0 {
					t.Errorf("mounts left of a swept layered session: %v", m)
				}
				if _, err := os.Lstat(bundle); !os.IsNotExist(err) {
					t.Errorf("the swept session's bundle: %v; want it gone", err)
				}
			})
		}
	}
}

// recoverWith opens a provider of opts on ledger, recovering its sessions;
// it is closed at the end of t unless crash was called.
func recoverWith(t *testing.T, opts container.Options, ledger *kit.MemoryLedger) (sb *kit.Sandbox, crash func()) {
	t.Helper()
	opts.Ledger = ledger
	sb, err := container.New(opts)
	if err != nil {
		t.Fatalf("a new provider with the crashed one's ledger: %v", err)
	}
	crashed := false
	t.Cleanup(func() {
		if !crashed {
			_ = sb.Close(context.Background())
		}
	})
	return sb, func() { container.Crash(sb); crashed = true }
}

// TestLayeredRecoverOldLayout: a remapped session an earlier version made,
// its image idmapped as one mount at the bundle's "lower" (not lower/0..),
// is brought back after an upgrade and its destroy unmounts it; one that
// is not kept is removed with it.
func TestLayeredRecoverOldLayout(t *testing.T) {
	containertest.Require(t)
	unsRequireRemap(t)
	// runc: the mounts are in this process's namespace, where the test
	// can make the old layout.
	opts := recoverOptions(t, "runc", container.UserNamespaceOn)
	sbA, ledger, crash := crashable(t, opts)
	store, err := imagestore.Open(opts.Images)
	if err != nil {
		t.Fatal(err)
	}
	img, err := store.Get(containertest.Busybox)
	if err != nil {
		t.Fatal(err)
	}
	kept := &crashSession{name: "kept", spec: spec(containertest.Busybox, sandbox.NetworkNone)}
	makeCrashSession(t, sbA, kept)
	left, err := sbA.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkNone))
	if err != nil {
		t.Fatal(err)
	}
	crash()
	bundle := func(id string) string { return filepath.Join(opts.StateDir, "container", "sessions", id) }
	for _, id := range []string{kept.id, left.ID()} {
		lower := filepath.Join(bundle(id), "lower")
		if err := unix.Unmount(filepath.Join(lower, "0"), unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(lower, "0")); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(img.Layers[0], lower, "", unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(lower, unix.MNT_DETACH) }) // left by a failure only

	}
	// Only kept is in the ledger the new provider reads.
	if err := ledger.Delete(ctxFor(t), left.ID()); err != nil {
		t.Fatal(err)
	}
	sb, _ := recoverWith(t, opts, ledger)
	if m := unsMountsUnder(t, bundle(left.ID())); len(m) > 0 {
		t.Errorf("mounts left of a swept session of the old layout: %v", m)
	}
	sess, err := sb.GetSession(ctxFor(t), kept.id)
	if err != nil {
		t.Fatalf("GetSession after the recovery: %v", err)
	}
	if out := mustSh(t, sess, `cat /workspace/hello`); out != kept.token {
		t.Errorf("the recovered session's file: %q; want %q", out, kept.token)
	}
	if err := sess.Destroy(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if m := unsMountsUnder(t, bundle(kept.id)); len(m) > 0 {
		t.Errorf("mounts left after the destroy of a recovered session of the old layout: %v", m)
	}
	if _, err := os.Lstat(bundle(kept.id)); !os.IsNotExist(err) {
		t.Errorf("its bundle: %v; want it gone", err)
	}
}

// TestLeakLayered: sessions on a three-layer image (remapped: three
// idmapped layers each), created and destroyed four at a time, leave
// nothing behind: the leak census of TestLeakCycles.
func TestLeakLayered(t *testing.T) {
	forEachRuntimeMode(t, func(t *testing.T, p *testProvider) {
		warmUp(t, p)
		image := layeredImage(t, p.opts)
		base := takeBaseline(t)
		const cycles = 16
		ids := make([]string, cycles)
		var wg sync.WaitGroup
		for w := range leakWorkers {
			wg.Go(func() {
				for i := w; i < cycles; i += leakWorkers {
					// 2i+1: the places TestLeakCycles gives busybox in the mix.
					id, err := leakCycle(p, image, 2*i+1)
					ids[i] = id
					if err != nil {
						t.Errorf("cycle %d (session %s): %v", i, id, err)
					}
				}
			})
		}
		wg.Wait()
		checkNoLeaks(t, p, slices.DeleteFunc(ids, func(id string) bool { return id == "" }), base, true)
	})
}

// TestSharedLayerOverDifferentLowers: two images share their top layer X,
// which hard-links /etc/link to /etc/target, over middle layers with other
// targets; a session of the image imported second reads its own target
// through the link, not the first image's (the store once keyed X by its
// diffID alone, its copy of the target made over the first image's
// lowers).
func TestSharedLayerOverDifferentLowers(t *testing.T) {
	containertest.Require(t)
	p := newProvider(t, runtimes[0])
	dir := p.opts.Images
	if dir == "" {
		dir = filepath.Join(p.opts.StateDir, "images")
	}
	store, err := imagestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	base, err := imagestoretest.BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	x := hardLinkLayer(t, "etc/link", "etc/target")
	for _, content := range []string{"EVIL", "GOOD"} {
		img, err := mutate.AppendLayers(base, ociLayer(t, []handFile{{path: "etc/target", content: content}}), x)
		if err != nil {
			t.Fatal(err)
		}
		oci := ociLayout(t, img)
		if _, err := store.Import(ctxFor(t), oci, "chain-"+strings.ToLower(content)+":1"); err != nil {
			t.Fatal(err)
		}
	}
	sess := p.session(t, spec("chain-good:1", sandbox.NetworkNone))
	if out := mustSh(t, sess, `cat /etc/link`); out != "GOOD" {
		t.Errorf("a session of the second image reads /etc/link as %q, want its own GOOD", out)
	}
}

// hardLinkLayer is a layer of one hard link, name to target, its parent
// directory left implicit.
func hardLinkLayer(t testing.TB, name, target string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, ModTime: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return tarLayer(t, buf.Bytes())
}

// ociLayout writes img as an OCI layout in a temporary directory, for an
// import, and returns its path.
func ociLayout(t testing.TB, img v1.Image) string {
	t.Helper()
	oci := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(oci, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return oci
}
