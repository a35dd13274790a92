package imagestore

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/tai42/sandbox"
)

// DefaultTag is the tag a name without one gets: "busybox" is
// "busybox:latest".
const DefaultTag = "latest"

// maxNameLen bounds a canonical name, as registries bound references.
const maxNameLen = 255

// ErrInvalidName is matched (errors.Is) by every error ValidName and
// CanonicalName return, and by those of the Store's methods given such a
// name.
var ErrInvalidName = errors.New("invalid image name")

// dockerHub is Docker Hub's registry as go-containerregistry's name
// package spells it (it rewrites "docker.io" to it).
const dockerHub = name.DefaultRegistry

// go-containerregistry's name package splits a reference into registry,
// repository, tag and digest and checks each one's characters, but not
// the distribution grammar of a path component or of a tag's first
// character, which docker and registries enforce: the store checks those
// too, so that a name it accepts is one a registry accepts. The patterns
// are compiled on first use, not at start: the tai42 binary is also each
// container's agent, and its start is on every session's create path.
var (
	pathComponent = lazyRegexp(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	tagStart      = lazyRegexp(`^[A-Za-z0-9_]`)
)

// lazyRegexp returns a function that compiles expr on its first call.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// ValidName reports whether name can name an image in the store: nil, or
// an error matching ErrInvalidName that says what is wrong.
//
// Names are the references of docker and OCI registries:
// [REGISTRY[:PORT]/]PATH[:TAG] or [REGISTRY[:PORT]/]PATH[:TAG]@DIGEST,
// e.g. "busybox", "busybox:1.35", "ghcr.io/x/y:tag",
// "localhost:5000/team/tool:v2", "localhost:5000/r@sha256:<64 hex>".
// PATH components are lowercase letters and digits, joined by '.', '_',
// "__" or dashes. A reference with both a tag and a digest is the image of
// the digest (the tag is ignored, as docker does). The repository "host"
// (with any tag or digest) is reserved for the provider's built-in image.
// Names never reach a directory name: the store's directories are named
// by image ID, so ':' (overlayfs's lowerdir separator) cannot appear in a
// path the store hands out.
func ValidName(name string) error {
	_, err := CanonicalName(name)
	return err
}

// CanonicalName returns the one spelling the store keeps name under: the
// tag made explicit ("busybox" is "busybox:latest") and Docker Hub's
// default registry and namespace dropped ("docker.io/library/busybox:1.35"
// is "busybox:1.35", "index.docker.io/x/y" is "x/y:latest"), so that the
// same image imported from a docker save tarball or an OCI layout, pulled,
// or asked for by a session spec, is found under one name. A digest
// reference is kept as REPO@DIGEST ("busybox:1.36@sha256:..." is
// "busybox@sha256:..."): the digest names the content, a tag beside it
// does not. Errors match ErrInvalidName and say what is wrong (see
// ValidName).
func CanonicalName(name string) (string, error) {
	_, canon, err := parseName(name)
	return canon, err
}

// parseName parses s as a reference and returns it (Docker Hub's spelled
// in full, index.docker.io/library/..., for a request) and its canonical
// name.
func parseName(s string) (name.Reference, string, error) {
	bad := func(format string, args ...any) (name.Reference, string, error) {
		return nil, "", fmt.Errorf("%w %q: %s", ErrInvalidName, s, fmt.Sprintf(format, args...))
	}
	if s == "" {
		return bad("empty")
	}
	var ref name.Reference
	var err error
	if strings.Contains(s, "@") {
		ref, err = name.NewDigest(s)
	} else {
		ref, err = name.NewTag(s)
	}
	if err != nil {
		return bad("%s", err)
	}
	repo := ref.Context()
	for _, p := range strings.Split(repo.RepositoryStr(), "/") {
		if !pathComponent().MatchString(p) {
			return bad("path component %q: want lowercase letters and digits, joined by '.', '_', \"__\" or '-'", p)
		}
	}
	sep := "@"
	if t, ok := ref.(name.Tag); ok {
		sep = ":"
		if !tagStart().MatchString(t.TagStr()) {
			return bad("tag %q: want letters, digits, '_', '.' or '-' (at most 128, not starting with '.' or '-')", t.TagStr())
		}
	}
	familiar := familiarRepo(repo)
	if familiar == sandbox.HostImage {
		return bad("%q is reserved: it is the container provider's built-in view of the host's system directories", sandbox.HostImage)
	}
	canon := familiar + sep + ref.Identifier()
	if len(canon) > maxNameLen {
		return bad("longer than %d characters", maxNameLen)
	}
	return ref, canon, nil
}

// familiarRepo is repo the way docker shows it: Docker Hub's registry,
// and its "library/" namespace for a one-component path, left out.
func familiarRepo(repo name.Repository) string {
	if repo.RegistryStr() != dockerHub {
		return repo.Name()
	}
	r := repo.RepositoryStr()
	if rest, ok := strings.CutPrefix(r, "library/"); ok && !strings.Contains(rest, "/") {
		return rest
	}
	return r
}
