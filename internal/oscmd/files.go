package oscmd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MountPoints lists the mount points of a mountinfo file
// (/proc/self/mountinfo, or a thread's), unescaped, in its order (a point
// with stacked mounts repeats).
func MountPoints(mountinfo string) ([]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		if fields := strings.Fields(sc.Text()); len(fields) >= 5 {
			out = append(out, UnescapeMount(fields[4]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	return out, nil
}

// UnescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func UnescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// SyncDirs flushes the directory dir to disk, so that a rename into it
// survives a crash of the machine; with ancestors, also every directory
// above it up to ".". open opens a directory by its path relative to a
// root (an os.Root's Open, or the like).
func SyncDirs(open func(name string) (*os.File, error), dir string, ancestors bool) error {
	for {
		d, err := open(dir)
		if err != nil {
			return err
		}
		err = d.Sync()
		d.Close()
		if err != nil || !ancestors || dir == "." {
			return err
		}
		dir = filepath.Dir(dir)
	}
}

// RemoveTemps removes the regular files below dir whose names start with
// prefix and that stale reports stale (nil: all of them), without
// following symlinks: the temporary files of writes a crash interrupted.
// A missing dir has none; ctx's end stops the walk.
//
// The walk and the removals go through an os.Root of dir: the trees swept
// include the workspaces of sessions still running, which can swap a
// directory for a symlink between the listing and the removal, and a walk
// by path would then follow it and remove a file outside the tree.
func RemoveTemps(ctx context.Context, dir, prefix string, stale func(name string) bool) error {
	// dir itself is not followed either (os.OpenRoot would): a symlink
	// there has no temporaries of the tree's.
	if fi, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) || err == nil && !fi.IsDir() {
		return nil
	}
	root, err := os.OpenRoot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer root.Close()
	var errs []error
	err = fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("sweeping %s: %w", filepath.Join(dir, path), RootErr(err)))
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasPrefix(d.Name(), prefix) && (stale == nil || stale(d.Name())) {
			if err := root.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("sweeping %s: %w", filepath.Join(dir, path), RootErr(err)))
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}
