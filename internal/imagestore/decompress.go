package imagestore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	kgzip "github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Magic numbers of the compressions a layer blob may have.
var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// fetchCompressed is a pull's addRequest.Fetch: l's blob as the registry
// sends it, decompressed by klauspost/compress instead of compress/gzip
// (which go-containerregistry's Uncompressed uses): its gzip inflates about
// twice as fast, and a pull is bound by inflating. The compression is told
// by the content, as the registry's media types are not always right.
// Reading the result to its end reads the blob to its end, so the
// registry's digest is checked (go-containerregistry's verifying reader
// reports a mismatch at EOF, which the read then returns).
func fetchCompressed(l v1.Layer) (io.ReadCloser, error) {
	blob, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(blob, 256<<10)
	head, err := br.Peek(len(zstdMagic))
	if err != nil && !errors.Is(err, io.EOF) {
		blob.Close()
		return nil, err
	}
	var r io.Reader
	var closeR func()
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		zr, err := kgzip.NewReader(br)
		if err != nil {
			blob.Close()
			return nil, fmt.Errorf("%w: the layer's gzip stream: %w", ErrInvalidImage, err)
		}
		r, closeR = zr, func() { zr.Close() }
	case bytes.HasPrefix(head, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			blob.Close()
			return nil, fmt.Errorf("%w: the layer's zstd stream: %w", ErrInvalidImage, err)
		}
		r, closeR = zr, zr.Close
	default:
		r, closeR = br, func() {}
	}
	return &blobReader{r: r, blob: br, closeBlob: blob.Close, closeR: closeR}, nil
}

// blobReader reads a decompressed blob; at the end of the decompressed
// stream it reads what is left of the blob, so that the blob's own end
// (and its digest check) is reached.
type blobReader struct {
	r         io.Reader
	blob      io.Reader
	closeBlob func() error
	closeR    func()
}

func (b *blobReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		if _, derr := io.Copy(io.Discard, b.blob); derr != nil {
			return n, derr
		}
	}
	return n, err
}

func (b *blobReader) Close() error {
	b.closeR()
	return b.closeBlob()
}
