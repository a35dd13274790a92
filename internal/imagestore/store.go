package imagestore

import (
	"cmp"
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
//	lock            flock(2)ed exclusively while the index or the set of
//	                image directories changes
//	index.json      the names: name -> image directory and metadata,
//	                replaced atomically (rename)
//	<alg>-<hex>-<r> one directory per import, named by the image ID and a
//	                random suffix: "lock" (shared-locked while acquired)
//	                and "rootfs"
//	tmp/<r>         imports in progress, each holding an exclusive lock on
//	                its "lock" file
//	trash/          directories being removed
//
// DefaultMaxImageSize bounds the bytes an image's layers unpack to (the
// apparent size of their files), unless the store is opened with another.
const DefaultMaxImageSize int64 = 20 << 30

const (
	storeLockFile = "lock"
	indexFile     = "index.json"
	tmpDirName    = "tmp"
	trashDirName  = "trash"
	imageLockFile = "lock"
	rootfsDir     = "rootfs"
	indexVersion  = 1
)

// imageDirPattern matches the name of an image directory.
var imageDirPattern = lazyRegexp(`^[a-z0-9]+-[0-9a-f]{32,128}-[0-9a-f]{16}$`)

// Image is an image of the store.
type Image struct {
	Name       string    // canonical name (see CanonicalName), e.g. "busybox:latest"
	ID         string    // content digest of the image's config, e.g. "sha256:0123…" (docker's IMAGE ID)
	Size       int64     // bytes the unpacked rootfs takes on disk (allocated blocks; a hardlinked file counts once)
	Imported   time.Time // when it was imported under Name (goes: Pulled)
	Env        []string  // the image config's Env, "KEY=VALUE" each
	WorkingDir string    // the image config's WorkingDir, "" for none
	// Filled by the layered store (the "store" part), which also drops
	// Rootfs and Imported for Layers and Pulled:
	Digest     string    // the manifest digest it was pulled by; "" for an import without one
	Platform   string    // "os/arch[/variant]" of its config
	SharedSize int64     // the part of Size in layers other images use too
	Pulled     time.Time // when it was pulled or imported under Name
	User       string    // the image config's User
	Entrypoint []string  // the image config's Entrypoint
	Cmd        []string  // the image config's Cmd
	Rootfs     string    // absolute path of the unpacked root filesystem; never contains ':' put there by the store
	// Layers are the absolute paths of the image's unpacked layers, lowest
	// first, for an overlay's lowerdirs (the top one given first to
	// overlayfs); none contains ':' or ','.
	Layers []string
}

// Store is a directory of images imported from OCI layouts and docker save
// tarballs; no registry is ever contacted.
//
// A Store is safe for concurrent use by many goroutines, and several
// processes may open the same directory: every change happens under an
// exclusive flock(2) of the store's lock file, and the index of names is
// replaced atomically, so readers (List, Get) never see a partial state.
// An image stays on disk while any process has acquired it (a shared
// flock(2) on a file of its directory), even after its name was removed
// or replaced; it is deleted once the last holder releases it.
type Store struct {
	dir string // absolute
}

// indexEntry is one name of the index.
type indexEntry struct {
	Name       string    `json:"name"`
	ID         string    `json:"id"`
	Dir        string    `json:"dir"` // base name of the image directory
	Size       int64     `json:"size"`
	Imported   time.Time `json:"imported"`
	Env        []string  `json:"env,omitempty"`
	WorkingDir string    `json:"working_dir,omitempty"`
}

type index struct {
	Version int          `json:"version"`
	Images  []indexEntry `json:"images"`
}

func (ix *index) find(name string) int {
	return slices.IndexFunc(ix.Images, func(e indexEntry) bool { return e.Name == name })
}

// Open opens the store in dir, creating dir (mode 0700) and its layout if
// missing, and removes what interrupted imports and removals left behind.
// dir must not contain ':' or ',', which overlayfs's mount options cannot
// carry in a lower directory's path.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	if strings.ContainsAny(abs, ":,") {
		return nil, fmt.Errorf("image store %s: the path contains ':' or ',', which overlayfs cannot take in a lower directory: choose another state directory", abs)
	}
	for _, d := range []string{abs, filepath.Join(abs, tmpDirName), filepath.Join(abs, trashDirName)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	s := &Store{dir: abs}
	var trash []string
	err = s.withLock(func() error {
		ix, err := s.readIndex()
		if err != nil {
			return err
		}
		trash = s.collect(ix)
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
	imgs := make([]Image, len(ix.Images))
	for i, e := range ix.Images {
		imgs[i] = s.image(e)
	}
	slices.SortFunc(imgs, func(a, b Image) int { return cmp.Compare(a.Name, b.Name) })
	return imgs, nil
}

// Get returns the image named name (any spelling CanonicalName accepts).
// An image the store does not hold is an error matching ErrNotFound; an
// invalid name one matching ErrInvalidName. Its Rootfs may be removed at
// any time by Remove or a replacing Import: a session uses Acquire.
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
	return s.image(ix.Images[i]), nil
}

// Acquire returns the image named name for a session, and a release
// function the session calls when it no longer uses the image's Rootfs.
// Until then (across processes: it holds a shared flock(2) on a file of
// the image), Remove refuses the image with an error matching ErrInUse,
// and a replacing Import or a Remove of the name leaves this version's
// directory in place; release deletes such an orphaned version once no
// other holder remains. release is safe to call more than once and from
// any goroutine. Errors: ErrNotFound, ErrInvalidName, or the I/O failure.
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
		f, err := os.Open(filepath.Join(s.dir, e.Dir, imageLockFile))
		if err != nil {
			return fmt.Errorf("image %s: %w", canon, err)
		}
		if err := flock.Lock(f, syscall.LOCK_SH); err != nil {
			f.Close()
			return fmt.Errorf("image %s: locking: %w", canon, err)
		}
		img, lock = s.image(e), f
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
			var trash []string
			if s.withLock(func() error {
				ix, err := s.readIndex()
				if err != nil {
					return err
				}
				trash = s.collect(ix)
				return nil
			}) == nil {
				s.emptyTrash(trash)
			}
		})
	}
	return img, release, nil
}

// Remove deletes the image named name: its name at once, its files before
// Remove returns. An image that is acquired (by any process) is refused
// with an error matching ErrInUse and left as it was; a name the store
// does not hold is an error matching ErrNotFound.
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
		f, err := os.Open(filepath.Join(s.dir, e.Dir, imageLockFile))
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
		if t, err := s.toTrash(e.Dir); err == nil {
			trash = append(trash, t)
		}
		trash = append(trash, s.collect(ix)...)
		return nil
	})
	s.emptyTrash(trash)
	return err
}

// image turns an index entry into an Image.
func (s *Store) image(e indexEntry) Image {
	return Image{
		Name:       e.Name,
		ID:         e.ID,
		Size:       e.Size,
		Imported:   e.Imported,
		Env:        slices.Clone(e.Env),
		WorkingDir: e.WorkingDir,
		Rootfs:     filepath.Join(s.dir, e.Dir, rootfsDir),
		Layers:     []string{filepath.Join(s.dir, e.Dir, rootfsDir)},
		Pulled:     e.Imported,
	}
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
	b, err := json.MarshalIndent(ix, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, ".index-*.json")
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
	if err := os.Rename(tmp.Name(), filepath.Join(s.dir, indexFile)); err != nil {
		return err
	}
	return syncDir(s.dir)
}

// collect moves to the trash every image directory no name refers to and
// no one holds, and every abandoned import directory; call it holding
// the lock. It returns the trash paths to delete (after unlocking).
func (s *Store) collect(ix *index) []string {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil
	}
	used := map[string]bool{}
	for _, e := range ix.Images {
		used[e.Dir] = true
	}
	var trash []string
	for _, ent := range ents {
		if !ent.IsDir() || !imageDirPattern().MatchString(ent.Name()) || used[ent.Name()] {
			continue
		}
		if t, ok := s.trashIfFree(ent.Name()); ok {
			trash = append(trash, t)
		}
	}
	if tmps, err := os.ReadDir(filepath.Join(s.dir, tmpDirName)); err == nil {
		for _, ent := range tmps {
			if t, ok := s.trashIfFree(filepath.Join(tmpDirName, ent.Name())); ok {
				trash = append(trash, t)
			}
		}
	}
	if old, err := os.ReadDir(filepath.Join(s.dir, trashDirName)); err == nil {
		for _, ent := range old {
			trash = append(trash, filepath.Join(s.dir, trashDirName, ent.Name()))
		}
	}
	return trash
}

// trashIfFree moves rel (relative to the store) to the trash unless a
// process holds a lock on its lock file. A directory without one (an
// import that died before locking) is trash too.
func (s *Store) trashIfFree(rel string) (string, bool) {
	f, err := os.Open(filepath.Join(s.dir, rel, imageLockFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return "", false
	default:
		defer f.Close()
		if flock.Lock(f, syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return "", false
		}
	}
	t, err := s.toTrash(rel)
	return t, err == nil
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
