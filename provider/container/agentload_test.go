package container

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
)

// TestLoadAgentStatic: a static binary runs as it is, with no bind.
func TestLoadAgentStatic(t *testing.T) {
	if _, err := os.Stat(imagestoretest.Busybox); err != nil {
		t.Skipf("no static busybox at %s (apt-get install -y busybox-static)", imagestoretest.Busybox)
	}
	a, err := loadAgent(imagestoretest.Busybox)
	if err != nil {
		t.Fatal(err)
	}
	if a.loader != "" || len(a.libs) != 0 {
		t.Errorf("a static binary got loader %q and libraries %v", a.loader, a.libs)
	}
	if got := a.args(); !slices.Equal(got, []string{agentPath, "agent", "--listen-fd", "3"}) {
		t.Errorf("a static agent's command line: %q", got)
	}
	s := buildSpec(specInput{agent: a, rootfs: "/r", workspace: "/w", netns: "/n"})
	for _, m := range s.Mounts {
		if strings.HasPrefix(m.Destination, agentLibDir) {
			t.Errorf("a static agent's session binds %s", m.Destination)
		}
	}
}

// TestLoadAgentDynamic: a dynamically linked binary of the host (its
// sh) gets its loader and libc, as the host's loader resolves them, and
// runs through the loader.
func TestLoadAgentDynamic(t *testing.T) {
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Skip(err)
	}
	f, err := elf.Open(sh)
	if err != nil {
		t.Skip(err)
	}
	interp, _ := interpOf(f)
	needed, _ := f.ImportedLibraries()
	f.Close()
	if interp == "" {
		t.Skipf("%s is static", sh)
	}
	a, err := loadAgent(sh)
	if err != nil {
		t.Fatal(err)
	}
	loaderName := filepath.Base(interp)
	if a.loader != agentLibDir+"/"+loaderName {
		t.Errorf("loader %q, want %s/%s", a.loader, agentLibDir, loaderName)
	}
	want := []string{a.loader, "--library-path", agentLibDir, agentPath, "agent", "--listen-fd", "3"}
	if got := a.args(); !slices.Equal(got, want) {
		t.Errorf("command line %q, want %q", got, want)
	}
	bound := map[string]string{}
	for _, b := range a.libs {
		bound[b.dest] = b.source
	}
	realInterp, _ := filepath.EvalSymlinks(interp)
	if bound[a.loader] != realInterp {
		t.Errorf("the loader is bound from %q, want %s", bound[a.loader], realInterp)
	}
	// What the host's loader maps for sh is what is bound.
	for _, n := range needed {
		src, ok := bound[agentLibDir+"/"+n]
		if !ok {
			t.Errorf("%s needs %s, not bound (%v)", sh, n, a.libs)
			continue
		}
		if fi, err := os.Stat(src); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s is bound from %s, not a regular file: %v", n, src, err)
		}
	}
	s := buildSpec(specInput{agent: a, rootfs: "/r", workspace: "/w", netns: "/n"})
	if !slices.Equal(s.Process.Args, want) {
		t.Errorf("the spec's command line %q", s.Process.Args)
	}
	for _, kv := range s.Process.Env {
		if strings.HasPrefix(kv, "LD_") {
			t.Errorf("PID 1's environment holds %s", kv)
		}
	}
	n := 0
	for _, m := range s.Mounts {
		if strings.HasPrefix(m.Destination, agentLibDir+"/") {
			n++
			if !slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "noexec") {
				t.Errorf("%s bound with %v: want read-only, executable", m.Destination, m.Options)
			}
		}
	}
	if n != len(a.libs) {
		t.Errorf("%d binds under %s, want %d", n, agentLibDir, len(a.libs))
	}
}

// TestLoadAgentRunpath: a library found through the binary's DT_RUNPATH
// ($ORIGIN), and a library that library needs, are bound; a library found
// nowhere fails, naming it and who needs it.
func TestLoadAgentRunpath(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no C compiler (apt-get install -y gcc)")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "lib")
	if err := os.Mkdir(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gcc := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	gcc("-shared", "-fPIC", "-o", filepath.Join(lib, "libtai42b.so"), write("b.c", "int b(void){return 1;}\n"))
	gcc("-shared", "-fPIC", "-o", filepath.Join(lib, "libtai42a.so"), write("a.c", "int b(void); int a(void){return b();}\n"),
		"-L"+lib, "-ltai42b", "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")
	exe := filepath.Join(dir, "exe")
	gcc("-o", exe, write("main.c", "int a(void); int main(void){return a();}\n"),
		"-L"+lib, "-ltai42a", "-Wl,-rpath,$ORIGIN/lib", "-Wl,--enable-new-dtags")
	if out, err := exec.Command(exe).CombinedOutput(); err != nil && !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("the test binary does not run: %v\n%s", err, out)
	}

	a, err := loadAgent(exe)
	if err != nil {
		t.Fatal(err)
	}
	bound := map[string]string{}
	for _, b := range a.libs {
		bound[filepath.Base(b.dest)] = b.source
	}
	for _, name := range []string{"libtai42a.so", "libtai42b.so"} {
		if bound[name] != filepath.Join(lib, name) {
			t.Errorf("%s bound from %q, want %s (all: %v)", name, bound[name], filepath.Join(lib, name), bound)
		}
	}
	if _, ok := bound["libc.so.6"]; !ok {
		t.Errorf("libc not bound: %v", bound)
	}

	if err := os.Remove(filepath.Join(lib, "libtai42b.so")); err != nil {
		t.Fatal(err)
	}
	_, err = loadAgent(exe)
	if err == nil || !strings.Contains(err.Error(), "libtai42b.so") || !strings.Contains(err.Error(), filepath.Join(lib, "libtai42a.so")+" needs") {
		t.Errorf("a missing library: %v, want an error naming libtai42b.so and the library that needs it", err)
	}
}

// TestLoadAgentNotELF: a file that is not an ELF executable is refused.
func TestLoadAgentNotELF(t *testing.T) {
	p := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := loadAgent(p); err == nil || !strings.Contains(err.Error(), "not an ELF executable") {
		t.Errorf("loadAgent of a script: %v", err)
	}
}

// TestLdConfDirs: the directories of an ld.so.conf, its includes
// followed in order, comments and hwcap lines skipped.
func TestLdConfDirs(t *testing.T) {
	dir := t.TempDir()
	d := filepath.Join(dir, "conf.d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(dir, "ld.so.conf"): "/first # a comment\ninclude conf.d/*.conf\nhwcap 0 nosegneg\n/last\n",
		filepath.Join(d, "b.conf"):       "/b1:/b2\n",
		filepath.Join(d, "a.conf"):       "# only a comment\n/a\ninclude " + filepath.Join(dir, "ld.so.conf") + "\n",
		filepath.Join(d, "c.txt"):        "/not-a-conf\n",
	}
	for name, s := range files {
		if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := ldConfDirs(filepath.Join(dir, "ld.so.conf"))
	if want := []string{"/first", "/a", "/b1", "/b2", "/last"}; !slices.Equal(got, want) {
		t.Errorf("ldConfDirs = %q, want %q", got, want)
	}
}
