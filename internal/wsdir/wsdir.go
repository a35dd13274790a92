// Package wsdir is the directory-backed store of persistent workspaces the
// providers share: one directory per workspace_key under a provider's
// workspace directory. It lists them with their sizes and removes one by
// its key, never reaching outside that directory: every access goes
// through an [os.Root] opened on it, so a symlink a session left (at the
// key itself or anywhere inside) is never followed out.
package wsdir

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tai42/sandbox"
)

// trashPrefix starts the name a workspace is renamed to while its files are
// removed. '+' is not allowed in a workspace_key, so no key can ever name
// it and a listing never shows it.
const trashPrefix = "+removing-"

// Store is the persistent workspaces of one provider, and its
// kit.WorkspaceStore: Dir holds one directory per workspace_key (e.g.
// <state>/host/workspaces). Entries of Dir that are not directories
// (symlinks included), or whose names are not valid workspace keys, are
// not workspaces: Workspaces skips them and RemoveWorkspace does not touch
// them. A Store holds no state; its methods are safe for concurrent use,
// but two calls removing the same key at once are the caller's to prevent
// (the kit holds the key while it removes).
type Store struct {
	Dir string
}

// Workspaces returns the workspaces in Dir, sorted by key, InUseBy empty.
// SizeBytes is the sum of the sizes of the regular files below the
// workspace, walked without following symlinks; a directory the process
// may not read (a session may make one unreadable, and a daemon not run as
// root cannot then enter it) and a file removed during the walk count 0,
// so SizeBytes is then a lower bound. ModifiedAt is the mtime of the
// workspace's top directory, in UTC. A missing Dir is no workspace (an
// empty list); a Dir that cannot be read, or a walk that fails otherwise,
// is a *sandbox.SandboxError naming the path; ctx's end stops the walk
// with an error matching ctx.Err().
func (s Store) Workspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error) {
	root, err := os.OpenRoot(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []sandbox.WorkspaceInfo{}, nil
	}
	if err != nil {
		return nil, sandbox.WrapError("list_workspaces", "cannot open the workspace directory "+s.Dir, err)
	}
	defer root.Close()
	fsys := root.FS()
	entries, err := fs.ReadDir(fsys, ".") // sorted by name
	if err != nil {
		return nil, sandbox.WrapError("list_workspaces", "cannot read the workspace directory "+s.Dir, err)
	}
	out := []sandbox.WorkspaceInfo{}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, sandbox.WrapError("list_workspaces", "listing the workspaces was cancelled", err)
		}
		key := e.Name()
		if !e.IsDir() || sandbox.ValidWorkspaceKey(key) != nil {
			continue
		}
		fi, err := root.Lstat(key)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // removed since the directory was read
		case err != nil:
			return nil, sandbox.WrapError("list_workspaces", "cannot stat workspace "+filepath.Join(s.Dir, key), err)
		case !fi.IsDir():
			continue // replaced by a non-directory since
		}
		size, err := s.size(ctx, fsys, key)
		if err != nil {
			return nil, err
		}
		out = append(out, sandbox.WorkspaceInfo{Key: key, SizeBytes: size, ModifiedAt: fi.ModTime().UTC()})
	}
	return out, nil
}

// size sums the regular files below dir in fsys (Lstat'ed, never followed).
func (s Store) size(ctx context.Context, fsys fs.FS, dir string) (int64, error) {
	var total int64
	err := fs.WalkDir(fsys, dir, func(_ string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				if d != nil && d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return err
		}
		total += fi.Size()
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return 0, sandbox.WrapError("list_workspaces", "listing the workspaces was cancelled", ctx.Err())
		}
		return 0, sandbox.WrapError("list_workspaces", "cannot measure workspace "+filepath.Join(s.Dir, dir), err)
	}
	return total, nil
}

// RemoveWorkspace deletes the workspace key and everything in it. key must be a
// valid workspace_key (see [sandbox.ValidWorkspaceKey]); any other, such as
// "", ".." or "../x", is refused with a *sandbox.SandboxError before
// anything is touched. A key with no workspace directory (nothing there,
// or a non-directory such as a symlink) is a *sandbox.WorkspaceNotFoundError.
//
// The workspace is first renamed, atomically, to a name no key can have,
// so that from then on no session and no listing sees it under its key;
// then its files are removed. Directories a session left without write or
// search permission are made accessible to finish the removal; files of
// other users go as their directory allows (a daemon run as root removes
// everything). Symlinks inside are removed, never followed. When removing
// the files fails the workspace is nonetheless gone under its key, and the
// *sandbox.SandboxError names the directory left to remove by hand; each
// later RemoveWorkspace tries such leftovers again. ctx is checked before anything
// is touched; a removal once begun runs to its end. The caller must ensure
// no session uses the workspace meanwhile.
func (s Store) RemoveWorkspace(ctx context.Context, key string) error {
	if err := sandbox.ValidWorkspaceKey(key); err != nil {
		return sandbox.Errorf("remove_workspace", "%v; no workspace can have it", err)
	}
	if err := ctx.Err(); err != nil {
		return sandbox.WrapError("remove_workspace", "the removal was cancelled", err)
	}
	root, err := os.OpenRoot(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return &sandbox.WorkspaceNotFoundError{Key: key}
	}
	if err != nil {
		return sandbox.WrapError("remove_workspace", "cannot open the workspace directory "+s.Dir, err)
	}
	defer root.Close()
	fi, err := root.Lstat(key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &sandbox.WorkspaceNotFoundError{Key: key}
	case err != nil:
		return sandbox.WrapError("remove_workspace", "cannot stat workspace "+filepath.Join(s.Dir, key), err)
	case !fi.IsDir():
		return &sandbox.WorkspaceNotFoundError{Key: key}
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return sandbox.WrapError("remove_workspace", "cannot make a temporary name", err)
	}
	trash := trashPrefix + key + "-" + hex.EncodeToString(rnd[:])
	if err := root.Rename(key, trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return &sandbox.WorkspaceNotFoundError{Key: key}
		}
		return sandbox.WrapError("remove_workspace", fmt.Sprintf("cannot move workspace %s aside to remove it", filepath.Join(s.Dir, key)), err)
	}
	if err := removeAll(root, trash); err != nil {
		return sandbox.WrapError("remove_workspace", fmt.Sprintf("workspace %q is gone, but removing its files failed; remove %s by hand",
			key, filepath.Join(s.Dir, trash)), err)
	}
	s.sweepTrash(root)
	return nil
}

// sweepTrash tries again to remove what earlier failed removals left.
// Failures were reported when they happened; they are ignored here.
func (s Store) sweepTrash(root *os.Root) {
	entries, err := fs.ReadDir(root.FS(), ".")
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), trashPrefix) && e.IsDir() {
			_ = removeAll(root, e.Name())
		}
	}
}

// removeAll removes name in root and everything below it. When the first
// attempt fails (a directory without write or search permission, for a
// process that is not root) it gives every directory below name mode 0700
// (walking without following symlinks; root.Chmod cannot leave root
// either) and tries once more.
func removeAll(root *os.Root, name string) error {
	err := root.RemoveAll(name)
	if err == nil || !permissionLike(err) {
		return err
	}
	// WalkDir hands a directory to the func before it reads it, so a
	// directory is made readable before its entries are needed.
	_ = fs.WalkDir(root.FS(), name, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = root.Chmod(p, 0o700)
		}
		return nil
	})
	return root.RemoveAll(name)
}

// permissionLike reports an error that making directories accessible may
// cure.
func permissionLike(err error) bool {
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)
}
