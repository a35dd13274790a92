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
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrTooLarge is matched (errors.Is) by the error of an image whose
// layers unpack to more than the store's maximum image size, or to more
// inodes than its maximum inode count (then ErrTooManyInodes too).
var ErrTooLarge = errors.New("image too large")

// ErrTooManyInodes is matched (errors.Is), beside ErrTooLarge, by the
// error of an image whose layers unpack to more inodes than the store's
// maximum image inode count.
var ErrTooManyInodes = errors.New("too many inodes")

// ErrDiskFull is matched (errors.Is) by the error of an unpacking that ran
// out of disk space; the error matches syscall.ENOSPC (or EDQUOT) too.
var ErrDiskFull = errors.New("disk full")

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
// them. Of the extended attributes (PAX SCHILY.xattr records) user.*
// ones are kept, and security.capability with keepOwners (see
// keepXattr). Runs of zero blocks in a file are left as holes.
//
// Errors about the archive's content match ErrInvalidImage and name the
// entry; ctx ends the extraction between reads.
func extractTar(ctx context.Context, r io.Reader, dest string, opts extractOptions) error {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return err
	}
	defer root.Close()
	x := newExtractor(root, opts, nil)
	defer x.closeCwd()
	if err := x.readAll(ctx, r); err != nil {
		return err
	}
	// Hard links last, as long as each pass links some: in a flattened
	// image a link can come before its target, itself a link.
	if later := x.linkAll(x.links); len(later) > 0 {
		if x.err != nil {
			return x.err
		}
		return hostile(later[0].Name, "hard link to %q, which the image does not have", later[0].Linkname)
	}
	if x.err != nil {
		return x.err
	}
	return x.finishDirs()
}

// layerOptions choose what extractLayer keeps and how much it may write.
type layerOptions struct {
	keepOwners bool    // chown entries to the tar's uid/gid (needs root)
	budget     *budget // charged every entry (see budget); nil: no limit
}

// budget bounds what the layers of one image take in the store: bytes
// and inodes. Every entry costs a filesystem block (its inode, or a hard
// link's name), whatever its data: a layer of empty directories, long
// symlinks or extended attributes takes disk space and inodes without a
// byte of file data. A file costs its apparent size besides, rounded up
// to whole blocks, a sparse file's holes included (what a copy of the
// file out of the sandbox would take); a symlink its target's length;
// extended attributes their names' and values' lengths. The concurrent
// layers of an image share one.
type budget struct {
	limit      int64 // bytes; <= 0 is no limit
	inodeLimit int64 // inodes; <= 0 is no limit
	used       atomic.Int64
	inodes     atomic.Int64
}

// blockCost is what budget charges an entry for its inode or name: a
// filesystem block, the least a directory or a symlink whose target does
// not fit in its inode takes.
const blockCost = 4096

// newBudget is a budget of limit bytes and no inode limit; limit <= 0 is
// no limit.
func newBudget(limit int64) *budget { return &budget{limit: limit} }

// charge counts n more bytes, failing (ErrTooLarge) past the limit.
func (b *budget) charge(n int64) error {
	if b == nil || b.limit <= 0 {
		return nil
	}
	// n alone is checked first so that a hostile size cannot overflow used;
	// a refused charge is taken back, so it fails no later one of the
	// image's other layers that fits.
	if n > b.limit || b.used.Add(n) > b.limit {
		if n <= b.limit {
			b.used.Add(-n)
		}
		return fmt.Errorf("%w: its layers take more than %s in the store (files, directories, symlinks and extended attributes, each at least a %d-byte block), the store's maximum image size (raise it with tai42 serve --max-image-size)", ErrTooLarge, sizeString(b.limit), blockCost)
	}
	return nil
}

// chargeEntry counts a new entry: an inode, unless it is a hard link
// (a name of an inode counted already), and its block.
func (b *budget) chargeEntry(inode bool) error {
	if b == nil {
		return nil
	}
	if inode && b.inodeLimit > 0 && b.inodes.Add(1) > b.inodeLimit {
		b.inodes.Add(-1)
		return fmt.Errorf("%w: %w: its layers hold more than %d inodes (files, directories, symlinks), the store's maximum image inode count (raise it with tai42 serve --max-image-inodes)", ErrTooLarge, ErrTooManyInodes, b.inodeLimit)
	}
	return b.charge(blockCost)
}

// roundBlocks is n (>= 0) rounded up to whole blocks; a size too large
// to round is past any limit as it is.
func roundBlocks(n int64) int64 {
	if n > math.MaxInt64-blockCost {
		return n
	}
	return (n + blockCost - 1) / blockCost * blockCost
}

// sizeString is n bytes for a person: "20 GiB", "1.5 MiB", "512 bytes".
func sizeString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, i := float64(n)/unit, 0
	for v >= unit && i < len(units)-1 {
		v /= unit
		i++
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0") + " " + units[i]
}

// diskFull makes an out-of-space error, wherever it arose, say so and
// what to do; other errors are returned as they are.
func diskFull(dir string, err error) error {
	if errors.Is(err, ErrDiskFull) || (!errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT)) {
		return err
	}
	return fmt.Errorf("%w: unpacking into %s: %w; free space on its filesystem, or raise its size or quota, or choose another state directory (tai42 serve --state-dir)", ErrDiskFull, dir, err)
}

// crossLink is a hard link of a layer whose target is not in that layer,
// or (dir) a directory of the layer that its tar does not list (made for
// the entries in it, the layer's root too): linkFromLowers makes the link
// from the layers below once they are unpacked, and gives the directory
// the attributes it has below, as overlayfs shows the topmost layer's.
type crossLink struct {
	name   string  // the link or directory, a cleaned name in the layer
	target string  // what it links to, a cleaned name; "" for a directory
	dir    bool    // an implicit directory
	budget *budget // the image's, charged the size of the copy
}

// Names of the OCI image spec's whiteouts (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."     // aufs metadata; only the opaque marker is meaningful
	opaqueMarker   = ".wh..wh..opq" // its directory hides the layers below
	opaqueXattr    = "trusted.overlay.opaque"
	paxXattrPrefix = "SCHILY.xattr."
)

// extractLayer unpacks the tar stream r of one OCI layer into the
// existing, empty directory dest in overlayfs's own format, so that the
// layers of an image stack as overlay lower directories, and returns what
// needs the layers below (for linkFromLowers, once they are unpacked).
//
// It has extractTar's protections (os.Root, no "..", no absolute names,
// no write through a symlink, device nodes and fifos skipped, streaming)
// and keeps what it keeps. What differs:
//
//   - A whiteout ".wh.NAME" becomes overlayfs's whiteout, a character
//     device 0:0 named NAME (mknod of it needs no privilege on Linux ≥
//     5.8); ".wh..wh..opq" in a directory D becomes the xattr
//     trusted.overlay.opaque=y on D (created when the tar has no D),
//     which needs root; other ".wh..wh." names (aufs metadata) are
//     skipped. Whiteouts apply to the layers below only (image-spec:
//     "files that are present in the same layer as a whiteout file can
//     only be hidden by whiteout files in subsequent layers"): a whiteout
//     of a non-directory this layer has too is dropped (this layer's
//     entry hides the lower one anyway), and of a directory this layer
//     has too makes that directory opaque (the lower one is gone, this
//     layer's contents stay), in either order.
//   - A name the tar has twice: the later entry wins, as when untarring;
//     a directory then a non-directory of one name is refused.
//   - A hard link to a name this layer lacks is returned as a crossLink,
//     and so is a directory the tar does not list: its attributes are
//     those of the layers below.
//   - Every entry is charged to opts.budget before it is written (see
//     budget: a block and an inode each, a file's apparent size, a
//     symlink's target, xattrs; ErrTooLarge, ErrTooManyInodes), and runs
//     of zero blocks are left as holes, so a 10 GiB sparse file costs no
//     disk.
//   - Running out of disk space is an error matching ErrDiskFull.
//   - On an error, what was unpacked into dest is removed.
//
// After the tar's end, r is read to its end, so that a reader below that
// verifies the stream's digest sees EOF and reports a mismatch.
func extractLayer(ctx context.Context, r io.Reader, dest string, opts layerOptions) ([]crossLink, error) {
	links, err := extractLayerInto(ctx, r, dest, opts)
	if err != nil {
		clearDir(dest)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, diskFull(dest, err)
	}
	return links, nil
}

func extractLayerInto(ctx context.Context, r io.Reader, dest string, opts layerOptions) ([]crossLink, error) {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	x := newExtractor(root, extractOptions{keepOwners: opts.keepOwners, keepLinks: true}, &layerState{
		budget:    opts.budget,
		whiteouts: map[string]bool{},
		opaque:    map[string]bool{},
		implicit:  map[string]bool{},
	})
	defer x.closeCwd()
	if err := x.readAll(ctx, r); err != nil {
		return nil, err
	}
	later := x.linkAll(x.links)
	if x.err != nil {
		return nil, x.err
	}
	var cross []crossLink
	for _, hdr := range later {
		cross = append(cross, crossLink{name: hdr.Name, target: path.Clean(hdr.Linkname), budget: opts.budget})
	}
	x.layer.implicit["."] = true
	for _, d := range slices.Sorted(maps.Keys(x.layer.implicit)) {
		if _, listed := x.dirs[d]; !listed {
			cross = append(cross, crossLink{name: d, dir: true})
		}
	}
	return cross, x.finishDirs()
}

// clearDir removes what dir holds (not dir itself), as far as it can: a
// failed extraction's leftovers, which the caller's own cleanup would
// otherwise be left to find.
func clearDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
	_ = unix.Removexattr(dir, opaqueXattr)
}

// linkFromLowers completes the layer dest with what extractLayer returned
// for it, once the layers below it (lowers, lowest first) are unpacked;
// call it for every layer (it does nothing for an empty list). Each hard
// link becomes a copy (content, mode, owner, times, kept xattrs) of its
// target as overlayfs would show it from the layer just below dest, that
// is from the topmost lower layer holding it, never a link to another
// layer's file (layers are shared between images, and a file of one must
// not change with another). A target through a symlink, deleted by a
// whiteout, hidden by an opaque directory, missing, or not a file, is a
// hostile image's (ErrInvalidImage). A link to another link of dest is
// made once that one is. Each implicit directory gets the mode, owner and
// times of the directory overlayfs would show from below (it keeps its
// own when none). The directories the copies go into keep their times.
// Owners are copied as root (where extractLayer keeps them). Each lower
// is read through its own os.Root.
func linkFromLowers(dest string, lowers []string, links []crossLink) error {
	if len(links) == 0 {
		return nil
	}
	if err := linkFromLowersInto(dest, lowers, links); err != nil {
		return diskFull(dest, err)
	}
	return nil
}

func linkFromLowersInto(dest string, lowers []string, links []crossLink) error {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return err
	}
	defer root.Close()
	layers := []*os.Root{root} // topmost first: dest, then the lowers from the top
	for _, l := range slices.Backward(lowers) {
		lr, err := os.OpenRoot(l)
		if err != nil {
			return err
		}
		defer lr.Close()
		layers = append(layers, lr)
	}
	// The copies are charged to the image's budget, as the links' own
	// entries were.
	var b *budget
	if i := slices.IndexFunc(links, func(c crossLink) bool { return c.budget != nil }); i >= 0 {
		b = links[i].budget
	}
	l := &linker{
		x:       newExtractor(root, extractOptions{keepOwners: os.Geteuid() == 0, keepLinks: true}, &layerState{budget: b, implicit: map[string]bool{}}),
		layers:  layers,
		pending: map[string]crossLink{},
		state:   map[string]linkState{},
	}
	defer l.x.closeCwd()
	var dirs []crossLink
	for _, c := range links {
		if c.dir {
			dirs = append(dirs, c)
		} else {
			l.pending[c.name] = c
		}
	}
	saved, err := l.dirTimes()
	if err != nil {
		return err
	}
	for _, c := range links {
		if c.dir {
			continue
		}
		if err := l.resolve(c); err != nil {
			return err
		}
	}
	for d, fi := range saved {
		if err := l.x.times(d, fi, false); err != nil {
			return err
		}
	}
	// Deepest first: setting a directory's times must come after its
	// subdirectories' changes.
	slices.SortFunc(dirs, func(a, b crossLink) int { return cmp.Compare(depthOf(b.name), depthOf(a.name)) })
	for _, c := range dirs {
		if err := l.dirFromBelow(c.name); err != nil {
			return err
		}
	}
	return nil
}

// dirTimes are the times (as a header's) of the directories of dest the
// hard links go into, which making them changes.
func (l *linker) dirTimes() (map[string]*tar.Header, error) {
	saved := map[string]*tar.Header{}
	for name := range l.pending {
		d := path.Dir(name)
		if _, done := saved[d]; done {
			continue
		}
		fi, ok, err := l.x.exists(d)
		if err != nil {
			return nil, err
		}
		if ok && fi.IsDir() {
			st := fi.Sys().(*syscall.Stat_t)
			saved[d] = &tar.Header{ModTime: time.Unix(st.Mtim.Unix()), AccessTime: time.Unix(st.Atim.Unix())}
		}
	}
	return saved, nil
}

// dirFromBelow gives the implicit directory name of dest the attributes of
// the directory the layers below show there, if any.
func (l *linker) dirFromBelow(name string) error {
	r := l.find(name, 1)
	if r.layer < 0 || !r.fi.IsDir() {
		return nil // a new directory, or one replacing a non-directory: it keeps its own
	}
	st := r.fi.Sys().(*syscall.Stat_t)
	hdr := &tar.Header{Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()), AccessTime: time.Unix(st.Atim.Unix())}
	x := l.x
	if x.opts.keepOwners {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return entryErr(name, err)
		}
	}
	if err := x.root.Chmod(name, modeOf(hdr)); err != nil {
		return entryErr(name, err)
	}
	return x.times(name, hdr, false)
}

// linker makes a layer's cross-layer hard links.
type linker struct {
	x       *extractor // of dest
	layers  []*os.Root // dest, then the lowers from the top
	pending map[string]crossLink
	state   map[string]linkState
}

type linkState int

const (
	linkPending linkState = iota
	linkResolving
	linkDone
)

func (l *linker) resolve(c crossLink) error {
	switch l.state[c.name] {
	case linkResolving:
		return hostile(c.name, "hard links in a cycle")
	case linkDone:
		return nil
	}
	l.state[c.name] = linkResolving
	// A link to another link of this layer: that one first, then this is
	// a plain link to it inside dest.
	if t, ok := l.pending[c.target]; ok && t.name != c.name {
		if err := l.resolve(t); err != nil {
			return err
		}
	}
	err := l.make(c)
	l.state[c.name] = linkDone
	return err
}

func (l *linker) make(c crossLink) error {
	x := l.x
	if err := x.parents(c.name); err != nil {
		return err
	}
	if _, ok, err := x.exists(c.name); err != nil || ok {
		return err // another entry of this layer took the name: it wins
	}
	i, fi, err := l.lookup(c)
	if err != nil {
		return err
	}
	if i == 0 {
		if err := x.charge(c.name, false, 0); err != nil {
			return err
		}
		return entryErr(c.name, x.root.Link(c.target, c.name))
	}
	return x.copyFrom(l.layers[i], c, fi)
}

// found is what find found: the index in l.layers of the layer whose
// entry overlayfs shows (-1 for none), and the entry's Lstat; else whether
// a layer deletes it (a whiteout), or which parent of it is a symlink or
// not a directory in the layer that shows that parent.
type found struct {
	layer   int
	fi      fs.FileInfo
	deleted bool
	blocked string
}

// find looks name up as overlayfs would in l.layers[from:], from the top.
func (l *linker) find(name string, from int) found {
	parts := strings.Split(name, "/")
	for i := from; i < len(l.layers); i++ {
		layer := l.layers[i]
		hidesBelow, _ := isOpaque(layer, ".")
		for j := range parts {
			p := strings.Join(parts[:j+1], "/")
			fi, err := layer.Lstat(p)
			if err != nil {
				break // this layer lacks it (or cannot show it)
			}
			switch {
			case isWhiteout(fi):
				return found{layer: -1, deleted: true}
			case j == len(parts)-1:
				return found{layer: i, fi: fi}
			case !fi.IsDir():
				return found{layer: -1, blocked: p}
			}
			opq, _ := isOpaque(layer, p)
			hidesBelow = hidesBelow || opq
		}
		if hidesBelow {
			break
		}
	}
	return found{layer: -1}
}

// lookup finds c's target for a hard link: the index in l.layers of the
// layer whose file it is, and the file's Lstat.
func (l *linker) lookup(c crossLink) (int, fs.FileInfo, error) {
	r := l.find(c.target, 0)
	switch {
	case r.deleted:
		return 0, nil, hostile(c.name, "hard link to %q, which a layer deletes", c.target)
	case r.blocked != "":
		return 0, nil, hostile(c.name, "hard link to %q, which is not a file of the image (its parent %q is a symlink or not a directory)", c.target, r.blocked)
	case r.layer < 0:
		return 0, nil, hostile(c.name, "hard link to %q, which neither its layer nor the layers below have", c.target)
	case !r.fi.Mode().IsRegular() && r.fi.Mode()&fs.ModeSymlink == 0:
		return 0, nil, hostile(c.name, "hard link to %q, which is not a file", c.target)
	}
	return r.layer, r.fi, nil
}

// isWhiteout reports whether fi is overlayfs's whiteout, a 0:0 character
// device.
func isWhiteout(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return fi.Mode()&fs.ModeCharDevice != 0 && ok && st.Rdev == 0
}

// isOpaque reports whether the directory name of root has overlayfs's
// opaque xattr.
func isOpaque(root *os.Root, name string) (bool, error) {
	d, err := root.Open(name)
	if err != nil {
		return false, err
	}
	defer d.Close()
	var v [1]byte
	n, err := unix.Fgetxattr(int(d.Fd()), opaqueXattr, v[:])
	switch {
	case err == nil:
		return n == 1 && v[0] == 'y', nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.ERANGE):
		return false, nil
	}
	return false, err
}

// copyFrom writes into x's layer, at c.name, a copy of the file c.target
// of the layer src (whose Lstat is fi).
func (x *extractor) copyFrom(src *os.Root, c crossLink, fi fs.FileInfo) error {
	st := fi.Sys().(*syscall.Stat_t)
	hdr := &tar.Header{
		Name: c.name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid), Size: fi.Size(),
		ModTime: time.Unix(st.Mtim.Unix()), AccessTime: time.Unix(st.Atim.Unix()),
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := src.Readlink(c.target)
		if err != nil {
			return entryErr(c.name, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return x.symlink(c.name, hdr)
	}
	f, err := src.Open(c.target)
	if err != nil {
		return entryErr(c.name, err)
	}
	defer f.Close()
	// The layers are committed and immutable; this only makes sure that
	// what was opened is what lookup checked.
	if ofi, err := f.Stat(); err != nil || !os.SameFile(fi, ofi) {
		return hostile(c.name, "hard link target %q changed while it was copied", c.target)
	}
	if hdr.PAXRecords, err = paxXattrs(f); err != nil {
		return entryErr(c.name, err)
	}
	hdr.Typeflag = tar.TypeReg
	return x.file(c.name, hdr, f)
}

// paxXattrs are the extended attributes of f as a tar's PAX records.
func paxXattrs(f *os.File) (map[string]string, error) {
	names, err := xattrNames(int(f.Fd()))
	if err != nil {
		return nil, err
	}
	recs := map[string]string{}
	for _, n := range names {
		if !keepXattr(n, true) {
			continue
		}
		v, err := getXattr(int(f.Fd()), n)
		if err != nil {
			return nil, err
		}
		recs[paxXattrPrefix+n] = string(v)
	}
	return recs, nil
}

func xattrNames(fd int) ([]string, error) {
	for size := 1024; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Flistxattr(fd, buf)
		switch {
		case errors.Is(err, unix.ERANGE) && size < 1<<20:
			continue
		case errors.Is(err, unix.ENOTSUP):
			return nil, nil
		case err != nil:
			return nil, err
		}
		return strings.FieldsFunc(string(buf[:n]), func(r rune) bool { return r == 0 }), nil
	}
}

func getXattr(fd int, name string) ([]byte, error) {
	for size := 256; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Fgetxattr(fd, name, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// keepXattr reports whether the extended attribute name of an archive's
// entry is kept: user.* ones (an image's own metadata), but not
// user.overlay.* (overlayfs's own, under its userxattr option: a layer
// must not forge whiteouts or redirects); security.capability (file
// capabilities, e.g. ping's) only with owners kept, as setting it needs
// CAP_SETFCAP, and it only ever grants capabilities in the session's user
// namespace. Never trusted.* (overlayfs reads trusted.overlay.*) nor other
// security.* (labels of another machine's policy).
func keepXattr(name string, owners bool) bool {
	switch {
	case strings.HasPrefix(name, "user.overlay."):
		return false
	case strings.HasPrefix(name, "user."):
		return true
	case name == "security.capability":
		return owners
	}
	return false
}

// setXattrs sets on fd the extended attributes of hdr that keepXattr
// keeps; a filesystem without extended attributes drops them.
func (x *extractor) setXattrs(name string, fd int, hdr *tar.Header) error {
	var keys []string
	for k := range hdr.PAXRecords {
		if n, ok := strings.CutPrefix(k, paxXattrPrefix); ok && keepXattr(n, x.opts.keepOwners) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var size int64
	for _, k := range keys {
		size += int64(len(k) - len(paxXattrPrefix) + len(hdr.PAXRecords[k]))
	}
	if x.layer != nil {
		// Their inode's block is counted already.
		if err := x.layer.budget.charge(size); err != nil {
			return entryErr(name, err)
		}
	}
	for _, k := range keys {
		err := unix.Fsetxattr(fd, strings.TrimPrefix(k, paxXattrPrefix), []byte(hdr.PAXRecords[k]), 0)
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("archive entry %q: setting its xattr %s: %w", name, strings.TrimPrefix(k, paxXattrPrefix), err)
		}
	}
	return nil
}

type extractor struct {
	root  *os.Root
	opts  extractOptions
	layer *layerState            // nil: extractTar's flattened stream
	dirs  map[string]*tar.Header // directory -> its header, metadata applied last
	links []*tar.Header          // hard links, created last
	buf   []byte                 // for copying files' data
	err   error                  // the first error of linkAll
	// Directories are never removed or replaced while a stream is
	// unpacked (claim refuses a non-directory over one), so what is known
	// of them stays true: isDir holds those checked to be directories (not
	// symlinks), and cwd is the last entry's directory, kept open, so that
	// an entry costs a lookup of its own name rather than a walk from the
	// root for each call (a file is looked up, created and timed).
	isDir   map[string]bool
	cwd     *os.Root
	cwdName string
}

// layerState is what extractLayer keeps track of in one layer.
type layerState struct {
	budget    *budget
	whiteouts map[string]bool // names whited out in this layer (by a char device made here)
	opaque    map[string]bool // directories made opaque
	implicit  map[string]bool // directories made for the entries in them
}

func newExtractor(root *os.Root, opts extractOptions, layer *layerState) *extractor {
	return &extractor{root: root, opts: opts, layer: layer, dirs: map[string]*tar.Header{}, isDir: map[string]bool{}}
}

// at returns the directory of name, as a root, and name's base: the root
// itself, or the last directory asked for, kept open.
func (x *extractor) at(name string) (*os.Root, string, error) {
	dir, base := path.Dir(name), path.Base(name)
	if dir == "." {
		return x.root, base, nil
	}
	if x.cwd != nil && x.cwdName == dir {
		return x.cwd, base, nil
	}
	r, err := x.root.OpenRoot(dir)
	if err != nil {
		return nil, "", err
	}
	x.closeCwd()
	x.cwd, x.cwdName = r, dir
	return r, base, nil
}

// closeCwd closes the directory at keeps open.
func (x *extractor) closeCwd() {
	if x.cwd != nil {
		x.cwd.Close()
		x.cwd, x.cwdName = nil, ""
	}
}

// readAll unpacks every entry of the tar stream r, but hard links, then
// reads r to its end.
func (x *extractor) readAll(ctx context.Context, r io.Reader) error {
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
			// its digest, an unsafe path) by failing the read after it,
			// and so does a reader verifying a layer's digest.
			_, err = io.Copy(io.Discard, ctxReader{ctx, r})
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: reading the archive: %w", ErrInvalidImage, err)
		}
		if eof {
			return nil
		}
		if err := x.entry(hdr, tr); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
}

// linkAll makes the hard links, in passes as long as each links some,
// and returns those whose targets never appeared; x.err is set to the
// first other error.
func (x *extractor) linkAll(pending []*tar.Header) []*tar.Header {
	for len(pending) > 0 {
		var later []*tar.Header
		for _, hdr := range pending {
			if err := x.hardlink(hdr); errors.Is(err, errLinkTargetMissing) {
				later = append(later, hdr)
			} else if err != nil {
				x.err = err
				return later
			}
		}
		if len(later) == len(pending) {
			return later
		}
		pending = later
	}
	return nil
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
	if x.layer != nil && strings.HasPrefix(path.Base(name), whiteoutPrefix) {
		return x.whiteout(name)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(name, hdr)
	case tar.TypeReg, tar.TypeGNUSparse:
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

// whiteout applies the whiteout entry name of a layer (see extractLayer).
func (x *extractor) whiteout(name string) error {
	if err := x.parents(name); err != nil {
		return err
	}
	dir, base := path.Dir(name), path.Base(name)
	if base == opaqueMarker {
		return x.makeOpaque(dir)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	hidden := strings.TrimPrefix(base, whiteoutPrefix)
	if hidden == "" || hidden == "." || hidden == ".." {
		return hostile(name, "a whiteout of no name")
	}
	target := path.Join(dir, hidden)
	fi, ok, err := x.exists(target)
	switch {
	case err != nil:
		return err
	case ok && fi.IsDir():
		return x.makeOpaque(target) // the lower directory goes, this layer's stays
	case ok:
		return nil // this layer's entry hides the lower one already
	}
	if err := x.charge(name, true, 0); err != nil {
		return err
	}
	d, err := x.root.Open(dir)
	if err != nil {
		return entryErr(name, err)
	}
	defer d.Close()
	if err := unix.Mknodat(int(d.Fd()), hidden, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("archive entry %q: making its whiteout (a 0:0 character device): %w", name, err)
	}
	x.layer.whiteouts[target] = true
	return nil
}

// makeOpaque marks the directory name so that overlayfs hides what the
// layers below have in it.
func (x *extractor) makeOpaque(name string) error {
	if x.layer.opaque[name] {
		return nil
	}
	d, err := x.root.Open(name)
	if err != nil {
		return entryErr(name, err)
	}
	defer d.Close()
	if err := unix.Fsetxattr(int(d.Fd()), opaqueXattr, []byte("y"), 0); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("archive entry %q: an opaque directory (a layer replacing a directory of the layers below) needs root: overlayfs marks it with a trusted.* xattr, which only root may set: %w", name, err)
		}
		return fmt.Errorf("archive entry %q: marking it opaque: %w", name, err)
	}
	x.layer.opaque[name] = true
	return nil
}

// exists reports whether name exists (not following a final symlink).
func (x *extractor) exists(name string) (fs.FileInfo, bool, error) {
	r, base, err := x.at(name)
	var fi fs.FileInfo
	if err == nil {
		fi, err = r.Lstat(base)
	}
	switch {
	case err == nil:
		return fi, true, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, false, nil
	}
	return nil, false, entryErr(name, err)
}

// slot is what claim found at an entry's name.
type slot int

const (
	slotFree slot = iota // nothing (any more): create the entry
	slotDir              // a directory, which a directory entry updates
	slotSkip             // an entry that wins over this one
)

// claim readies name for a new entry (a directory when dir). In a
// flattened stream the first entry of a name wins (it is the upper
// layer's). In a layer the later one does: an earlier non-directory or
// whiteout is removed; a directory stays for a directory entry and
// refuses a non-directory.
func (x *extractor) claim(name string, dir bool) (slot, error) {
	fi, ok, err := x.exists(name)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return slotFree, nil
	case fi.IsDir() && dir:
		return slotDir, nil
	case x.layer == nil:
		return slotSkip, nil
	case fi.IsDir():
		return 0, hostile(name, "a directory, then a non-directory of the same name")
	}
	r, base, err := x.at(name)
	if err == nil {
		err = r.Remove(base)
	}
	if err != nil {
		return 0, entryErr(name, err)
	}
	delete(x.layer.whiteouts, name)
	return slotFree, nil
}

// charge counts a new entry of a layer (see budget): an inode (but for a
// hard link), a block, and extra bytes. extractTar's flattened stream
// has no budget.
func (x *extractor) charge(name string, inode bool, extra int64) error {
	if x.layer == nil || x.layer.budget == nil {
		return nil
	}
	b := x.layer.budget
	err := b.chargeEntry(inode)
	if err == nil {
		err = b.charge(extra)
	}
	return entryErr(name, err)
}

// entryErr names the entry an I/O error (or an os.Root refusal) is about.
func entryErr(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("archive entry %q: %w", name, err)
}

// parents creates name's missing parent directories (mode 0755, as
// implicit parents get) and fails when one of them is a symlink or not a
// directory.
func (x *extractor) parents(name string) error { return x.walkParents(name, true) }

// walkParents checks that each of name's parents is a directory, not a
// symlink; a missing one is created when create, else an error matching
// errLinkTargetMissing.
func (x *extractor) walkParents(name string, create bool) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	if x.isDir[dir] {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		if x.isDir[p] {
			continue
		}
		fi, ok, err := x.exists(p)
		if err != nil {
			return err
		}
		switch {
		case !ok && !create:
			return fmt.Errorf("%w: %q: its parent %q does not exist", errLinkTargetMissing, name, p)
		case !ok:
			if err := x.charge(p, true, 0); err != nil {
				return err
			}
			if err := x.root.Mkdir(p, 0o755); err != nil {
				return entryErr(name, err)
			}
			if x.layer != nil {
				x.layer.implicit[p] = true
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			return hostile(name, "its parent %q is a symlink: refusing to write through it", p)
		case !fi.IsDir():
			return hostile(name, "its parent %q is not a directory", p)
		}
		x.isDir[p] = true
	}
	return nil
}

func (x *extractor) dir(name string, hdr *tar.Header) error {
	if name == "." {
		x.dirs[name] = hdr
		return x.dirXattrs(name, hdr)
	}
	if err := x.parents(name); err != nil {
		return err
	}
	whitedOut := x.layer != nil && x.layer.whiteouts[name]
	s, err := x.claim(name, true)
	switch {
	case err != nil:
		return err
	case s == slotSkip:
		return nil // an upper layer's non-directory wins
	case s == slotFree:
		if err := x.charge(name, true, 0); err != nil {
			return err
		}
		if err := x.root.Mkdir(name, 0o700); err != nil {
			return entryErr(name, err)
		}
	}
	if whitedOut {
		// The lower directory was deleted and this layer has its own.
		if err := x.makeOpaque(name); err != nil {
			return err
		}
	}
	if _, done := x.dirs[name]; !done || x.layer != nil {
		x.dirs[name] = hdr
	}
	return x.dirXattrs(name, hdr)
}

func (x *extractor) dirXattrs(name string, hdr *tar.Header) error {
	if len(hdr.PAXRecords) == 0 {
		return nil
	}
	d, err := x.root.Open(name)
	if err != nil {
		return entryErr(name, err)
	}
	defer d.Close()
	return x.setXattrs(name, int(d.Fd()), hdr)
}

func (x *extractor) file(name string, hdr *tar.Header, r io.Reader) error {
	if name == "." {
		return hostile(name, "a file where the image's root directory is")
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if s, err := x.claim(name, false); err != nil || s != slotFree {
		return err // exists: an upper layer's entry wins
	}
	if err := x.charge(name, true, roundBlocks(hdr.Size)); err != nil {
		return fmt.Errorf("%w (a file of %s)", err, sizeString(hdr.Size))
	}
	// O_EXCL: never opens an existing file, or through a final symlink.
	dir, base, err := x.at(name)
	var f *os.File
	if err == nil {
		f, err = dir.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return entryErr(name, err)
	}
	if err := x.fillFile(f, hdr, r); err != nil {
		f.Close()
		return entryErr(name, err)
	}
	if err := f.Close(); err != nil {
		return entryErr(name, err)
	}
	return x.times(name, hdr, false)
}

// fillFile writes a new file's data, owner, mode and xattrs.
func (x *extractor) fillFile(f *os.File, hdr *tar.Header, r io.Reader) error {
	if err := x.writeData(f, r, hdr.Size); err != nil {
		return err
	}
	if x.opts.keepOwners {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	// After the chown, which clears setuid and setgid bits.
	if err := f.Chmod(modeOf(hdr)); err != nil {
		return err
	}
	// After the write and the chown, which both clear security.capability.
	return x.setXattrs(hdr.Name, int(f.Fd()), hdr)
}

const (
	holeBlock = 32 << 10 // a run of zeros this long, so aligned, is left as a hole
	copyChunk = 1 << 20  // bytes read at a time; a multiple of holeBlock
)

var zeroBlock = make([]byte, holeBlock)

// writeData writes size bytes of r into the new, empty file f, leaving
// every holeBlock-aligned block of zeros a hole, then sets its size (so
// trailing zeros are a hole too).
func (x *extractor) writeData(f *os.File, r io.Reader, size int64) error {
	if x.buf == nil && size > 0 {
		x.buf = make([]byte, copyChunk)
	}
	for off := int64(0); off < size; {
		chunk := x.buf[:min(int64(len(x.buf)), size-off)]
		if _, err := io.ReadFull(r, chunk); err != nil {
			return err
		}
		for i := 0; i < len(chunk); {
			if isZeroBlock(chunk[i:]) {
				i += holeBlock
				continue
			}
			j := i + min(holeBlock, len(chunk)-i)
			for j < len(chunk) && !isZeroBlock(chunk[j:]) {
				j += min(holeBlock, len(chunk)-j)
			}
			if _, err := f.WriteAt(chunk[i:j], off+int64(i)); err != nil {
				return err
			}
			i = j
		}
		off += int64(len(chunk))
	}
	return f.Truncate(size)
}

// isZeroBlock reports whether b starts with a whole block of zeros.
func isZeroBlock(b []byte) bool {
	return len(b) >= holeBlock && bytes.Equal(b[:holeBlock], zeroBlock)
}

func (x *extractor) symlink(name string, hdr *tar.Header) error {
	if name == "." {
		return hostile(name, "a symlink where the image's root directory is")
	}
	if err := x.parents(name); err != nil {
		return err
	}
	if s, err := x.claim(name, false); err != nil || s != slotFree {
		return err
	}
	if err := x.charge(name, true, int64(len(hdr.Linkname))); err != nil {
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
	if s, err := x.claim(name, false); err != nil || s != slotFree {
		return err
	}
	if target == "." {
		return hostile(name, "hard link to the image's root directory")
	}
	if err := x.walkParents(target, false); errors.Is(err, errLinkTargetMissing) {
		return err
	} else if err != nil {
		return hostile(name, "hard link to %q, which is not a file of the image (a parent is not a directory, or a symlink)", hdr.Linkname)
	}
	fi, ok, err := x.exists(target)
	switch {
	case err != nil:
		return err
	case !ok:
		return errLinkTargetMissing
	case x.layer != nil && x.layer.whiteouts[target]:
		return hostile(name, "hard link to %q, which this layer deletes", hdr.Linkname)
	case !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0:
		return hostile(name, "hard link to %q, which is not a file", hdr.Linkname)
	}
	if err := x.charge(name, false, 0); err != nil {
		return err
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
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(depthOf(b), depthOf(a)), cmp.Compare(a, b)) })
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

// depthOf is how deep the cleaned name n is: 0 for the root.
func depthOf(n string) int {
	if n == "." {
		return 0
	}
	return strings.Count(n, "/") + 1
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
		r, base, err := x.at(name)
		if err == nil {
			err = r.Chtimes(base, atime, mtime)
		}
		if err != nil {
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
