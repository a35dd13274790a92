package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

// testRegistry is go-containerregistry's in-process registry on
// 127.0.0.1, plain HTTP; host is its HOST:PORT.
type testRegistry struct{ host string }

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	ts := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(ts.Close)
	// No credentials of this machine's reach the test's registry.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	return &testRegistry{host: strings.TrimPrefix(ts.URL, "http://")}
}

// push writes img to the registry as repo:tag and returns the reference.
func (r *testRegistry) push(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repoTag
	parsed, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := ggcrremote.Write(parsed, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

// busyboxPlus is the busybox image with n small layers of random files on
// top: images that share busybox's layer.
func busyboxPlus(t *testing.T, n int) v1.Image {
	t.Helper()
	img, err := imagestoretest.BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		l, err := random.Layer(2048, types.DockerLayer)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

// layerDigests are img's layers' (compressed) digests, as pulls name them.
func layerDigests(t *testing.T, img v1.Image) []string {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var ds []string
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d.String())
	}
	return ds
}

// pullJSON parses "image pull --json": the events, then the image.
func pullJSON(t *testing.T, out string) ([]sandbox.PullProgress, sandbox.ImageInfo) {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) == 0 {
		t.Fatal("pull --json printed nothing")
	}
	var evs []sandbox.PullProgress
	for _, l := range lines[:len(lines)-1] {
		var ev sandbox.PullProgress
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ev); err != nil || ev.Status == "" {
			t.Fatalf("pull --json: event %q: %v", l, err)
		}
		evs = append(evs, ev)
	}
	var info sandbox.ImageInfo
	last := lines[len(lines)-1]
	if err := json.Unmarshal([]byte(last), &info); err != nil || info.Name == "" || strings.Contains(last, `"status"`) {
		t.Fatalf("pull --json: the last line %q is not the image (%v)", last, err)
	}
	return evs, info
}

func TestImagePull(t *testing.T) {
	reg := startRegistry(t)
	state := t.TempDir()
	env := map[string]string{stateDirEnv: state}
	one := busyboxPlus(t, 1)
	two := busyboxPlus(t, 2)
	ref1 := reg.push(t, "tools/box:1", one)
	ref2 := reg.push(t, "tools/box:2", two)

	// A registry on loopback is not reached unless listed: the reference
	// is refused (invalid_reference, a usage error), naming the setting.
	r := runCLI(t, nil, env, "image", "pull", ref1)
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--registries") || !strings.Contains(r.stderr, ref1) {
		t.Errorf("pull from loopback without --registries: stderr %q", r.stderr)
	}
	// Plain HTTP needs --insecure-registry, and the error says so.
	r = runCLI(t, nil, map[string]string{stateDirEnv: state, "TAI42_REGISTRIES": reg.host}, "image", "pull", ref1)
	r.want(t, exitFailure)
	if !strings.Contains(r.stderr, "add --insecure-registry "+reg.host) || !strings.Contains(r.stderr, ref1) {
		t.Errorf("pull over plain HTTP without --insecure-registry: stderr %q", r.stderr)
	}
	if imgs := imageLs(t, env); len(imgs) != 0 {
		t.Fatalf("a failed pull left images: %+v", imgs)
	}

	// --json: events, then the image.
	r = runCLI(t, nil, env, "image", "pull", "--insecure-registry", reg.host, "--json", ref1)
	r.want(t, exitOK)
	evs, info := pullJSON(t, r.stdout)
	if info.Name != ref1 || !strings.HasPrefix(info.ID, "sha256:") || info.Layers != 2 {
		t.Errorf("pull --json: image %+v", info)
	}
	done := map[string]bool{}
	statuses := map[sandbox.PullStatus]bool{}
	for _, ev := range evs {
		statuses[ev.Status] = true
		if ev.Ref != ref1 {
			t.Errorf("event of another ref: %+v", ev)
		}
		if ev.Status == sandbox.PullLayerDone {
			done[ev.Layer] = true
		}
	}
	if !statuses[sandbox.PullResolved] || !statuses[sandbox.PullComplete] {
		t.Errorf("pull --json: no resolved or complete event: %+v", evs)
	}
	for _, d := range layerDigests(t, one) {
		if !done[d] {
			t.Errorf("pull --json: no done event of layer %s: %+v", d, evs)
		}
	}

	// --quiet: the name alone. The config's TAI42_INSECURE_REGISTRY works
	// as the flag does.
	r = runCLI(t, nil, map[string]string{stateDirEnv: state, "TAI42_INSECURE_REGISTRY": reg.host}, "image", "pull", "-q", ref2)
	r.want(t, exitOK)
	if r.stdout != ref2+"\n" || r.stderr != "" {
		t.Errorf("pull --quiet: stdout %q stderr %q", r.stdout, r.stderr)
	}

	// Without a terminal: a line per layer, a summary, the name on stdout.
	// Every layer is held now.
	r = runCLI(t, nil, env, "image", "pull", "--insecure-registry", reg.host, ref2)
	r.want(t, exitOK)
	if r.stdout != ref2+"\n" {
		t.Errorf("pull: stdout %q", r.stdout)
	}
	for _, d := range layerDigests(t, two) {
		if !strings.Contains(r.stderr, shortLayer(d)+": already held\n") {
			t.Errorf("pull: stderr lacks a line for layer %s: %q", d, r.stderr)
		}
	}
	if !strings.Contains(r.stderr, "pulled "+ref2) || !strings.Contains(r.stderr, "0 layer(s) fetched (0B), 3 already held") {
		t.Errorf("pull: summary: %q", r.stderr)
	}

	// ls: both, the busybox layer shared.
	imgs := imageLs(t, env)
	if len(imgs) != 2 || imgs[0].Name != ref1 || imgs[1].Name != ref2 {
		t.Fatalf("ls: %+v", imgs)
	}
	for _, img := range imgs {
		if !strings.HasPrefix(img.Digest, "sha256:") || img.Platform == "" || img.SharedSize <= 0 || img.SharedSize >= img.Size {
			t.Errorf("ls: %+v", img)
		}
	}
	r = runCLI(t, nil, env, "image", "ls")
	r.want(t, exitOK)
	row := strings.Fields(strings.Split(r.stdout, "\n")[1])
	if len(row) < 6 || row[0] != ref1 || row[1] != orDash(shortImageID(imgs[0].Digest)) || row[2] != orDash(imgs[0].Platform) ||
		row[3] != humanBytes(imgs[0].Size) || row[4] != humanBytes(imgs[0].SharedSize) {
		t.Errorf("ls row %q of %+v", row, imgs[0])
	}

	// rm one; the other keeps the shared layer.
	runCLI(t, nil, env, "image", "rm", ref1).want(t, exitOK)
	if imgs := imageLs(t, env); len(imgs) != 1 || imgs[0].Name != ref2 || imgs[0].SharedSize != 0 {
		t.Errorf("after rm: %+v", imgs)
	}
	r = runCLI(t, nil, env, "image", "prune", "--json")
	r.want(t, exitOK)
	var pr sandbox.PruneResult
	if err := json.Unmarshal([]byte(r.stdout), &pr); err != nil || pr.Layers != 0 {
		t.Errorf("prune after rm (which removed the unused layers): %q %v", r.stdout, err)
	}
}

// TestImagePrune replaces an image while a session holds it: its own layer
// stays while held and goes with the last release, and prune then finds
// nothing left to remove.
func TestImagePrune(t *testing.T) {
	reg := startRegistry(t)
	state := t.TempDir()
	env := map[string]string{stateDirEnv: state, "TAI42_INSECURE_REGISTRY": reg.host}
	ref := reg.push(t, "tools/box:1", busyboxPlus(t, 1))
	runCLI(t, nil, env, "image", "pull", "-q", ref).want(t, exitOK)

	s, err := imagestore.Open(filepath.Join(state, imagestore.DirName))
	if err != nil {
		t.Fatal(err)
	}
	_, release, err := s.Acquire(ref)
	if err != nil {
		t.Fatal(err)
	}
	layers := func() int {
		ents, err := os.ReadDir(filepath.Join(state, imagestore.DirName, "layers"))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	// The tag moves to another image; the held version keeps its layer.
	reg.push(t, "tools/box:1", busyboxPlus(t, 1))
	runCLI(t, nil, env, "image", "pull", "-q", ref).want(t, exitOK)
	if n := layers(); n != 3 {
		t.Errorf("%d layers while the old version is held, want 3 (the base and both tops)", n)
	}
	release()
	if n := layers(); n != 2 {
		t.Errorf("%d layers after the last release, want 2: the replaced version's own layer goes with it", n)
	}

	r := runCLI(t, nil, env, "image", "prune")
	if r.stdout != "removed 0 layer(s), freed 0B\n" {
		t.Errorf("prune: %q", r.stdout)
	}
	if imgs := imageLs(t, env); len(imgs) != 1 || imgs[0].Layers != 2 {
		t.Errorf("prune touched the image: %+v", imgs)
	}
}

func TestImagePullErrors(t *testing.T) {
	reg := startRegistry(t)
	env := map[string]string{stateDirEnv: t.TempDir(), "TAI42_INSECURE_REGISTRY": reg.host}
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"Bad Ref"}, exitUsage, []string{"Bad Ref"}},
		{[]string{reg.host + "/no/such:1"}, exitFailure, []string{reg.host + "/no/such:1"}},
		{[]string{"x:1", "--platform", "linux"}, exitUsage, []string{"--platform", "OS/ARCH"}},
		{[]string{"x:1", "-q", "--json"}, exitUsage, []string{"--quiet or --json"}},
		{[]string{"x:1", "--insecure-registry", "http://h:5000"}, exitUsage, []string{"--insecure-registry", "HOST[:PORT]"}},
		{[]string{"x:1", "--registry-mirror", "https://user:hunter2@mirror.test"}, exitUsage, []string{"--registry-mirror", "docker config"}},
		{[]string{}, exitUsage, []string{"name the image to pull"}},
	} {
		r := runCLI(t, nil, env, append([]string{"image", "pull"}, c.args...)...)
		if r.code != c.code {
			t.Errorf("image pull %q: exit %d, want %d (stderr %q)", c.args, r.code, c.code, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("image pull %q: stderr %q lacks %q", c.args, r.stderr, w)
			}
		}
		if strings.Contains(r.stderr, "hunter2") {
			t.Errorf("image pull %q shows a credential: %q", c.args, r.stderr)
		}
	}
}

// imageSandbox is a daemon's sandbox that manages images: the host
// provider's sessions, the images of a local store.
type imageSandbox struct {
	*kit.Sandbox
	images imagestore.Manager
}

// The image calls are imageSandbox's own, whatever kit.Sandbox has.
func (s imageSandbox) PullImage(ctx context.Context, ref string, o sandbox.PullOptions) (sandbox.ImageInfo, error) {
	return s.images.PullImage(ctx, ref, o)
}
func (s imageSandbox) ListImages(ctx context.Context) ([]sandbox.ImageInfo, error) {
	return s.images.ListImages(ctx)
}
func (s imageSandbox) RemoveImage(ctx context.Context, name string) error {
	return s.images.RemoveImage(ctx, name)
}
func (s imageSandbox) PruneImages(ctx context.Context) (sandbox.PruneResult, error) {
	return s.images.PruneImages(ctx)
}

// startImageDaemon is startDaemon whose sandbox manages the images of the
// store in its state directory, pulling with reg.
func startImageDaemon(t *testing.T, reg imagestore.RegistryOptions) *daemon {
	t.Helper()
	dir := t.TempDir()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: defaultPolicy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := imagestore.Open(filepath.Join(dir, imagestore.DirName))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(imageSandbox{sb, imagestore.Manager{Store: s, Registry: reg}}, server.Options{Token: testToken, Provider: host.Name, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the sandbox: %v", err)
		}
	})
	return &daemon{url: ts.URL, stateDir: dir, env: map[string]string{urlEnv: ts.URL, tokenEnv: testToken}}
}

// TestImageRemote: with a daemon named, "tai42 image" pulls, lists,
// removes and prunes the daemon's images, with the daemon's registry
// settings; the local store's flags are refused.
func TestImageRemote(t *testing.T) {
	reg := startRegistry(t)
	ref := reg.push(t, "tools/box:1", busyboxPlus(t, 1))
	d := startImageDaemon(t, imagestore.RegistryOptions{Insecure: []string{reg.host}})
	local := t.TempDir()
	d.env[stateDirEnv] = local

	for _, args := range [][]string{
		{"image", "pull", "--state-dir", local, ref},
		{"image", "pull", "--insecure-registry", reg.host, ref},
		{"image", "ls", "--state-dir", local},
	} {
		r := d.cli(t, nil, args...)
		r.want(t, exitUsage)
		if !strings.Contains(r.stderr, "does not apply to a daemon") {
			t.Errorf("%q on a daemon: %q", args, r.stderr)
		}
	}

	r := d.cli(t, nil, "image", "pull", "--json", ref)
	r.want(t, exitOK)
	evs, info := pullJSON(t, r.stdout)
	if info.Name != ref || info.Layers != 2 || len(evs) == 0 || evs[len(evs)-1].Status != sandbox.PullComplete {
		t.Errorf("pull --json through the daemon: %+v %+v", evs, info)
	}
	imgs := imageLs(t, d.env)
	if len(imgs) != 1 || imgs[0].Name != ref || imgs[0].ID != info.ID {
		t.Errorf("ls on the daemon: %+v", imgs)
	}
	// The daemon's store, not the local one.
	if imgs := imageLs(t, map[string]string{stateDirEnv: local}); len(imgs) != 0 {
		t.Errorf("the daemon's pull reached the local store: %+v", imgs)
	}
	r = d.cli(t, nil, "image", "rm", ref, reg.host+"/tools/none:1")
	r.want(t, exitFailure)
	if !strings.Contains(r.stderr, "tools/none:1") {
		t.Errorf("rm of a missing image on the daemon: %q", r.stderr)
	}
	if imgs := imageLs(t, d.env); len(imgs) != 0 {
		t.Errorf("after rm on the daemon: %+v", imgs)
	}
	r = d.cli(t, nil, "image", "prune", "--json")
	r.want(t, exitOK)
	var pr sandbox.PruneResult
	if err := json.Unmarshal([]byte(r.stdout), &pr); err != nil {
		t.Errorf("prune --json on the daemon: %q %v", r.stdout, err)
	}
	r = d.cli(t, nil, "image", "pull", "Bad Ref")
	r.want(t, exitUsage)

	// A daemon without images (the host runner alone).
	plain := startDaemon(t)
	// It lists none (as a provider without workspaces lists none) and
	// refuses a pull, naming the provider.
	r = plain.cli(t, nil, "image", "ls", "-q")
	if r.code != exitOK || r.stdout != "" {
		t.Errorf("image ls on a daemon without images: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	r = plain.cli(t, nil, "image", "pull", "x:1")
	if r.code != exitFailure || !strings.Contains(r.stderr, "keeps no images") {
		t.Errorf("image pull on a daemon without images: exit %d, %q", r.code, r.stderr)
	}
}
