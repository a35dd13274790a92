package imagestore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/tai42/sandbox/internal/flock"
)

// gcMode is which unused layers a collection removes.
type gcMode int

const (
	// gcNone removes no layer: Open's sweep, which must keep the layers a
	// crashed pull committed for its restart to resume from.
	gcNone gcMode = iota
	// gcReleased removes the layers of the image versions this collection
	// removes that nothing else uses: a replaced or released version takes
	// its own layers with it, and nothing more.
	gcReleased
	// gcAll removes every layer nothing uses (Remove, Prune).
	gcAll
)

// garbage is what a collection moved to the trash.
type garbage struct {
	trash  []string // paths to delete once the store lock is released
	layers int      // layers among them
	bytes  int64    // their disk size
}

// collect moves to the trash, holding the store lock: the stages no
// process holds (dead imports and pulls, with their half-unpacked layers),
// the image versions no name refers to and no session holds, what a
// version-1 store left of the same, the trash's old content, and the
// layers mode says. A layer is used, and kept, when an indexed image, a
// held image version or a live stage lists it.
func (s *Store) collect(ix *index, mode gcMode) garbage {
	var g garbage
	used := map[string]bool{}
	named := map[string]bool{}
	for _, e := range ix.Images {
		named[e.Dir] = true
		for _, k := range e.Layers {
			used[k] = true
		}
	}
	var released []string
	for _, name := range s.subdirs(imagesDirName, imageDirPattern().MatchString) {
		rel := filepath.Join(imagesDirName, name)
		rec, _ := s.readRecord(filepath.Join(s.dir, rel))
		switch {
		case named[name]:
		case s.trashIfFree(rel, &g):
			released = append(released, rec.Layers...)
		default:
			markUsed(used, rec.Layers)
		}
	}
	for _, name := range s.subdirs(tmpDirName, nil) {
		rel := filepath.Join(tmpDirName, name)
		if !s.trashIfFree(rel, &g) {
			// A live stage: the layers it will use may be committed
			// already, or be found committed by it.
			rec, _ := s.readRecord(filepath.Join(s.dir, rel))
			markUsed(used, rec.Layers)
		}
	}
	// A version-1 store's image directories at the top, orphaned before
	// the migration and held then by an older tai42's session.
	for _, name := range s.subdirs(".", imageDirPattern().MatchString) {
		s.trashIfFree(name, &g)
	}
	for _, name := range s.subdirs(trashDirName, nil) {
		g.trash = append(g.trash, filepath.Join(s.dir, trashDirName, name))
	}
	var candidates []string
	switch mode {
	case gcAll:
		for _, name := range s.subdirs(layersDirName, layerDirPattern().MatchString) {
			candidates = append(candidates, dirKey(name))
		}
	case gcReleased:
		candidates = uniq(released)
	}
	for _, k := range candidates {
		if used[k] {
			continue
		}
		size := s.layerSize(k)
		t, err := s.toTrash(filepath.Join(layersDirName, keyDir(k)))
		if err != nil {
			continue
		}
		g.trash = append(g.trash, t)
		g.layers++
		g.bytes += size
	}
	return g
}

func markUsed(used map[string]bool, keys []string) {
	for _, k := range keys {
		used[k] = true
	}
}

// subdirs lists the directories in rel (relative to the store) whose
// names match keep (nil: all).
func (s *Store) subdirs(rel string, keep func(string) bool) []string {
	ents, err := os.ReadDir(filepath.Join(s.dir, rel))
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() && (keep == nil || keep(e.Name())) {
			names = append(names, e.Name())
		}
	}
	return names
}

// collectNow runs a collection under the store lock and empties the
// trash after it, best effort: what fails is retried by the next one.
func (s *Store) collectNow(mode gcMode) {
	var g garbage
	if s.withLock(func() error {
		ix, err := s.readIndex()
		if err != nil {
			return err
		}
		g = s.collect(ix, mode)
		return nil
	}) == nil {
		s.emptyTrash(g.trash)
	}
}

// trashIfFree moves rel (relative to the store) to the trash, recording
// it in g, unless a process holds a lock on its lock file. A directory
// without one (an import that died before locking) is trash too.
func (s *Store) trashIfFree(rel string, g *garbage) bool {
	f, err := os.Open(filepath.Join(s.dir, rel, imageLockFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false
	default:
		defer f.Close()
		if flock.Lock(f, syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return false
		}
	}
	t, err := s.toTrash(rel)
	if err != nil {
		return false
	}
	g.trash = append(g.trash, t)
	return true
}
