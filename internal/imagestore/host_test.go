package imagestore

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// forbiddenEtc are /etc entries the skeleton must never hold.
var forbiddenEtc = []string{
	"shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssh", "machine-id",
	"ssl/private", "subuid", "subgid", "hostname", "pip.conf", "npmrc", "gitconfig", "wgetrc", "netrc",
	"passwd-", "group-", "security", "pam.d",
}

// skeletonTop are the names the skeleton's top level may hold beside the
// host's top-level entries of hostTopDirs.
var skeletonTop = []string{"usr", "etc", "proc", "sys", "dev", "run", "tmp", "workspace", "root"}

func TestBuildHostReal(t *testing.T) {
	dir := t.TempDir()
	h, err := BuildHost(dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(h.Rootfs) != dir || strings.Contains(h.Rootfs, ":") {
		t.Errorf("rootfs %s, want a directory of %s without ':'", h.Rootfs, dir)
	}
	checkSkeleton(t, "/", h)

	// Idempotent and fast when current.
	fi1, _ := os.Stat(h.Rootfs)
	start := time.Now()
	h2, err := BuildHost(dir)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	fi2, _ := os.Stat(h.Rootfs)
	if h2.Rootfs != h.Rootfs || !os.SameFile(fi1, fi2) || !fi1.ModTime().Equal(fi2.ModTime()) {
		t.Errorf("a second BuildHost rebuilt: %s -> %s", h.Rootfs, h2.Rootfs)
	}
	t.Logf("BuildHost when current: %v", took)
	if took > time.Second {
		t.Errorf("BuildHost when current took %v", took)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("dir holds %d entries, want the skeleton alone", len(ents))
	}
}

// checkSkeleton checks h against the host at hostRoot: nothing forbidden,
// every allowlisted item the host has present.
func checkSkeleton(t *testing.T, hostRoot string, h HostImage) {
	t.Helper()
	host := func(rel string) string { return filepath.Join(hostRoot, rel) }
	skel := func(rel string) string { return filepath.Join(h.Rootfs, rel) }
	bound := map[string]Bind{}
	for _, b := range h.Binds {
		if _, dup := bound[b.Dest]; dup {
			t.Errorf("bind %s twice", b.Dest)
		}
		bound[b.Dest] = b
		if fi, err := os.Stat(b.Source); err != nil || !fi.IsDir() {
			t.Errorf("bind %s: source %s is not a directory (%v)", b.Dest, b.Source, err)
		}
		rel, _ := filepath.Rel(hostRoot, b.Source)
		for _, f := range hostForbidden {
			if p := "/" + rel; p == f || strings.HasPrefix(p, f+"/") {
				t.Errorf("bind %s exposes the host's %s", b.Dest, b.Source)
			}
		}
		if b.Dest == "/etc/ssl" || strings.HasPrefix(b.Dest, "/etc/ssl/private") {
			t.Errorf("bind %s exposes private keys", b.Dest)
		}
		// Its mount point: an empty directory.
		ents, err := os.ReadDir(skel(b.Dest))
		if err != nil || len(ents) > 0 {
			t.Errorf("mount point %s: %d entries, %v", b.Dest, len(ents), err)
		}
	}
	if _, ok := bound["/usr"]; !ok {
		t.Error("/usr is not bound")
	}

	// The top level: the skeleton's own directories, and the host's.
	var hostTop []string
	for _, pat := range hostTopDirs {
		m, _ := filepath.Glob(host(pat))
		for _, p := range m {
			hostTop = append(hostTop, filepath.Base(p))
		}
	}
	top, err := os.ReadDir(h.Rootfs)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range top {
		if !slices.Contains(skeletonTop, e.Name()) && !slices.Contains(hostTop, e.Name()) {
			t.Errorf("skeleton holds /%s", e.Name())
		}
	}
	for _, name := range hostTop {
		fi, err := os.Lstat(host(name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			want, _ := os.Readlink(host(name))
			if got, err := os.Readlink(skel(name)); err != nil || got != want {
				t.Errorf("/%s -> %q (%v), want the host's %q", name, got, err, want)
			}
		} else if _, ok := bound["/"+name]; !ok && fi.IsDir() {
			t.Errorf("the host's directory /%s is not bound", name)
		}
	}
	for name, mode := range map[string]os.FileMode{"tmp": 0o777 | os.ModeSticky, "root": 0o700, "workspace": 0o755, "proc": 0o555} {
		fi, err := os.Lstat(skel(name))
		if err != nil || fi.Mode() != mode|os.ModeDir {
			t.Errorf("/%s: %v %v, want a %v directory", name, fi, err, mode)
			continue
		}
		if ents, _ := os.ReadDir(skel(name)); len(ents) > 0 {
			t.Errorf("/%s is not empty", name)
		}
	}

	// etc: nothing forbidden, nothing not allowlisted.
	for _, f := range forbiddenEtc {
		if _, err := os.Lstat(skel("etc/" + f)); !os.IsNotExist(err) {
			t.Errorf("skeleton holds /etc/%s (%v)", f, err)
		}
	}
	err = filepath.WalkDir(skel("etc"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(h.Rootfs, p)
		if d.IsDir() {
			return nil
		}
		if !slices.Contains(hostEtcFiles, strings.TrimPrefix(rel, "etc/")) {
			t.Errorf("skeleton holds /%s, which is not allowlisted", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every allowlisted file the host has.
	for _, f := range hostEtcFiles {
		rel := "etc/" + f
		fi, err := os.Lstat(host(rel))
		if err != nil {
			continue
		}
		got, err := os.Lstat(skel(rel))
		if err != nil {
			if _, serr := os.Stat(host(rel)); serr == nil {
				t.Errorf("/%s is on the host, not in the skeleton", rel)
			}
			continue
		}
		if got.Mode()&fs.ModeSymlink != 0 {
			want, _ := os.Readlink(host(rel))
			if l, _ := os.Readlink(skel(rel)); l != want || fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("/%s -> %q, want the host's %q", rel, l, want)
			}
			continue
		}
		want, _ := os.ReadFile(host(rel))
		if b, err := os.ReadFile(skel(rel)); err != nil || !bytes.Equal(b, want) {
			t.Errorf("/%s differs from the host's (%v)", rel, err)
		}
	}
	// Every allowlisted directory the host has.
	for _, pat := range hostEtcDirs {
		m, _ := filepath.Glob(host("etc/" + pat))
		for _, p := range m {
			if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
				continue
			}
			rel, _ := filepath.Rel(hostRoot, p)
			resolved, _ := filepath.EvalSymlinks(p)
			realRel, _ := filepath.Rel(hostRoot, resolved)
			_, ok := bound["/"+rel]
			switch {
			case slices.ContainsFunc(hostForbidden, func(f string) bool { return strings.HasPrefix("/"+realRel+"/", f+"/") }):
				if ok {
					t.Errorf("the host's /%s, which leads to %s, is bound", rel, resolved)
				}
			case !ok:
				t.Errorf("the host's /%s is not bound", rel)
			}
		}
	}
	path := h.Env[0]
	if !strings.HasPrefix(path, "PATH=") || !strings.Contains(path, ":/usr/bin:") {
		t.Errorf("env %q", h.Env)
	}
	_, err = os.Stat(host("usr/local/go/bin"))
	if strings.HasSuffix(path, ":/usr/local/go/bin") != (err == nil) {
		t.Errorf("PATH %q: /usr/local/go/bin on the host: %v", path, err)
	}
}

// fakeHost writes a host root with merged and unmerged top-level
// directories, secrets, and symlinks of every kind.
func fakeHost(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(rel, target string) {
		p := filepath.Join(root, rel)
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	write("usr/bin/sh", "#!sh")
	write("usr/lib/os-release", "ID=fake")
	write("usr/local/go/bin/go", "go")
	link("bin", "usr/bin")
	write("sbin/init", "init")
	write("lib64/ld.so", "ld")
	write("etc/passwd", "root:x:0:0::/root:/bin/sh\n")
	write("etc/shadow", "root:$6$secret")
	write("etc/ssh/ssh_host_ed25519_key", "KEY")
	write("etc/ssl/private/server.key", "KEY")
	write("etc/ssl/certs/ca.pem", "CERT")
	write("etc/ssl/openssl.cnf", "cnf")
	write("etc/pip.conf", "index-url = https://user:token@example.invalid/")
	write("etc/environment", "https_proxy=http://user:SECRET@proxy.invalid:3128\n")
	write("etc/python3.11/sitecustomize.py", "")
	write("etc/alternatives/README", "")
	write("run/resolv/resolv.conf", "nameserver 127.0.0.53\n")
	write("home/user/fonts/secret.ttf", "SECRET")
	write("root/.bash_history", "SECRET")
	link("etc/os-release", "../usr/lib/os-release")
	link("etc/resolv.conf", "../run/resolv/resolv.conf")
	link("etc/mtab", "../proc/self/mounts")
	link("etc/fonts", "../home/user/fonts")
	return root
}

func TestBuildHostFake(t *testing.T) {
	root := fakeHost(t)
	dir := t.TempDir()
	h, err := buildHost(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkSkeleton(t, root, h)
	var dests []string
	for _, b := range h.Binds {
		dests = append(dests, b.Dest)
	}
	slices.Sort(dests)
	want := []string{"/etc/alternatives", "/etc/python3.11", "/etc/ssl/certs", "/lib64", "/sbin", "/usr"}
	if !slices.Equal(dests, want) {
		t.Errorf("binds %v, want %v", dests, want)
	}
	if l, _ := os.Readlink(filepath.Join(h.Rootfs, "bin")); l != "usr/bin" {
		t.Errorf("bin -> %q", l)
	}
	if l, _ := os.Readlink(filepath.Join(h.Rootfs, "etc/os-release")); l != "../usr/lib/os-release" {
		t.Errorf("os-release -> %q: want the relative symlink kept", l)
	}
	if l, _ := os.Readlink(filepath.Join(h.Rootfs, "etc/mtab")); l != "../proc/self/mounts" {
		t.Errorf("mtab -> %q", l)
	}
	if b, err := os.ReadFile(filepath.Join(h.Rootfs, "etc/resolv.conf")); err != nil || string(b) != "nameserver 127.0.0.53\n" {
		t.Errorf("resolv.conf: %q %v: want the file it leads to copied", b, err)
	}
	if fi, _ := os.Lstat(filepath.Join(h.Rootfs, "etc/resolv.conf")); fi.Mode()&fs.ModeSymlink != 0 {
		t.Error("resolv.conf is a symlink to the host's /run")
	}
	if _, err := os.Lstat(filepath.Join(h.Rootfs, "etc/environment")); !os.IsNotExist(err) {
		t.Errorf("etc/environment, where a host keeps its proxy's credentials, is in the skeleton: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(h.Rootfs, "etc/fonts")); !os.IsNotExist(err) {
		t.Errorf("etc/fonts, a symlink into /home: %v", err)
	}
	// No byte of a secret anywhere.
	_ = filepath.WalkDir(h.Rootfs, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("SECRET")) || bytes.Contains(b, []byte("KEY")) || bytes.Contains(b, []byte("token")) {
				t.Errorf("%s holds a secret", p)
			}
		}
		return nil
	})
	if !strings.HasSuffix(h.Env[0], ":/usr/local/go/bin") {
		t.Errorf("env %q", h.Env)
	}

	// A change on the host rebuilds beside the old skeleton.
	if h2, _ := buildHost(root, dir); h2.Rootfs != h.Rootfs {
		t.Fatalf("rebuilt with no change: %s, %s", h.Rootfs, h2.Rootfs)
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\nu:x:1:1::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h3, err := buildHost(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	if h3.Rootfs == h.Rootfs {
		t.Fatal("a changed /etc/passwd did not rebuild")
	}
	if b, _ := os.ReadFile(filepath.Join(h3.Rootfs, "etc/passwd")); !strings.Contains(string(b), "u:x:1") {
		t.Errorf("rebuilt passwd: %q", b)
	}
	if _, err := os.Stat(filepath.Join(h.Rootfs, "etc/passwd")); err != nil {
		t.Errorf("the superseded skeleton is gone at once: %v", err)
	}
	// Past the grace period, the superseded skeleton goes.
	old := time.Now().Add(-hostSupersededGrace - time.Hour)
	if err := os.Chtimes(h.Rootfs+".superseded", old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := buildHost(root, dir); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != filepath.Base(h3.Rootfs) {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("dir holds %v, want the current skeleton alone", names)
	}
}

func TestBuildHostRefusesStateInsideBind(t *testing.T) {
	root := fakeHost(t)
	if _, err := buildHost(root, filepath.Join(root, "usr", "state")); err == nil || !strings.Contains(err.Error(), "usr") {
		t.Errorf("a state directory inside /usr: %v", err)
	}
	if _, err := BuildHost(filepath.Join(t.TempDir(), "a:b")); err == nil {
		t.Error("a directory with ':' was accepted")
	}
}
