package imagestoretest

import (
	"compress/gzip"
	"fmt"
	"os"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DebianPath is the PATH Debian's own images set, the default of
// RootfsImage's config.
const DebianPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// RootfsConfig is what RootfsImage puts in the image's config.
type RootfsConfig struct {
	// Env is the image's environment, "K=V" each; nil means DebianPath alone.
	Env []string
	// Cmd is the image's command; nil means /bin/sh.
	Cmd []string
}

// RootfsImage returns an image of one layer, the root filesystem tarball
// at rootfsTar (plain or gzip-compressed, as mmdebstrap or `tar -C DIR -c
// .` write it), with cfg's environment and command and this machine's
// platform. The layer is read from the file when the image is written
// (twice: once for its digests, once to write it) and compressed at gzip's
// fastest level: the image lives on this machine only, so speed matters
// more than size.
func RootfsImage(rootfsTar string, cfg RootfsConfig) (v1.Image, error) {
	if _, err := os.Stat(rootfsTar); err != nil {
		return nil, fmt.Errorf("imagestoretest: root filesystem tarball: %w", err)
	}
	layer, err := tarball.LayerFromFile(rootfsTar, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, fmt.Errorf("imagestoretest: %s: %w", rootfsTar, err)
	}
	env := cfg.Env
	if env == nil {
		env = []string{DebianPath}
	}
	cmd := cfg.Cmd
	if cmd == nil {
		cmd = []string{"/bin/sh"}
	}
	return singleLayerImage(layer, env, cmd)
}

// singleLayerImage is the image of layer alone on this machine's platform,
// with env and cmd in its config and a fixed creation time, so that the
// same layer always gives the same image id.
func singleLayerImage(layer v1.Layer, env, cmd []string) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("imagestoretest: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("imagestoretest: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Env, cf.Config.Cmd = env, cmd
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("imagestoretest: %w", err)
	}
	return img, nil
}

// WriteRootfsDockerSave writes RootfsImage(rootfsTar, cfg) as a `docker
// save` tarball tagged name (e.g. "debian-tools:latest") to file, for
// `tai42 image import` or `docker load`, and returns file.
func WriteRootfsDockerSave(rootfsTar, file, name string, cfg RootfsConfig) (string, error) {
	tag, err := parseTag(name)
	if err != nil {
		return "", err
	}
	img, err := RootfsImage(rootfsTar, cfg)
	if err != nil {
		return "", err
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return "", fmt.Errorf("imagestoretest: %w", err)
	}
	return file, nil
}
