package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
)

// imageLs runs "tai42 image ls --json" and decodes it.
func imageLs(t *testing.T, env map[string]string) []sandbox.ImageInfo {
	t.Helper()
	r := runCLI(t, nil, env, "image", "ls", "--json")
	r.want(t, exitOK)
	var imgs []sandbox.ImageInfo
	if err := json.Unmarshal([]byte(r.stdout), &imgs); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, r.stdout)
	}
	return imgs
}

func TestImageEndToEnd(t *testing.T) {
	state := t.TempDir()
	env := map[string]string{stateDirEnv: state}
	layout := imagestoretest.BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "busybox:test")
	saved := imagestoretest.BusyboxDockerSave(t, filepath.Join(t.TempDir(), "busybox.tar"), "busybox:saved")

	// An empty store.
	if r := runCLI(t, nil, env, "image", "ls", "--json"); r.code != exitOK || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("ls --json of an empty store: %d %q %q", r.code, r.stdout, r.stderr)
	}

	// Import an OCI layout under its own name.
	r := runCLI(t, nil, env, "image", "import", layout)
	r.want(t, exitOK)
	if r.stdout != "busybox:test\n" || r.stderr != "" {
		t.Errorf("import: stdout %q stderr %q", r.stdout, r.stderr)
	}
	// A docker save tarball under another name, with --state-dir instead
	// of the environment.
	r = runCLI(t, nil, nil, "image", "import", "--state-dir", state, saved, "--name", "tools/box:1", "--json")
	r.want(t, exitOK)
	var imported sandbox.ImageInfo
	if err := json.Unmarshal([]byte(r.stdout), &imported); err != nil || imported.Name != "tools/box:1" {
		t.Fatalf("import --json: %v %q", err, r.stdout)
	}

	imgs := imageLs(t, env)
	if len(imgs) != 2 || imgs[0].Name != "busybox:test" || imgs[1].Name != "tools/box:1" {
		t.Fatalf("ls: %+v", imgs)
	}
	for _, img := range imgs {
		if !strings.HasPrefix(img.ID, "sha256:") || img.Size < 1<<20 || time.Since(img.Pulled) > time.Minute || img.Layers != 1 {
			t.Errorf("image %+v", img)
		}
	}
	// The JSON holds the contract's fields and never the config's Env.
	r = runCLI(t, nil, env, "image", "ls", "--json")
	var raw []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil || len(raw) != 2 {
		t.Fatalf("ls --json: %v %q", err, r.stdout)
	}
	for _, k := range []string{"name", "id", "platform", "size", "shared_size", "layers", "pulled"} {
		if _, ok := raw[0][k]; !ok {
			t.Errorf("ls --json lacks %q: %v", k, raw[0])
		}
	}
	if strings.Contains(strings.ToLower(r.stdout), "env") || strings.Contains(r.stdout, imagestoretest.Path) {
		t.Errorf("ls --json shows the image's environment: %s", r.stdout)
	}

	// The table shows the size.
	r = runCLI(t, nil, env, "image", "ls")
	r.want(t, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "NAME DIGEST PLATFORM SIZE SHARED PULLED" {
		t.Fatalf("ls table:\n%s", r.stdout)
	}
	// An import has no manifest digest of its own: "-".
	if f := strings.Fields(lines[1]); len(f) < 6 || f[0] != "busybox:test" || f[1] != "-" || f[2] != orDash(imgs[0].Platform) ||
		f[3] != humanBytes(imgs[0].Size) || !strings.HasSuffix(f[3], "MB") || f[4] != humanBytes(imgs[0].SharedSize) || !strings.HasSuffix(lines[1], "ago") && !strings.HasSuffix(lines[1], "now") {
		t.Errorf("ls row %q", lines[1])
	}
	r = runCLI(t, nil, env, "image", "ls", "-q")
	if r.stdout != "busybox:test\ntools/box:1\n" {
		t.Errorf("ls -q: %q", r.stdout)
	}

	// Importing a name again replaces the image.
	r = runCLI(t, nil, env, "image", "import", saved, "--name", "busybox:test")
	r.want(t, exitOK)
	again := imageLs(t, env)
	if len(again) != 2 || again[0].Name != "busybox:test" || !again[0].Pulled.After(imgs[0].Pulled) {
		t.Fatalf("after a second import: %+v", again)
	}

	// rm; rm of a missing name.
	runCLI(t, nil, env, "image", "rm", "busybox:test").want(t, exitOK)
	if imgs := imageLs(t, env); len(imgs) != 1 || imgs[0].Name != "tools/box:1" {
		t.Errorf("after rm: %+v", imgs)
	}
	r = runCLI(t, nil, env, "image", "rm", "busybox:test", "tools/box:1")
	r.want(t, exitFailure)
	if !strings.Contains(r.stderr, "busybox:test is not in the image store") {
		t.Errorf("rm of a missing image: stderr %q", r.stderr)
	}
	if imgs := imageLs(t, env); len(imgs) != 0 {
		t.Errorf("rm stopped at the missing name: %+v", imgs)
	}
	r = runCLI(t, nil, env, "image", "rm", "host")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "reserved") {
		t.Errorf("rm host: %q", r.stderr)
	}
}

func TestImageErrors(t *testing.T) {
	state := t.TempDir()
	env := map[string]string{stateDirEnv: state}
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if err := os.WriteFile(bad, []byte("this is no image"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.tar")
	layout := imagestoretest.BusyboxLayout(t, filepath.Join(t.TempDir(), "oci"), "")
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"import", bad}, exitUsage, []string{bad, "neither an OCI image layout directory nor a tar archive"}},
		{[]string{"import", missing}, exitUsage, []string{missing, "no such file"}},
		{[]string{"import", layout}, exitUsage, []string{layout, "has no name of its own: give it a name (with --name NAME)"}},
		{[]string{"import", layout, "--name", "host"}, exitUsage, []string{"reserved"}},
		{[]string{"import", layout, "--name", "Bad Name"}, exitUsage, []string{`invalid image name "Bad Name"`}},
		{[]string{"import"}, exitUsage, []string{"name the file to import"}},
		{[]string{"rm"}, exitUsage, []string{"name the images to remove"}},
		{[]string{"ls", "extra"}, exitUsage, []string{"unknown command"}},
		{[]string{"frobnicate"}, exitUsage, []string{`unknown command "frobnicate"`}},
	} {
		r := runCLI(t, nil, env, append([]string{"image"}, c.args...)...)
		if r.code != c.code {
			t.Errorf("image %q: exit %d, want %d (stderr %q)", c.args, r.code, c.code, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("image %q: stderr %q lacks %q", c.args, r.stderr, w)
			}
		}
	}
	if imgs := imageLs(t, env); len(imgs) != 0 {
		t.Errorf("failed imports left images: %+v", imgs)
	}
	ents, err := os.ReadDir(filepath.Join(state, imagestore.DirName, "tmp"))
	if err != nil || len(ents) != 0 {
		t.Errorf("failed imports left %d entries in tmp (%v)", len(ents), err)
	}

	// No state directory to be found.
	r := runCLI(t, nil, nil, "image", "ls")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "cannot find a state directory") {
		t.Errorf("no state dir: %q", r.stderr)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0B", 999: "999B", 1000: "1.00kB", 2027520: "2.03MB", 43_210_000: "43.2MB", 999_499_999: "999MB", 1_070_000_000: "1.07GB",
	} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
	if got := shortImageID("sha256:" + strings.Repeat("ab", 32)); got != "sha256:abababababab" {
		t.Errorf("shortImageID: %q", got)
	}
}
