package imagestore

// TEMPORARY (branch h-store only): a stand-in for the "extract" part's
// layer unpacker, with exactly its names, so the layered store builds and
// is tested before the merge. The lead deletes this file at the merge and
// uses extract.go's real implementation (whiteouts and opaque directories
// in overlayfs's format, sparse files, ...); nothing here converts
// whiteouts, and no test tests this file's own behaviour.

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync/atomic"
	"syscall"
)

// ErrTooLarge is matched by an unpack whose files exceed the budget.
var ErrTooLarge = errors.New("image too large")

// ErrDiskFull is matched by an unpack the filesystem has no room for.
var ErrDiskFull = errors.New("no space left for the image")

// layerOptions choose how extractLayer unpacks.
type layerOptions struct {
	keepOwners bool
	budget     *budget
}

// budget bounds the bytes the layers of one image unpack to.
type budget struct {
	limit int64
	used  atomic.Int64
}

func newBudget(limit int64) *budget { return &budget{limit: limit} }

func (b *budget) take(n int64) error {
	if b == nil || b.limit <= 0 {
		return nil
	}
	if b.used.Add(n) > b.limit {
		return fmt.Errorf("%w: its files exceed %d bytes", ErrTooLarge, b.limit)
	}
	return nil
}

// crossLink is a hard link of a layer whose target is in a lower layer.
type crossLink struct {
	name, target string // cleaned, relative to the layer's root
}

// extractLayer unpacks the layer tar r into dest and returns its hard
// links whose targets are not in the layer itself.
func extractLayer(ctx context.Context, r io.Reader, dest string, opts layerOptions) ([]crossLink, error) {
	pr, pw := io.Pipe()
	var links []*tar.Header
	done := make(chan error, 1)
	go func() {
		err := stripLinks(r, pw, opts.budget, &links)
		pw.CloseWithError(err)
		done <- err
	}()
	err := extractTar(ctx, pr, dest, extractOptions{keepOwners: opts.keepOwners, keepLinks: true})
	pr.CloseWithError(errors.New("extraction ended"))
	if serr := <-done; err == nil || errors.Is(serr, ErrTooLarge) {
		err = errors.Join(err, serr)
	}
	if errors.Is(err, syscall.ENOSPC) {
		err = fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var cross []crossLink
	for _, hdr := range links {
		name, err := cleanName(hdr.Name)
		if err != nil {
			return nil, err
		}
		target, err := cleanName(hdr.Linkname)
		if err != nil {
			return nil, hostile(hdr.Name, "hard link to %q, outside the image", hdr.Linkname)
		}
		if fi, err := root.Lstat(target); err == nil && fi.Mode().IsRegular() {
			if err := root.Link(target, name); err != nil {
				return nil, entryErr(name, err)
			}
			continue
		}
		cross = append(cross, crossLink{name: name, target: target})
	}
	return cross, nil
}

// stripLinks copies the tar r to w without its hard links (listed in
// links), charging regular files to b.
func stripLinks(r io.Reader, w io.Writer, b *budget, links *[]*tar.Header) error {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if err := tw.Close(); err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, r)
			return err
		}
		if err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeLink {
			*links = append(*links, hdr)
			continue
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := b.take(hdr.Size); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// linkFromLowers creates links in dest, each a copy of its target in the
// topmost of lowers (lowest first) that has it.
func linkFromLowers(dest string, lowers []string, links []crossLink) error {
	for _, l := range links {
		if err := linkOne(dest, lowers, l); err != nil {
			return err
		}
	}
	return nil
}

func linkOne(dest string, lowers []string, l crossLink) error {
	for i := len(lowers) - 1; i >= 0; i-- {
		src, err := os.OpenInRoot(lowers[i], l.target)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return hostile(l.name, "hard link to %q: %v", l.target, err)
		}
		defer src.Close()
		fi, err := src.Stat()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return hostile(l.name, "hard link to %q, which is not a file", l.target)
		}
		root, err := os.OpenRoot(dest)
		if err != nil {
			return err
		}
		defer root.Close()
		if err := root.MkdirAll(path.Dir(l.name), 0o755); err != nil {
			return entryErr(l.name, err)
		}
		f, err := root.OpenFile(l.name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
		if err != nil {
			return entryErr(l.name, err)
		}
		_, err = io.Copy(f, src)
		return errors.Join(err, f.Close())
	}
	return hostile(filepath.ToSlash(l.name), "hard link to %q, which the image does not have", l.target)
}
