package imagestore

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/flock"
)

// DirName is the store's directory in a tai42 state directory: the CLI
// ("tai42 image") and the container provider both open
// <state-dir>/images.
const DirName = "images"

// ErrNotFound is matched (errors.Is) by the error of Get, Acquire and
// Remove for a name the store does not hold; the error text names the
// image.
var ErrNotFound = errors.New("image not found")

// ErrInUse is matched (errors.Is) by the error of Remove for an image a
// session (of any process) has acquired.
var ErrInUse = errors.New("image in use")

// Layout of a store directory:
//
//	lock                 flock(2)ed exclusively while the index, the set
//	                     of image versions or the set of layers changes
//	index.json           the names (version 2): name -> image version, its
//	                     layers and its config, replaced atomically
//	layers/<key>/        one unpacked layer, shared by every image that has
//	                     it over the same layers below: fs/ (the tree, in
//	                     overlayfs's format) and
//	                     meta.json (see layerMeta); committed by a rename
//	images/<alg>-<hex>-<r>/
//	                     one image version per import or pull, named by the
//	                     image ID and a random suffix: "lock" (shared-locked
//	                     while acquired) and config.json (see versionRecord)
//	tmp/<r>/             stages (imports and pulls in progress), each
//	                     holding an exclusive lock on its "lock" file, with
//	                     the config.json of the version it will commit (so
//	                     a collection keeps the layers it uses) and the
//	                     layers it is unpacking
//	trash/               directories being removed
//
// A layer's key is its chain ID ("chain:<hex>", directory chain-<hex>;
// see chainKeys): the layer and every layer below it. A store of an older
// tai42 keyed layers by their diffIDs ("sha256:<hex>", directory
// sha256-<hex>), which its images keep using; a layer migrated from a
// version-1 store, the flattened root filesystem of one image, is keyed
// "v1:<its old directory>" (directory v1-<alg>-<hex>-<r>).

// DefaultMaxImageSize bounds the bytes an image's layers take in the
// store (see WithMaxImageSize), unless the store is opened with another.
const DefaultMaxImageSize int64 = 20 << 30

// DefaultMaxImageInodes bounds the inodes an image's layers take in the
// store, unless the store is opened with another: more than the largest
// images hold (a full TeX Live has about 200,000 files), and a small part
// of a state filesystem's inodes.
const DefaultMaxImageInodes int64 = 1 << 20

const (
	storeLockFile = "lock"
	indexFile     = "index.json"
	tmpDirName    = "tmp"
	trashDirName  = "trash"
	layersDirName = "layers"
	imagesDirName = "images"
	imageLockFile = "lock"
	configFile    = "config.json"
	indexVersion  = 2
)

// imageDirPattern matches the name of an image version directory (and of
// a version-1 store's image directory).
var imageDirPattern = lazyRegexp(`^[a-z0-9]+-[0-9a-f]{32,128}-[0-9a-f]{16}$`)

// Image is an image of the store.
type Image struct {
	Name       string    // canonical name (see CanonicalName), e.g. "busybox:latest"
	ID         string    // content digest of the image's config, e.g. "sha256:0123…" (docker's IMAGE ID)
	Digest     string    // the manifest digest it was pulled by; "" for an import without one
	Platform   string    // "os/arch[/variant]" of its config
	Size       int64     // bytes its layers take on disk (allocated blocks; a hardlinked file counts once)
	SharedSize int64     // the part of Size in layers another image of the store uses too
	Pulled     time.Time // when it was pulled or imported under Name
	Env        []string  // the image config's Env, "KEY=VALUE" each
	WorkingDir string    // the image config's WorkingDir, "" for none
	User       string    // the image config's User
	Entrypoint []string  // the image config's Entrypoint
	Cmd        []string  // the image config's Cmd
	// Layers are the absolute paths of the image's unpacked layers, lowest
	// first, for an overlay's lowerdirs (the top one given first to
	// overlayfs); none contains ':' or ','. An image may have none.
	Layers []string
}

// Store is a directory of images imported from OCI layouts and docker save
// tarballs, or pulled from registries, their layers stored once each.
//
// A Store is safe for concurrent use by many goroutines, and several
// processes may open the same directory: every change of the index, of
// the image versions or of the layers happens under an exclusive flock(2)
// of the store's lock file (but the commit of a layer: an atomic rename),
// and the index of names is replaced atomically, so readers (List, Get)
// never see a partial state. An image version stays on disk, its layers
// too, while any process has acquired it (a shared flock(2) on a file of
// its directory), even after its name was removed or replaced.
type Store struct {
	dir       string // absolute
	maxSize   int64  // the byte budget of each image's layers
	maxInodes int64  // the inode budget of each image's layers
}

// Option is an option of Open.
type Option func(*Store)

// WithMaxImageSize bounds the bytes each image's layers take in the
// store: every file, directory, symlink, whiteout and hard link a block
// (4 KiB), a file its apparent size besides (holes included), a symlink
// its target's length, extended attributes their lengths. An import or
// pull beyond it fails with an error matching ErrTooLarge. n <= 0 is
// DefaultMaxImageSize.
func WithMaxImageSize(n int64) Option {
	return func(s *Store) {
		if n > 0 {
			s.maxSize = n
		}
	}
}

// WithMaxImageInodes bounds the inodes each image's layers take in the
// store (files, directories, symlinks, whiteouts; the copies of hard
// links across layers too); an import or pull beyond it fails with an
// error matching ErrTooLarge and ErrTooManyInodes. n <= 0 is
// DefaultMaxImageInodes.
func WithMaxImageInodes(n int64) Option {
	return func(s *Store) {
		if n > 0 {
			s.maxInodes = n
		}
	}
}

// indexEntry is one name of the index.
type indexEntry struct {
	Name       string    `json:"name"`
	ID         string    `json:"id"`
	Dir        string    `json:"dir"`    // base name of the image version directory, under images/
	Layers     []string  `json:"layers"` // layer keys (chain IDs), lowest first
	Digest     string    `json:"digest,omitempty"`
	Platform   string    `json:"platform,omitempty"`
	Pulled     time.Time `json:"pulled"`
	Env        []string  `json:"env,omitempty"`
	WorkingDir string    `json:"working_dir,omitempty"`
	User       string    `json:"user,omitempty"`
	Entrypoint []string  `json:"entrypoint,omitempty"`
	Cmd        []string  `json:"cmd,omitempty"`
}

type index struct {
	Version int          `json:"version"`
	Images  []indexEntry `json:"images"`
}

func (ix *index) find(name string) int {
	return slices.IndexFunc(ix.Images, func(e indexEntry) bool { return e.Name == name })
}

// Open opens the store in dir, creating dir (mode 0700) and its layout if
// missing, migrating a version-1 store (one flattened root filesystem per
// image) to the layered one, and removes what interrupted imports, pulls
// and removals left behind: stages no process holds, image versions
// nothing names or holds, the trash. Committed layers stay, used or not
// (a restarted pull resumes from them; Prune removes them). dir must not
// contain ':' or ',', which overlayfs's mount options cannot carry in a
// lower directory's path.
func Open(dir string, opts ...Option) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	if strings.ContainsAny(abs, ":,") {
		return nil, fmt.Errorf("image store %s: the path contains ':' or ',', which overlayfs cannot take in a lower directory: choose another state directory", abs)
	}
	for _, d := range []string{abs, tmpDirName, trashDirName, layersDirName, imagesDirName} {
		if !filepath.IsAbs(d) {
			d = filepath.Join(abs, d)
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	s := &Store{dir: abs, maxSize: DefaultMaxImageSize, maxInodes: DefaultMaxImageInodes}
	for _, o := range opts {
		o(s)
	}
	var trash []string
	err = s.withLock(func() error {
		if err := s.migrate(); err != nil {
			return err
		}
		ix, err := s.readIndex()
		if err != nil {
			return err
		}
		trash = s.collect(ix, gcNone).trash
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.emptyTrash(trash)
	return s, nil
}

// Dir returns the store's directory (absolute).
func (s *Store) Dir() string { return s.dir }

// List returns the store's images sorted by name. It takes no lock: it
// reads one consistent version of the index.
func (s *Store) List() ([]Image, error) {
	ix, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	v := s.view(ix)
	imgs := make([]Image, len(ix.Images))
	for i, e := range ix.Images {
		imgs[i] = v.image(e)
	}
	slices.SortFunc(imgs, func(a, b Image) int { return cmp.Compare(a.Name, b.Name) })
	return imgs, nil
}

// Get returns the image named name (any spelling CanonicalName accepts).
// An image the store does not hold is an error matching ErrNotFound; an
// invalid name one matching ErrInvalidName. Its Layers may be removed at
// any time by Remove or Prune: a session uses Acquire.
func (s *Store) Get(name string) (Image, error) {
	canon, err := CanonicalName(name)
	if err != nil {
		return Image{}, err
	}
	ix, err := s.readIndex()
	if err != nil {
		return Image{}, err
	}
	i := ix.find(canon)
	if i < 0 {
		return Image{}, s.notFound(canon)
	}
	return s.view(ix).image(ix.Images[i]), nil
}

// Acquire returns the image named name for a session, and a release
// function the session calls when it no longer uses the image's Layers.
// Until then (across processes: it holds a shared flock(2) on a file of
// the image version), Remove refuses the image with an error matching
// ErrInUse, and a replacing Import or Pull, a Remove of another image or a
// Prune leave this version and its layers in place; release deletes such
// an orphaned version once no other holder remains. release is safe to
// call more than once and from any goroutine. Errors: ErrNotFound,
// ErrInvalidName, or the I/O failure.
func (s *Store) Acquire(name string) (Image, func(), error) {
	canon, err := CanonicalName(name)
	if err != nil {
		return Image{}, nil, err
	}
	var img Image
	var lock *os.File
	err = s.withLock(func() error {
		ix, err := s.readIndex()
		if err != nil {
			return err
		}
		i := ix.find(canon)
		if i < 0 {
			return s.notFound(canon)
		}
		e := ix.Images[i]
		f, err := os.Open(s.versionPath(e.Dir, imageLockFile))
		if err != nil {
			return fmt.Errorf("image %s: %w", canon, err)
		}
		if err := flock.Lock(f, syscall.LOCK_SH); err != nil {
			f.Close()
			return fmt.Errorf("image %s: locking: %w", canon, err)
		}
		img, lock = s.view(ix).image(e), f
		return nil
	})
	if err != nil {
		return Image{}, nil, err
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			lock.Close()
			// The version may have been replaced or removed meanwhile:
			// delete it now if this was its last holder.
			s.collectNow(gcReleased)
		})
	}
	return img, release, nil
}

// Remove deletes the image named name: its name at once, its image
// version and every layer no other image (indexed, or acquired by a
// session) and no import or pull in progress uses, before Remove returns.
// An image that is acquired (by any process) is refused with an error
// matching ErrInUse and left as it was; a name the store does not hold is
// an error matching ErrNotFound.
func (s *Store) Remove(name string) error {
	canon, err := CanonicalName(name)
	if err != nil {
		return err
	}
	var trash []string
	err = s.withLock(func() error {
		ix, err := s.readIndex()
		if err != nil {
			return err
		}
		i := ix.find(canon)
		if i < 0 {
			return s.notFound(canon)
		}
		e := ix.Images[i]
		f, err := os.Open(s.versionPath(e.Dir, imageLockFile))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing image %s: %w", canon, err)
		}
		if f != nil {
			defer f.Close()
			if err := flock.Lock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				if errors.Is(err, syscall.EWOULDBLOCK) {
					return fmt.Errorf("image %s is in use by a running session: remove it when the session ends: %w", canon, ErrInUse)
				}
				return fmt.Errorf("removing image %s: locking: %w", canon, err)
			}
		}
		ix.Images = slices.Delete(ix.Images, i, i+1)
		if err := s.writeIndex(ix); err != nil {
			return fmt.Errorf("removing image %s: %w", canon, err)
		}
		// Holding the exclusive lock, no one can acquire it any more: move
		// it aside now, delete it outside the store lock.
		if t, err := s.toTrash(filepath.Join(imagesDirName, e.Dir)); err == nil {
			trash = append(trash, t)
		}
		trash = append(trash, s.collect(ix, gcAll).trash...)
		return nil
	})
	s.emptyTrash(trash)
	return err
}

// Prune removes every layer no image (indexed, or acquired by a session)
// and no import or pull in progress uses, and the image versions no name
// refers to and no session holds. It returns what it removed.
func (s *Store) Prune(ctx context.Context) (sandbox.PruneResult, error) {
	if err := ctx.Err(); err != nil {
		return sandbox.PruneResult{}, err
	}
	var g garbage
	err := s.withLock(func() error {
		ix, err := s.readIndex()
		if err != nil {
			return err
		}
		g = s.collect(ix, gcAll)
		return nil
	})
	s.emptyTrash(g.trash)
	if err != nil {
		return sandbox.PruneResult{}, err
	}
	return sandbox.PruneResult{Layers: g.layers, Bytes: g.bytes}, nil
}

// view turns index entries into Images: it knows how many images use each
// indexed layer, and reads the sizes of the layers it is asked about.
type view struct {
	s     *Store
	sizes map[string]int64
	users map[string]int
}

func (s *Store) view(ix *index) *view {
	v := &view{s: s, sizes: map[string]int64{}, users: map[string]int{}}
	for _, e := range ix.Images {
		for _, k := range uniq(e.Layers) {
			v.users[k]++
		}
	}
	return v
}

// size is layer k's disk size, read from its meta file on first use: an
// image's own layers only (Get and Acquire are on every create's path, so
// they never read the other images' files).
func (v *view) size(k string) int64 {
	n, ok := v.sizes[k]
	if !ok {
		n = v.s.layerSize(k)
		v.sizes[k] = n
	}
	return n
}

func (v *view) image(e indexEntry) Image {
	img := Image{
		Name:       e.Name,
		ID:         e.ID,
		Digest:     e.Digest,
		Platform:   e.Platform,
		Pulled:     e.Pulled,
		Env:        slices.Clone(e.Env),
		WorkingDir: e.WorkingDir,
		User:       e.User,
		Entrypoint: slices.Clone(e.Entrypoint),
		Cmd:        slices.Clone(e.Cmd),
		Layers:     make([]string, len(e.Layers)),
	}
	for i, k := range e.Layers {
		img.Layers[i] = v.s.layerFS(k)
	}
	for _, k := range uniq(e.Layers) {
		n := v.size(k)
		img.Size += n
		if v.users[k] > 1 {
			img.SharedSize += n
		}
	}
	return img
}

// uniq is keys without repeats, in order.
func uniq(keys []string) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// versionPath is the path of elem in the image version directory dir.
func (s *Store) versionPath(dir string, elem ...string) string {
	return filepath.Join(append([]string{s.dir, imagesDirName, dir}, elem...)...)
}

func (s *Store) notFound(canon string) error {
	return fmt.Errorf("image %s is not in the image store %s: %w", canon, s.dir, ErrNotFound)
}

// withLock runs fn holding the store's exclusive lock.
func (s *Store) withLock(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(s.dir, storeLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer f.Close()
	if err := flock.Lock(f, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("image store: locking %s: %w", f.Name(), err)
	}
	return fn()
}

// readIndex reads the index; a missing one is empty.
func (s *Store) readIndex() (*index, error) {
	path := filepath.Join(s.dir, indexFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &index{Version: indexVersion}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var ix index
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, fmt.Errorf("image store: index %s is corrupt: %w", path, err)
	}
	if ix.Version != indexVersion {
		return nil, fmt.Errorf("image store: index %s has version %d, this tai42 reads version %d", path, ix.Version, indexVersion)
	}
	return &ix, nil
}

// writeIndex replaces the index atomically; call it holding the lock.
func (s *Store) writeIndex(ix *index) error {
	ix.Version = indexVersion
	if ix.Images == nil {
		ix.Images = []indexEntry{}
	}
	slices.SortFunc(ix.Images, func(a, b indexEntry) int { return cmp.Compare(a.Name, b.Name) })
	return writeJSON(filepath.Join(s.dir, indexFile), ix)
}

// writeJSON replaces file atomically with v as JSON, on disk when it
// returns.
func writeJSON(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(file)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(file)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return err
	}
	return syncDir(dir)
}

// readJSON reads file as JSON into v.
func readJSON(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s is corrupt: %w", file, err)
	}
	return nil
}

// toTrash renames rel (relative to the store) into the trash.
func (s *Store) toTrash(rel string) (string, error) {
	t := filepath.Join(s.dir, trashDirName, filepath.Base(rel)+"-"+randomHex(4))
	if err := os.Rename(filepath.Join(s.dir, rel), t); err != nil {
		return "", err
	}
	return t, nil
}

// emptyTrash deletes the given trash directories, best effort: what is
// left is retried by the next collection.
func (s *Store) emptyTrash(paths []string) {
	for _, p := range paths {
		_ = removeAll(p)
	}
}

// removeAll is os.RemoveAll that also deletes read-only directories (an
// image's tree unpacked without root keeps their modes).
func removeAll(path string) error {
	if err := os.RemoveAll(path); err == nil {
		return nil
	}
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(path)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
