package imagestore

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// ErrInvalidImage is matched (errors.Is) by Import's errors about the
// content of the file imported: not an OCI layout or a docker save
// tarball, no image or several without a name choosing one, an image for
// another platform, a layer that does not match its digest, or a hostile
// archive entry (a path with "..", an absolute path, a write through a
// symlink, a hard link out of the image).
var ErrInvalidImage = errors.New("invalid image file")

// ErrNeedName is matched (errors.Is), beside ErrInvalidImage, by Import's
// error when the file needs a name to be imported: its image has no
// usable name of its own, or it holds several images and the name given
// chooses none of them (the error lists them).
var ErrNeedName = errors.New("a name is needed")

// Annotations of an OCI layout's index that name an image: containerd's
// (a full reference) first, then the OCI one (often only a tag).
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Import unpacks the image in file under name and returns it.
//
// file is an OCI image layout directory, a tar of one, or a `docker save`
// tarball (either tar may be gzip-compressed); the format is told by the
// content, never by the file name. name "" takes the image's own name: a
// docker save tarball's repo tag, an OCI layout's
// io.containerd.image.name or org.opencontainers.image.ref.name
// annotation; an image without one is an error asking for a name. A file
// holding several images needs a name that selects one of them (an image
// whose own names include it), else the error lists them; a file holding
// one image is imported under name whatever its own names are. An index
// of several platforms (a multi-platform image) gives the linux one of
// this machine's architecture.
//
// Each layer the store lacks is unpacked, streaming, into a layer
// directory of its own, shared with every image that has it over the same
// layers below (see addImage, chainKeys and extractLayer), keeping modes (setuid bits included), owners (when
// running as root) and modification times. Each layer is checked against
// its digest in the image config. A hostile entry fails the import:
// nothing is ever written outside the new layer's directory or through a
// symlink. Only a complete image is committed: a failed or cancelled
// Import leaves no image and no half layer behind (the layers it
// completed stay, for Prune or a later import to take).
//
// An existing image of the same name is replaced atomically: sessions
// that acquired the old version keep using it until they release it,
// when it is deleted (see Acquire). Import is safe to call concurrently
// (from many processes too); of two imports of one name, the last to
// finish wins.
//
// Errors name file and the cause: those about the file's content match
// ErrInvalidImage, an invalid name ErrInvalidName, a missing file
// fs.ErrNotExist; ctx's error when it ends the import.
func (s *Store) Import(ctx context.Context, file, name string) (Image, error) {
	img, err := s.importImage(ctx, file, name)
	if err != nil {
		return Image{}, fmt.Errorf("importing %s: %w", file, err)
	}
	return img, nil
}

func (s *Store) importImage(ctx context.Context, file, want string) (Image, error) {
	if want != "" {
		var err error
		if want, err = CanonicalName(want); err != nil {
			return Image{}, err
		}
	}
	st, err := s.newStage()
	if err != nil {
		return Image{}, err
	}
	defer st.abort()

	cands, err := openSource(ctx, file, filepath.Join(st.dir, "src"))
	if err != nil {
		return Image{}, err
	}
	c, canon, err := choose(cands, want)
	if err != nil {
		return Image{}, &needNameError{err}
	}
	img, err := c.load()
	if err != nil {
		return Image{}, fmt.Errorf("%w: reading image %s: %w", ErrInvalidImage, c.label(), err)
	}
	return s.addImage(ctx, st, addRequest{Name: canon, Image: img, Label: c.label()})
}

// needNameError is choose's error: it matches ErrInvalidImage and
// ErrNeedName.
type needNameError struct{ err error }

func (e *needNameError) Error() string { return ErrInvalidImage.Error() + ": " + e.err.Error() }
func (e *needNameError) Unwrap() []error {
	return []error{ErrInvalidImage, ErrNeedName, e.err}
}

// candidate is one image of a file.
type candidate struct {
	digest string   // digest of its manifest or config, to list it
	names  []string // its own names, canonical
	bad    error    // why its first unusable own name is unusable
	load   func() (v1.Image, error)
}

func (c candidate) label() string {
	if len(c.names) > 0 {
		return c.names[0] + " (" + shortDigest(c.digest) + ")"
	}
	return shortDigest(c.digest)
}

func shortDigest(d string) string {
	if i := strings.IndexByte(d, ':'); i >= 0 && len(d) > i+13 {
		return d[:i+13]
	}
	return d
}

// choose picks the candidate that want (canonical, "" for none) selects
// and the name to import it under.
func choose(cands []candidate, want string) (candidate, string, error) {
	list := func() string {
		labels := make([]string, len(cands))
		for i, c := range cands {
			labels[i] = c.label()
			if len(c.names) > 1 {
				labels[i] += " also named " + strings.Join(c.names[1:], ", ")
			}
		}
		return strings.Join(labels, "; ")
	}
	switch {
	case len(cands) == 0:
		return candidate{}, "", errors.New("the file holds no image")
	case want != "":
		var match []candidate
		for _, c := range cands {
			if slices.Contains(c.names, want) {
				match = append(match, c)
			}
		}
		switch {
		case len(match) == 1:
			return match[0], want, nil
		case len(match) > 1:
			return candidate{}, "", fmt.Errorf("%d images are named %s: %s", len(match), want, list())
		case len(cands) == 1:
			return cands[0], want, nil
		}
		return candidate{}, "", fmt.Errorf("the file holds %d images and none is named %s: %s; name one of them", len(cands), want, list())
	case len(cands) > 1:
		return candidate{}, "", fmt.Errorf("the file holds %d images: %s; name the one to import", len(cands), list())
	}
	c := cands[0]
	switch {
	case len(c.names) == 1:
		return c, c.names[0], nil
	case len(c.names) > 1:
		return candidate{}, "", fmt.Errorf("the image has several names (%s): name the one to import it under", strings.Join(c.names, ", "))
	case c.bad != nil:
		return candidate{}, "", fmt.Errorf("the image's own name is unusable (%v): give it a name", c.bad)
	}
	return candidate{}, "", fmt.Errorf("the image %s has no name of its own: give it a name", shortDigest(c.digest))
}

// addName files an image's own name under names, or its error in bad.
func (c *candidate) addName(n string) {
	if n == "" {
		return
	}
	canon, err := CanonicalName(n)
	switch {
	case err != nil:
		if c.bad == nil {
			c.bad = err
		}
	case !slices.Contains(c.names, canon):
		c.names = append(c.names, canon)
	}
}

// openSource tells file's format and lists its images. An OCI layout in a
// tar is unpacked into scratch (plain files only) to be read.
func openSource(ctx context.Context, file, scratch string) ([]candidate, error) {
	fi, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		if !isLayoutDir(file) {
			return nil, fmt.Errorf("%w: a directory, but not an OCI image layout (it needs an oci-layout file and an index.json)", ErrInvalidImage)
		}
		return layoutCandidates(file)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: not a regular file or a directory", ErrInvalidImage)
	}
	kind, gz, err := sniff(file)
	if err != nil {
		return nil, err
	}
	opener := func() (io.ReadCloser, error) { return openMaybeGzip(file, gz) }
	if kind == kindDockerSave {
		m, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, fmt.Errorf("%w: reading the docker save manifest.json: %w", ErrInvalidImage, err)
		}
		return dockerCandidates(m, opener), nil
	}
	rc, err := opener()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return nil, err
	}
	if err := extractTar(ctx, rc, scratch, extractOptions{}); err != nil {
		return nil, err
	}
	if !isLayoutDir(scratch) {
		return nil, fmt.Errorf("%w: the OCI layout in the tar lacks its oci-layout file or index.json", ErrInvalidImage)
	}
	return layoutCandidates(scratch)
}

func isLayoutDir(dir string) bool {
	for _, f := range []string{"oci-layout", "index.json"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

type sourceKind int

const (
	kindDockerSave sourceKind = iota
	kindLayoutTar
)

// sniff reads file's tar headers: a docker save tarball has a top-level
// manifest.json, a tar of an OCI layout an oci-layout file and an
// index.json. gz reports a gzip-compressed tar.
func sniff(file string) (sourceKind, bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	magic, _ := br.Peek(2)
	gz := len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b
	var r io.Reader = f
	if gz {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return 0, false, fmt.Errorf("%w: gzip data, but unreadable: %w", ErrInvalidImage, err)
		}
		defer zr.Close()
		r = zr
	} else if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, false, err
	}
	tr := tar.NewReader(r)
	seen := map[string]bool{}
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if n == 0 {
				return 0, false, fmt.Errorf("%w: neither an OCI image layout directory nor a tar archive (docker save or OCI layout): %w", ErrInvalidImage, err)
			}
			return 0, false, fmt.Errorf("%w: reading the tar archive: %w", ErrInvalidImage, err)
		}
		switch n := path.Clean(strings.TrimPrefix(hdr.Name, "/")); n {
		case "manifest.json":
			return kindDockerSave, gz, nil
		case "oci-layout", "index.json":
			seen[n] = true
		}
	}
	if seen["oci-layout"] && seen["index.json"] {
		return kindLayoutTar, gz, nil
	}
	return 0, false, fmt.Errorf("%w: a tar archive, but neither a docker save tarball (no manifest.json) nor an OCI image layout (no oci-layout and index.json)", ErrInvalidImage)
}

// openMaybeGzip opens file, decompressing it when gz.
func openMaybeGzip(file string, gz bool) (io.ReadCloser, error) {
	f, err := os.Open(file)
	if err != nil || !gz {
		return f, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, closeBoth{zr, f}}, nil
}

type closeBoth struct{ a, b io.Closer }

func (c closeBoth) Close() error { return errors.Join(c.a.Close(), c.b.Close()) }

// dockerCandidates lists the images of a docker save manifest.
func dockerCandidates(m tarball.Manifest, opener tarball.Opener) []candidate {
	cands := make([]candidate, 0, len(m))
	for _, d := range m {
		c := candidate{digest: configDigest(d.Config)}
		for _, t := range d.RepoTags {
			c.addName(t)
		}
		tags, only := d.RepoTags, len(m) == 1
		c.load = func() (v1.Image, error) {
			if only {
				return tarball.Image(opener, nil)
			}
			if len(tags) == 0 {
				return nil, errors.New("an untagged image among several cannot be selected: save it with a tag, or alone")
			}
			tag, err := name.NewTag(tags[0])
			if err != nil {
				return nil, err
			}
			return tarball.Image(opener, &tag)
		}
		cands = append(cands, c)
	}
	return cands
}

// configDigest turns a docker save config path ("blobs/sha256/<hex>" or
// "<hex>.json") into a digest to show.
func configDigest(p string) string {
	p = strings.TrimSuffix(p, ".json")
	dir, base := path.Split(p)
	if alg := path.Base(path.Clean(dir)); dir != "" && alg != "." {
		return alg + ":" + base
	}
	return "sha256:" + base
}

// layoutCandidates lists the images of the OCI layout in dir: one per
// manifest of its index.json (descriptors of one digest are one image
// with several names); nested indexes give this platform's image.
func layoutCandidates(dir string) ([]candidate, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidImage, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("%w: reading index.json: %w", ErrInvalidImage, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: reading index.json: %w", ErrInvalidImage, err)
	}
	var cands []candidate
	at := map[v1.Hash]int{}
	for _, d := range im.Manifests {
		var load func() (v1.Image, error)
		switch {
		case d.MediaType.IsImage():
			load = func() (v1.Image, error) { return idx.Image(d.Digest) }
		case d.MediaType.IsIndex():
			load = func() (v1.Image, error) {
				child, err := idx.ImageIndex(d.Digest)
				if err != nil {
					return nil, err
				}
				return platformImage(child)
			}
		default:
			continue // not an image: an artifact, a signature...
		}
		i, ok := at[d.Digest]
		if !ok {
			i = len(cands)
			at[d.Digest] = i
			cands = append(cands, candidate{digest: d.Digest.String(), load: load})
		}
		if n := d.Annotations[annotationContainerdName]; n != "" {
			cands[i].addName(n)
		} else {
			cands[i].addName(d.Annotations[annotationRefName])
		}
	}
	return cands, nil
}

// platformImage picks this machine's image from a multi-platform index,
// as a pull does (pickPlatform).
func platformImage(idx v1.ImageIndex) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	host, err := parsePlatform("")
	if err != nil {
		return nil, err
	}
	d, err := pickPlatform(im, host)
	if err != nil {
		return nil, err
	}
	return idx.Image(d.Digest)
}

// diskUsage sums the blocks allocated to the tree at dir, counting a
// hardlinked file once.
func diskUsage(dir string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			total += fi.Size()
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}

// syncFS flushes the filesystem holding dir, so a committed image is on
// disk whole (one syncfs rather than an fsync per file).
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
