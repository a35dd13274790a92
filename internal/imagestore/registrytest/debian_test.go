package registrytest_test

import (
	"archive/tar"
	"io"
	"path"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/tai42/sandbox/internal/imagestore/registrytest"
)

// The realistic image has its three layers as promised: python's files
// out of the base, the whiteout and the opaque directory in the top, and
// the second image on the same base.
func TestDebianPython(t *testing.T) {
	d := registrytest.DebianPython(t)
	base := names(t, d.Base)
	py := names(t, d.PythonLayer)
	top := names(t, d.Top)
	if !base["usr/bin/dpkg"] || base["usr/bin/python3"] {
		t.Errorf("the base layer: dpkg %v, python3 %v; want dpkg alone", base["usr/bin/dpkg"], base["usr/bin/python3"])
	}
	if !py["usr/bin/python3"] || py["usr/bin/dpkg"] {
		t.Errorf("the python layer: python3 %v, dpkg %v; want python3 alone", py["usr/bin/python3"], py["usr/bin/dpkg"])
	}
	for _, want := range []string{"etc/.wh.issue.net", "etc/skel/.wh..wh..opq", "etc/skel/registrytest"} {
		if !top[want] {
			t.Errorf("the top layer lacks %s: %v", want, top)
		}
	}
	if !base[strings.TrimPrefix(registrytest.DeletedFile, "/")] {
		t.Errorf("the base lacks %s, which the top deletes", registrytest.DeletedFile)
	}
	pl, _ := d.Python.Layers()
	ol, _ := d.Other.Layers()
	if len(pl) != 3 || len(ol) != 2 {
		t.Fatalf("layers: python %d, other %d; want 3 and 2", len(pl), len(ol))
	}
	if digest(t, pl[0]) != digest(t, ol[0]) {
		t.Error("the two images do not share their base layer")
	}
}

func names(t *testing.T, l v1.Layer) map[string]bool {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	set := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return set
		}
		if err != nil {
			t.Fatal(err)
		}
		set[strings.TrimPrefix(path.Clean("/"+h.Name), "/")] = true
	}
}

func digest(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}
