// Package imagestoretest builds a tiny image from Debian's busybox-static
// (/bin/busybox) for the container provider's conformance tests and
// benchmarks: an OCI image layout, a `docker save` tarball, or a plain
// root filesystem directory, all of the same content.
//
// The root filesystem holds /bin/busybox and a symlink per applet it
// lists (`busybox --list`: /bin/sh among them) pointing at it,
// /etc/passwd and /etc/group (root, and nobody and nogroup as in Debian,
// 65534 both: a user an exec may run as), /tmp (mode 1777), /workspace,
// /root, and the /proc, /dev and /sys mount points; every entry is owned
// by root and dated 2000-01-01 UTC, so the image (and its ID) depends on
// the busybox binary alone. Its config sets
// PATH=/bin:/sbin:/usr/bin:/usr/sbin, the command /bin/sh and the
// platform linux/GOARCH.
//
// The Write* functions are for programs (see cmd/mkbusybox); the
// functions taking a testing.TB skip the test, saying why, when
// /bin/busybox is missing or not statically linked, and fail it on any
// other error.
package imagestoretest

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// Busybox is the path of the busybox binary the image is made from
// (Debian's busybox-static package).
const Busybox = "/bin/busybox"

// Path is the image's PATH, in its config's Env.
const Path = "PATH=/bin:/sbin:/usr/bin:/usr/sbin"

// RefNameAnnotation is the OCI layout index annotation naming the image.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// ErrNoBusybox is matched (errors.Is) by the errors of the Write*
// functions when Busybox is missing or not a static executable; the
// error says which and how to install it.
var ErrNoBusybox = errors.New("no static busybox")

// epoch dates every entry of the image.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// entry is one file of the root filesystem.
type entry struct {
	name     string // relative, no leading "/"
	typ      byte   // tar.TypeDir, tar.TypeReg, tar.TypeSymlink
	mode     int64  // permission bits, with 01000 sticky
	linkname string
	data     []byte // a regular file's content; nil: the busybox binary
}

// rootfsEntries lists the root filesystem, parents first.
func rootfsEntries() ([]entry, error) {
	if err := checkStatic(Busybox); err != nil {
		return nil, err
	}
	out, err := exec.Command(Busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("imagestoretest: %s --list: %w", Busybox, err)
	}
	es := []entry{
		{name: "bin", typ: tar.TypeDir, mode: 0o755},
		{name: "dev", typ: tar.TypeDir, mode: 0o755},
		{name: "etc", typ: tar.TypeDir, mode: 0o755},
		{name: "proc", typ: tar.TypeDir, mode: 0o555},
		{name: "root", typ: tar.TypeDir, mode: 0o700},
		{name: "sys", typ: tar.TypeDir, mode: 0o555},
		{name: "tmp", typ: tar.TypeDir, mode: 0o1777},
		{name: "workspace", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/busybox", typ: tar.TypeReg, mode: 0o755},
		{name: "etc/group", typ: tar.TypeReg, mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		{name: "etc/passwd", typ: tar.TypeReg, mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
	}
	haveSh := false
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		haveSh = haveSh || a == "sh"
		es = append(es, entry{name: "bin/" + a, typ: tar.TypeSymlink, mode: 0o777, linkname: "busybox"})
	}
	if !haveSh {
		return nil, fmt.Errorf("imagestoretest: %s --list has no sh applet", Busybox)
	}
	return es, nil
}

// checkStatic reports, as an ErrNoBusybox error, why path is not a static
// executable for this machine.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s is missing (apt-get install busybox-static)", ErrNoBusybox, path)
	}
	if err != nil {
		return fmt.Errorf("%w: %s is not an ELF executable: %v", ErrNoBusybox, path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: %s is dynamically linked (it has a PT_INTERP program header): install busybox-static, not busybox", ErrNoBusybox, path)
		}
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386, "arm": elf.EM_ARM, "riscv64": elf.EM_RISCV, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390}
	if m, ok := want[runtime.GOARCH]; ok && f.Machine != m {
		return fmt.Errorf("%w: %s is for %v, not this machine's %s", ErrNoBusybox, path, f.Machine, runtime.GOARCH)
	}
	return nil
}

// layerTar writes the root filesystem as a tar (an image layer).
func layerTar() ([]byte, error) {
	es, err := rootfsEntries()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		hdr := &tar.Header{
			Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.linkname,
			ModTime: epoch, Uname: "root", Gname: "root", Format: tar.FormatPAX,
		}
		var body io.Reader
		switch e.typ {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeReg:
			data := e.data
			if data == nil {
				if data, err = os.ReadFile(Busybox); err != nil {
					return nil, fmt.Errorf("imagestoretest: %w", err)
				}
			}
			hdr.Size = int64(len(data))
			body = bytes.NewReader(data)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if body != nil {
			if _, err := io.Copy(tw, body); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BusyboxImage returns the busybox image (docker media types, one gzip
// layer). It is built once per process (busybox is read then) and shared:
// v1.Image values are immutable. It is safe for concurrent use.
func BusyboxImage() (v1.Image, error) {
	built.Lock()
	defer built.Unlock()
	if built.img == nil {
		img, err := buildImage()
		if err != nil {
			return nil, err
		}
		built.img = img
	}
	return built.img, nil
}

var built struct {
	sync.Mutex
	img v1.Image
}

func buildImage() (v1.Image, error) {
	b, err := layerTar()
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("imagestoretest: %w", err)
	}
	return singleLayerImage(layer, []string{Path}, []string{"/bin/sh"})
}

// WriteBusyboxLayout writes an OCI image layout holding the busybox image
// into dir (created if missing; it must be empty) and returns dir. name,
// when not "", annotates the image in index.json
// (org.opencontainers.image.ref.name); "" leaves it nameless.
func WriteBusyboxLayout(dir, name string) (string, error) {
	img, err := BusyboxImage()
	if err != nil {
		return "", err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if err := emptyDir(dir); err != nil {
		return "", err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("imagestoretest: %w", err)
	}
	var opts []layout.Option
	if name != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{RefNameAnnotation: name}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		return "", fmt.Errorf("imagestoretest: %w", err)
	}
	return dir, nil
}

// WriteBusyboxDockerSave writes the busybox image as a `docker save`
// tarball tagged name (e.g. "busybox:test") to file and returns file.
func WriteBusyboxDockerSave(file, name string) (string, error) {
	tag, err := parseTag(name)
	if err != nil {
		return "", err
	}
	img, err := BusyboxImage()
	if err != nil {
		return "", err
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return "", fmt.Errorf("imagestoretest: %w", err)
	}
	return file, nil
}

func parseTag(s string) (name.Tag, error) {
	if s == "" {
		return name.Tag{}, errors.New("imagestoretest: a docker save tarball needs a name to tag the image with")
	}
	tag, err := name.NewTag(s)
	if err != nil {
		return name.Tag{}, fmt.Errorf("imagestoretest: %w", err)
	}
	return tag, nil
}

// WriteBusyboxRootfs writes the busybox root filesystem as a plain
// directory dir (created if missing; it must be empty) and returns dir.
// Running as root, every entry is owned by root; otherwise by the caller.
func WriteBusyboxRootfs(dir string) (string, error) {
	es, err := rootfsEntries()
	if err != nil {
		return "", err
	}
	if err := emptyDir(dir); err != nil {
		return "", err
	}
	root := os.Geteuid() == 0
	ts := []unix.Timespec{unix.NsecToTimespec(epoch.UnixNano()), unix.NsecToTimespec(epoch.UnixNano())}
	// Parents first; directories' modes and times last, so writing into
	// them neither fails (0555) nor changes their times.
	var dirs []entry
	for _, e := range es {
		p := filepath.Join(dir, e.name)
		switch e.typ {
		case tar.TypeDir:
			err = os.Mkdir(p, 0o755)
			dirs = append(dirs, e)
		case tar.TypeSymlink:
			err = os.Symlink(e.linkname, p)
		case tar.TypeReg:
			err = writeFile(p, e)
		}
		if err == nil && root {
			err = os.Lchown(p, 0, 0)
		}
		if err == nil && e.typ != tar.TypeDir {
			err = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return "", fmt.Errorf("imagestoretest: %w", err)
		}
	}
	for _, e := range dirs {
		p := filepath.Join(dir, e.name)
		if err := os.Chmod(p, fileMode(e.mode)); err != nil {
			return "", fmt.Errorf("imagestoretest: %w", err)
		}
		if err := os.Chtimes(p, epoch, epoch); err != nil {
			return "", fmt.Errorf("imagestoretest: %w", err)
		}
	}
	return dir, nil
}

func writeFile(p string, e entry) error {
	data := e.data
	if data == nil {
		var err error
		if data, err = os.ReadFile(Busybox); err != nil {
			return err
		}
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return err
	}
	return os.Chmod(p, fileMode(e.mode))
}

// fileMode turns tar permission bits (01000 sticky) into an os.FileMode.
func fileMode(m int64) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// emptyDir creates dir if missing and fails if it holds anything.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("imagestoretest: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("imagestoretest: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("imagestoretest: %s is not empty", dir)
	}
	return nil
}

// BusyboxLayout is WriteBusyboxLayout for a test: it skips t when
// /bin/busybox is missing or not static, and fails it on other errors.
func BusyboxLayout(t testing.TB, dir, name string) string {
	t.Helper()
	return must(t, func() (string, error) { return WriteBusyboxLayout(dir, name) })
}

// BusyboxDockerSave is WriteBusyboxDockerSave for a test: it skips t when
// /bin/busybox is missing or not static, and fails it on other errors.
func BusyboxDockerSave(t testing.TB, file, name string) string {
	t.Helper()
	return must(t, func() (string, error) { return WriteBusyboxDockerSave(file, name) })
}

// BusyboxRootfs is WriteBusyboxRootfs for a test: it skips t when
// /bin/busybox is missing or not static, and fails it on other errors.
func BusyboxRootfs(t testing.TB, dir string) string {
	t.Helper()
	return must(t, func() (string, error) { return WriteBusyboxRootfs(dir) })
}

func must(t testing.TB, fn func() (string, error)) string {
	t.Helper()
	p, err := fn()
	if errors.Is(err, ErrNoBusybox) {
		t.Skip(err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}
