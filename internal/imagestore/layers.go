package imagestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/tai42/sandbox/internal/flock"
	"golang.org/x/sync/errgroup"
)

// maxConcurrentLayers is how many layers of one image are fetched and
// unpacked at a time: enough to keep a link busy while one layer's
// unpacking waits on the disk, few enough not to split a registry's
// bandwidth into slivers.
const maxConcurrentLayers = 3

// layerDirPattern matches the name of a layer directory: a chain ID's, a
// diffID's (a store of an older tai42), or a layer migrated from a
// version-1 store (see the layout in store.go).
var layerDirPattern = lazyRegexp(`^(chain-[0-9a-f]{64}|sha256-[0-9a-f]{64}|v1-[a-z0-9]+-[0-9a-f]{32,128}-[0-9a-f]{16})$`)

const (
	layerFSDir    = "fs"
	layerMetaFile = "meta.json"
	// chainKeyPrefix keys a layer by its chain ID (see chainKeys).
	chainKeyPrefix = "chain:"
	// v1KeyPrefix keys a layer migrated from a version-1 store; no chain
	// ID or diffID starts with it.
	v1KeyPrefix = "v1:"
)

// chainKeys are the keys of the layers diffIDs (sha256 digests, lowest
// first) stack into: each layer's chain ID (OCI image spec, config.md:
// ChainID(L0) = DiffID(L0), ChainID(Ln) = SHA256(ChainID(Ln-1) + " " +
// DiffID(Ln))) as "chain:<hex>".
//
// A layer is keyed by the layers below it too, not by its diffID alone,
// because what is stored of it depends on them: its hard links to their
// files are copies of those files, and its implicit directories take
// their owners and modes (see linkFromLowers). Keyed by diffID, the copy
// made over the first image's lowers served every later image with that
// layer, whatever its own lowers held. Only layers over the same lowers
// are shared now; a base, the layers most often shared, still is.
//
// The prefix keeps these keys apart from a diffID-keyed layer of an older
// tai42's store ("sha256:<hex>", the same digest for a bottom layer),
// which may have been unpacked over another image's lowers: such a layer
// is never reused, it stays for the images indexed with it until they
// are removed or pulled again, then goes as any unused layer.
func chainKeys(diffIDs []v1.Hash) []string {
	keys := make([]string, len(diffIDs))
	var chain string // "sha256:<hex>"
	for i, d := range diffIDs {
		if i == 0 {
			chain = d.String()
		} else {
			sum := sha256.Sum256([]byte(chain + " " + d.String()))
			chain = "sha256:" + hex.EncodeToString(sum[:])
		}
		keys[i] = chainKeyPrefix + strings.TrimPrefix(chain, "sha256:")
	}
	return keys
}

// keyDir is the directory name of the layer keyed k ("chain:<hex>" ->
// "chain-<hex>", "sha256:<hex>" -> "sha256-<hex>"); dirKey is the
// inverse.
func keyDir(k string) string { return strings.Replace(k, ":", "-", 1) }
func dirKey(d string) string { return strings.Replace(d, "-", ":", 1) }

func (s *Store) layerPath(k string) string { return filepath.Join(s.dir, layersDirName, keyDir(k)) }
func (s *Store) layerFS(k string) string   { return filepath.Join(s.layerPath(k), layerFSDir) }

// layerMeta is a layer's meta.json.
type layerMeta struct {
	// DiffID is the layer's diffID; in a store of an older tai42, its
	// key: its diffID, or "v1:<dir>" for a layer migrated from a version-1
	// store (the flattened image of that dir).
	DiffID string `json:"diff_id"`
	// ChainID is the layer's chain ID (see chainKeys), its key without
	// the prefix; none in a store of an older tai42.
	ChainID string `json:"chain_id,omitempty"`
	// Digest is the layer's compressed (blob) digest when it was pulled.
	Digest string `json:"digest,omitempty"`
	// Size is the bytes its tree takes on disk (allocated blocks).
	Size int64 `json:"size"`
}

// layerSize is the disk size a layer's meta.json records; 0 when it
// cannot be read.
func (s *Store) layerSize(k string) int64 {
	var m layerMeta
	if readJSON(filepath.Join(s.layerPath(k), layerMetaFile), &m) != nil {
		return 0
	}
	return m.Size
}

// versionRecord is the config.json of an image version, and of a stage:
// the layers it uses, so a collection keeps them while the version is
// held or the stage is live.
type versionRecord struct {
	ID     string          `json:"id"`
	Layers []string        `json:"layers"`           // layer keys, lowest first
	Config json.RawMessage `json:"config,omitempty"` // the image's config as it came; none for a migrated image
}

func (s *Store) readRecord(dir string) (versionRecord, error) {
	var r versionRecord
	err := readJSON(filepath.Join(dir, configFile), &r)
	return r, err
}

// addRequest is an image to add to the store under Name: imported from a
// file, or pulled from a registry.
type addRequest struct {
	Name   string   // canonical (see CanonicalName)
	Image  v1.Image // its layers are read through Fetch
	Label  string   // names the image in errors: a file's image, or the reference pulled
	Digest string   // the manifest digest it was pulled by; "" for an import without one
	// Fetch opens a layer's uncompressed tar stream; nil is
	// l.Uncompressed(). A pull passes one that counts the bytes fetched
	// for its progress. It is called for the layers the store lacks only,
	// from up to maxConcurrentLayers goroutines at a time. The store
	// checks the stream against the layer's DiffID itself.
	Fetch func(l v1.Layer) (io.ReadCloser, error)
	// Events, when set, is told of each layer the store has already
	// (sandbox.PullLayerExists) and of each it has unpacked
	// (sandbox.PullLayerDone), from one goroutine at a time. The layer is
	// named by its blob (compressed) digest when Digest is set (a pull:
	// the manifest has them), else by its diffID (an import, whose
	// tarball layers would have to be compressed to get one).
	Events func(layer v1.Hash, status string)
	// Platform is the platform the image must be for; zero is this
	// machine's, linux/GOARCH. A pull sets the one asked for.
	Platform v1.Platform
}

// addImage adds req's image to the store through the stage st: it lists
// the image's layers in st (so no collection removes those committed
// meanwhile), unpacks the ones the store lacks, each checked against its
// diffID and committed on its own as it completes, then commits the image
// under req.Name. A failure leaves the layers committed before it (a
// restarted pull resumes from them), never a half one.
func (s *Store) addImage(ctx context.Context, st *stage, req addRequest) (Image, error) {
	img := req.Image
	cfg, err := img.ConfigFile()
	if err != nil {
		return Image{}, fmt.Errorf("%w: reading the config of image %s: %w", ErrInvalidImage, req.Label, err)
	}
	id, err := img.ConfigName()
	if err != nil {
		return Image{}, fmt.Errorf("%w: image %s: %w", ErrInvalidImage, req.Label, err)
	}
	want := req.Platform
	if want.Architecture == "" {
		want = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	if (cfg.OS != "" && cfg.OS != want.OS) || (cfg.Architecture != "" && cfg.Architecture != want.Architecture) {
		return Image{}, fmt.Errorf("%w: image %s is for %s/%s, not %s/%s", ErrInvalidImage, req.Label, cfg.OS, cfg.Architecture, want.OS, want.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return Image{}, fmt.Errorf("%w: reading the layers of image %s: %w", ErrInvalidImage, req.Label, err)
	}
	if err := checkLayerCount(len(layers)); err != nil {
		return Image{}, fmt.Errorf("image %s: %w", req.Label, err)
	}
	diffIDs := cfg.RootFS.DiffIDs
	if len(diffIDs) != len(layers) {
		return Image{}, fmt.Errorf("%w: image %s has %d layers but its config lists %d diff IDs", ErrInvalidImage, req.Label, len(layers), len(diffIDs))
	}
	for i, d := range diffIDs {
		if b, err := hex.DecodeString(d.Hex); d.Algorithm != "sha256" || err != nil || len(b) != sha256.Size {
			return Image{}, fmt.Errorf("%w: image %s: layer %d has diff ID %q, not a sha256 digest", ErrInvalidImage, req.Label, i+1, d)
		}
	}
	keys := chainKeys(diffIDs)
	raw, err := img.RawConfigFile()
	if err != nil {
		return Image{}, fmt.Errorf("%w: reading the config of image %s: %w", ErrInvalidImage, req.Label, err)
	}
	if err := st.plan(versionRecord{ID: id.String(), Layers: keys, Config: raw}); err != nil {
		return Image{}, err
	}
	if err := s.unpackLayers(ctx, st, req, layers, diffIDs, keys); err != nil {
		return Image{}, err
	}
	if err := removeAll(filepath.Join(st.dir, "src")); err != nil {
		return Image{}, err
	}
	return st.commit(ctx, indexEntry{
		Name:       req.Name,
		ID:         id.String(),
		Layers:     keys,
		Digest:     req.Digest,
		Platform:   platformOf(cfg),
		Pulled:     time.Now().UTC().Round(time.Millisecond),
		Env:        cfg.Config.Env,
		WorkingDir: cfg.Config.WorkingDir,
		User:       cfg.Config.User,
		Entrypoint: cfg.Config.Entrypoint,
		Cmd:        cfg.Config.Cmd,
	}, id)
}

// platformOf is "os/arch[/variant]" of cfg; an unset OS or architecture
// is this machine's (addImage takes no other).
func platformOf(cfg *v1.ConfigFile) string {
	p := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	if p.OS == "" {
		p.OS = "linux"
	}
	if p.Architecture == "" {
		p.Architecture = runtime.GOARCH
	}
	return p.String()
}

// layerJob is one layer of an image being added.
type layerJob struct {
	n      int    // 1-based position in the image, for errors
	key    string // its chain key: no two layers of an image have one
	diffID v1.Hash
	layer  v1.Layer
	done   chan struct{} // closed once the layer is committed
}

// unpackLayers commits every layer of the image the store lacks,
// maxConcurrentLayers at a time, in order; each one unpacks while it
// downloads. A layer with hard links to lower layers waits for them to be
// committed to resolve them: they were started before it, so they finish
// without waiting for it.
func (s *Store) unpackLayers(ctx context.Context, st *stage, req addRequest, layers []v1.Layer, diffIDs []v1.Hash, keys []string) error {
	u := &unpacker{s: s, st: st, req: req, budget: &budget{limit: s.maxSize, inodeLimit: s.maxInodes}}
	g, gctx := errgroup.WithContext(ctx)
	// A goroutine per layer, and a layer's temporary directory, only once
	// it has a slot: a hostile image's count of layers costs no more.
	g.SetLimit(maxConcurrentLayers)
	jobs := make([]*layerJob, len(layers))
	for i, l := range layers {
		// A diffID the image has twice is two layers: over other lowers,
		// each is stored on its own (see chainKeys).
		j := &layerJob{n: i + 1, key: keys[i], diffID: diffIDs[i], layer: l, done: make(chan struct{})}
		jobs[i] = j
		lowers := jobs[:i]
		if gctx.Err() != nil {
			break // a layer failed: start no more
		}
		g.Go(func() error { return u.layer(gctx, j, lowers) })
	}
	return g.Wait()
}

// unpacker holds what the layers of one addImage share.
type unpacker struct {
	s      *Store
	st     *stage
	req    addRequest
	budget *budget
	mu     sync.Mutex // serializes req.Events
}

func (u *unpacker) event(j *layerJob, status string) {
	if u.req.Events == nil {
		return
	}
	h := j.diffID
	if u.req.Digest != "" {
		if d, err := j.layer.Digest(); err == nil {
			h = d
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.req.Events(h, status)
}

// layer commits j's layer unless the store has it.
func (u *unpacker) layer(ctx context.Context, j *layerJob, lowers []*layerJob) error {
	dest := u.s.layerPath(j.key)
	if _, err := os.Stat(dest); err == nil {
		u.event(j, "exists")
		close(j.done)
		return nil
	}
	tmp, err := os.MkdirTemp(u.st.dir, "layer-")
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer removeAll(tmp) // a no-op once committed
	links, err := u.fetch(ctx, j, filepath.Join(tmp, layerFSDir))
	if err != nil {
		return err
	}
	if len(links) > 0 {
		if err := u.linkLowers(ctx, j, filepath.Join(tmp, layerFSDir), lowers, links); err != nil {
			return err
		}
	}
	existed, err := u.commitLayer(ctx, j, tmp, dest)
	if errors.Is(err, syscall.ENOSPC) {
		err = fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	if err != nil {
		return fmt.Errorf("image store: layer %d (%s): %w", j.n, j.diffID, err)
	}
	if existed {
		u.event(j, "exists")
	} else {
		u.event(j, "done")
	}
	close(j.done)
	return nil
}

// fetch unpacks j's layer into fsDir as it reads it, hashing the stream,
// and checks it against the layer's diffID.
func (u *unpacker) fetch(ctx context.Context, j *layerJob, fsDir string) ([]crossLink, error) {
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	open := u.req.Fetch
	if open == nil {
		open = v1.Layer.Uncompressed
	}
	rc, err := open(j.layer)
	if err != nil {
		return nil, u.layerErr(ctx, j, "opening it", err)
	}
	defer rc.Close()
	h := sha256.New()
	r := io.TeeReader(rc, h)
	links, err := extractLayer(ctx, r, fsDir, layerOptions{keepOwners: os.Geteuid() == 0, budget: u.budget})
	if err == nil {
		// The tar's end-of-archive blocks and any padding after them are
		// part of what the diffID hashes.
		_, err = io.Copy(io.Discard, r)
	}
	if err != nil {
		return nil, u.layerErr(ctx, j, "unpacking it", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != j.diffID.Hex {
		return nil, fmt.Errorf("%w: image %s: layer %d does not match its digest in the image config (%s, got sha256:%s)", ErrInvalidImage, u.req.Label, j.n, j.diffID, got)
	}
	return links, nil
}

func (u *unpacker) layerErr(ctx context.Context, j *layerJob, doing string, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return fmt.Errorf("image %s: layer %d (%s): %s: %w", u.req.Label, j.n, j.diffID, doing, err)
}

// linkLowers waits for the layers below j to be committed and resolves
// j's hard links to them.
func (u *unpacker) linkLowers(ctx context.Context, j *layerJob, fsDir string, lowers []*layerJob, links []crossLink) error {
	dirs := make([]string, len(lowers))
	for i, l := range lowers {
		select {
		case <-l.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		dirs[i] = u.s.layerFS(l.key)
	}
	if err := linkFromLowers(fsDir, dirs, links); err != nil {
		return fmt.Errorf("image %s: layer %d (%s): %w", u.req.Label, j.n, j.diffID, err)
	}
	return nil
}

// commitLayer records the unpacked layer's size, flushes it to disk and
// renames it into the store. When another import or process committed
// the same layer meanwhile, theirs is kept (existed) and tmp is left to
// be deleted.
func (u *unpacker) commitLayer(ctx context.Context, j *layerJob, tmp, dest string) (existed bool, err error) {
	size, err := diskUsage(filepath.Join(tmp, layerFSDir))
	if err != nil {
		return false, err
	}
	m := layerMeta{DiffID: j.diffID.String(), ChainID: "sha256:" + strings.TrimPrefix(j.key, chainKeyPrefix), Size: size}
	if u.req.Digest != "" {
		if d, err := j.layer.Digest(); err == nil {
			m.Digest = d.String()
		}
	}
	if err := writeJSON(filepath.Join(tmp, layerMetaFile), m); err != nil {
		return false, err
	}
	if err := syncFS(tmp); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	err = os.Rename(tmp, dest)
	if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		return true, nil
	}
	return false, err
}

// stage is an import or pull in progress: a directory under tmp/ whose
// lock file it holds exclusively, so no collection deletes it.
type stage struct {
	s         *Store
	dir       string
	lock      *os.File
	committed bool
}

func (s *Store) newStage() (*stage, error) {
	st := &stage{s: s}
	err := s.withLock(func() error {
		dir, err := os.MkdirTemp(filepath.Join(s.dir, tmpDirName), "stage-")
		if err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(dir, imageLockFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			_ = os.RemoveAll(dir)
			return err
		}
		if err := flock.Lock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			_ = os.RemoveAll(dir)
			return err
		}
		st.dir, st.lock = dir, f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("image store: starting an import: %w", err)
	}
	return st, nil
}

// plan writes the record of the version st will commit, under the store
// lock: from then on no collection removes the layers it lists, so one
// found committed stays until the version commits, and then as long as
// it is used.
func (st *stage) plan(rec versionRecord) error {
	err := st.s.withLock(func() error { return writeJSON(filepath.Join(st.dir, configFile), rec) })
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	return nil
}

// commit renames the stage into the store as e's image version and
// points e's name at it, replacing any previous version.
func (st *stage) commit(ctx context.Context, e indexEntry, id v1.Hash) (Image, error) {
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	s := st.s
	var img Image
	var g garbage
	err := s.withLock(func() error {
		ix, err := s.readIndex()
		if err != nil {
			return err
		}
		e.Dir = id.Algorithm + "-" + id.Hex + "-" + randomHex(8)
		if !imageDirPattern().MatchString(e.Dir) {
			return fmt.Errorf("%w: image ID %s is not a digest this store can name a directory by", ErrInvalidImage, id)
		}
		for _, k := range e.Layers {
			if _, err := os.Stat(s.layerPath(k)); err != nil {
				return fmt.Errorf("layer %s is missing: %w", k, err)
			}
		}
		if err := os.Rename(st.dir, s.versionPath(e.Dir)); err != nil {
			return err
		}
		st.dir = s.versionPath(e.Dir)
		if i := ix.find(e.Name); i >= 0 {
			ix.Images[i] = e
		} else {
			ix.Images = append(ix.Images, e)
		}
		if err := s.writeIndex(ix); err != nil {
			return err
		}
		st.committed = true
		// Unlock before the store lock goes, so Acquire never waits.
		st.lock.Close()
		img = s.view(ix).image(e)
		g = s.collect(ix, gcReleased)
		return nil
	})
	s.emptyTrash(g.trash)
	if err != nil {
		return Image{}, fmt.Errorf("image store: %w", err)
	}
	return img, nil
}

// abort deletes an uncommitted stage.
func (st *stage) abort() {
	if st.committed {
		return
	}
	_ = removeAll(st.dir)
	st.lock.Close()
}
