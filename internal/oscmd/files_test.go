package oscmd

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:          "/a/b",
		`/a\040b`:       "/a b",
		`/a\011b\134c`:  "/a\tb\\c",
		`/trailing\04`:  `/trailing\04`,
		`/not\999octal`: `/not\999octal`,
	} {
		if got := UnescapeMount(in); got != want {
			t.Errorf("UnescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountPoints(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	const table = "22 1 0:21 / /proc rw - proc proc rw\n" +
		"23 1 0:22 / /with\\040space rw - tmpfs tmpfs rw\n" +
		"short line\n"
	if err := os.WriteFile(mi, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := MountPoints(mi)
	if err != nil || !slices.Equal(got, []string{"/proc", "/with space"}) {
		t.Fatalf("MountPoints = %q, %v", got, err)
	}
	if _, err := MountPoints(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing mountinfo gave no error")
	}
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	for _, f := range []string{".tmp-1", "a/.tmp-2", "a/b/.tmp-keep", "a/keep.txt", filepath.Join("..", filepath.Base(outside), ".tmp-out")} {
		must(os.WriteFile(filepath.Join(dir, f), nil, 0o600))
	}
	must(os.Symlink(outside, filepath.Join(dir, "a", "link")))
	err := RemoveTemps(context.Background(), dir, ".tmp-", func(name string) bool { return name != ".tmp-keep" })
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]bool{".tmp-1": false, "a/.tmp-2": false, "a/b/.tmp-keep": true, "a/keep.txt": true} {
		if _, err := os.Lstat(filepath.Join(dir, f)); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", f, err == nil, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(outside, ".tmp-out")); err != nil {
		t.Errorf("a file outside, behind a symlink, was removed: %v", err)
	}
	if err := RemoveTemps(context.Background(), filepath.Join(dir, "missing"), ".tmp-", nil); err != nil {
		t.Errorf("a missing dir: %v", err)
	}
	// dir itself a symlink: not followed either.
	if err := RemoveTemps(context.Background(), filepath.Join(dir, "a", "link"), ".tmp-", nil); err != nil {
		t.Errorf("dir a symlink: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(outside, ".tmp-out")); err != nil {
		t.Errorf("a file outside, behind dir itself a symlink, was removed: %v", err)
	}
}

// TestRemoveTempsDirSwapped swaps a directory of the tree for a symlink
// to outside it during the walk (a session does so in its workspace, which
// the sweep walks while the session runs): the walk had listed the
// directory, then followed the symlink by path and removed a temp-named
// file outside. The swap comes from the stale callback, on the first temp
// file of the walk's lexical order, so it lands between the listing of the
// tree's top and the walk into the directory.
func TestRemoveTempsDirSwapped(t *testing.T) {
	for _, late := range []bool{false, true} {
		dir, outside := t.TempDir(), t.TempDir()
		mk := func(name string) {
			t.Helper()
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(name, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		mk(filepath.Join(dir, ".tmp-first"))
		mk(filepath.Join(dir, "sub", ".tmp-in"))
		mk(filepath.Join(outside, ".tmp-in"))
		swapped := false
		swap := func() {
			if swapped {
				return
			}
			swapped = true
			if err := os.Rename(filepath.Join(dir, "sub"), filepath.Join(dir, "old")); err != nil {
				t.Error(err)
			}
			if err := os.Symlink(outside, filepath.Join(dir, "sub")); err != nil {
				t.Error(err)
			}
		}
		// late: the swap comes after the walk has listed sub itself,
		// between the listing and the removal of sub/.tmp-in.
		stale := func(name string) bool {
			if name == ".tmp-first" && !late || name == ".tmp-in" && late {
				swap()
			}
			return true
		}
		// Errors are expected (the walk meets the symlink where it had
		// seen a directory); what matters is what was removed.
		_ = RemoveTemps(context.Background(), dir, ".tmp-", stale)
		if !swapped {
			t.Fatalf("late %v: the walk never called stale where the test swaps", late)
		}
		if _, err := os.Lstat(filepath.Join(outside, ".tmp-in")); err != nil {
			t.Errorf("late %v: a temp-named file outside the tree was removed through a directory swapped for a symlink: %v", late, err)
		}
		if _, err := os.Lstat(filepath.Join(dir, ".tmp-first")); err == nil {
			t.Errorf("late %v: the tree's own temp file was kept", late)
		}
	}
}

func TestSyncDirs(t *testing.T) {
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := root.MkdirAll("a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	var opened []string
	open := func(name string) (*os.File, error) { opened = append(opened, name); return root.Open(name) }
	if err := SyncDirs(open, "a/b", true); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(opened, []string{"a/b", "a", "."}) {
		t.Errorf("synced %q; want a/b, a, .", opened)
	}
	opened = nil
	if err := SyncDirs(open, "a/b", false); err != nil || !slices.Equal(opened, []string{"a/b"}) {
		t.Errorf("without ancestors synced %q (%v)", opened, err)
	}
	if err := SyncDirs(open, "missing", false); err == nil {
		t.Error("a missing dir gave no error")
	}
}
