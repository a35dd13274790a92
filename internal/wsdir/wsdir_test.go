package wsdir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/unixuser/unixusertest"
	"github.com/tai42/sandbox/kit"
)

// A provider whose workspaces are plain directories takes Store as its
// kit.WorkspaceStore (the host runner embeds it).
var _ kit.WorkspaceStore = Store{}

func write(t *testing.T, path string, n int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, n), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

// chmodBack gives every directory under dir mode 0700 at cleanup, so that
// t.TempDir's own removal works whatever a test left.
func chmodBack(t *testing.T, dir string) {
	t.Cleanup(func() {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, _ error) error {
			if d != nil && d.IsDir() {
				_ = os.Chmod(p, 0o700)
			}
			return nil
		})
	})
}

func TestListSizesKeysAndTimes(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "workspaces")
	outside := filepath.Join(base, "outside")
	write(t, filepath.Join(outside, "big"), 1<<20)

	write(t, filepath.Join(dir, "proj", "a"), 100)
	write(t, filepath.Join(dir, "proj", "sub", "deep", "b"), 23)
	mkdir(t, filepath.Join(dir, "proj", "emptydir"))
	// Symlinks are not followed: neither to a big file nor to a directory outside.
	if err := os.Symlink(filepath.Join(outside, "big"), filepath.Join(dir, "proj", "link-file")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "proj", "link-dir")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "proj", "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(dir, "empty"))
	write(t, filepath.Join(dir, "A-1.x_y", "f"), 7)
	// Not workspaces: a file, a symlink to a directory, a name no key can have.
	write(t, filepath.Join(dir, "plainfile"), 5)
	if err := os.Symlink(outside, filepath.Join(dir, "linked")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "+removing-x-0011", "f"), 9)

	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.FixedZone("X", 3600))
	if err := os.Chtimes(filepath.Join(dir, "proj"), mtime, mtime); err != nil {
		t.Fatal(err)
	}

	got, err := Store{Dir: dir}.Workspaces(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		key  string
		size int64
	}{{"A-1.x_y", 7}, {"empty", 0}, {"proj", 123}}
	if len(got) != len(want) {
		t.Fatalf("List = %+v; want keys %v", got, want)
	}
	for i, w := range want {
		if got[i].Key != w.key || got[i].SizeBytes != w.size || got[i].InUseBy != "" {
			t.Errorf("List[%d] = %+v; want key %q size %d, not in use", i, got[i], w.key, w.size)
		}
		if got[i].ModifiedAt.Location() != time.UTC {
			t.Errorf("List[%d].ModifiedAt %v is not UTC", i, got[i].ModifiedAt)
		}
	}
	if !got[2].ModifiedAt.Equal(mtime) {
		t.Errorf("proj ModifiedAt = %v; want the directory's mtime %v", got[2].ModifiedAt, mtime)
	}
}

func TestListMissingDirIsEmpty(t *testing.T) {
	got, err := Store{Dir: filepath.Join(t.TempDir(), "never-made")}.Workspaces(t.Context())
	if err != nil || got == nil || len(got) != 0 {
		t.Errorf("List of a missing directory = %#v, %v; want an empty, non-nil list", got, err)
	}
}

func TestListUnreadableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	write(t, file, 1)
	_, err := Store{Dir: file}.Workspaces(t.Context())
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), file) {
		t.Errorf("List of a Dir that is a file = %v; want a SandboxError naming it", err)
	}
}

func TestListCancelled(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "k", "f"), 1)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := (Store{Dir: dir}).Workspaces(ctx); !errors.Is(err, context.Canceled) || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("List with a cancelled context = %v; want a SandboxError matching context.Canceled", err)
	}
}

func TestRemove(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "workspaces")
	outside := filepath.Join(base, "outside")
	write(t, filepath.Join(outside, "keep"), 10)
	write(t, filepath.Join(dir, "other", "keep"), 10)

	ws := filepath.Join(dir, "proj")
	write(t, filepath.Join(ws, "a"), 10)
	write(t, filepath.Join(ws, "sub", "b"), 10)
	// Symlinks out of the workspace: removed, their targets kept.
	if err := os.Symlink(outside, filepath.Join(ws, "sub", "out-dir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "keep"), filepath.Join(ws, "out-file")); err != nil {
		t.Fatal(err)
	}
	// Read-only and unsearchable directories, and files of another user.
	write(t, filepath.Join(ws, "ro", "f"), 1)
	write(t, filepath.Join(ws, "locked", "inner", "f"), 1)
	write(t, filepath.Join(ws, "foreign", "f"), 1)
	if err := os.Lchown(filepath.Join(ws, "foreign", "f"), 65534, 65534); err != nil && os.Geteuid() == 0 {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{"ro": 0o500, "locked/inner": 0o000, "locked": 0o300} {
		if err := os.Chmod(filepath.Join(ws, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	chmodBack(t, base)

	s := Store{Dir: dir}
	if err := s.RemoveWorkspace(t.Context(), "proj"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Lstat(ws); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the workspace is still there: %v", err)
	}
	for _, p := range []string{filepath.Join(outside, "keep"), filepath.Join(dir, "other", "keep")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("Remove touched %s outside the workspace: %v", p, err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "other" {
		t.Errorf("the workspace directory holds %v after the removal; want only the other workspace", entries)
	}
	// A second removal: not found.
	var nf *sandbox.WorkspaceNotFoundError
	if err := s.RemoveWorkspace(t.Context(), "proj"); !errors.As(err, &nf) || nf.Key != "proj" || !errors.Is(err, sandbox.ErrWorkspaceNotFound) {
		t.Errorf("removing it again = %v; want *WorkspaceNotFoundError{proj}", err)
	}
	// So is any key of a store whose directory does not exist.
	if err := (Store{Dir: filepath.Join(base, "nope")}).RemoveWorkspace(t.Context(), "proj"); !errors.As(err, &nf) {
		t.Errorf("Remove in a missing directory = %v; want *WorkspaceNotFoundError", err)
	}
}

// Keys that are not valid can never remove anything, and a non-directory
// at a key (a symlink a session made, a file) is not a workspace.
func TestRemoveRefusesWhatIsNotAWorkspace(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "ws", "workspaces")
	write(t, filepath.Join(base, "x", "keep"), 3)
	write(t, filepath.Join(base, "ws", "sibling", "keep"), 3)
	write(t, filepath.Join(dir, "k", "keep"), 3)
	write(t, filepath.Join(dir, "file"), 3)
	if err := os.Symlink(filepath.Join(base, "x"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	s := Store{Dir: dir}
	for _, key := range []string{"", ".", "..", "../x", "../../x", "k/keep", "/", "/etc", "a\x00b", "+removing-k", strings.Repeat("a", sandbox.MaxWorkspaceKey+1)} {
		err := s.RemoveWorkspace(t.Context(), key)
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || errors.Is(err, sandbox.ErrWorkspaceNotFound) || !strings.Contains(err.Error(), "workspace_key") {
			t.Errorf("Remove(%q) = %v; want a SandboxError saying the key is not valid", key, err)
		}
	}
	for _, key := range []string{"file", "link"} {
		var nf *sandbox.WorkspaceNotFoundError
		if err := s.RemoveWorkspace(t.Context(), key); !errors.As(err, &nf) {
			t.Errorf("Remove(%q) = %v; want *WorkspaceNotFoundError", key, err)
		}
	}
	for _, p := range []string{filepath.Join(base, "x", "keep"), filepath.Join(base, "ws", "sibling", "keep"),
		filepath.Join(dir, "k", "keep"), filepath.Join(dir, "file"), filepath.Join(dir, "link")} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("a refused removal touched %s: %v", p, err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.RemoveWorkspace(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Remove with a cancelled context = %v; want context.Canceled", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "k", "keep")); err != nil {
		t.Errorf("a cancelled removal touched the workspace: %v", err)
	}
}

// A later Remove removes what an earlier failed one left.
func TestRemoveSweepsLeftovers(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, trashPrefix+"old-0123", "sub", "f"), 5)
	write(t, filepath.Join(dir, "k", "f"), 5)
	if err := (Store{Dir: dir}).RemoveWorkspace(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left after the removal: %v", entries)
	}
}

// helperEnv names the store and key ("DIR\nKEY") the re-executed test
// binary removes as an unprivileged user (see TestRemoveUnprivileged).
const helperEnv = "TAI42_WSDIR_TEST_REMOVE" // TAI42_: unixusertest.AsNobody passes it on

// TestMain runs the tests, or, as TestRemoveUnprivileged's helper, only the
// removal it was given: exit 0 when it succeeded, else 3 with the error.
func TestMain(m *testing.M) {
	if arg, ok := os.LookupEnv(helperEnv); ok {
		dir, key, _ := strings.Cut(arg, "\n")
		if err := (Store{Dir: dir}).RemoveWorkspace(context.Background(), key); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A daemon that is not root removes a workspace whose directories a
// session left without write or search permission. As root, the test
// runs the removal as nobody (uid 65534) in a copy of the test binary;
// otherwise it removes in-process.
func TestRemoveUnprivileged(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} { // t.TempDir's directories are 0700: let nobody through
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "workspaces")
	ws := filepath.Join(dir, "proj")
	write(t, filepath.Join(ws, "ro", "f"), 1)
	write(t, filepath.Join(ws, "ro", "nested", "g"), 1)
	write(t, filepath.Join(ws, "nosearch", "h"), 1)
	write(t, filepath.Join(ws, "noread", "i"), 1)
	chmodBack(t, base)
	const nobody = unixusertest.Nobody
	root := os.Geteuid() == 0
	if root {
		if err := filepath.WalkDir(base, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, nobody, nobody)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for p, mode := range map[string]os.FileMode{"ro/nested": 0o500, "ro": 0o500, "nosearch": 0o600, "noread": 0o300} {
		if err := os.Chmod(filepath.Join(ws, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	if !root {
		if err := (Store{Dir: dir}).RemoveWorkspace(t.Context(), "proj"); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	} else {
		cmd := exec.Command(os.Args[0])
		cmd.Env = []string{helperEnv + "=" + dir + "\nproj"}
		unixusertest.AsNobody(t, cmd)
		out, err := unixusertest.CombinedOutput(t.Context(), cmd)
		if err != nil {
			t.Fatalf("the removal as uid %d failed: %v\n%s", nobody, err, out)
		}
	}
	if _, err := os.Lstat(ws); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the workspace is still there: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left in the workspace directory: %v", entries)
	}
}
