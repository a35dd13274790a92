package main

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/tai42/sandbox/internal/imagestore/registrytest"
)

// staticBinary is a static ELF executable for the push to carry: busybox
// where busybox-static is installed (the test's own binary may be
// dynamically linked), else a static tai42 built for it.
func staticBinary(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if checkStatic(p) == nil {
			return p
		}
	}
	return buildBinary(t)
}

// pushCLI runs "tai42 ARGS..." in-process with exe as the executable.
func pushCLI(t *testing.T, exe string, env map[string]string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	c := &cli{stdout: &out, stderr: &errb, lookupEnv: lookupFrom(env), exe: exe}
	return result{c.main(args), out.String(), errb.String()}
}

// TestAgentImagePush: the push reaches a loopback registry only as a pull
// would (plain HTTP and an untrusted certificate refused, saying to add
// --insecure-registry, allowed with it, from the flag or the variable),
// prints the reference pinned by digest, the same for the same binary,
// and the image is the agent image: one layer, /tai42 mode 0755 with the
// binary's bytes, Entrypoint ["/tai42"].
func TestAgentImagePush(t *testing.T) {
	bin := staticBinary(t)
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, useTLS := range []bool{false, true} {
		reg := registrytest.Start(t, registrytest.Options{TLS: useTLS})
		ref := reg.Ref("tai42/agent", "test")

		r := pushCLI(t, bin, nil, "agent-image", "push", ref)
		r.want(t, exitFailure)
		if !strings.Contains(r.stderr, "--insecure-registry "+reg.Host()) {
			t.Errorf("TLS %v: a push without --insecure-registry: %q; want it to say --insecure-registry %s", useTLS, r.stderr, reg.Host())
		}

		r = pushCLI(t, bin, nil, "agent-image", "push", ref, "--insecure-registry", reg.Host())
		r.want(t, exitOK)
		pinned := strings.TrimSpace(r.stdout)
		if !strings.HasPrefix(pinned, reg.Host()+"/tai42/agent@sha256:") || !strings.Contains(r.stderr, "pushed the agent image of "+bin) {
			t.Fatalf("TLS %v: push printed %q, stderr %q; want %s/tai42/agent@sha256:...", useTLS, r.stdout, r.stderr, reg.Host())
		}
		r = pushCLI(t, bin, map[string]string{"TAI42_INSECURE_REGISTRY": reg.Host()}, "agent-image", "push", reg.Ref("tai42/agent", "again"))
		r.want(t, exitOK)
		if again := strings.TrimSpace(r.stdout); again != pinned {
			t.Errorf("TLS %v: the same binary pushed twice: %s, then %s; want one digest", useTLS, pinned, again)
		}

		nr, err := name.ParseReference(pinned, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		tr := reg.Transport()
		t.Cleanup(tr.CloseIdleConnections)
		img, err := ggcrremote.Image(nr, ggcrremote.WithTransport(tr))
		if err != nil {
			t.Fatalf("pulling %s back: %v", pinned, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cf.Config.Entrypoint, []string{"/tai42"}) || cf.OS != "linux" {
			t.Errorf("config: entrypoint %q, os %q; want [/tai42], linux", cf.Config.Entrypoint, cf.OS)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("layers: %d, %v; want one", len(layers), err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr2 := tar.NewReader(rc)
		var found bool
		for {
			h, err := tr2.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Clean("/"+h.Name) != "/tai42" {
				t.Errorf("the layer holds %q besides /tai42", h.Name)
				continue
			}
			got, err := io.ReadAll(tr2)
			if err != nil {
				t.Fatal(err)
			}
			found = true
			if h.Mode&0o7777 != 0o755 || !bytes.Equal(got, want) {
				t.Errorf("/tai42: mode %o, %d bytes (equal %v); want 0755 and the binary's %d bytes", h.Mode, len(got), bytes.Equal(got, want), len(want))
			}
		}
		rc.Close()
		if !found {
			t.Error("the layer has no /tai42")
		}
	}
}

// TestAgentImagePushErrors: a bad reference or flag, and a binary that is
// not a static executable, are usage errors naming the cause; nothing is
// dialled for them.
func TestAgentImagePushErrors(t *testing.T) {
	bin := staticBinary(t)
	text := filepath.Join(t.TempDir(), "not-elf")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		exe  string
		env  map[string]string
		args []string
		msg  string
	}{
		"no ref":           {bin, nil, []string{"agent-image", "push"}, "name the reference"},
		"bad ref":          {bin, nil, []string{"agent-image", "push", "Reg/UPPER:x"}, "not an image reference"},
		"bad insecure":     {bin, nil, []string{"agent-image", "push", "127.0.0.1:1/a:b", "--insecure-registry", "h/p"}, "--insecure-registry"},
		"bad insecure env": {bin, map[string]string{"TAI42_INSECURE_REGISTRY": "h/p"}, []string{"agent-image", "push", "127.0.0.1:1/a:b"}, "--insecure-registry"},
		"dynamic":          {"/bin/sh", nil, []string{"agent-image", "push", "127.0.0.1:1/a:b"}, "CGO_ENABLED=0"},
		"not elf":          {text, nil, []string{"agent-image", "push", "127.0.0.1:1/a:b"}, "not an ELF executable"},
	} {
		if name == "dynamic" && checkStatic("/bin/sh") == nil {
			continue // a static /bin/sh: nothing to refuse
		}
		r := pushCLI(t, tc.exe, tc.env, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.msg) || r.stdout != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d saying %q", name, r.code, r.stdout, r.stderr, exitUsage, tc.msg)
		}
	}
}

// TestAgentImagePushCredentials: the push authenticates with the docker
// config's credentials (a registry behind the token flow); without them,
// or with a wrong password, the registry's refusal is the error (exit 1),
// and no password is shown.
func TestAgentImagePushCredentials(t *testing.T) {
	bin := staticBinary(t)
	reg := registrytest.Start(t, registrytest.Options{TLS: true, Token: true, Users: map[string]string{"pusher": "pw-right-123"}})
	insecure := []string{"--insecure-registry", reg.Host(), "--insecure-registry", reg.TokenHost()}
	for _, pw := range []string{"pw-wrong-456", "pw-right-123"} {
		dir := t.TempDir()
		t.Setenv("DOCKER_CONFIG", dir)
		t.Setenv("HOME", dir)
		auth := base64.StdEncoding.EncodeToString([]byte("pusher:" + pw))
		cfg := `{"auths": {"` + reg.Host() + `": {"auth": "` + auth + `"}}}`
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		r := pushCLI(t, bin, nil, append([]string{"agent-image", "push", reg.Ref("tai42/agent", "auth")}, insecure...)...)
		if strings.Contains(r.stderr+r.stdout, pw) {
			t.Errorf("the output shows the password: %q %q", r.stdout, r.stderr)
		}
		if pw == "pw-wrong-456" {
			if r.code != exitFailure || !strings.Contains(r.stderr, "pushing the agent image") {
				t.Errorf("a wrong password: exit %d, stderr %q; want 1, the registry's refusal", r.code, r.stderr)
			}
			continue
		}
		r.want(t, exitOK)
		if !strings.HasPrefix(r.stdout, reg.Host()+"/tai42/agent@sha256:") {
			t.Errorf("push printed %q", r.stdout)
		}
	}
}
