package imagestore

import (
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The bounds of what a pull reads of a registry's answers before it has
// checked any of it: a hostile registry picks every size and count it
// declares, and the daemon must not spend its memory, goroutines or disk
// on more than an image can need.
const (
	// MaxLayers is the most layers an image may have. Docker refuses
	// more than 125 layers on top of each other, so no image that runs
	// elsewhere has more.
	MaxLayers = 128
	// MaxManifestSize is the most bytes of a manifest or an index: the
	// distribution registry refuses to store larger ones, and one of
	// MaxLayers layers takes some 30 KiB.
	MaxManifestSize = 4 << 20
	// MaxConfigSize is the most bytes of an image's config: the history
	// and environment of a large image take a few hundred KiB.
	MaxConfigSize = 8 << 20
)

// limitError is an image that exceeds one of the bounds above. It
// matches ErrTooLarge.
type limitError struct {
	what string // "has 5000 layers", "its manifest is 13 MiB"
	max  string // "128 layers", "4 MiB"
}

func (e *limitError) Error() string {
	if e.max == "" {
		return fmt.Sprintf("%v: %s (a hostile or broken image)", ErrTooLarge, e.what)
	}
	return fmt.Sprintf("%v: %s, more than the %s a pull accepts (a hostile or broken image)", ErrTooLarge, e.what, e.max)
}
func (e *limitError) Is(t error) bool { return t == ErrTooLarge }

func mib(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// checkLayerCount refuses an image of more than MaxLayers layers, pulled
// or imported.
func checkLayerCount(n int) error {
	if n > MaxLayers {
		return &limitError{what: fmt.Sprintf("the image has %d layers", n), max: fmt.Sprintf("%d layers", MaxLayers)}
	}
	return nil
}

// checkManifest refuses a pulled image whose manifest declares more
// layers or a larger config than a pull takes, before its config is
// read: remote reads a config whole, at whatever size is declared.
func checkManifest(img v1.Image) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	if err := checkLayerCount(len(m.Layers)); err != nil {
		return err
	}
	if m.Config.Size > MaxConfigSize {
		return &limitError{what: "its config is declared at " + mib(m.Config.Size), max: mib(MaxConfigSize)}
	}
	return nil
}

// checkManifestSize refuses a manifest an index declares larger than
// MaxManifestSize, before it is asked for.
func checkManifestSize(d v1.Descriptor) error {
	if d.Size > MaxManifestSize {
		return &limitError{what: fmt.Sprintf("the manifest %s is declared at %s", d.Digest, mib(d.Size)), max: mib(MaxManifestSize)}
	}
	return nil
}

// limitedBody is a manifest's body: reading past MaxManifestSize fails,
// so a registry cannot make a pull hold more of it than that.
type limitedBody struct {
	io.ReadCloser
	left int64
}

func limitManifest(body io.ReadCloser, length int64) (io.ReadCloser, error) {
	if length > MaxManifestSize {
		body.Close()
		return nil, manifestTooLarge(length)
	}
	return &limitedBody{ReadCloser: body, left: MaxManifestSize}, nil
}

func manifestTooLarge(n int64) error {
	if n > 0 {
		return &limitError{what: "its manifest is " + mib(n), max: mib(MaxManifestSize)}
	}
	return &limitError{what: "its manifest goes on past the " + mib(MaxManifestSize) + " a pull accepts"}
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more than the limit tells a body of exactly the limit
		// from a larger one.
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, manifestTooLarge(0)
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
