package container_test

// Sessions on images pulled from a real registry (Debian's
// docker-registry on loopback, see registrytest): the realistic Debian
// image pulled on create, its layers stacked (the whiteout and the opaque
// directory applied), the second image on the same base fetching only
// its own layer; a failed pull on create a SpecRejectedError naming the
// reference; a 10 GiB sparse layer over the image size cap; credentials
// in no error or log line.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/imagestore/registrytest"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// registryProvider is a runc provider with an image store of its own,
// pulling through reg, its options changed by set; its log goes to the
// returned buffer.
func registryProvider(t *testing.T, reg imagestore.RegistryOptions, set ...func(*container.Options)) (*testProvider, *lockedBuffer) {
	t.Helper()
	opts := containertest.Options(t, "runc", permissive)
	opts.ReapInterval = -1
	opts.Images = filepath.Join(t.TempDir(), "images")
	opts.Registry = reg
	opts.Pull = container.PullMissing
	logs := &lockedBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, f := range set {
		f(&opts)
	}
	return &testProvider{sb: containertest.New(t, opts), opts: opts, rt: "runc"}, logs
}

// lockedBuffer is a log sink safe for the provider's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func blobDigest(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestRegistryDebianSessions(t *testing.T) {
	containertest.Require(t)
	r := registrytest.Start(t, registrytest.Options{})
	d := registrytest.DebianPython(t)
	pyRef, otherRef := r.Ref("debian/python", "v1"), r.Ref("debian/other", "v1")
	r.Push(t, pyRef, d.Python)
	r.Push(t, otherRef, d.Other)
	p, _ := registryProvider(t, imagestore.RegistryOptions{Insecure: []string{r.Host()}})

	// Pulled on create (the default policy, missing).
	sess := p.session(t, spec(pyRef, sandbox.NetworkNone))
	if out := mustSh(t, sess, `python3 -c 'print("py", 6*7)'`); out != "py 42\n" {
		t.Errorf("python3 -c printed %q", out)
	}
	if res := sh(t, sess, `test -e "$1"`, registrytest.DeletedFile); res.ExitCode == 0 {
		t.Errorf("%s, deleted by the top layer's whiteout, is there", registrytest.DeletedFile)
	}
	if out := mustSh(t, sess, `ls -A "$1"`, registrytest.OpaqueDir); out != filepath.Base(registrytest.NewFile)+"\n" {
		t.Errorf("the opaque %s shows %q, want the top layer's file alone", registrytest.OpaqueDir, out)
	}
	base := blobDigest(t, d.Base)
	first := r.BlobGETs(t, base)
	if first != 1 {
		t.Errorf("the first pull fetched the base %d times, want 1", first)
	}

	// The second image: its own layer only; the base's file the first
	// image deletes is there, the opaque directory whole.
	other := p.session(t, spec(otherRef, sandbox.NetworkNone))
	if n := r.BlobGETs(t, base); n != first {
		t.Errorf("the second image fetched the shared base again (%d GETs, %d before)", n, first)
	}
	if n := r.BlobGETs(t, blobDigest(t, d.OtherLayer)); n != 1 {
		t.Errorf("the second image's own layer was fetched %d times, want 1", n)
	}
	mustSh(t, other, `test -f "$1" && test -f "$2" && test -f "$3/.bashrc" && ! test -e "$4"`,
		registrytest.OtherFile, registrytest.DeletedFile, registrytest.OpaqueDir, registrytest.NewFile)

	// A second session of the pulled image fetches nothing.
	again := p.session(t, spec(pyRef, sandbox.NetworkNone))
	mustSh(t, again, `python3 -c 'import json'`)
	if n := r.BlobGETs(t, base); n != first {
		t.Errorf("a second session of the image fetched the base again")
	}
}

// wantSpecRejected checks that err is a SpecRejectedError of the image
// naming ref, and that no secret is in its text.
func wantSpecRejected(t *testing.T, err error, ref string, secret string) {
	t.Helper()
	var sre *sandbox.SpecRejectedError
	if !errors.As(err, &sre) || sre.Field != "image" {
		t.Fatalf("create: %v (%T), want a SpecRejectedError of the image", err, err)
	}
	if !strings.Contains(err.Error(), ref) {
		t.Errorf("the error does not name the reference %s: %v", ref, err)
	}
	if secret != "" && strings.Contains(err.Error(), secret) {
		t.Errorf("the error holds the password: %v", err)
	}
}

func createErr(t *testing.T, p *testProvider, ref string) error {
	t.Helper()
	sess, err := p.sb.CreateSession(ctxFor(t), spec(ref, sandbox.NetworkNone))
	if err == nil {
		_ = sess.Destroy(context.Background())
		t.Fatalf("a session of %s was created", ref)
	}
	return err
}

func TestRegistryPullFailsCreate(t *testing.T) {
	containertest.Require(t)
	const password = "pw-provider-e2e-51c0d"
	r := registrytest.Start(t, registrytest.Options{TLS: true, Users: map[string]string{"alice": password}})
	small, err := registrytest.LayerOf(registrytest.Dir("etc"), registrytest.File("etc/hello", "hello\n"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := registrytest.ImageOf(nil, small)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Ref("private/small", "v1")
	r.Push(t, ref, img)

	t.Run("missing", func(t *testing.T) {
		p, _ := registryProvider(t, imagestore.RegistryOptions{Transport: r.Transport(), Registries: []string{r.Host()}, Keychain: r.Keychain("alice")})
		missing := r.Ref("private/none", "v1")
		wantSpecRejected(t, createErr(t, p, missing), missing, "")
	})
	t.Run("wrong-password", func(t *testing.T) {
		wrong := "wrong-" + password
		p, logs := registryProvider(t, imagestore.RegistryOptions{Transport: r.Transport(), Registries: []string{r.Host()}, Keychain: r.KeychainFor("alice", wrong)})
		err := createErr(t, p, ref)
		wantSpecRejected(t, err, ref, wrong)
		var pe *sandbox.ImagePullError
		if errors.As(err, &pe) && pe.Reason != sandbox.PullUnauthorized {
			t.Errorf("reason %s, want unauthorized", pe.Reason)
		}
		if strings.Contains(logs.String(), wrong) || strings.Contains(logs.String(), password) {
			t.Errorf("the provider's log holds the password:\n%s", logs)
		}
	})
	t.Run("never", func(t *testing.T) {
		p, _ := registryProvider(t, imagestore.RegistryOptions{Transport: r.Transport(), Registries: []string{r.Host()}, Keychain: r.Keychain("alice")},
			func(o *container.Options) { o.Pull = container.PullNever })
		err := createErr(t, p, ref)
		if n := r.BlobGETs(t, blobDigest(t, small)); n != 0 {
			t.Errorf("pull policy never fetched the layer %d times", n)
		}
		wantSpecRejected(t, err, ref, "")
	})
}

// A 10 GiB sparse file is refused by the image size cap before it is
// written: the store keeps nothing of it.
func TestRegistrySparseOverMaxImageSize(t *testing.T) {
	containertest.Require(t)
	r := registrytest.Start(t, registrytest.Options{})
	sparse, err := registrytest.SparseLayer("big", 10<<30)
	if err != nil {
		t.Fatal(err)
	}
	img, err := registrytest.ImageOf(nil, sparse)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Ref("hostile/sparse", "v1")
	r.Push(t, ref, img)
	p, _ := registryProvider(t, imagestore.RegistryOptions{Insecure: []string{r.Host()}},
		func(o *container.Options) { o.MaxImageSize = 1 << 30 })
	err = createErr(t, p, ref)
	wantSpecRejected(t, err, ref, "")
	// A spec rejection carries the pull's reason and the limit in its text.
	if msg := err.Error(); !strings.Contains(msg, "("+string(sandbox.PullInvalidImage)+")") || !strings.Contains(msg, "--max-image-size") {
		t.Errorf("%v: want the pull's reason %s and the flag that raises the limit", err, sandbox.PullInvalidImage)
	}
	for _, sub := range []string{"tmp", "trash", "layers"} {
		ents, err := os.ReadDir(filepath.Join(p.opts.Images, sub))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if names := dirNames(ents); len(names) > 0 {
			t.Errorf("the refused pull left %s/%v", sub, names)
		}
	}
}

func dirNames(ents []os.DirEntry) []string {
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// The image pulled into the provider's store beforehand (as `tai42 image
// pull` does), then a session of it with pull policy never: the layers as
// the store unpacked them, the whiteout and opaque directory applied.
func TestRegistryDebianPulledByStore(t *testing.T) {
	containertest.Require(t)
	r := registrytest.Start(t, registrytest.Options{})
	d := registrytest.DebianPython(t)
	ref := r.Ref("debian/python", "v1")
	r.Push(t, ref, d.Python)
	reg := imagestore.RegistryOptions{Insecure: []string{r.Host()}}
	p, _ := registryProvider(t, reg, func(o *container.Options) { o.Pull = container.PullNever })
	store, err := imagestore.Open(p.opts.Images)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Pull(ctxFor(t), ref, imagestore.PullOptions{Registry: reg}); err != nil {
		t.Fatal(err)
	}
	sess := p.session(t, spec(ref, sandbox.NetworkNone))
	if out := mustSh(t, sess, `python3 -c 'import sys; print(sys.version_info[0])'`); out != "3\n" {
		t.Errorf("python3 printed %q", out)
	}
	mustSh(t, sess, `! test -e "$1" && test "$(ls -A "$2")" = "$3"`,
		registrytest.DeletedFile, registrytest.OpaqueDir, filepath.Base(registrytest.NewFile))
}
