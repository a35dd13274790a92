package main

import (
	"context"
	"errors"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
)

// storeImages is the local image store as a sandbox.ImageManager, so that
// "tai42 image" runs one code path on the store and on a daemon.
type storeImages struct {
	s        *imagestore.Store
	registry imagestore.RegistryOptions
}

var _ sandbox.ImageManager = storeImages{}

func (l storeImages) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	img, _, err := l.s.Pull(ctx, ref, imagestore.PullOptions{Platform: opts.Platform, Progress: opts.Progress, Registry: l.registry})
	if err != nil {
		return sandbox.ImageInfo{}, err
	}
	return imageInfo(img), nil
}

func (l storeImages) ListImages(context.Context) ([]sandbox.ImageInfo, error) {
	imgs, err := l.s.List()
	if err != nil {
		return nil, err
	}
	infos := make([]sandbox.ImageInfo, len(imgs))
	for i, img := range imgs {
		infos[i] = imageInfo(img)
	}
	return infos, nil
}

func (l storeImages) RemoveImage(_ context.Context, name string) error { return l.s.Remove(name) }

// storePruner is the store's Prune (the layered store's): removes the
// layers no image version and no pull in progress uses.
type storePruner interface {
	Prune(ctx context.Context) (sandbox.PruneResult, error)
}

// errNoPrune is PruneImages on a store that keeps no shared layers.
var errNoPrune = errors.New("this image store keeps no shared layers to prune")

func (l storeImages) PruneImages(ctx context.Context) (sandbox.PruneResult, error) {
	p, ok := any(l.s).(storePruner)
	if !ok {
		return sandbox.PruneResult{}, errNoPrune
	}
	return p.Prune(ctx)
}

// imageInfo is a store's image as the contract shows one; never its Env
// (an image's ENV may carry credentials).
func imageInfo(img imagestore.Image) sandbox.ImageInfo {
	return sandbox.ImageInfo{
		Name:       img.Name,
		ID:         img.ID,
		Digest:     img.Digest,
		Platform:   img.Platform,
		Size:       img.Size,
		SharedSize: img.SharedSize,
		Layers:     len(img.Layers),
		Pulled:     img.Pulled,
	}
}
