package imagestoretest

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// applets is what busybox --list prints.
func applets(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command(Busybox, "--list").Output()
	if err != nil {
		t.Skipf("%s --list: %v", Busybox, err)
	}
	return strings.Fields(string(out))
}

// files flattens img into name -> header.
func files(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	m := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return m
		}
		if err != nil {
			t.Fatal(err)
		}
		m[strings.TrimSuffix(h.Name, "/")] = h
	}
}

func checkImage(t *testing.T, img v1.Image) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || !slices.Equal(cf.Config.Env, []string{Path}) {
		t.Errorf("config: %s/%s env %q", cf.OS, cf.Architecture, cf.Config.Env)
	}
	fs := files(t, img)
	for name, mode := range map[string]int64{
		"bin": 0o755, "tmp": 0o1777, "workspace": 0o755, "proc": 0o555, "dev": 0o755, "sys": 0o555, "root": 0o700,
		"bin/busybox": 0o755, "etc/passwd": 0o644, "etc/group": 0o644,
	} {
		h, ok := fs[name]
		if !ok {
			t.Errorf("no /%s", name)
			continue
		}
		if h.Mode != mode || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("/%s: mode %o uid %d gid %d", name, h.Mode, h.Uid, h.Gid)
		}
	}
	for _, a := range applets(t) {
		if a == "busybox" {
			continue
		}
		if h, ok := fs["bin/"+a]; !ok || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
			t.Errorf("applet %s: %+v", a, h)
		}
	}
	if _, ok := fs["bin/sh"]; !ok {
		t.Error("no /bin/sh")
	}
}

func TestBusyboxIsStatic(t *testing.T) {
	err := checkStatic(Busybox)
	if errors.Is(err, ErrNoBusybox) && strings.Contains(err.Error(), "missing") {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// A dynamic executable is refused, saying why.
	err = checkStatic("/usr/bin/env")
	if !errors.Is(err, ErrNoBusybox) || !strings.Contains(err.Error(), "PT_INTERP") {
		t.Errorf("checkStatic(/usr/bin/env): %v", err)
	}
	if err := checkStatic(filepath.Join(t.TempDir(), "none")); !errors.Is(err, ErrNoBusybox) || !strings.Contains(err.Error(), "busybox-static") {
		t.Errorf("checkStatic of a missing file: %v", err)
	}
}

func TestBusyboxLayout(t *testing.T) {
	dir := BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "busybox:test")
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations[RefNameAnnotation] != "busybox:test" || !im.Manifests[0].MediaType.IsImage() {
		t.Fatalf("index: %+v", im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	checkImage(t, img)

	// Deterministic: a second layout is the same image.
	dir2 := BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "busybox:test")
	p2, _ := layout.FromPath(dir2)
	idx2, _ := p2.ImageIndex()
	im2, _ := idx2.IndexManifest()
	if im2.Manifests[0].Digest != im.Manifests[0].Digest {
		t.Errorf("two layouts differ: %s, %s", im.Manifests[0].Digest, im2.Manifests[0].Digest)
	}
	// Nameless.
	dir3 := BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "")
	p3, _ := layout.FromPath(dir3)
	idx3, _ := p3.ImageIndex()
	im3, _ := idx3.IndexManifest()
	if len(im3.Manifests[0].Annotations) != 0 {
		t.Errorf("a nameless layout has annotations %v", im3.Manifests[0].Annotations)
	}
}

func TestBusyboxDockerSave(t *testing.T) {
	file := BusyboxDockerSave(t, filepath.Join(t.TempDir(), "busybox.tar"), "busybox:saved")
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{"busybox:saved"}) {
		t.Fatalf("manifest.json: %+v", m)
	}
	img, err := tarball.Image(opener, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkImage(t, img)
	// The same image as the layout's: one config digest.
	ref, err := BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	a, _ := img.ConfigName()
	b, _ := ref.ConfigName()
	if a != b {
		t.Errorf("config digest %s, want %s", a, b)
	}
	if _, err := WriteBusyboxDockerSave(filepath.Join(t.TempDir(), "x.tar"), ""); err == nil {
		t.Error("a docker save without a name was written")
	}
}

func TestBusyboxRootfs(t *testing.T) {
	dir := BusyboxRootfs(t, filepath.Join(t.TempDir(), "rootfs"))
	for name, mode := range map[string]os.FileMode{
		"bin/busybox": 0o755, "tmp": os.ModeDir | os.ModeSticky | 0o777, "proc": os.ModeDir | 0o555, "etc/passwd": 0o644,
	} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil || fi.Mode() != mode || fi.ModTime().Year() != 2000 {
			t.Errorf("%s: %v %v", name, fi, err)
		}
	}
	for _, a := range applets(t) {
		if a == "busybox" {
			continue
		}
		if l, err := os.Readlink(filepath.Join(dir, "bin", a)); err != nil || l != "busybox" {
			t.Errorf("bin/%s -> %q, %v", a, l, err)
		}
	}
	if _, err := WriteBusyboxRootfs(dir); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("writing into a non-empty directory: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("running the image needs root (chroot)")
	}
	// The image runs: its shell, its applets, its passwd.
	cmd := exec.Command("/bin/sh", "-c", `echo $((6*7)); id -un; ls /bin/sh`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir}
	cmd.Dir = "/"
	cmd.Env = []string{Path}
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "42\nroot\n/bin/sh\n" {
		t.Errorf("running the image's shell: %q %v", out, err)
	}
}
