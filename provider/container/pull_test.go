package container_test

// The tests of pulls: on create, by the pull policy, and through the
// provider's sandbox.ImageManager, against go-containerregistry's
// in-process registry on 127.0.0.1 (the end-to-end tests against a real
// registry are elsewhere).

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// memRegistry is an in-process registry on 127.0.0.1 that counts the
// manifest requests it serves, and may demand basic auth.
type memRegistry struct {
	host      string
	manifests atomic.Int64 // GETs of manifests
	delay     time.Duration
	user      string // "": no auth
	pass      string
}

// newMemRegistry starts a registry, stopped at the end of t; user and
// pass, when set, are the only credentials it takes.
func newMemRegistry(t *testing.T, user, pass string) *memRegistry {
	t.Helper()
	r := &memRegistry{user: user, pass: pass}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.user != "" {
			if u, p, ok := req.BasicAuth(); !ok || u != r.user || p != r.pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="tai42 test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
		}
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/manifests/") {
			r.manifests.Add(1)
			time.Sleep(r.delay)
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// push writes img to the registry as repo:tag and returns the reference.
func (r *memRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repo
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	var opts []remote.Option
	if r.user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.user, Password: r.pass}))
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	r.manifests.Store(0)
	return ref
}

// memTarLayer is a layer of files (path -> content; content "" with a path
// ending in '/' is a directory).
func memTarLayer(t *testing.T, files ...[2]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg, ModTime: time.Unix(1, 0)}
		if strings.HasSuffix(f[0], "/") {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return tarLayer(t, buf.Bytes())
}

// tarLayer is the uncompressed tar b as a layer, held in memory.
func tarLayer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// memLayeredImage is busybox and two layers, the OCI way: the second deletes
// a file of the first (a .wh. whiteout) and makes a directory opaque.
func memLayeredImage(t *testing.T, cfg func(*v1.Config)) v1.Image {
	t.Helper()
	base, err := imagestoretest.BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base,
		memTarLayer(t, [2]string{"etc/layer1", "one"}, [2]string{"etc/gone", "deleted above"}, [2]string{"opt/", ""}, [2]string{"opt/opq/", ""}, [2]string{"opt/opq/old", "hidden above"}),
		memTarLayer(t, [2]string{"etc/layer2", "two"}, [2]string{"etc/.wh.gone", ""}, [2]string{"opt/opq/", ""}, [2]string{"opt/opq/.wh..wh..opq", ""}, [2]string{"opt/opq/new", "new"}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cf.Config.DeepCopy()
		cfg(c)
		if img, err = mutate.Config(img, *c); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

// pulledView is what a session of memLayeredImage shows of its layers.
const (
	pulledScript = `cat /etc/layer1 /etc/layer2; echo; ls -a /etc | grep -c gone; ls /opt/opq`
	pulledWant   = "onetwo\n0\nnew\n"
)

// pullLogs is a logger's output, safe for concurrent writes.
type pullLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *pullLogs) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *pullLogs) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// pullProvider makes a provider (runc, no user namespace) with a store of
// its own, pull policy pull, the registry reg reached over plain HTTP, and
// its log in the returned buffer.
func pullProvider(t *testing.T, pull container.PullPolicy, reg *memRegistry) (*testProvider, *pullLogs) {
	t.Helper()
	logs := &pullLogs{}
	p := newProviderMode(t, "runc", container.UserNamespaceOff, func(o *container.Options) {
		o.Images = t.TempDir()
		o.Pull = pull
		o.Registry.Insecure = []string{reg.host}
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	return p, logs
}

// pullLines are the log's lines about pulls.
func pullLines(logs *pullLogs) []string {
	var out []string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "image pull") {
			out = append(out, line)
		}
	}
	return out
}

// TestPullOnCreate: under the default policy (missing), the first create
// of an image the store lacks pulls it, once, and the session sees its
// three layers applied (whiteout, opaque directory); the next create pulls
// nothing; the pull is one log line naming the reference and its digest.
func TestPullOnCreate(t *testing.T) {
	reg := newMemRegistry(t, "", "")
	ref := reg.push(t, "layered:v1", memLayeredImage(t, nil))
	p, logs := pullProvider(t, "", reg)
	for i := range 2 {
		sess := p.session(t, spec(ref, sandbox.NetworkNone))
		if out := mustSh(t, sess, pulledScript); out != pulledWant {
			t.Errorf("create %d: the pulled image's root shows %q; want %q", i, out, pulledWant)
		}
		if n := reg.manifests.Load(); n != 1 {
			t.Errorf("after create %d: %d manifest GETs; want 1 (one pull, on the first)", i, n)
		}
	}
	lines := pullLines(logs)
	if len(lines) != 1 || !strings.Contains(lines[0], "ref="+ref) || !strings.Contains(lines[0], "digest=") || !strings.Contains(lines[0], "duration=") {
		t.Errorf("the log's pull lines: %q; want one naming ref %s, its digest and duration", lines, ref)
	}
	imgs, err := providerImages(t, p).ListImages(ctxFor(t))
	if err != nil || len(imgs) != 1 || imgs[0].Name != ref || imgs[0].ID == "" || imgs[0].Layers < 1 {
		t.Errorf("ListImages: %+v, %v; want the one image %s", imgs, err, ref)
	}
}

// TestPullNever: under policy never, a create of an image the store lacks
// is a SpecRejectedError naming the image and the policy, and nothing is
// asked of the registry.
func TestPullNever(t *testing.T) {
	reg := newMemRegistry(t, "", "")
	ref := reg.push(t, "layered:v1", memLayeredImage(t, nil))
	p, _ := pullProvider(t, container.PullNever, reg)
	_, err := p.sb.CreateSession(ctxFor(t), spec(ref, sandbox.NetworkNone))
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Field != "image" || !strings.Contains(rej.Message, ref) || !strings.Contains(rej.Message, "never") {
		t.Errorf("create under pull policy never: %v; want a SpecRejectedError of field image naming %s and the policy", err, ref)
	}
	if n := reg.manifests.Load(); n != 0 {
		t.Errorf("%d manifest GETs under pull policy never; want none", n)
	}
}

// TestPullAlways: under policy always, every create asks the registry
// again (one manifest GET each), and a new push under the tag is what the
// next session runs.
func TestPullAlways(t *testing.T) {
	reg := newMemRegistry(t, "", "")
	ref := reg.push(t, "layered:v1", memLayeredImage(t, nil))
	p, logs := pullProvider(t, container.PullAlways, reg)
	for i := range 2 {
		sess := p.session(t, spec(ref, sandbox.NetworkNone))
		mustSh(t, sess, "true")
		if n := reg.manifests.Load(); n != int64(i+1) {
			t.Errorf("after create %d: %d manifest GETs; want %d (one per create)", i, n, i+1)
		}
	}
	reg.push(t, "layered:v1", memLayeredImage(t, func(c *v1.Config) { c.Env = append(c.Env, "TAI42_VERSION=2") }))
	sess := p.session(t, spec(ref, sandbox.NetworkNone))
	if out := mustSh(t, sess, `echo "$TAI42_VERSION"`); out != "2\n" {
		t.Errorf("a create after a new push of the tag runs env TAI42_VERSION=%q; want the new image's 2", out)
	}
	if lines := pullLines(logs); len(lines) != 3 {
		t.Errorf("%d pull lines in the log for 3 creates: %q", len(lines), lines)
	}
}

// TestPullShared: concurrent creates of one missing image share one pull.
func TestPullShared(t *testing.T) {
	reg := newMemRegistry(t, "", "")
	ref := reg.push(t, "layered:v1", memLayeredImage(t, nil))
	reg.delay = 300 * time.Millisecond // the creates all come while it is pulled
	p, logs := pullProvider(t, "", reg)
	const n = 4
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			sess, err := p.sb.CreateSession(ctxFor(t), spec(ref, sandbox.NetworkNone))
			if err == nil {
				err = sess.Destroy(ctxFor(t))
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("create %d: %v", i, err)
		}
	}
	if got := reg.manifests.Load(); got != 1 {
		t.Errorf("%d concurrent creates made %d manifest GETs; want 1 (one shared pull)", n, got)
	}
	if lines := pullLines(logs); len(lines) != 1 {
		t.Errorf("%d pull lines in the log: %q; want 1", len(lines), lines)
	}
}

// TestPullFails: a create whose pull fails (no such repository; refused
// credentials) is a SpecRejectedError of field image naming the reference
// and the registry's answer; the credential is in no error and no log line.
func TestPullFails(t *testing.T) {
	const secret = "Tai42-Distinctive-s3cret"
	reg := newMemRegistry(t, "tai42", "the-right-one")
	ref := reg.push(t, "layered:v1", memLayeredImage(t, nil))
	pullDockerConfig(t, reg.host, "tai42", secret)
	p, logs := pullProvider(t, "", reg)
	for _, c := range []struct {
		name, ref, answer string
		reason            sandbox.PullReason
	}{
		{"refused credentials", ref, "UNAUTHORIZED", sandbox.PullUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := p.sb.CreateSession(ctxFor(t), spec(c.ref, sandbox.NetworkNone))
			var rej *sandbox.SpecRejectedError
			if !errors.As(err, &rej) || rej.Field != "image" || rej.Reason != sandbox.ReasonUnenforceable || !strings.Contains(rej.Message, c.ref) || !strings.Contains(rej.Message, c.answer) {
				t.Errorf("create: %v; want a SpecRejectedError of field image naming %s and %q", err, c.ref, c.answer)
			}
			_, err = providerImages(t, p).PullImage(ctxFor(t), c.ref, sandbox.PullOptions{})
			var perr *sandbox.ImagePullError
			if !errors.As(err, &perr) || perr.Reason != c.reason || perr.Ref != c.ref {
				t.Errorf("PullImage: %v; want an ImagePullError of reason %s", err, c.reason)
			}
			for _, s := range []string{secret, base64.StdEncoding.EncodeToString([]byte("tai42:" + secret))} {
				if strings.Contains(fmt.Sprint(err), s) || strings.Contains(logs.String(), s) {
					t.Errorf("the credential %q is in an error or the log", s)
				}
			}
		})
	}
	// The same registry with the right credentials: an unknown repository.
	pullDockerConfig(t, reg.host, "tai42", "the-right-one")
	missing := reg.host + "/nothing-here:v1"
	_, err := p.sb.CreateSession(ctxFor(t), spec(missing, sandbox.NetworkNone))
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Field != "image" || !strings.Contains(rej.Message, missing) || !strings.Contains(rej.Message, "NAME_UNKNOWN") {
		t.Errorf("create of a missing repository: %v; want a SpecRejectedError naming %s and the registry's NAME_UNKNOWN", err, missing)
	}
	t.Logf("a create of a missing repository: %v", err)
	_, err = providerImages(t, p).PullImage(ctxFor(t), missing, sandbox.PullOptions{})
	var perr *sandbox.ImagePullError
	if !errors.As(err, &perr) || perr.Reason != sandbox.PullNotFound {
		t.Errorf("PullImage of a missing repository: %v; want reason %s", err, sandbox.PullNotFound)
	}
	sess := p.session(t, spec(ref, sandbox.NetworkNone))
	if out := mustSh(t, sess, pulledScript); out != pulledWant {
		t.Errorf("with the right credentials the image shows %q; want %q", out, pulledWant)
	}
}

// TestPullUnreachable: a create whose registry is gone is a
// SpecRejectedError naming the reference and saying the registry could
// not be reached; PullImage's reason is unreachable.
func TestPullUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	gone := strings.TrimPrefix(srv.URL, "http://")
	ref := gone + "/gone:v1"
	srv.Close()
	p := newProviderMode(t, "runc", container.UserNamespaceOff, func(o *container.Options) {
		o.Images = t.TempDir()
		o.Pull = container.PullMissing
		o.Registry.Registries = []string{gone} // on loopback: reached only when listed
	})
	_, err := p.sb.CreateSession(ctxFor(t), spec(ref, sandbox.NetworkNone))
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Field != "image" || !strings.Contains(rej.Message, ref) || !strings.Contains(rej.Message, "could not be reached") {
		t.Errorf("create of an image of a registry that is gone: %v; want a SpecRejectedError naming %s and saying it could not be reached", err, ref)
	}
	_, err = providerImages(t, p).PullImage(ctxFor(t), ref, sandbox.PullOptions{})
	var perr *sandbox.ImagePullError
	if !errors.As(err, &perr) || perr.Reason != sandbox.PullUnreachable {
		t.Errorf("PullImage from a registry that is gone: %v; want reason %s", err, sandbox.PullUnreachable)
	}
}

// pullDockerConfig points $DOCKER_CONFIG, for t, at a config giving user and
// pass for host.
func pullDockerConfig(t *testing.T, host, user, pass string) {
	t.Helper()
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, auth)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}

// providerImages is p's sandbox.ImageManager: the provider's own.
func providerImages(t *testing.T, p *testProvider) sandbox.ImageManager {
	t.Helper()
	im, ok := p.sb.Provider().(sandbox.ImageManager)
	if !ok {
		t.Fatal("the container provider is not a sandbox.ImageManager")
	}
	return im
}

// TestImageManager: PullImage, ListImages and RemoveImage on the provider:
// an image a live session uses is refused removal with a SandboxError
// saying so, removed once it ends; a name not held is an
// ImageNotFoundError; an invalid reference is reason invalid_reference.
func TestImageManager(t *testing.T) {
	reg := newMemRegistry(t, "", "")
	ref := reg.push(t, "layered:v1", memLayeredImage(t, nil))
	p, logs := pullProvider(t, container.PullNever, reg)
	im := providerImages(t, p)
	info, err := im.PullImage(ctxFor(t), ref, sandbox.PullOptions{})
	if err != nil || info.Name != ref || !strings.HasPrefix(info.ID, "sha256:") || info.Layers < 1 {
		t.Fatalf("PullImage: %+v, %v", info, err)
	}
	if lines := pullLines(logs); len(lines) != 1 || !strings.Contains(lines[0], "for=pull") {
		t.Errorf("the log's pull lines: %q; want one, of a pull", lines)
	}
	imgs, err := im.ListImages(ctxFor(t))
	if err != nil || len(imgs) != 1 || imgs[0].ID != info.ID {
		t.Errorf("ListImages: %+v, %v; want [%+v]", imgs, err, info)
	}
	sess := p.session(t, spec(ref, sandbox.NetworkNone))
	err = im.RemoveImage(ctxFor(t), ref)
	var serr *sandbox.SandboxError
	if !errors.As(err, &serr) || errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), "live session") {
		t.Errorf("RemoveImage of an image a session uses: %v; want a SandboxError saying a live session uses it", err)
	}
	if err := sess.Destroy(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if err := im.RemoveImage(ctxFor(t), ref); err != nil {
		t.Errorf("RemoveImage once the session ended: %v", err)
	}
	err = im.RemoveImage(ctxFor(t), ref)
	var nf *sandbox.ImageNotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, sandbox.ErrImageNotFound) || nf.Name != ref {
		t.Errorf("RemoveImage of a removed image: %v; want an ImageNotFoundError of %s", err, ref)
	}
	if imgs, err := im.ListImages(ctxFor(t)); err != nil || len(imgs) != 0 {
		t.Errorf("ListImages after the remove: %+v, %v; want none", imgs, err)
	}
	_, err = im.PullImage(ctxFor(t), "Not A/Reference::", sandbox.PullOptions{})
	var perr *sandbox.ImagePullError
	if !errors.As(err, &perr) || perr.Reason != sandbox.PullInvalidReference {
		t.Errorf("PullImage of an invalid reference: %v; want reason %s", err, sandbox.PullInvalidReference)
	}
}

// TestImageConfig: the image's User is the user of an exec that names
// none (an exec naming one runs as it), its WorkingDir changes nothing
// (an exec starts in the workspace, as the contract has it), and its
// Entrypoint and Cmd are not run (the agent is PID 1). An image whose User
// no exec could take is refused at create, naming it.
func TestImageConfig(t *testing.T) {
	reg := newMemRegistry(t, "", "")
	ref := reg.push(t, "configured:v1", memLayeredImage(t, func(c *v1.Config) {
		c.User, c.WorkingDir = "1000", "/opt"
		c.Entrypoint, c.Cmd = []string{"/bin/sh", "-c"}, []string{"echo ran > /etc/entrypoint-ran"}
	}))
	bad := reg.push(t, "baduser:v1", memLayeredImage(t, func(c *v1.Config) { c.User = "app:staff" }))
	p, _ := pullProvider(t, "", reg)
	sess := p.session(t, spec(ref, sandbox.NetworkNone))
	if out := mustSh(t, sess, `id -u; pwd; test -e /etc/entrypoint-ran && echo ran; cat /proc/1/cmdline | tr '\0' ' '`); !strings.HasPrefix(out, "1000\n/workspace\n") || strings.Contains(out, "ran\n") || strings.Contains(out, "echo") {
		t.Errorf("an exec of an image of User 1000, WorkingDir /opt: %q; want uid 1000 in /workspace, and the entrypoint not run", out)
	}
	res, err := sess.Exec(ctxFor(t), []string{"id", "-u"}, sandbox.ExecOptions{Timeout: execTimeout, User: "root"})
	if err != nil || res.Stdout != "0\n" {
		t.Errorf("an exec as root of that image: %+v, %v; want uid 0", res, err)
	}
	_, err = p.sb.CreateSession(ctxFor(t), spec(bad, sandbox.NetworkNone))
	var rej *sandbox.SpecRejectedError
	if !errors.As(err, &rej) || rej.Field != "image" || !strings.Contains(rej.Message, "app:staff") {
		t.Errorf("create of an image of User app:staff: %v; want a SpecRejectedError naming it", err)
	}
}

// TestPullPolicyInvalid: New refuses a pull policy it does not know.
func TestPullPolicyInvalid(t *testing.T) {
	opts := containertest.Options(t, "runc", permissive)
	opts.Pull = "sometimes"
	if _, err := container.New(opts); err == nil || !strings.Contains(err.Error(), `"sometimes"`) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("New with pull policy sometimes: %v; want an error naming it and the policies", err)
	}
}

// TestPullOutlivesCreate: a create that gives up (its context ends) while
// its image is pulled fails with its context's error, not a rejection of
// its spec, and the pull goes on: the image lands in the store.
func TestPullOutlivesCreate(t *testing.T) {
	reg := newMemRegistry(t, "", "")
	ref := reg.push(t, "layered:v1", memLayeredImage(t, nil))
	reg.delay = time.Second
	p, _ := pullProvider(t, "", reg)
	ctx, cancel := context.WithTimeout(ctxFor(t), 200*time.Millisecond)
	defer cancel()
	_, err := p.sb.CreateSession(ctx, spec(ref, sandbox.NetworkNone))
	var rej *sandbox.SpecRejectedError
	if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &rej) {
		t.Errorf("a create whose context ends during its pull: %v; want its context's error, not a SpecRejectedError", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		imgs, err := providerImages(t, p).ListImages(ctxFor(t))
		if err == nil && len(imgs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pull the create began did not finish: %+v, %v", imgs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sess := p.session(t, spec(ref, sandbox.NetworkNone))
	if out := mustSh(t, sess, pulledScript); out != pulledWant {
		t.Errorf("the image the pull got shows %q; want %q", out, pulledWant)
	}
	if n := reg.manifests.Load(); n != 1 {
		t.Errorf("%d manifest GETs; want the one pull's", n)
	}
}
