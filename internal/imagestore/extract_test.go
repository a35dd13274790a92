package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
// pipeline (mutate.Extract's flattening, then the extraction).
func TestHostileImports(t *testing.T) {
	t.Skip("TEMPORARY (branch h-store): no mutate.Extract in front any more; the extract part's version of this test checks its extractLayer through the store")
	outside := outsideDir(t)
	climb := strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/")
	cases := []struct {
		name    string
		layer   []tent
		fail    string // "" for a successful import; else a part of the error
		checkFn func(t *testing.T, rootfs string)
	}{
		{name: "dotdot", layer: []tent{{name: "../escape", data: "x"}}, fail: "unsafe"},
		{name: "dotdot-inside", layer: []tent{{name: "a/../../escape", data: "x"}}, fail: "unsafe"},
		{name: "absolute", layer: []tent{{name: outside + "/abs", data: "x"}}, fail: "absolute"},
		{
			name:  "absolute-symlink-then-write-through",
			layer: []tent{{name: "evil", typ: tar.TypeSymlink, linkname: outside}, {name: "evil/pwned", data: "x"}},
			checkFn: func(t *testing.T, rootfs string) {
				if l, err := os.Readlink(filepath.Join(rootfs, "evil")); err != nil || l != outside {
					t.Errorf("evil -> %q, %v: want the symlink kept as it is", l, err)
				}
			},
		},
		{
			name:  "relative-symlink-out-then-write-through",
			layer: []tent{{name: "up", typ: tar.TypeSymlink, linkname: climb}, {name: "up/pwned", data: "x"}},
			checkFn: func(t *testing.T, rootfs string) {
				if fi, err := os.Lstat(filepath.Join(rootfs, "up")); err != nil || !fi.IsDir() {
					t.Errorf("up: %v %v: want a plain directory (the escaping symlink dropped)", fi, err)
				}
			},
		},
		{name: "hardlink-climbing", layer: []tent{{name: "a/b/hl", typ: tar.TypeLink, linkname: "../target"}}, fail: "outside the image"},
		{name: "hardlink-absolute", layer: []tent{{name: "hl", typ: tar.TypeLink, linkname: outside + "/target"}}, fail: "outside the image"},
		{
			name:  "hardlink-through-symlink",
			layer: []tent{{name: "s", typ: tar.TypeSymlink, linkname: outside}, {name: "h", typ: tar.TypeLink, linkname: "s/target"}},
			fail:  "not a file of the image",
		},
		{name: "hardlink-to-missing", layer: []tent{{name: "h", typ: tar.TypeLink, linkname: "nothing"}}, fail: "does not have"},
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

// TestWhiteoutsAndLinksAcrossLayers checks the flattening: whiteouts and
// opaque directories hide lower files, an upper file wins, and a hard link
// in an upper layer reaches its lower target.
func TestWhiteoutsAndLinksAcrossLayers(t *testing.T) {
	t.Skip("TEMPORARY (branch h-store): the store keeps layers apart now; the extract part's version of this test checks them, with its extractLayer")
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
	for p, want := range map[string]string{"a/y": "y", "o/new": "new", "same": "upper", "hl": "shared", "orig": "shared"} {
		if b, err := os.ReadFile(filepath.Join(img.Layers[len(img.Layers)-1], p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", p, b, err, want)
		}
	}
	for _, p := range []string{"a/x", "b", "o/old", "a/.wh.x", ".wh.b", "o/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(img.Layers[len(img.Layers)-1], p)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want it hidden", p, err)
		}
	}
	a, _ := os.Stat(filepath.Join(img.Layers[len(img.Layers)-1], "hl"))
	b, _ := os.Stat(filepath.Join(img.Layers[len(img.Layers)-1], "orig"))
	if !os.SameFile(a, b) {
		t.Error("hl is not a hard link of orig")
	}
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
