package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/pflag"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/provider/container"
)

// imageFlags are the image settings of "tai42 serve" and "tai42 run" (the
// container provider's pulls) as their flags hold them; "tai42 image pull"
// has the registry ones.
type imageFlags struct {
	pull       string
	mirrors    []string
	insecure   []string
	registries []string
	maxSize    string
	// maxInodes is --max-image-inodes; 0 is refused, as a size of 0 is.
	maxInodes int64
}

// defaultMaxImageSize is --max-image-size's default, as the flag prints it.
var defaultMaxImageSize = strings.ReplaceAll(humanize.IBytes(uint64(imagestore.DefaultMaxImageSize)), " ", "")

// imageSettings tie the image flags to their variables and config keys.
var imageSettings = []setting{
	{"pull", "TAI42_PULL", "images.pull"},
	{"max-image-size", "TAI42_MAX_IMAGE_SIZE", "images.max_size"},
	{"max-image-inodes", "TAI42_MAX_IMAGE_INODES", "images.max_inodes"},
	{"registry-mirror", "TAI42_REGISTRY_MIRROR", "registry.mirrors"},
	{"insecure-registry", "TAI42_INSECURE_REGISTRY", "registry.insecure"},
	{"registries", "TAI42_REGISTRIES", "registry.allowed"},
}

// addRegistryFlags registers --registry-mirror, --insecure-registry and
// --registries.
func addRegistryFlags(fl *pflag.FlagSet, f *imageFlags) {
	fl.StringSliceVar(&f.mirrors, "registry-mirror", nil, "a mirror of Docker Hub, `HOST[:PORT]` or an http(s) URL, tried before Docker Hub for its images; repeatable, tried in order")
	fl.StringSliceVar(&f.insecure, "insecure-registry", nil, "a registry `HOST[:PORT]` reached over plain HTTP, or over TLS without verifying its certificate; repeatable (default: none)")
	fl.StringSliceVar(&f.registries, "registries", nil, "the only registries pulls may reach, `HOST[:PORT]` (docker.io for Docker Hub; the mirrors and insecure registries count as listed); repeatable (default: any, but a registry at a loopback, link-local or unspecified address only when listed here or as insecure)")
}

// addImageFlags registers the image flags of serve and run.
func addImageFlags(fl *pflag.FlagSet, f *imageFlags) {
	fl.StringVar(&f.pull, "pull", string(container.PullMissing), "when a create pulls its image from its registry: missing (when the store lacks it), always (every create; layers held are not fetched again) or never (an image the store lacks is rejected)")
	fl.StringVar(&f.maxSize, "max-image-size", defaultMaxImageSize, "the most one image's layers may take in the image store (every file, directory and symlink at least a 4 KiB block), a `SIZE` such as 20GiB, 500MB or bytes")
	fl.Int64Var(&f.maxInodes, "max-image-inodes", imagestore.DefaultMaxImageInodes, "the most inodes (files, directories, symlinks) one image's layers may take in the image store")
	addRegistryFlags(fl, f)
}

// imageConfig is the resolved image settings of the container provider.
type imageConfig struct {
	pull      container.PullPolicy
	registry  imagestore.RegistryOptions // its Mirrors and Insecure
	maxSize   int64                      // bytes; 0 for the provider's default
	maxInodes int64                      // 0 for the provider's default
	// given lists the settings given (flag, variable or file) rather than
	// defaulted, as their flags' names, for the host runner's warning.
	given []string
}

// validate parses f; an error names the flag and the value at fault (a
// mirror's credentials left out: they go in the docker config).
func (f *imageFlags) validate() (imageConfig, error) {
	var cfg imageConfig
	switch p := container.PullPolicy(f.pull); p {
	case container.PullMissing, container.PullAlways, container.PullNever:
		cfg.pull = p
	default:
		return imageConfig{}, fmt.Errorf("--pull %q is not one of missing, always, never", f.pull)
	}
	if f.maxSize != "" {
		n, err := humanize.ParseBytes(f.maxSize)
		if err != nil || n == 0 || n > 1<<62 {
			return imageConfig{}, fmt.Errorf("--max-image-size %q: want a size > 0 such as 20GiB, 500MB or a number of bytes", f.maxSize)
		}
		cfg.maxSize = int64(n)
	}
	if f.maxInodes <= 0 {
		return imageConfig{}, fmt.Errorf("--max-image-inodes %d: want a count > 0", f.maxInodes)
	}
	cfg.maxInodes = f.maxInodes
	reg, err := registryOptions(f.mirrors, f.insecure, f.registries)
	if err != nil {
		return imageConfig{}, err
	}
	cfg.registry = reg
	return cfg, nil
}

// registryOptions validates mirrors, insecure and allowed registries.
func registryOptions(mirrors, insecure, allowed []string) (imagestore.RegistryOptions, error) {
	var o imagestore.RegistryOptions
	for _, m := range mirrors {
		m = strings.TrimSpace(m)
		if err := validMirror(m); err != nil {
			return o, err
		}
		o.Mirrors = append(o.Mirrors, m)
	}
	for _, h := range insecure {
		h = strings.TrimSpace(h)
		if err := validRegistryHost(h); err != nil {
			return o, fmt.Errorf("--insecure-registry %q: %w (want HOST[:PORT], e.g. 127.0.0.1:5000)", h, err)
		}
		o.Insecure = append(o.Insecure, h)
	}
	for _, h := range allowed {
		h = strings.TrimSpace(h)
		if err := validRegistryHost(h); err != nil {
			return o, fmt.Errorf("--registries %q: %w (want HOST[:PORT], e.g. registry.example:5000 or docker.io)", h, err)
		}
		o.Registries = append(o.Registries, h)
	}
	return o, nil
}

// validMirror accepts HOST[:PORT] and http(s)://HOST[:PORT][/PATH]. A URL
// with credentials is refused without echoing them.
func validMirror(m string) error {
	host := m
	if strings.Contains(m, "://") {
		u, err := url.Parse(m)
		if err != nil {
			return fmt.Errorf("--registry-mirror: %q is not a URL", m)
		}
		if u.User != nil {
			return fmt.Errorf("--registry-mirror %q: a mirror's credentials go in the docker config ($DOCKER_CONFIG or ~/.docker/config.json), not in its URL", u.Redacted())
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("--registry-mirror %q: the scheme must be http or https", m)
		}
		host = u.Host
	}
	if err := validRegistryHost(host); err != nil {
		return fmt.Errorf("--registry-mirror %q: %w (want HOST[:PORT] or an http(s) URL, e.g. mirror.example:5000)", m, err)
	}
	return nil
}

// validRegistryHost accepts a registry's HOST[:PORT] as references name it.
func validRegistryHost(h string) error {
	if h == "" || strings.ContainsAny(h, "/@") {
		return errors.New("not a registry host")
	}
	if _, err := name.NewRegistry(h, name.StrictValidation); err != nil {
		return errors.New("not a registry host")
	}
	return nil
}
