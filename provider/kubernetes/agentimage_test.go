package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func fakeBinary(t *testing.T) (string, []byte) {
	t.Helper()
	content := bytes.Repeat([]byte("\x7fELF not really a tai42 "), 4096)
	p := filepath.Join(t.TempDir(), "tai42")
	if err := os.WriteFile(p, content, 0o700); err != nil {
		t.Fatal(err)
	}
	return p, content
}

// checkAgentImage asserts img is the agent image of content: one layer
// holding /tai42 alone (0755, root), Entrypoint [/tai42], linux/GOARCH.
func checkAgentImage(t *testing.T, img v1.Image, content []byte) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/tai42"}) || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [/tai42] and none", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if strings.TrimPrefix(h.Name, "/") != "tai42" {
			continue
		}
		if h.Typeflag != tar.TypeReg || h.Mode&0o7777 != 0o755 || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("/tai42: type %c mode %o uid %d gid %d, want a regular file 0755 owned by 0:0", h.Typeflag, h.Mode, h.Uid, h.Gid)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, content) {
			t.Errorf("/tai42 holds %d bytes that are not the binary's %d", len(b), len(content))
		}
	}
	if !slices.Equal(names, []string{"tai42"}) {
		t.Errorf("layer entries %q, want [tai42]", names)
	}
	// The digest the manifest names is the layer's: a registry accepts it.
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Layers[0].Digest != d {
		t.Errorf("manifest names layer %s, the layer is %s", m.Layers[0].Digest, d)
	}
}

func TestAgentImage(t *testing.T) {
	bin, content := fakeBinary(t)
	img, err := AgentImage(bin)
	if err != nil {
		t.Fatal(err)
	}
	checkAgentImage(t, img, content)

	// The same binary makes the same image: pushes of one build agree.
	again, err := AgentImage(bin)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two images of one binary differ: %s and %s", d1, d2)
	}
}

func TestAgentImageErrors(t *testing.T) {
	if _, err := AgentImage(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing binary: %v, want an error naming it", err)
	}
	if _, err := AgentImage(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v, want 'not a regular file'", err)
	}
}

func TestPushAgentImage(t *testing.T) {
	bin, content := fakeBinary(t)
	// go-containerregistry's in-memory registry, on loopback: the push is
	// plain HTTP, as to the harness's registry.
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/tai42-agent:test"
	if err := PushAgentImage(context.Background(), ref, bin); err != nil {
		t.Fatal(err)
	}
	nr, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(nr)
	if err != nil {
		t.Fatal(err)
	}
	checkAgentImage(t, img, content)

	if err := PushAgentImage(context.Background(), "not a reference", bin); err == nil {
		t.Error("a bad reference was accepted")
	}
}
