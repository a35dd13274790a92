package container_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
	"github.com/tai42/sandbox/internal/imagestore/registrytest"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// The layered images' names in their store.
const (
	debian5 = "debian:layers5"
	debian1 = "debian:layers1"
)

// layered is the store BenchmarkCreateFirstExecLayers imports its two
// images into, once per process.
var layered struct {
	once sync.Once
	dir  string
	err  error
}

// BenchmarkCreateFirstExecLayers: create -> first exec (as
// BenchmarkCreateFirstExec's) on registrytest's Debian root filesystem
// stacked from 5 layers (registrytest.SplitRootfs) and on the same files
// as one layer; the target is 5 layers within 10% of one.
func BenchmarkCreateFirstExecLayers(b *testing.B) {
	containertest.Require(b)
	dir := layeredStore(b)
	runPeers(b, []peer{
		{"layers-5", func(b *testing.B) { layersCreateFirstExec(b, dir, debian5) }},
		{"layers-1", func(b *testing.B) { layersCreateFirstExec(b, dir, debian1) }},
	})
}

func layersCreateFirstExec(b *testing.B, images, image string) {
	sb, _ := newProviderWith(b, "runc", func(o *container.Options) { o.Images = images })
	ctx := context.Background()
	op := func() (time.Duration, string, error) {
		t0 := time.Now()
		s, err := sb.CreateSession(ctx, sessionSpec(image))
		if err != nil {
			return 0, "", err
		}
		err = execTrue(ctx, s)
		return time.Since(t0), s.ID(), err
	}
	if _, id, err := op(); err != nil { // warm-up, not timed
		b.Fatal(err)
	} else if err := sb.DestroySession(ctx, id); err != nil {
		b.Fatal(err)
	}
	var l latencies
	for b.Loop() {
		d, id, err := op()
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		l.add(d)
		if err := sb.DestroySession(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l.report(b)
}

// layeredStore is a store holding the 5-layer and the 1-layer image,
// kept beside the Debian image in its cache (registrytest.CacheDir) and
// imported there on a miss: importing them takes longer than the
// benchmark itself.
func layeredStore(b *testing.B) string {
	b.Helper()
	layered.once.Do(func() { layered.dir, layered.err = importLayered() })
	if layered.err != nil {
		b.Fatal(layered.err)
	}
	return layered.dir
}

func importLayered() (string, error) {
	d, err := registrytest.BuildDebian(registrytest.CacheDir())
	if err != nil {
		return "", err
	}
	tmp := filepath.Join(filepath.Dir(d.Rootfs), "bench-layers")
	store, err := imagestore.Open(filepath.Join(tmp, "images"))
	if err != nil {
		return "", err
	}
	// Kept only as 5 layers and 1: a store that flattened its imports
	// (before the layered store) or was migrated from one is imported
	// again.
	img5, err5 := store.Get(debian5)
	img1, err1 := store.Get(debian1)
	if err5 == nil && err1 == nil && len(img5.Layers) == 5 && len(img1.Layers) == 1 {
		return store.Dir(), nil
	}
	ls, err := registrytest.SplitRootfs(d.Rootfs, tmp, 5)
	if err != nil {
		return "", err
	}
	five, err := registrytest.ImageOf([]string{"/bin/sh"}, ls...)
	if err != nil {
		return "", err
	}
	one, err := imagestoretest.RootfsImage(d.Rootfs, imagestoretest.RootfsConfig{})
	if err != nil {
		return "", err
	}
	for name, img := range map[string]v1.Image{debian5: five, debian1: one} {
		dir := filepath.Join(tmp, "layout-"+name[len("debian:"):])
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			return "", err
		}
		oci := mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)
		if err := p.AppendImage(oci, layout.WithAnnotations(map[string]string{imagestoretest.RefNameAnnotation: name})); err != nil {
			return "", err
		}
		got, err := store.Import(context.Background(), dir, name)
		if err != nil {
			return "", fmt.Errorf("importing %s: %w", name, err)
		}
		ls, err := img.Layers()
		if err != nil {
			return "", err
		}
		if len(got.Layers) != len(ls) {
			return "", fmt.Errorf("the store keeps %s as %d layers, not its %d: the comparison would measure nothing", name, len(got.Layers), len(ls))
		}
		os.RemoveAll(dir)
	}
	for i := range ls {
		os.Remove(filepath.Join(tmp, fmt.Sprintf("layer-%d.tar.gz", i)))
	}
	return store.Dir(), nil
}
