package imagestoretest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// rootfsTar writes a small root filesystem tarball (as mmdebstrap does:
// "./"-prefixed names), gzip-compressed when gz, and returns its path.
func rootfsTar(t *testing.T, gz bool) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./bin/hello", Typeflag: tar.TypeReg, Mode: 0o755, Size: 6},
		{Name: "./bin/sh", Typeflag: tar.TypeSymlink, Linkname: "hello", Mode: 0o777},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte("hello\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	if gz {
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		if _, err := zw.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		data = zb.Bytes()
	}
	p := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWriteRootfsDockerSave(t *testing.T) {
	for _, gz := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "image.tar")
		if _, err := WriteRootfsDockerSave(rootfsTar(t, gz), out, "debian-tools", RootfsConfig{}); err != nil {
			t.Fatal(err)
		}
		tag, err := name.NewTag("debian-tools:latest")
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(out, &tag)
		if err != nil {
			t.Fatalf("gzip %v: the tarball holds no image debian-tools:latest: %v", gz, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
			t.Errorf("gzip %v: platform %s/%s, want linux/%s", gz, cf.OS, cf.Architecture, runtime.GOARCH)
		}
		if !slices.Equal(cf.Config.Env, []string{DebianPath}) || !slices.Equal(cf.Config.Cmd, []string{"/bin/sh"}) {
			t.Errorf("gzip %v: env %q, cmd %q; want Debian's PATH and /bin/sh", gz, cf.Config.Env, cf.Config.Cmd)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("gzip %v: layers %d, %v; want one", gz, len(layers), err)
		}
		fs := files(t, img)
		if h := fs["bin/hello"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o755 {
			t.Errorf("gzip %v: ./bin/hello is %+v; want the file, mode 0755", gz, h)
		}
		if h := fs["bin/sh"]; h == nil || h.Linkname != "hello" {
			t.Errorf("gzip %v: ./bin/sh is %+v; want a symlink to hello", gz, h)
		}
	}
}

func TestRootfsConfigGiven(t *testing.T) {
	env := []string{"PATH=/bin", "LANG=C.UTF-8"}
	img, err := RootfsImage(rootfsTar(t, false), RootfsConfig{Env: env, Cmd: []string{"/bin/hello"}})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Env, env) || !slices.Equal(cf.Config.Cmd, []string{"/bin/hello"}) {
		t.Errorf("env %q, cmd %q; want %q and /bin/hello", cf.Config.Env, cf.Config.Cmd, env)
	}
}

func TestRootfsErrors(t *testing.T) {
	if _, err := RootfsImage(filepath.Join(t.TempDir(), "missing.tar"), RootfsConfig{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing tarball: %v; want an error saying it does not exist", err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if _, err := WriteRootfsDockerSave(rootfsTar(t, false), out, "", RootfsConfig{}); err == nil {
		t.Error("no name: no error; want one asking for a name")
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused write left %s", out)
	}
}
