package imagestore

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"golang.org/x/sys/unix"
)

// outsideDir is a directory a hostile archive aims at, holding one file,
// "target" ("precious"); assertUntouched checks it is as it was.
func outsideDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "target"), []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func assertUntouched(t *testing.T, outside string) {
	t.Helper()
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "target" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the archive wrote outside: %v", names)
	}
	fi, err := os.Stat(filepath.Join(outside, "target"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(outside, "target"))
	if string(b) != "precious" || fi.Mode() != 0o644 || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Errorf("the outside file changed: %q %v nlink %d", b, fi.Mode(), fi.Sys().(*syscall.Stat_t).Nlink)
	}
}

// TestHostileImports imports images with hostile layers through the whole
// pipeline (the store's addImage, then extractLayer).
func TestHostileImports(t *testing.T) {
	outside := outsideDir(t)
	climb := strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/")
	cases := []struct {
		name    string
		layer   []tent
		fail    string // "" for a successful import; else a part of the error
		checkFn func(t *testing.T, rootfs string)
	}{
		{name: "dotdot", layer: []tent{{name: "../escape", data: "x"}}, fail: "climbs out"},
		{name: "dotdot-inside", layer: []tent{{name: "a/../../escape", data: "x"}}, fail: "climbs out"},
		{name: "absolute", layer: []tent{{name: outside + "/abs", data: "x"}}, fail: "absolute"},
		{
			name:  "absolute-symlink-then-write-through",
			layer: []tent{{name: "evil", typ: tar.TypeSymlink, linkname: outside}, {name: "evil/pwned", data: "x"}},
			fail:  "is a symlink",
		},
		{
			name:  "relative-symlink-out-then-write-through",
			layer: []tent{{name: "up", typ: tar.TypeSymlink, linkname: climb}, {name: "up/pwned", data: "x"}},
			fail:  "is a symlink",
		},
		{name: "hardlink-climbing", layer: []tent{{name: "a/b/hl", typ: tar.TypeLink, linkname: "../target"}}, fail: "outside the image"},
		{name: "hardlink-absolute", layer: []tent{{name: "hl", typ: tar.TypeLink, linkname: outside + "/target"}}, fail: "outside the image"},
		{
			name:  "hardlink-through-symlink",
			layer: []tent{{name: "s", typ: tar.TypeSymlink, linkname: outside}, {name: "h", typ: tar.TypeLink, linkname: "s/target"}},
			fail:  "not a file of the image",
		},
		{name: "hardlink-to-missing", layer: []tent{{name: "h", typ: tar.TypeLink, linkname: "nothing"}}, fail: "neither its layer nor the layers below have"},
		{
			name: "devices-and-fifos-skipped",
			layer: []tent{
				{name: "dev", typ: tar.TypeDir}, {name: "dev/null", typ: tar.TypeChar, mode: 0o666},
				{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660}, {name: "fifo", typ: tar.TypeFifo}, {name: "ok", data: "ok"},
			},
			checkFn: func(t *testing.T, rootfs string) {
				for _, p := range []string{"dev/null", "dev/sda", "fifo"} {
					if _, err := os.Lstat(filepath.Join(rootfs, p)); !os.IsNotExist(err) {
						t.Errorf("%s: %v, want it skipped", p, err)
					}
				}
				if b, _ := os.ReadFile(filepath.Join(rootfs, "ok")); string(b) != "ok" {
					t.Errorf("ok: %q", b)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t)
			dir := layoutOf(t, "hostile", mkTar(t, c.layer...))
			if c.fail != "" {
				err := importErr(t, s, dir, "", ErrInvalidImage)
				if !strings.Contains(err.Error(), c.fail) {
					t.Errorf("error %q lacks %q", err, c.fail)
				}
			} else {
				img := mustImport(t, s, dir, "")
				c.checkFn(t, img.Layers[0])
			}
			assertUntouched(t, outside)
			assertClean(t, s)
		})
	}
}

// TestKeepsMetadata checks modes (setuid, setgid, sticky), owners and
// times, of files, directories and symlinks.
func TestKeepsMetadata(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("keeping owners needs root")
	}
	s := openStore(t)
	t1 := time.Date(2003, 4, 5, 6, 7, 8, 0, time.UTC)
	t2 := time.Date(2004, 5, 6, 7, 8, 9, 0, time.UTC)
	t3 := time.Date(2005, 6, 7, 8, 9, 10, 0, time.UTC)
	dir := layoutOf(t, "meta", mkTar(t,
		tent{name: "bin", typ: tar.TypeDir, mode: 0o755},
		tent{name: "bin/su", mode: 0o4755, uid: 1000, gid: 2000, mtime: t1, data: "su"},
		tent{name: "bin/wall", mode: 0o2755, uid: 0, gid: 5, mtime: t1, data: "wall"},
		tent{name: "data", typ: tar.TypeDir, mode: 0o2775, uid: 7, gid: 8, mtime: t2},
		tent{name: "data/f", mode: 0o600, uid: 7, gid: 8, data: "f"},
		tent{name: "scratch", typ: tar.TypeDir, mode: 0o1777, mtime: t2},
		tent{name: "link", typ: tar.TypeSymlink, linkname: "bin/su", uid: 5, gid: 6, mtime: t3},
	))
	img := mustImport(t, s, dir, "")
	for _, c := range []struct {
		path     string
		mode     os.FileMode
		uid, gid uint32
		mtime    time.Time
	}{
		{"bin/su", 0o755 | os.ModeSetuid, 1000, 2000, t1},
		{"bin/wall", 0o755 | os.ModeSetgid, 0, 5, t1},
		{"data", 0o775 | os.ModeSetgid | os.ModeDir, 7, 8, t2},
		{"scratch", 0o777 | os.ModeSticky | os.ModeDir, 0, 0, t2},
		{"link", 0o777 | os.ModeSymlink, 5, 6, t3},
	} {
		fi, err := os.Lstat(filepath.Join(img.Layers[0], c.path))
		if err != nil {
			t.Error(err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != c.mode || st.Uid != c.uid || st.Gid != c.gid || !fi.ModTime().Equal(c.mtime) {
			t.Errorf("%s: %v %d:%d %v, want %v %d:%d %v", c.path, fi.Mode(), st.Uid, st.Gid, fi.ModTime(), c.mode, c.uid, c.gid, c.mtime)
		}
	}
}

// TestWhiteoutsAndLinksAcrossLayers imports a two-layer image and stacks
// its layers in a real overlayfs: whiteouts and opaque directories hide
// lower files, an upper file wins, and a hard link in an upper layer
// reaches its lower target.
func TestWhiteoutsAndLinksAcrossLayers(t *testing.T) {
	needRoot(t, "opaque directories (trusted.* xattrs) and mounting overlayfs")
	s := openStore(t)
	lower := mkTar(t,
		tent{name: "a", typ: tar.TypeDir}, tent{name: "a/x", data: "x"}, tent{name: "a/y", data: "y"},
		tent{name: "b", typ: tar.TypeDir}, tent{name: "b/z", data: "z"},
		tent{name: "o", typ: tar.TypeDir}, tent{name: "o/old", data: "old"},
		tent{name: "same", data: "lower"}, tent{name: "orig", data: "shared"},
	)
	upper := mkTar(t,
		tent{name: "a/.wh.x"}, tent{name: ".wh.b"},
		tent{name: "o", typ: tar.TypeDir}, tent{name: "o/.wh..wh..opq"}, tent{name: "o/new", data: "new"},
		tent{name: "same", data: "upper"}, tent{name: "hl", typ: tar.TypeLink, linkname: "orig"},
	)
	img := mustImport(t, s, layoutOf(t, "layers", lower, upper), "")
	if len(img.Layers) != 2 {
		t.Fatalf("layers %v, want 2", img.Layers)
	}
	visible(t, mountOverlay(t, img.Layers...),
		map[string]string{"a/y": "y", "o/new": "new", "same": "upper", "hl": "shared", "orig": "shared"},
		[]string{"a/x", "b", "o/old", "a/.wh.x", ".wh.b", "o/.wh..wh..opq"})
	assertClean(t, s)
}

// TestExtractTarHostile feeds hostile tars straight to the extractor,
// without mutate.Extract's filtering in front.
func TestExtractTarHostile(t *testing.T) {
	outside := outsideDir(t)
	climb := strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/")
	for _, c := range []struct {
		name  string
		ents  []tent
		fail  string // "" for success
		check func(t *testing.T, dest string)
	}{
		{name: "absolute-symlink-write-through", ents: []tent{{name: "evil", typ: tar.TypeSymlink, linkname: outside}, {name: "evil/pwned", data: "x"}}, fail: "is a symlink"},
		{name: "relative-symlink-write-through", ents: []tent{{name: "up", typ: tar.TypeSymlink, linkname: climb}, {name: "up/pwned", data: "x"}}, fail: "is a symlink"},
		{name: "inner-symlink-write-through", ents: []tent{{name: "sub", typ: tar.TypeDir}, {name: "s", typ: tar.TypeSymlink, linkname: "sub"}, {name: "s/x", data: "x"}}, fail: "is a symlink"},
		{name: "dir-over-symlink", ents: []tent{{name: "d", typ: tar.TypeSymlink, linkname: outside}, {name: "d", typ: tar.TypeDir}, {name: "d/f", data: "x"}}, fail: "is a symlink"},
		{name: "file-over-symlink", ents: []tent{{name: "f", typ: tar.TypeSymlink, linkname: outside + "/target"}, {name: "f", data: "overwrite"}},
			check: func(t *testing.T, dest string) {
				if l, _ := os.Readlink(filepath.Join(dest, "f")); l != outside+"/target" {
					t.Errorf("f -> %q: want the first entry kept", l)
				}
			}},
		{name: "hardlink-to-dir", ents: []tent{{name: "d", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, linkname: "d"}}, fail: "not a file"},
		{name: "hardlink-through-relative-symlink", ents: []tent{{name: "up", typ: tar.TypeSymlink, linkname: climb}, {name: "h", typ: tar.TypeLink, linkname: "up/target"}}, fail: "not a file of the image"},
		{name: "hardlink-climbing", ents: []tent{{name: "h", typ: tar.TypeLink, linkname: "../target"}}, fail: "outside the image"},
		{name: "hardlink-chain-out-of-order", ents: []tent{{name: "c", typ: tar.TypeLink, linkname: "b"}, {name: "b", typ: tar.TypeLink, linkname: "a"}, {name: "a", data: "a"}},
			check: func(t *testing.T, dest string) {
				a, _ := os.Stat(filepath.Join(dest, "a"))
				c, _ := os.Stat(filepath.Join(dest, "c"))
				if !os.SameFile(a, c) {
					t.Error("c is not a hard link of a")
				}
			}},
		{name: "hardlink-cycle", ents: []tent{{name: "x", typ: tar.TypeLink, linkname: "y"}, {name: "y", typ: tar.TypeLink, linkname: "x"}}, fail: "does not have"},
		{name: "file-as-root", ents: []tent{{name: ".", data: "x"}}, fail: "root directory"},
		{name: "root-dir-mode", ents: []tent{{name: "./", typ: tar.TypeDir, mode: 0o751}},
			check: func(t *testing.T, dest string) {
				if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o751 {
					t.Errorf("root mode %v, want 0751", fi.Mode())
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dest := t.TempDir()
			err := extractTar(context.Background(), bytes.NewReader(mkTar(t, c.ents...)), dest, extractOptions{keepLinks: true})
			switch {
			case c.fail == "" && err != nil:
				t.Fatal(err)
			case c.fail != "" && (!errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), c.fail)):
				t.Fatalf("error %v, want ErrInvalidImage saying %q", err, c.fail)
			case c.check != nil:
				c.check(t, dest)
			}
			assertUntouched(t, outside)
		})
	}
}

// TestExtractPlainSkipsLinks checks the mode used to unpack an OCI layout
// from a tar: no symlinks or hard links, so reading a blob can never
// follow one out.
func TestExtractPlainSkipsLinks(t *testing.T) {
	dest := t.TempDir()
	b := mkTar(t,
		tent{name: "blobs/sha256/aa", typ: tar.TypeSymlink, linkname: "/etc/passwd"},
		tent{name: "blobs/sha256/bb", data: "blob"},
		tent{name: "blobs/sha256/cc", typ: tar.TypeLink, linkname: "blobs/sha256/bb"},
	)
	if err := extractTar(context.Background(), bytes.NewReader(b), dest, extractOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"aa", "cc"} {
		if _, err := os.Lstat(filepath.Join(dest, "blobs/sha256", p)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want it skipped", p, err)
		}
	}
}

// layerTar is a layer's tar made of headers, each followed by its data.
type layerEnt struct {
	hdr  *tar.Header
	data string
}

// mkLayerTar writes ents as a tar; a header's Size is its data's, and a
// zero ModTime a fixed one.
func mkLayerTar(t testing.TB, ents ...layerEnt) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := *e.hdr
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
		}
		h.Size = int64(len(e.data))
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// unpackLayer extracts a layer made of ents into a new directory, keeping
// owners as root.
func unpackLayer(t *testing.T, ents ...tent) (string, []crossLink) {
	t.Helper()
	dest := t.TempDir()
	links, err := extractLayer(context.Background(), bytes.NewReader(mkTar(t, ents...)), dest, layerOptions{keepOwners: os.Geteuid() == 0})
	if err != nil {
		t.Fatalf("extractLayer: %v", err)
	}
	return dest, links
}

// assertEmpty checks that a failed extraction left nothing in dir.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left in the layer: %s", e.Name())
	}
}

// needRoot skips a test, saying why, when not run as root.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("%s needs root", why)
	}
}

// mountOverlay mounts a read-only overlayfs of layers (lowest first) and
// returns its directory, unmounted at the test's end.
func mountOverlay(t *testing.T, layers ...string) string {
	t.Helper()
	needRoot(t, "mounting overlayfs")
	mnt := t.TempDir()
	lower := slices.Clone(layers)
	slices.Reverse(lower)
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// visible checks what the overlay at mnt shows: each of want's paths with
// its content ("" for a directory), and none of gone's.
func visible(t *testing.T, mnt string, want map[string]string, gone []string) {
	t.Helper()
	for p, content := range want {
		fi, err := os.Lstat(filepath.Join(mnt, p))
		if err != nil {
			t.Errorf("%s: %v, want it visible", p, err)
			continue
		}
		if content == "" {
			if !fi.IsDir() {
				t.Errorf("%s: %v, want a directory", p, fi.Mode())
			}
			continue
		}
		if b, err := os.ReadFile(filepath.Join(mnt, p)); err != nil || string(b) != content {
			t.Errorf("%s: %q %v, want %q", p, b, err, content)
		}
	}
	for _, p := range gone {
		if _, err := os.Lstat(filepath.Join(mnt, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it hidden", p, err)
		}
	}
}

// TestExtractLayerHostile feeds hostile layers to extractLayer: nothing
// outside the layer is touched, and a refused layer leaves nothing.
func TestExtractLayerHostile(t *testing.T) {
	outside := outsideDir(t)
	climb := strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/")
	for _, c := range []struct {
		name  string
		ents  []tent
		fail  string // "" for success
		check func(t *testing.T, dest string, links []crossLink)
	}{
		{name: "dotdot", ents: []tent{{name: "ok", data: "x"}, {name: "../escape", data: "x"}}, fail: "climbs out"},
		{name: "dotdot-inside", ents: []tent{{name: "a/../../escape", data: "x"}}, fail: "climbs out"},
		{name: "absolute", ents: []tent{{name: outside + "/abs", data: "x"}}, fail: "absolute"},
		{name: "absolute-symlink-write-through", ents: []tent{{name: "evil", typ: tar.TypeSymlink, linkname: outside}, {name: "evil/pwned", data: "x"}}, fail: "is a symlink"},
		{name: "relative-symlink-write-through", ents: []tent{{name: "up", typ: tar.TypeSymlink, linkname: climb}, {name: "up/pwned", data: "x"}}, fail: "is a symlink"},
		{name: "symlink-then-file-replaces-it", ents: []tent{{name: "f", typ: tar.TypeSymlink, linkname: outside + "/target"}, {name: "f", data: "mine"}},
			check: func(t *testing.T, dest string, _ []crossLink) {
				if fi, _ := os.Lstat(filepath.Join(dest, "f")); fi == nil || !fi.Mode().IsRegular() {
					t.Errorf("f: %v, want the later entry, a file, in place of the symlink", fi)
				}
			}},
		{name: "whiteout-through-symlink", ents: []tent{{name: "evil", typ: tar.TypeSymlink, linkname: outside}, {name: "evil/.wh.target"}}, fail: "is a symlink"},
		{name: "opaque-through-symlink", ents: []tent{{name: "evil", typ: tar.TypeSymlink, linkname: outside}, {name: "evil/.wh..wh..opq"}}, fail: "is a symlink"},
		{name: "whiteout-of-dotdot", ents: []tent{{name: "a/.wh.."}}, fail: "no name"},
		{name: "hardlink-climbing", ents: []tent{{name: "h", typ: tar.TypeLink, linkname: "../target"}}, fail: "outside the image"},
		{name: "hardlink-absolute", ents: []tent{{name: "h", typ: tar.TypeLink, linkname: outside + "/target"}}, fail: "outside the image"},
		{name: "hardlink-through-symlink", ents: []tent{{name: "s", typ: tar.TypeSymlink, linkname: outside}, {name: "h", typ: tar.TypeLink, linkname: "s/target"}}, fail: "not a file of the image"},
		{name: "hardlink-to-dir", ents: []tent{{name: "d", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, linkname: "d"}}, fail: "not a file"},
		{name: "hardlink-to-whiteout", ents: []tent{{name: ".wh.x"}, {name: "h", typ: tar.TypeLink, linkname: "x"}}, fail: "this layer deletes"},
		{name: "dir-then-file", ents: []tent{{name: "d", typ: tar.TypeDir}, {name: "d/in", data: "x"}, {name: "d", data: "x"}}, fail: "a directory, then a non-directory"},
		{name: "devices-and-fifos-skipped", ents: []tent{
			{name: "dev/null", typ: tar.TypeChar, mode: 0o666}, {name: "dev/sda", typ: tar.TypeBlock, mode: 0o660},
			{name: "fifo", typ: tar.TypeFifo}, {name: "ok", data: "ok"},
		}, check: func(t *testing.T, dest string, _ []crossLink) {
			for _, p := range []string{"dev/null", "dev/sda", "fifo"} {
				if _, err := os.Lstat(filepath.Join(dest, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s: %v, want it skipped", p, err)
				}
			}
		}},
		{name: "hardlink-to-a-lower-layer", ents: []tent{{name: "x", data: "x"}, {name: "in", typ: tar.TypeLink, linkname: "x"}, {name: "a/h", typ: tar.TypeLink, linkname: "./usr/bin/../bin/sh"}},
			check: func(t *testing.T, dest string, links []crossLink) {
				if links = hardLinks(links); len(links) != 1 || links[0].name != "a/h" || links[0].target != "usr/bin/sh" {
					t.Errorf("cross-layer links %+v, want a/h -> usr/bin/sh", links)
				}
				a, _ := os.Stat(filepath.Join(dest, "x"))
				b, _ := os.Stat(filepath.Join(dest, "in"))
				if !os.SameFile(a, b) {
					t.Error("in is not a hard link of x")
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dest := t.TempDir()
			links, err := extractLayer(context.Background(), bytes.NewReader(mkTar(t, c.ents...)), dest, layerOptions{})
			switch {
			case c.fail == "" && err != nil:
				t.Fatal(err)
			case c.fail != "" && (!errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), c.fail)):
				t.Fatalf("error %v, want ErrInvalidImage saying %q", err, c.fail)
			case c.fail != "":
				assertEmpty(t, dest)
			case c.check != nil:
				c.check(t, dest, links)
			}
			assertUntouched(t, outside)
		})
	}
}

// TestExtractLayerWhiteoutFormat checks the layer on disk: a whiteout is
// a 0:0 character device (unprivileged), aufs metadata is skipped, and an
// opaque directory has overlayfs's xattr (root) or is refused saying it
// needs root.
func TestExtractLayerWhiteoutFormat(t *testing.T) {
	dest, _ := unpackLayer(t, tent{name: "a/.wh.gone"}, tent{name: ".wh..wh.plnk", data: "aufs"}, tent{name: "a/kept", data: "k"})
	fi, err := os.Lstat(filepath.Join(dest, "a/gone"))
	if err != nil || !isWhiteout(fi) {
		t.Errorf("a/gone: %v %v, want a 0:0 character device", fi, err)
	}
	for _, p := range []string{"a/.wh.gone", ".wh..wh.plnk", "plnk"} {
		if _, err := os.Lstat(filepath.Join(dest, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want nothing", p, err)
		}
	}

	ents := []tent{{name: "o/.wh..wh..opq"}, {name: "o/new", data: "n"}}
	if os.Geteuid() != 0 {
		dest := t.TempDir()
		_, err := extractLayer(context.Background(), bytes.NewReader(mkTar(t, ents...)), dest, layerOptions{})
		if err == nil || !strings.Contains(err.Error(), "needs root") {
			t.Fatalf("an opaque directory as %d: %v, want an error saying it needs root", os.Geteuid(), err)
		}
		assertEmpty(t, dest)
		return
	}
	dest, _ = unpackLayer(t, ents...)
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(dest, "o"), opaqueXattr, buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("o: %s=%q %v, want y", opaqueXattr, buf[:n], err)
	}
}

// TestLayersStackInOverlayfs unpacks three layers and mounts them as a
// real overlayfs: whiteouts and opaque directories hide what is below,
// and a whiteout of a name its own layer has too only applies below.
func TestLayersStackInOverlayfs(t *testing.T) {
	needRoot(t, "opaque directories (trusted.* xattrs) and mounting overlayfs")
	bottom, _ := unpackLayer(t,
		tent{name: "a", typ: tar.TypeDir}, tent{name: "a/x", data: "x"}, tent{name: "a/y", data: "y"},
		tent{name: "b", typ: tar.TypeDir}, tent{name: "b/z", data: "z"},
		tent{name: "o", typ: tar.TypeDir}, tent{name: "o/old", data: "old"}, tent{name: "o/sub/deep", data: "deep"},
		tent{name: "c/old", data: "c-old"}, tent{name: "d", data: "d-bottom"}, tent{name: "e/old", data: "e-old"},
		tent{name: "f/old", data: "f-old"}, tent{name: "same", data: "bottom"}, tent{name: "back", data: "bottom"},
	)
	mid, _ := unpackLayer(t,
		tent{name: "a", typ: tar.TypeDir}, tent{name: "a/.wh.x"}, tent{name: ".wh.b"}, tent{name: ".wh.back"},
		tent{name: "o", typ: tar.TypeDir}, tent{name: "o/.wh..wh..opq"}, tent{name: "o/new", data: "new"},
		tent{name: "same", data: "mid"},
	)
	top, _ := unpackLayer(t,
		// Both orders of "the layer's own c (a directory) and its whiteout".
		tent{name: "c", typ: tar.TypeDir}, tent{name: "c/new", data: "c-new"}, tent{name: ".wh.c"},
		tent{name: ".wh.e"}, tent{name: "e", typ: tar.TypeDir}, tent{name: "e/new", data: "e-new"},
		// And of a file.
		tent{name: "d", data: "d-top"}, tent{name: ".wh.d"},
		tent{name: ".wh.f"}, tent{name: "f", data: "f-top"},
		tent{name: "back", data: "top"}, // back again after mid deleted it
	)
	mnt := mountOverlay(t, bottom, mid, top)
	visible(t, mnt, map[string]string{
		"a/y": "y", "o/new": "new", "same": "mid", "back": "top",
		"c/new": "c-new", "e/new": "e-new", "d": "d-top", "f": "f-top",
	}, []string{"a/x", "b", "o/old", "o/sub", "c/old", "e/old", "a/.wh.x", ".wh.b", "o/.wh..wh..opq", ".wh.c", ".wh.d"})
}

// TestLinkFromLowers checks hard links to files of the layers below: a
// copy of the topmost one (content and metadata), never a link into
// another layer, and the hostile ones refused.
func TestLinkFromLowers(t *testing.T) {
	mtime := time.Date(2010, 1, 2, 3, 4, 5, 0, time.UTC)
	bottom, _ := unpackLayer(t,
		tent{name: "bin/tool", data: "old tool"}, tent{name: "etc/conf", data: "conf"},
		tent{name: "gone", data: "g"}, tent{name: "dir/f", data: "f"}, tent{name: "hidden/f", data: "f"},
	)
	mid, _ := unpackLayer(t,
		tent{name: "bin/tool", data: "tool", mode: 0o4755, uid: 3, gid: 4, mtime: mtime},
		tent{name: "bin/sh", typ: tar.TypeSymlink, linkname: "tool"},
		tent{name: "out", typ: tar.TypeSymlink, linkname: "/etc"},
		tent{name: ".wh.gone"},
	)
	top, links := unpackLayer(t,
		tent{name: "usr", typ: tar.TypeDir, mtime: mtime}, tent{name: "usr/bin", typ: tar.TypeDir, mtime: mtime},
		tent{name: "usr/bin/tool", typ: tar.TypeLink, linkname: "bin/tool"},
		tent{name: "usr/bin/tool2", typ: tar.TypeLink, linkname: "usr/bin/tool"},
		tent{name: "sh", typ: tar.TypeLink, linkname: "bin/sh"},
		tent{name: "conf", typ: tar.TypeLink, linkname: "etc/conf"},
	)
	if n := len(hardLinks(links)); n != 4 {
		t.Fatalf("cross-layer links %+v, want 4", links)
	}
	if err := linkFromLowers(top, []string{bottom, mid}, links); err != nil {
		t.Fatal(err)
	}
	src, _ := os.Lstat(filepath.Join(mid, "bin/tool"))
	for _, p := range []string{"usr/bin/tool", "usr/bin/tool2"} {
		fi, err := os.Lstat(filepath.Join(top, p))
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(top, p)); string(b) != "tool" {
			t.Errorf("%s: %q, want mid's bin/tool", p, b)
		}
		if os.SameFile(fi, src) {
			t.Errorf("%s is a hard link into the layer below, want a copy", p)
		}
		if fi.Mode() != 0o755|os.ModeSetuid || !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: %v %v, want %v %v", p, fi.Mode(), fi.ModTime(), 0o755|os.ModeSetuid, mtime)
		}
		if st := fi.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && (st.Uid != 3 || st.Gid != 4) {
			t.Errorf("%s: owner %d:%d, want 3:4", p, st.Uid, st.Gid)
		}
	}
	a, _ := os.Lstat(filepath.Join(top, "usr/bin/tool"))
	b, _ := os.Lstat(filepath.Join(top, "usr/bin/tool2"))
	if !os.SameFile(a, b) {
		t.Error("usr/bin/tool2 is not a hard link of usr/bin/tool (both in the layer)")
	}
	if l, err := os.Readlink(filepath.Join(top, "sh")); err != nil || l != "tool" {
		t.Errorf("sh -> %q %v, want a copy of the symlink bin/sh (-> tool)", l, err)
	}
	if b, _ := os.ReadFile(filepath.Join(top, "conf")); string(b) != "conf" {
		t.Errorf("conf: %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(top, "usr/bin")); !fi.ModTime().Equal(mtime) {
		t.Errorf("usr/bin: mtime %v, want the tar's %v (kept while the copies went in)", fi.ModTime(), mtime)
	}

	for _, c := range []struct {
		name   string
		target string
		lowers []string
		fail   string
	}{
		{"whited-out", "gone", []string{bottom, mid}, "a layer deletes"},
		{"missing", "nothing", []string{bottom, mid}, "neither its layer nor the layers below"},
		{"no-lowers", "etc/conf", nil, "neither its layer nor the layers below"},
		{"through-symlink", "out/passwd", []string{bottom, mid}, "is a symlink or not a directory"},
		{"directory", "dir", []string{bottom, mid}, "not a file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dest, links := unpackLayer(t, tent{name: "h", typ: tar.TypeLink, linkname: c.target})
			err := linkFromLowers(dest, c.lowers, links)
			if !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), c.fail) {
				t.Fatalf("error %v, want ErrInvalidImage saying %q", err, c.fail)
			}
		})
	}
	t.Run("cycle", func(t *testing.T) {
		dest, links := unpackLayer(t, tent{name: "x", typ: tar.TypeLink, linkname: "y"}, tent{name: "y", typ: tar.TypeLink, linkname: "x"})
		if err := linkFromLowers(dest, []string{bottom}, links); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "cycle") {
			t.Fatalf("error %v, want a cycle refused", err)
		}
	})
	t.Run("hidden-by-opaque-dir", func(t *testing.T) {
		needRoot(t, "an opaque directory (trusted.* xattrs)")
		opq, _ := unpackLayer(t, tent{name: "hidden/.wh..wh..opq"})
		dest, links := unpackLayer(t, tent{name: "h", typ: tar.TypeLink, linkname: "hidden/f"})
		if err := linkFromLowers(dest, []string{bottom, opq}, links); !errors.Is(err, ErrInvalidImage) || !strings.Contains(err.Error(), "neither") {
			t.Fatalf("error %v, want the target hidden by the opaque directory", err)
		}
	})
	t.Run("budget", func(t *testing.T) {
		big, _ := unpackLayer(t, tent{name: "big", size: 2 << 20})
		dest := t.TempDir()
		links, err := extractLayer(context.Background(), bytes.NewReader(mkTar(t, tent{name: "h1", typ: tar.TypeLink, linkname: "big"}, tent{name: "h2", typ: tar.TypeLink, linkname: "big"})), dest, layerOptions{budget: newBudget(3 << 20)})
		if err != nil {
			t.Fatal(err)
		}
		if err := linkFromLowers(dest, []string{big}, links); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("two 2 MiB copies under a 3 MiB budget: %v, want ErrTooLarge", err)
		}
	})
}

// hardLinks are the hard links of links (not the implicit directories).
func hardLinks(links []crossLink) []crossLink {
	return slices.DeleteFunc(slices.Clone(links), func(c crossLink) bool { return c.dir })
}

// TestImplicitDirsFromBelow checks that the directories a layer's tar does
// not list (its root included) show the attributes they have below, not
// those they were made with, through a real overlayfs too.
func TestImplicitDirsFromBelow(t *testing.T) {
	t1 := time.Date(2006, 1, 2, 3, 4, 5, 0, time.UTC)
	t2 := time.Date(2007, 1, 2, 3, 4, 5, 0, time.UTC)
	bottom, links := unpackLayer(t,
		tent{name: "./", typ: tar.TypeDir, mode: 0o751, mtime: t1},
		tent{name: "tmp", typ: tar.TypeDir, mode: 0o1777, mtime: t1, uid: 0},
		tent{name: "a", typ: tar.TypeDir, mode: 0o750, uid: 5, gid: 6, mtime: t1}, tent{name: "a/x", data: "x"},
		tent{name: "f", data: "f"},
	)
	if len(links) != 0 {
		t.Fatalf("a layer listing its directories: %+v, want nothing to complete", links)
	}
	top, links := unpackLayer(t,
		tent{name: "tmp/new", data: "n"}, tent{name: "a/.wh.x"},
		tent{name: "f/in", data: "a directory where a file was"},
		tent{name: "n/m/new", data: "n", mtime: t2}, // no such directory below
	)
	if err := linkFromLowers(top, []string{bottom}, links); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		path     string
		mode     os.FileMode
		uid, gid uint32
	}{{".", 0o751, 0, 0}, {"tmp", 0o777 | os.ModeSticky, 0, 0}, {"a", 0o750, 5, 6}}
	check := func(dir string) {
		for _, c := range want {
			fi, err := os.Stat(filepath.Join(dir, c.path))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm()|fi.Mode()&os.ModeSticky != c.mode || !fi.ModTime().Equal(t1) {
				t.Errorf("%s/%s: %v %v, want %v %v", dir, c.path, fi.Mode(), fi.ModTime(), c.mode, t1)
			}
			if os.Geteuid() == 0 && (st.Uid != c.uid || st.Gid != c.gid) {
				t.Errorf("%s/%s: owner %d:%d, want %d:%d", dir, c.path, st.Uid, st.Gid, c.uid, c.gid)
			}
		}
	}
	check(top)
	for _, p := range []string{"f", "n", "n/m"} {
		if fi, _ := os.Stat(filepath.Join(top, p)); fi.Mode().Perm() != 0o755 || fi.ModTime().Equal(t1) {
			t.Errorf("%s: %v %v, want a directory of its own (0755)", p, fi.Mode(), fi.ModTime())
		}
	}
	if os.Geteuid() == 0 {
		check(mountOverlay(t, bottom, top))
	}
}

// zeroTar is a tar stream of one file of size zero bytes, made as it is
// read, and counts the bytes read of it.
type zeroTar struct {
	r    io.Reader
	read atomic.Int64
}

func newZeroTar(t testing.TB, name string, size int64) *zeroTar {
	t.Helper()
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: time.Unix(1e9, 0)}); err != nil {
		t.Fatal(err)
	}
	pad := (512 - size%512) % 512
	return &zeroTar{r: io.MultiReader(&hdr, io.LimitReader(zeros{}, size+pad+1024))}
}

func (z *zeroTar) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	z.read.Add(int64(n))
	return n, err
}

// TestExtractLayerSparse checks that zeros cost no disk and that the
// budget counts a file's apparent size, before writing it.
func TestExtractLayerSparse(t *testing.T) {
	const size = 10 << 30
	t.Run("10GiB-under-20GiB", func(t *testing.T) {
		dest := t.TempDir()
		if _, err := extractLayer(context.Background(), newZeroTar(t, "sparse", size), dest, layerOptions{budget: newBudget(20 << 30)}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(dest, "sparse"))
		if err != nil {
			t.Fatal(err)
		}
		if blocks := fi.Sys().(*syscall.Stat_t).Blocks; fi.Size() != size || blocks*512 > 1<<20 {
			t.Errorf("sparse: size %d, %d bytes on disk; want %d and about none", fi.Size(), blocks*512, int64(size))
		}
	})
	t.Run("10GiB-under-1GiB", func(t *testing.T) {
		dest := t.TempDir()
		z := newZeroTar(t, "sparse", size)
		_, err := extractLayer(context.Background(), z, dest, layerOptions{budget: newBudget(1 << 30)})
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "1 GiB") || !strings.Contains(err.Error(), "--max-image-size") {
			t.Fatalf("error %v, want ErrTooLarge naming the 1 GiB limit and --max-image-size", err)
		}
		if n := z.read.Load(); n > 1<<20 {
			t.Errorf("read %d bytes of the layer before refusing it", n)
		}
		assertEmpty(t, dest)
	})
	t.Run("data-and-holes", func(t *testing.T) {
		// Data, a 96 KiB run of zeros (at least two aligned blocks), data,
		// a short run of zeros (kept), data, trailing zeros.
		var want bytes.Buffer
		want.Write(bytes.Repeat([]byte("a"), 10<<10))
		want.Write(make([]byte, 96<<10))
		want.Write(bytes.Repeat([]byte("b"), 100))
		want.Write(make([]byte, 1000))
		want.Write(bytes.Repeat([]byte("c"), 3<<20))
		want.Write(make([]byte, 5<<20))
		dest, _ := unpackLayer(t, tent{name: "f", data: want.String()})
		got, err := os.ReadFile(filepath.Join(dest, "f"))
		if err != nil || !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("f: %d bytes %v, want the %d written (equal: %v)", len(got), err, want.Len(), bytes.Equal(got, want.Bytes()))
		}
		fi, _ := os.Stat(filepath.Join(dest, "f"))
		if onDisk := fi.Sys().(*syscall.Stat_t).Blocks * 512; onDisk > 4<<20 {
			t.Errorf("f takes %d bytes on disk, want its ~3 MiB of data and holes for the rest", onDisk)
		}
	})
	t.Run("shared-budget", func(t *testing.T) {
		// Two layers of one image, unpacked at once, share its budget.
		b := newBudget(1 << 30)
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				_, err := extractLayer(context.Background(), newZeroTar(t, "f", 600<<20), t.TempDir(), layerOptions{budget: b})
				errs <- err
			}()
		}
		e1, e2 := <-errs, <-errs
		if (e1 == nil) == (e2 == nil) || !errors.Is(cmp.Or(e1, e2), ErrTooLarge) {
			t.Errorf("two 600 MiB layers under one 1 GiB budget: %v, %v; want one ErrTooLarge", e1, e2)
		}
	})
}

// TestExtractLayerDiskFull unpacks a layer bigger than the filesystem it
// goes to, a small tmpfs.
func TestExtractLayerDiskFull(t *testing.T) {
	needRoot(t, "mounting a tmpfs")
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	dest := filepath.Join(mnt, "layer")
	if err := os.Mkdir(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("data"), 4<<20) // 16 MiB, no zeros to leave as holes
	_, err := extractLayer(context.Background(), bytes.NewReader(mkTar(t, tent{name: "small", data: "s"}, tent{name: "big", data: string(data)})), dest, layerOptions{})
	if !errors.Is(err, ErrDiskFull) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dest) || !strings.Contains(err.Error(), "free space") {
		t.Fatalf("error %v, want ErrDiskFull (and ENOSPC) naming %s and what to do", err, dest)
	}
	assertEmpty(t, dest)
}

// TestExtractLayerMetadata checks what a layer keeps of its entries:
// modes (setuid, setgid, sticky), owners (as root), times, and the kept
// extended attributes.
func TestExtractLayerMetadata(t *testing.T) {
	root := os.Geteuid() == 0
	t1 := time.Date(2003, 4, 5, 6, 7, 8, 0, time.UTC)
	t2 := time.Date(2004, 5, 6, 7, 8, 9, 0, time.UTC)
	// cap_net_raw, effective: a VFS_CAP_REVISION_2 value.
	capNetRaw := string([]byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	xattrs := map[string]string{
		paxXattrPrefix + "user.note":              "kept",
		paxXattrPrefix + "user.overlay.opaque":    "y",
		paxXattrPrefix + "trusted.overlay.opaque": "y",
		paxXattrPrefix + "security.selinux":       "system_u:object_r:bin_t:s0",
		paxXattrPrefix + "security.capability":    capNetRaw,
	}
	b := mkLayerTar(t,
		layerEnt{hdr: &tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: t2}},
		layerEnt{hdr: &tar.Header{Name: "bin/su", Mode: 0o4755, Uid: 1000, Gid: 2000, ModTime: t1}, data: "su"},
		layerEnt{hdr: &tar.Header{Name: "bin/ping", Mode: 0o755, ModTime: t1, PAXRecords: xattrs}, data: "ping"},
		layerEnt{hdr: &tar.Header{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o2775, Uid: 7, Gid: 8, ModTime: t2, PAXRecords: map[string]string{paxXattrPrefix + "user.dir": "d"}}},
		layerEnt{hdr: &tar.Header{Name: "scratch/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: t2}},
		layerEnt{hdr: &tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "bin/su", Uid: 5, Gid: 6, ModTime: t1}},
	)
	dest := t.TempDir()
	if _, err := extractLayer(context.Background(), bytes.NewReader(b), dest, layerOptions{keepOwners: root}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path     string
		mode     os.FileMode
		uid, gid uint32
		mtime    time.Time
	}{
		{"bin", 0o755 | os.ModeDir, 0, 0, t2},
		{"bin/su", 0o755 | os.ModeSetuid, 1000, 2000, t1},
		{"data", 0o775 | os.ModeSetgid | os.ModeDir, 7, 8, t2},
		{"scratch", 0o777 | os.ModeSticky | os.ModeDir, 0, 0, t2},
		{"link", 0o777 | os.ModeSymlink, 5, 6, t1},
	} {
		fi, err := os.Lstat(filepath.Join(dest, c.path))
		if err != nil {
			t.Error(err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != c.mode || !fi.ModTime().Equal(c.mtime) {
			t.Errorf("%s: %v %v, want %v %v", c.path, fi.Mode(), fi.ModTime(), c.mode, c.mtime)
		}
		if root && (st.Uid != c.uid || st.Gid != c.gid) {
			t.Errorf("%s: owner %d:%d, want %d:%d", c.path, st.Uid, st.Gid, c.uid, c.gid)
		}
	}
	get := func(p, name string) (string, error) {
		buf := make([]byte, 256)
		n, err := unix.Lgetxattr(filepath.Join(dest, p), name, buf)
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	if v, err := get("bin/ping", "user.note"); v != "kept" {
		t.Errorf("bin/ping user.note: %q %v, want it kept", v, err)
	}
	if v, err := get("data", "user.dir"); v != "d" {
		t.Errorf("data user.dir: %q %v, want it kept", v, err)
	}
	for _, name := range []string{"user.overlay.opaque", "trusted.overlay.opaque", "security.selinux"} {
		if v, err := get("bin/ping", name); !errors.Is(err, unix.ENODATA) {
			t.Errorf("bin/ping %s: %q %v, want it dropped", name, v, err)
		}
	}
	v, err := get("bin/ping", "security.capability")
	switch {
	case root && v != capNetRaw:
		t.Errorf("bin/ping security.capability: %x %v, want the tar's (kept as root)", v, err)
	case !root && !errors.Is(err, unix.ENODATA):
		t.Errorf("bin/ping security.capability as %d: %x %v, want it dropped", os.Geteuid(), v, err)
	}
	// Without owners kept (as when not root) file capabilities go too.
	dest = t.TempDir()
	if _, err := extractLayer(context.Background(), bytes.NewReader(b), dest, layerOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, err := get("bin/ping", "security.capability"); !errors.Is(err, unix.ENODATA) {
		t.Errorf("bin/ping security.capability without owners kept: %x %v, want it dropped", v, err)
	}
}

// TestExtractLayerLaterEntryWins checks a name the tar has twice.
func TestExtractLayerLaterEntryWins(t *testing.T) {
	dest, _ := unpackLayer(t,
		tent{name: "f", data: "first"}, tent{name: "f", data: "second"},
		tent{name: "d", typ: tar.TypeDir, mode: 0o700}, tent{name: "d", typ: tar.TypeDir, mode: 0o751},
	)
	if b, _ := os.ReadFile(filepath.Join(dest, "f")); string(b) != "second" {
		t.Errorf("f: %q, want the later entry's", b)
	}
	if fi, _ := os.Stat(filepath.Join(dest, "d")); fi.Mode().Perm() != 0o751 {
		t.Errorf("d: %v, want the later entry's mode", fi.Mode())
	}
}

// TestExtractLayerCancel cancels a layer's extraction in the middle of a
// file.
func TestExtractLayerCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	data := bytes.Repeat([]byte("x"), 16<<20)
	r := &cancelAfter{r: bytes.NewReader(mkTar(t, tent{name: "big", data: string(data)})), n: 4 << 20, cancel: cancel}
	dest := t.TempDir()
	if _, err := extractLayer(ctx, r, dest, layerOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if r.read > 5<<20 {
		t.Errorf("read %d bytes after the cancel at %d", r.read, r.n)
	}
	assertEmpty(t, dest)
}

// cancelAfter calls cancel once n bytes have been read.
type cancelAfter struct {
	r      io.Reader
	n      int64
	read   int64
	cancel func()
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.read += int64(n); c.read >= c.n {
		c.cancel()
	}
	return n, err
}

// TestExtractLayerReadsToEOF checks that the stream is read past the
// tar's end, so a verifying reader's mismatch at EOF is reported.
func TestExtractLayerReadsToEOF(t *testing.T) {
	errMismatch := errors.New("layer digest mismatch")
	b := mkTar(t, tent{name: "f", data: "f"})
	r := io.MultiReader(bytes.NewReader(b), bytes.NewReader(make([]byte, 4096)), iotest.ErrReader(errMismatch))
	dest := t.TempDir()
	if _, err := extractLayer(context.Background(), r, dest, layerOptions{}); !errors.Is(err, errMismatch) || !errors.Is(err, ErrInvalidImage) {
		t.Fatalf("error %v, want the reader's mismatch (ErrInvalidImage)", err)
	}
	assertEmpty(t, dest)
}

// BenchmarkExtractLayer unpacks a layer of 256 files of 256 KiB of data
// (no zeros) and 256 empty ones, for its throughput in MB/s.
func BenchmarkExtractLayer(b *testing.B) {
	data := string(bytes.Repeat([]byte("0123456789abcdef"), 16<<10))
	var ents []tent
	for i := range 256 {
		ents = append(ents, tent{name: fmt.Sprintf("d%d/f%d", i%16, i), data: data}, tent{name: fmt.Sprintf("d%d/e%d", i%16, i), data: ""})
	}
	layer := mkTar(b, ents...)
	b.SetBytes(int64(len(layer)))
	for b.Loop() {
		b.StopTimer()
		dest := b.TempDir()
		b.StartTimer()
		if _, err := extractLayer(context.Background(), bytes.NewReader(layer), dest, layerOptions{budget: newBudget(1 << 30)}); err != nil {
			b.Fatal(err)
		}
	}
}
