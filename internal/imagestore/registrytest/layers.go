package registrytest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"strconv"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one entry of a layer LayerOf writes: its header (Size is set
// from Data for a regular file) and content.
type Entry struct {
	tar.Header
	Data string
}

// File is a regular file entry of mode 0644.
func File(name, data string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, Data: data}
}

// Dir is a directory entry of mode 0755.
func Dir(name string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

// LayerOf is a layer of entries as written, in order: a hostile layer's
// names and links are not checked or cleaned.
func LayerOf(entries ...Entry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.ModTime.IsZero() {
			h.ModTime = epoch
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("entry %s: %w", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return bytesLayer(buf.Bytes())
}

func bytesLayer(b []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

// SparseLayer is a layer of one file, name, of size bytes that are all a
// hole but the last: a PAX GNU sparse file (format 1.0), so the layer is
// a few kilobytes however large size is. Go's archive/tar reads it
// (Header.Size is size) but does not write the format, so its headers are
// written here.
func SparseLayer(name string, size int64) (v1.Layer, error) {
	var buf bytes.Buffer
	records := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", name) + paxRecord("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	buf.Write(ustarHeader("./PaxHeaders/"+name, 'x', int64(len(records))))
	buf.WriteString(records)
	pad(&buf)
	// The data: the sparse map (1 region: the last byte), padded to a
	// block, then the region's byte.
	sparseMap := fmt.Sprintf("1\n%d\n1\n", size-1)
	data := make([]byte, 512+1)
	copy(data, sparseMap)
	data[512] = 'x'
	buf.Write(ustarHeader("./GNUSparseFile.0/"+name, tar.TypeReg, int64(len(data))))
	buf.Write(data)
	pad(&buf)
	buf.Write(make([]byte, 1024)) // the end of the archive
	return bytesLayer(buf.Bytes())
}

// paxRecord is one PAX record, "LEN KEY=VALUE\n" with LEN counting
// itself.
func paxRecord(k, v string) string {
	rest := " " + k + "=" + v + "\n"
	n := len(rest)
	for n < len(rest)+len(strconv.Itoa(n)) {
		n++
	}
	return strconv.Itoa(len(rest)+len(strconv.Itoa(n))) + rest
}

// ustarHeader is a 512-byte ustar header block.
func ustarHeader(name string, typ byte, size int64) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], fmt.Sprintf("%011o\x00", epoch.Unix()))
	b[156] = typ
	copy(b[257:265], "ustar\x0000")
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func pad(buf *bytes.Buffer) {
	if n := buf.Len() % 512; n != 0 {
		buf.Write(make([]byte, 512-n))
	}
}
