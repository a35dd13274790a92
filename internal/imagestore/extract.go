package imagestore

import (
	"archive/tar"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// extractOptions choose what extractTar keeps.
type extractOptions struct {
	keepOwners bool // chown entries to the tar's uid/gid (needs root)
	keepLinks  bool // create symlinks and hard links; else skip them
}

// extractTar unpacks the tar stream r into the existing directory dest,
// streaming (no entry is held in memory), and never outside dest.
//
// Entry names are cleaned; an absolute name, or one that climbs out with
// "..", fails the extraction. Every write goes through an os.Root of dest
// and, beyond that, no entry is ever created through a symlink: a parent
// that is a symlink fails the extraction. Symlinks are created as they
// are (their targets are not followed, ever), hard links must point at a
// file inside dest (created after all other entries, so a link may come
// before its target, as in a flattened image). An entry whose name
// already exists is skipped: in mutate.Extract's flattened stream the
// upper layer's entry comes first and wins. Device nodes, fifos and
// other special entries are skipped silently. Modes, setuid bits and
// modification times are kept, owners too with keepOwners; directories
// get theirs last, deepest first, so their mtimes stay as the tar has
// them.
//
// Errors about the archive's content match ErrInvalidImage and name the
// entry; ctx ends the extraction between reads.
func extractTar(ctx context.Context, r io.Reader, dest string, opts extractOptions) error {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return err
	}
	defer root.Close()
	x := &extractor{root: root, opts: opts, dirs: map[string]*tar.Header{}}
	tr := tar.NewReader(ctxReader{ctx, r})
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		eof := errors.Is(err, io.EOF)
		if eof {
			// Read on to the stream's end: mutate.Extract ends its tar
			// before it reports a failure (a layer that does not match
			// its digest, an unsafe path) by failing the read after it.
			_, err = io.Copy(io.Discard, ctxReader{ctx, r})
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: reading the archive: %w", ErrInvalidImage, err)
		}
		if eof {
			break
		}
		if err := x.entry(hdr, tr); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
	// Hard links last, as long as each pass links some: in a flattened
	// image a link can come before its target, itself a link.
	for pending := x.links; len(pending) > 0; {
		var later []*tar.Header
		for _, hdr := range pending {
			if err := x.hardlink(hdr); errors.Is(err, errLinkTargetMissing) {
				later = append(later, hdr)
			} else if err != nil {
				return err
			}
		}
		if len(later) == len(pending) {
			return hostile(later[0].Name, "hard link to %q, which the image does not have", later[0].Linkname)
		}
		pending = later
	}
	return x.finishDirs()
}

type extractor struct {
	root  *os.Root
	opts  extractOptions
	dirs  map[string]*tar.Header // directory -> its header, metadata applied last
	links []*tar.Header          // hard links, created last
}

// hostile is an error about an archive entry that would escape or abuse
// the destination.
func hostile(name, format string, args ...any) error {
	return fmt.Errorf("%w: archive entry %q: %s", ErrInvalidImage, name, fmt.Sprintf(format, args...))
}

// cleanName cleans an entry name relative to the archive's root; "."
// is the root itself.
func cleanName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", hostile(name, "absolute path")
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", hostile(name, "climbs out of the image with \"..\"")
	}
	return c, nil
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(name, hdr)
	case tar.TypeReg:
		return x.file(name, hdr, tr)
	case tar.TypeSymlink:
		if x.opts.keepLinks {
			return x.symlink(name, hdr)
		}
	case tar.TypeLink:
		if x.opts.keepLinks {
			h := *hdr
			h.Name = name
			x.links = append(x.links, &h)
		}
	}
	// Devices, fifos, and anything else: skipped.
	return nil
}

// exists reports whether name exists (not following a final symlink).
func (x *extractor) exists(name string) (fs.FileInfo, bool, error) {
	fi, err := x.root.Lstat(name)
	switch {
	case err == nil:
		return fi, true, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, false, nil
	}
	return nil, false, entryErr(name, err)
}

// entryErr names the entry an I/O error (or an os.Root refusal) is about.
func entryErr(name string, err error) error {
	return fmt.Errorf("archive entry %q: %w", name, err)
}

// parents creates name's missing parent directories (mode 0755, as
// implicit parents get) and fails when one of them is a symlink or not a
// directory.
func (x *extractor) parents(name string) error { return x.walkParents(name, true) }

// walkParents checks that each of name's parents is a directory, not a
// symlink; a missing one is created when create, else an error.
func (x *extractor) walkParents(name string, create bool) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, ok, err := x.exists(p)
		if err != nil {
			return err
		}
		switch {
		case !ok && !create:
			return hostile(name, "its parent %q does not exist", p)
		case !ok:
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return entryErr(name, err)
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			return hostile(name, "its parent %q is a symlink: refusing to write through it", p)
		case !fi.IsDir():
			return hostile(name, "its parent %q is not a directory", p)
		}
	}
	return nil
}

func (x *extractor) dir(name string, hdr *tar.Header) error {
	if name == "." {
		x.dirs[name] = hdr
		return nil
	}
	if err := x.parents(name); err != nil {
		return err
	}
	fi, ok, err := x.exists(name)
	switch {
	case err != nil:
		return err
	case !ok:
		if err := x.root.Mkdir(name, 0o700); err != nil {
			return entryErr(name, err)
		}
	case !fi.IsDir():
		return nil // an upper layer's non-directory wins
	}
	if _, done := x.dirs[name]; !done {
		x.dirs[name] = hdr
	}
	return nil
}

func (x *extractor) file(name string, hdr *tar.Header, r io.Reader) error {
	if name == "." {
		return hostile(name, "a file where the image's root directory is")
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if _, ok, err := x.exists(name); err != nil || ok {
		return err // exists: an upper layer's entry wins
	}
	// O_EXCL: never opens an existing file, or through a final symlink.
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return entryErr(name, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return entryErr(name, err)
	}
	if x.opts.keepOwners {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			f.Close()
			return entryErr(name, err)
		}
	}
	// After the chown, which clears setuid and setgid bits.
	if err := f.Chmod(modeOf(hdr)); err != nil {
		f.Close()
		return entryErr(name, err)
	}
	if err := f.Close(); err != nil {
		return entryErr(name, err)
	}
	return x.times(name, hdr, false)
}

func (x *extractor) symlink(name string, hdr *tar.Header) error {
	if name == "." {
		return hostile(name, "a symlink where the image's root directory is")
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if _, ok, err := x.exists(name); err != nil || ok {
		return err
	}
	if err := x.root.Symlink(hdr.Linkname, name); err != nil {
		return entryErr(name, err)
	}
	if x.opts.keepOwners {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return entryErr(name, err)
		}
	}
	return x.times(name, hdr, true)
}

// errLinkTargetMissing is hardlink's error for a target not (yet) there.
var errLinkTargetMissing = errors.New("hard link target missing")

// hardlink creates a hard link to a regular file or symlink inside the
// image, never to a directory or through a symlink.
func (x *extractor) hardlink(hdr *tar.Header) error {
	name := hdr.Name
	if name == "." {
		return hostile(name, "a hard link where the image's root directory is")
	}
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return hostile(name, "hard link to %q, outside the image", hdr.Linkname)
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if _, ok, err := x.exists(name); err != nil || ok {
		return err
	}
	if target == "." {
		return hostile(name, "hard link to the image's root directory")
	}
	if err := x.walkParents(target, false); err != nil {
		return hostile(name, "hard link to %q, which is not a file of the image (a parent is missing, not a directory, or a symlink)", hdr.Linkname)
	}
	fi, ok, err := x.exists(target)
	switch {
	case err != nil:
		return err
	case !ok:
		return errLinkTargetMissing
	case !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0:
		return hostile(name, "hard link to %q, which is not a file", hdr.Linkname)
	}
	if err := x.root.Link(target, name); err != nil {
		return entryErr(name, err)
	}
	return nil
}

// finishDirs applies the directories' owners, modes and times, deepest
// first.
func (x *extractor) finishDirs() error {
	names := make([]string, 0, len(x.dirs))
	for n := range x.dirs {
		names = append(names, n)
	}
	depth := func(n string) int {
		if n == "." {
			return 0
		}
		return strings.Count(n, "/") + 1
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(depth(b), depth(a)), cmp.Compare(a, b)) })
	for _, n := range names {
		hdr := x.dirs[n]
		if x.opts.keepOwners {
			if err := x.root.Lchown(n, hdr.Uid, hdr.Gid); err != nil {
				return entryErr(n, err)
			}
		}
		if err := x.root.Chmod(n, modeOf(hdr)); err != nil {
			return entryErr(n, err)
		}
		if err := x.times(n, hdr, false); err != nil {
			return err
		}
	}
	return nil
}

// times sets name's access and modification times from hdr; a symlink's
// own (lutimes), through its parent directory opened in the root.
func (x *extractor) times(name string, hdr *tar.Header, symlink bool) error {
	mtime := hdr.ModTime
	if mtime.IsZero() {
		return nil
	}
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = mtime
	}
	if !symlink {
		if err := x.root.Chtimes(name, atime, mtime); err != nil {
			return entryErr(name, err)
		}
		return nil
	}
	d, err := x.root.Open(path.Dir(name))
	if err != nil {
		return entryErr(name, err)
	}
	defer d.Close()
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if err := unix.UtimesNanoAt(int(d.Fd()), path.Base(name), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("archive entry %q: setting its times: %w", name, err)
	}
	return nil
}

func timespec(t time.Time) unix.Timespec { return unix.NsecToTimespec(t.UnixNano()) }

// modeOf is the permission, setuid, setgid and sticky bits of hdr.
func modeOf(hdr *tar.Header) os.FileMode {
	return hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
