package imagestore

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

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

// The patterns are compiled on first use, not at start: the tai42 binary
// is also each container's agent, and its start is on every session's
// create path.
var (
	// pathComponent is one lowercase path component of a repository, as
	// the distribution reference grammar has it.
	pathComponent = lazyRegexp(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	// domainComponent is a registry host, with an optional port.
	domainComponent = lazyRegexp(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?$`)
	tagPattern      = lazyRegexp(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// lazyRegexp returns a function that compiles expr on its first call.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// ValidName reports whether name can name an image in the store: nil, or
// an error matching ErrInvalidName that says what is wrong.
//
// Names follow the references of docker and OCI registries without a
// digest: [REGISTRY[:PORT]/]PATH[:TAG], e.g. "busybox", "busybox:1.35",
// "ghcr.io/x/y:tag", "localhost:5000/team/tool:v2". PATH components are
// lowercase letters and digits, joined by '.', '_', "__" or dashes. The
// repository "host" (with any tag) is reserved for the provider's
// built-in image. Names never reach a directory name: the store's
// directories are named by image ID, so ':' (overlayfs's lowerdir
// separator) cannot appear in a path the store hands out.
func ValidName(name string) error {
	_, err := CanonicalName(name)
	return err
}

// CanonicalName returns the one spelling the store keeps name under: the
// tag made explicit ("busybox" is "busybox:latest") and Docker Hub's
// default registry and namespace dropped ("docker.io/library/busybox:1.35"
// is "busybox:1.35", "index.docker.io/x/y" is "x/y:latest"), so that the
// same image imported from a docker save tarball or an OCI layout, or
// asked for by a session spec, is found under one name. Errors match
// ErrInvalidName and say what is wrong (see ValidName).
func CanonicalName(name string) (string, error) {
	bad := func(format string, args ...any) (string, error) {
		return "", fmt.Errorf("%w %q: %s", ErrInvalidName, name, fmt.Sprintf(format, args...))
	}
	if name == "" {
		return bad("empty")
	}
	if strings.Contains(name, "@") {
		return bad("digest references (NAME@sha256:...) are not names; give NAME[:TAG]")
	}
	repo, tag := name, DefaultTag
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		repo, tag = name[:i], name[i+1:]
		if !tagPattern().MatchString(tag) {
			return bad("tag %q: want letters, digits, '_', '.' or '-' (at most 128, not starting with '.' or '-')", tag)
		}
	}
	parts := strings.Split(repo, "/")
	if len(parts) > 1 && isDomain(parts[0]) {
		if !domainComponent().MatchString(parts[0]) {
			return bad("registry %q is not a host name with an optional :PORT", parts[0])
		}
	} else if strings.Contains(parts[0], ":") {
		return bad("':' may only separate the tag, or a registry's port")
	}
	start := 0
	if len(parts) > 1 && isDomain(parts[0]) {
		start = 1
	}
	for _, p := range parts[start:] {
		if !pathComponent().MatchString(p) {
			return bad("path component %q: want lowercase letters and digits, joined by '.', '_', \"__\" or '-'", p)
		}
	}
	// Docker Hub's default spellings.
	if len(parts) > 1 && (parts[0] == "docker.io" || parts[0] == "index.docker.io") {
		parts = parts[1:]
		if len(parts) == 2 && parts[0] == "library" {
			parts = parts[1:]
		}
	}
	repo = strings.Join(parts, "/")
	if repo == sandbox.HostImage {
		return bad("%q is reserved: it is the container provider's built-in view of the host's system directories", sandbox.HostImage)
	}
	canon := repo + ":" + tag
	if len(canon) > maxNameLen {
		return bad("longer than %d characters", maxNameLen)
	}
	return canon, nil
}

// isDomain reports whether the first component of a multi-component
// repository is a registry host: it has a '.' or a ':', or is localhost.
func isDomain(s string) bool {
	return strings.ContainsAny(s, ".:") || s == "localhost"
}
