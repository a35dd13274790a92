package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ImageManager is an optional interface of a [Sandbox] whose sessions run
// images from registries (the container provider): pull an image by
// reference, list and remove the images it holds, and prune the layers no
// image uses. A Sandbox without one runs no images of its own (the host
// runner has only [HostImage]). Like [WorkspaceManager], it is found with a
// type assertion, as io/fs finds its optional interfaces.
type ImageManager interface {
	// PullImage fetches ref ("python:3.12-slim", "ghcr.io/o/r:tag",
	// "host:5000/r@sha256:...") from its registry into the store, layers
	// the store holds already are not fetched again, and returns the image.
	// A failure is an *ImagePullError naming the reference and what the
	// registry said; an invalid reference an *ImagePullError of Reason
	// PullInvalidReference.
	PullImage(ctx context.Context, ref string, opts PullOptions) (ImageInfo, error)
	// ListImages returns the images held, sorted by name.
	ListImages(ctx context.Context) ([]ImageInfo, error)
	// RemoveImage removes the image name, and the layers no other image
	// uses. An image a live session uses is refused with a *SandboxError
	// saying so; a name not held is an *ImageNotFoundError.
	RemoveImage(ctx context.Context, name string) error
	// PruneImages removes the layers no image uses (left by an interrupted
	// pull, or by images replaced while a session used them).
	PruneImages(ctx context.Context) (PruneResult, error)
}

// PullOptions are the options of one [ImageManager.PullImage].
type PullOptions struct {
	// Platform is "os/arch[/variant]" to take from a multi-platform index;
	// "" is this machine's (linux/GOARCH).
	Platform string
	// Progress, when set, is called with each event of the pull, from one
	// goroutine at a time, in order.
	Progress func(PullProgress)
}

// PullProgress is one event of a pull.
type PullProgress struct {
	// Ref is the reference being pulled.
	Ref string `json:"ref"`
	// Status is one of the PullStatus values.
	Status PullStatus `json:"status"`
	// Layer is the digest of the layer (blob) the event is about; "" for
	// an event about the whole image.
	Layer string `json:"layer,omitempty"`
	// Done and Total are the bytes of Layer fetched so far and its size
	// (compressed, as the registry sends it); 0 when not known.
	Done  int64 `json:"done,omitempty"`
	Total int64 `json:"total,omitempty"`
	// Digest is the manifest digest the reference resolved to (on
	// PullResolved and PullComplete).
	Digest string `json:"digest,omitempty"`
}

// PullStatus is the kind of a [PullProgress] event.
type PullStatus string

const (
	// PullResolved: the reference resolved to a manifest (Digest), whose
	// layers follow.
	PullResolved PullStatus = "resolved"
	// PullLayerExists: the store holds Layer already; it is not fetched.
	PullLayerExists PullStatus = "exists"
	// PullLayerFetching: Done of Total bytes of Layer fetched (repeated).
	PullLayerFetching PullStatus = "fetching"
	// PullLayerDone: Layer is fetched, verified and unpacked.
	PullLayerDone PullStatus = "done"
	// PullComplete: the image is in the store under its name.
	PullComplete PullStatus = "complete"
)

// ImageInfo is an image an [ImageManager] holds.
type ImageInfo struct {
	// Name is the image's name in the store, in the familiar form:
	// "python:3.12-slim" (Docker Hub's docker.io/library/ left out),
	// "ghcr.io/o/r:tag", "host:5000/r@sha256:...".
	Name string `json:"name"`
	// ID is the digest of the image's config (docker's IMAGE ID).
	ID string `json:"id"`
	// Digest is the manifest digest it was pulled by; "" for an image
	// imported from a file without one.
	Digest string `json:"digest,omitempty"`
	// Platform is "os/arch[/variant]".
	Platform string `json:"platform"`
	// Size is the bytes its layers take on disk; SharedSize is the part of
	// Size in layers other images use too (the rest is its own).
	Size       int64 `json:"size"`
	SharedSize int64 `json:"shared_size"`
	// Layers is the number of its layers.
	Layers int `json:"layers"`
	// Pulled is when it was pulled or imported under Name.
	Pulled time.Time `json:"pulled"`
}

// PruneResult is what [ImageManager.PruneImages] removed.
type PruneResult struct {
	Layers int   `json:"layers"`
	Bytes  int64 `json:"bytes"`
}

// ErrImageNotFound matches *ImageNotFoundError; ErrImagePull matches
// *ImagePullError.
var (
	ErrImageNotFound = errors.New("sandbox: image not found")
	ErrImagePull     = errors.New("sandbox: image pull failed")
)

// ImageNotFoundError reports that an [ImageManager] holds no image Name.
type ImageNotFoundError struct {
	Name string
}

func (e *ImageNotFoundError) Error() string {
	return fmt.Sprintf("sandbox: no image %q in the store", e.Name)
}
func (e *ImageNotFoundError) Is(t error) bool { return t == ErrSandbox || t == ErrImageNotFound }
func (e *ImageNotFoundError) As(t any) bool   { return asBase(t, "remove_image", e) }

// PullReason says why a pull failed.
type PullReason string

const (
	// PullInvalidReference: the reference is not one (nothing was asked).
	PullInvalidReference PullReason = "invalid_reference"
	// PullNotFound: the registry has no such repository, tag or digest.
	PullNotFound PullReason = "not_found"
	// PullUnauthorized: the registry refused the credentials (or asked for
	// some and none were configured).
	PullUnauthorized PullReason = "unauthorized"
	// PullNoPlatform: the image has no manifest for the platform asked.
	PullNoPlatform PullReason = "no_platform"
	// PullInvalidImage: what the registry sent is not a usable image (a
	// digest that does not match, a hostile layer, too large).
	PullInvalidImage PullReason = "invalid_image"
	// PullUnreachable: the registry could not be reached, or stalled.
	PullUnreachable PullReason = "unreachable"
	// PullStorage: the store could not keep it (a full disk, an I/O error).
	PullStorage PullReason = "storage"
)

// ImagePullError reports that Ref could not be pulled. Message says what
// the registry (or the store) answered; it never holds a credential.
type ImagePullError struct {
	Ref     string
	Reason  PullReason
	Message string
}

func (e *ImagePullError) Error() string {
	return fmt.Sprintf("sandbox: pulling image %q (%s): %s", e.Ref, e.Reason, e.Message)
}
func (e *ImagePullError) Is(t error) bool { return t == ErrSandbox || t == ErrImagePull }
func (e *ImagePullError) As(t any) bool   { return asBase(t, "pull_image", e) }
