package imagestore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/tai42/sandbox"
)

// PullError is the error of a Pull: Ref could not be pulled, for Reason,
// because of Err. Its text names the reference and the cause (what the
// registry or the store said); it never holds a credential.
type PullError struct {
	Ref    string
	Reason sandbox.PullReason
	Err    error
}

func (e *PullError) Error() string { return fmt.Sprintf("pulling %s: %v", e.Ref, e.Err) }
func (e *PullError) Unwrap() error { return e.Err }

// pullError classifies err, the failure of pulling ref.
func pullError(ref string, err error) *PullError {
	var pe *PullError
	if errors.As(err, &pe) {
		return pe
	}
	return &PullError{Ref: ref, Reason: reason(err), Err: err}
}

// reason says why a pull failed with err. The checks go from what the
// pull itself found (a name, a platform, a refused credential, a stall)
// and a full disk, to the registry's answer and the network's failure,
// then to what the store found.
func reason(err error) sandbox.PullReason {
	var te *transport.Error
	switch {
	case errors.Is(err, ErrRegistryNotAllowed):
		// Nothing was asked of the registry: the operator's settings
		// keep pulls from it.
		return sandbox.PullInvalidReference
	case errors.Is(err, ErrUnreachable), errors.As(err, new(*notRegistryError)):
		return sandbox.PullUnreachable
	case errors.Is(err, ErrInvalidName):
		return sandbox.PullInvalidReference
	case errors.Is(err, ErrNoPlatform):
		return sandbox.PullNoPlatform
	case errors.Is(err, ErrUnauthorized):
		return sandbox.PullUnauthorized
	case errors.Is(err, ErrStalled):
		return sandbox.PullUnreachable
	case errors.Is(err, ErrTooLarge):
		return sandbox.PullInvalidImage
	case isDiskFull(err):
		return sandbox.PullStorage
	// The store wraps any failure of reading a layer in ErrInvalidImage:
	// the registry's answers and the network's failures inside it are
	// told apart first (a layer's content failures match ErrInvalidImage
	// only, see contentReader).
	case errors.As(err, &te):
		return registryReason(te)
	case isNetwork(err):
		return sandbox.PullUnreachable
	case errors.Is(err, ErrInvalidImage):
		return sandbox.PullInvalidImage
	case isStorage(err):
		return sandbox.PullStorage
	}
	// What is left is what the registry sent and the pull could not use:
	// a manifest it cannot parse, a schema it does not support.
	return sandbox.PullInvalidImage
}

// registryReason classifies a registry's answer by its error codes, else
// by its HTTP status.
func registryReason(te *transport.Error) sandbox.PullReason {
	blob := te.Request != nil && strings.Contains(te.Request.URL.Path, "/blobs/")
	for _, d := range te.Errors {
		switch d.Code {
		case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
			return sandbox.PullUnauthorized
		case transport.BlobUnknownErrorCode, transport.ManifestBlobUnknownErrorCode, transport.DigestInvalidErrorCode,
			transport.ManifestInvalidErrorCode, transport.ManifestUnverifiedErrorCode, transport.SizeInvalidErrorCode:
			return sandbox.PullInvalidImage
		case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
			if blob {
				return sandbox.PullInvalidImage
			}
			return sandbox.PullNotFound
		case transport.NameInvalidErrorCode, transport.TagInvalidErrorCode:
			return sandbox.PullInvalidReference
		}
	}
	switch te.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		return sandbox.PullUnauthorized
	case http.StatusNotFound:
		if blob {
			// The manifest lists a blob the registry does not have.
			return sandbox.PullInvalidImage
		}
		if len(te.Errors) == 0 {
			// A registry says what it lacks (MANIFEST_UNKNOWN,
			// NAME_UNKNOWN): a bare 404 is a server that is not one.
			return sandbox.PullUnreachable
		}
		return sandbox.PullNotFound
	}
	return sandbox.PullUnreachable
}

// isUnauthorized reports whether err is a registry refusing access.
func isUnauthorized(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && registryReason(te) == sandbox.PullUnauthorized
}

func isDiskFull(err error) bool {
	return errors.Is(err, ErrDiskFull) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EROFS)
}

// isNetwork reports whether err is the network failing: a name that does
// not resolve, a connection refused, reset, timed out or cut short, a TLS
// handshake that failed.
func isNetwork(err error) bool {
	var ne net.Error
	var dns *net.DNSError
	var op *net.OpError
	// Not any net.Error: every syscall.Errno is one, a disk's EIO too.
	return (errors.As(err, &ne) && ne.Timeout()) || errors.As(err, &dns) || errors.As(err, &op) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, context.DeadlineExceeded) || isCertError(err) || errors.As(err, new(*routeError)) ||
		errors.As(err, new(tls.RecordHeaderError)) || errors.As(err, new(tls.AlertError))
}

func isStorage(err error) bool {
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	return errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se)
}

// authError is a registry refusing access: it names the registry and the
// repository, and says whether credentials were configured for it.
type authError struct {
	registry, repo string
	anonymous      bool
	err            error
}

func (e *authError) Error() string {
	how := "the credentials configured for it (docker config: $DOCKER_CONFIG or ~/.docker/config.json) were refused"
	if e.anonymous {
		how = "no credentials are configured for it: run `docker login " + e.registry + "` or add them to $DOCKER_CONFIG/config.json"
	}
	return fmt.Sprintf("registry %s refused access to %s (%s): %v", e.registry, e.repo, how, e.err)
}
func (e *authError) Unwrap() []error { return []error{ErrUnauthorized, e.err} }
