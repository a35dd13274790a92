package imagestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"time"
)

// v1Entry is a name of a version-1 index: a flattened image in the
// directory Dir at the store's top ("lock" and "rootfs").
type v1Entry struct {
	Name       string    `json:"name"`
	ID         string    `json:"id"`
	Dir        string    `json:"dir"`
	Size       int64     `json:"size"`
	Imported   time.Time `json:"imported"`
	Env        []string  `json:"env,omitempty"`
	WorkingDir string    `json:"working_dir,omitempty"`
}

// v1RootfsDir is a version-1 image directory's root filesystem.
const v1RootfsDir = "rootfs"

// migrate turns a version-1 store into a layered one, holding the store
// lock: each image becomes a version whose one layer (keyed "v1:<dir>")
// is its old root filesystem, moved, not copied. Every step can be
// repeated, so a migration a crash cut short finishes at the next Open;
// the index says version 2 only once every image is moved. A session of
// an older tai42 holding an image keeps its lock: the version directory
// is the old one, renamed.
func (s *Store) migrate() error {
	file := filepath.Join(s.dir, indexFile)
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	var old struct {
		Version int       `json:"version"`
		Images  []v1Entry `json:"images"`
	}
	if json.Unmarshal(b, &old) != nil || old.Version != 1 {
		return nil // readIndex tells what is wrong
	}
	ix := &index{}
	for _, e := range old.Images {
		ne, err := s.migrateImage(e)
		if err != nil {
			return fmt.Errorf("image store %s: migrating image %s from a version-1 store: %w", s.dir, e.Name, err)
		}
		ix.Images = append(ix.Images, ne)
	}
	if err := syncFS(s.dir); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if err := s.writeIndex(ix); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	return nil
}

func (s *Store) migrateImage(e v1Entry) (indexEntry, error) {
	if !imageDirPattern().MatchString(e.Dir) {
		return indexEntry{}, fmt.Errorf("its directory %q is not one a version-1 store names", e.Dir)
	}
	key := v1KeyPrefix + e.Dir
	oldDir := filepath.Join(s.dir, e.Dir)
	layer := s.layerPath(key)
	if err := os.MkdirAll(layer, 0o700); err != nil {
		return indexEntry{}, err
	}
	if err := writeJSON(filepath.Join(layer, layerMetaFile), layerMeta{DiffID: key, Size: e.Size}); err != nil {
		return indexEntry{}, err
	}
	if err := moveOnce(filepath.Join(oldDir, v1RootfsDir), s.layerFS(key)); err != nil {
		return indexEntry{}, err
	}
	if _, err := os.Stat(oldDir); err == nil {
		rec := versionRecord{ID: e.ID, Layers: []string{key}}
		if err := writeJSON(filepath.Join(oldDir, configFile), rec); err != nil {
			return indexEntry{}, err
		}
	}
	if err := moveOnce(oldDir, s.versionPath(e.Dir)); err != nil {
		return indexEntry{}, err
	}
	return indexEntry{
		Name:   e.Name,
		ID:     e.ID,
		Dir:    e.Dir,
		Layers: []string{key},
		// A version-1 store took linux images of this machine only, and
		// did not keep User, Entrypoint or Cmd.
		Platform:   "linux/" + runtime.GOARCH,
		Pulled:     e.Imported,
		Env:        e.Env,
		WorkingDir: e.WorkingDir,
	}, nil
}

// moveOnce renames from to to, unless an earlier run did (from is gone,
// to is there).
func moveOnce(from, to string) error {
	err := os.Rename(from, to)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(to); serr == nil {
			return nil
		}
	}
	return err
}
