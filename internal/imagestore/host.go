package imagestore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// HostImage is the container provider's built-in image "host": a
// read-only view of the host's system directories (its toolchains), none
// of its data, none of its writes.
type HostImage struct {
	// Rootfs is a skeleton directory for the overlay's lower layer: the
	// mount points (usr, etc, proc, dev, sys, run, tmp, workspace, and an
	// empty root for root's home), the host's top-level symlinks as they
	// are (on a merged-/usr system bin -> usr/bin, lib -> usr/lib, ...),
	// and in etc the copied files of hostEtcFiles. There is no home,
	// var, opt or srv: a session makes what it needs in its upper layer.
	// Nothing in it is ever written to: it is shared by every session.
	Rootfs string
	// Binds are the read-only bind mounts the provider adds to the
	// container: /usr; /bin, /sbin and /lib* where they are real
	// directories on the host; the directories of hostEtcDirs that exist.
	// Dest is a mount point the skeleton has.
	Binds []Bind
	// Env is the image's environment: PATH, Debian's for root, with
	// /usr/local/go/bin last when the host has it (Debian's Go is older
	// than the project's toolchain, which lives there; last, it never
	// shadows a system binary).
	Env []string
}

// Bind is a read-only bind mount of the host's Source at Dest in the
// container.
type Bind struct{ Source, Dest string }

// hostEtcFiles are the files of /etc that programs read (libc's name
// services and loader, time zone, shells and locales, TLS and mime
// configuration), copied into the skeleton's etc. A symlink is kept as a
// symlink when it leads into /usr, /proc or another bound directory (on
// Debian os-release -> ../usr/lib/os-release, localtime ->
// /usr/share/zoneinfo/..., mtab -> /proc/mounts); otherwise (e.g. a
// resolv.conf managed under /run) the file it leads to is copied.
//
// Left out on purpose: shadow, gshadow and their backups, sudoers,
// machine-id, ssh (host keys), ssl/private, subuid/subgid, hostname,
// credentials-bearing configs (pip.conf, npmrc, gitconfig, wgetrc,
// netrc...), environment (pam_env's variables for logins, often a proxy
// URL with its password; a session's environment is the exec's, which
// never reads it), and anything else not listed.
var hostEtcFiles = []string{
	"passwd", "group", "hosts", "nsswitch.conf", "resolv.conf", "gai.conf", "host.conf",
	"protocols", "services", "rpc", "networks", "ethertypes",
	"ld.so.cache", "ld.so.conf",
	"localtime", "timezone",
	"os-release", "lsb-release", "debian_version",
	"profile", "bash.bashrc", "inputrc", "shells",
	"locale.alias", "locale.conf", "default/locale",
	"mime.types", "mailcap", "magic", "magic.mime",
	"ssl/openssl.cnf",
	"mtab",
}

// hostEtcDirs are the directories of /etc programs need, bound read-only
// (a pattern may hold a '*'): the alternatives' symlinks, the loader's
// configuration, the CA certificates (ssl/certs only: never ssl/private),
// login shells' snippets, terminfo and fonts, and the configuration some
// language runtimes of /usr read from /etc (Debian's Java needs its
// jvm.cfg there).
var hostEtcDirs = []string{
	"alternatives", "ld.so.conf.d", "ssl/certs", "ca-certificates",
	"profile.d", "terminfo", "fonts", "perl", "python3", "python3.*",
	"java-*-openjdk", "vim",
}

// hostTopDirs are the top-level directories bound from the host where they
// are real directories, reproduced as symlinks where they are symlinks
// (a pattern may hold a '*').
var hostTopDirs = []string{"usr", "bin", "sbin", "lib*"}

// hostForbidden are host trees no bind ever exposes: homes, data,
// scratch and service state. BuildHost adds its own directory.
var hostForbidden = []string{"/home", "/root", "/var", "/tmp", "/srv", "/opt", "/mnt", "/media", "/run", "/boot", "/lost+found"}

// hostHomes are host trees whose files are never copied, even when an
// allowlisted /etc file is a symlink into them.
var hostHomes = []string{"/home", "/root"}

// skeletonDirs are the skeleton's own directories and their modes.
var skeletonDirs = []struct {
	name string
	mode os.FileMode
}{
	{"usr", 0o755}, {"etc", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
	{"run", 0o755}, {"tmp", 0o777 | os.ModeSticky}, {"workspace", 0o755}, {"root", 0o700},
}

// hostVersion changes when the skeleton's layout does, so that a new
// tai42 rebuilds it.
const hostVersion = "tai42-host-skeleton/1"

// hostSupersededGrace is how long a superseded skeleton is kept for the
// sessions still running on it before it is deleted.
const hostSupersededGrace = 24 * time.Hour

// BuildHost (re)builds the host image's skeleton under dir (created if
// missing) from the running host, and returns the image.
//
// It is fast when the skeleton is current: it stats the host files the
// skeleton depends on, and builds only when one of them changed (or the
// layout did). A rebuild writes a new skeleton directory, named by a hash
// of its inputs, beside the old one and renames it into place whole, so
// a caller never sees a partial skeleton, and sessions already running on
// the old one keep it: a superseded skeleton is deleted only once it has
// been superseded for 24 hours. BuildHost is safe to call concurrently,
// from many goroutines and processes.
//
// Errors name the host path or the skeleton path at fault.
func BuildHost(dir string) (HostImage, error) {
	return buildHost("/", dir)
}

// hostPlan is what a skeleton is built from.
type hostPlan struct {
	root   string     // the host's root, "/" but in tests
	files  []hostFile // etc files to copy or link
	links  []hostLink // symlinks to reproduce (top-level and in etc)
	mounts []string   // mount points to create for binds, relative
	binds  []Bind
	env    []string
	sum    string // fingerprint of all the inputs
}

type hostFile struct {
	rel string // relative to the skeleton, e.g. "etc/passwd"
	src string // host path to copy (a symlink's target resolved)
}

type hostLink struct {
	rel, target string
}

func buildHost(hostRoot, dir string) (HostImage, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return HostImage{}, fmt.Errorf("host image %s: %w", dir, err)
	}
	if strings.ContainsAny(abs, ":,") {
		return HostImage{}, fmt.Errorf("host image %s: the path contains ':' or ',', which overlayfs cannot take in a lower directory: choose another state directory", abs)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return HostImage{}, fmt.Errorf("host image: %w", err)
	}
	plan, err := planHost(hostRoot, abs)
	if err != nil {
		return HostImage{}, err
	}
	rootfs := filepath.Join(abs, "skel-"+plan.sum[:24])
	if fi, err := os.Lstat(rootfs); err != nil || !fi.IsDir() {
		if err := plan.build(abs, rootfs); err != nil {
			return HostImage{}, err
		}
	}
	gcSkeletons(abs, filepath.Base(rootfs))
	return HostImage{Rootfs: rootfs, Binds: plan.binds, Env: plan.env}, nil
}

// planHost inspects the host and fingerprints what the skeleton holds.
func planHost(hostRoot, selfDir string) (*hostPlan, error) {
	p := &hostPlan{root: hostRoot}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", hostVersion)
	host := func(rel string) string { return filepath.Join(hostRoot, rel) }
	// under reports whether host path src is (or is inside) one of the
	// host trees trees (absolute, as on the host), or holds selfDir.
	under := func(src string, trees []string) bool {
		if src == selfDir || strings.HasPrefix(src, selfDir+"/") || strings.HasPrefix(selfDir, src+"/") {
			return true
		}
		rel, err := filepath.Rel(hostRoot, src)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return true // outside the host root seen
		}
		abs := "/" + filepath.ToSlash(rel)
		for _, f := range trees {
			if abs == f || strings.HasPrefix(abs, f+"/") {
				return true
			}
		}
		return false
	}
	stamp := func(kind, rel string, fi fs.FileInfo, extra string) {
		fmt.Fprintf(h, "%s %q %v %d %d", kind, rel, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			fmt.Fprintf(h, " %d %d %d.%d %d %d", st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec, st.Uid, st.Gid)
		}
		fmt.Fprintf(h, " %q\n", extra)
	}

	// Top level: bind real directories, reproduce symlinks.
	var tops []string
	for _, pat := range hostTopDirs {
		m, err := filepath.Glob(host(pat))
		if err != nil {
			return nil, err
		}
		for _, src := range m {
			tops = append(tops, filepath.Base(src))
		}
	}
	slices.Sort(tops)
	tops = slices.Compact(tops)
	for _, name := range tops {
		src := host(name)
		fi, err := os.Lstat(src)
		if err != nil {
			continue
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(src)
			if err != nil {
				return nil, fmt.Errorf("host image: %w", err)
			}
			p.links = append(p.links, hostLink{name, t})
			stamp("link", name, fi, t)
		case fi.IsDir():
			if under(src, nil) {
				return nil, fmt.Errorf("host image: its directory %s is inside the host's %s, which the host image exposes: choose a state directory outside it", selfDir, src)
			}
			p.mounts = append(p.mounts, name)
			p.binds = append(p.binds, Bind{Source: src, Dest: "/" + name})
			fmt.Fprintf(h, "bind %q\n", name)
		}
	}
	if !slices.ContainsFunc(p.binds, func(b Bind) bool { return b.Dest == "/usr" }) {
		return nil, fmt.Errorf("host image: %s is not a directory: the host image needs the host's /usr", host("usr"))
	}

	// etc directories: bound where they exist (a symlink to a directory
	// binds where it leads).
	for _, pat := range hostEtcDirs {
		m, err := filepath.Glob(host(filepath.Join("etc", pat)))
		if err != nil {
			return nil, err
		}
		for _, src := range m {
			rel, _ := filepath.Rel(hostRoot, src)
			resolved, err := filepath.EvalSymlinks(src)
			if err != nil {
				continue
			}
			fi, err := os.Stat(resolved)
			if err != nil || !fi.IsDir() || under(resolved, hostForbidden) {
				continue
			}
			p.mounts = append(p.mounts, rel)
			p.binds = append(p.binds, Bind{Source: resolved, Dest: "/" + filepath.ToSlash(rel)})
			fmt.Fprintf(h, "bind %q %q\n", rel, resolved)
		}
	}

	// etc files: symlinks into bound trees stay symlinks, others are
	// copied from where they lead.
	for _, name := range hostEtcFiles {
		rel := filepath.Join("etc", name)
		src := host(rel)
		fi, err := os.Lstat(src)
		if err != nil {
			continue
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			t, err := os.Readlink(src)
			if err != nil {
				return nil, fmt.Errorf("host image: %w", err)
			}
			if linkStaysInside(filepath.Dir("/"+rel), t, p.binds) {
				p.links = append(p.links, hostLink{rel, t})
				stamp("link", rel, fi, t)
				continue
			}
			resolved, err := filepath.EvalSymlinks(src)
			if err != nil {
				continue // dangling: programs do without it on the host too
			}
			if fi, err = os.Stat(resolved); err != nil || under(resolved, hostHomes) {
				continue
			}
			src = resolved
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		p.files = append(p.files, hostFile{rel, src})
		stamp("file", rel, fi, src)
	}

	p.env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if fi, err := os.Stat(host("usr/local/go/bin")); err == nil && fi.IsDir() {
		p.env[0] += ":/usr/local/go/bin"
	}
	p.sum = hex.EncodeToString(h.Sum(nil))
	return p, nil
}

// linkStaysInside reports whether a symlink in dir (absolute, in the
// container) to target resolves, lexically, into a bound directory or
// /proc, so it works in the container without its target being copied.
func linkStaysInside(dir, target string, binds []Bind) bool {
	t := target
	if !filepath.IsAbs(t) {
		t = filepath.Join(dir, t)
	}
	t = filepath.Clean(t)
	if t == "/proc" || strings.HasPrefix(t, "/proc/") {
		return true
	}
	for _, b := range binds {
		if t == b.Dest || strings.HasPrefix(t, b.Dest+"/") {
			return true
		}
	}
	return false
}

// build writes the skeleton into a new directory of parent and renames it
// to rootfs; another builder that got there first wins.
func (p *hostPlan) build(parent, rootfs string) error {
	tmp, err := os.MkdirTemp(parent, ".build-")
	if err != nil {
		return fmt.Errorf("host image: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := p.write(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, rootfs); err != nil {
		if fi, serr := os.Lstat(rootfs); serr == nil && fi.IsDir() {
			return nil // built concurrently
		}
		return fmt.Errorf("host image: %w", err)
	}
	return syncDir(parent)
}

// write fills the skeleton directory dir.
func (p *hostPlan) write(dir string) error {
	fail := func(err error) error { return fmt.Errorf("host image: building %s: %w", dir, err) }
	for _, d := range skeletonDirs {
		if err := os.Mkdir(filepath.Join(dir, d.name), 0o700); err != nil {
			return fail(err)
		}
	}
	for _, m := range p.mounts {
		if err := os.MkdirAll(filepath.Join(dir, m), 0o755); err != nil {
			return fail(err)
		}
	}
	for _, l := range p.links {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(l.rel)), 0o755); err != nil {
			return fail(err)
		}
		if err := os.Symlink(l.target, filepath.Join(dir, l.rel)); err != nil {
			return fail(err)
		}
	}
	for _, f := range p.files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f.rel)), 0o755); err != nil {
			return fail(err)
		}
		if err := copyHostFile(f.src, filepath.Join(dir, f.rel)); err != nil {
			return fail(err)
		}
	}
	// Modes last: the skeleton's own dirs as listed, its root 0755.
	for _, d := range skeletonDirs {
		if err := os.Chmod(filepath.Join(dir, d.name), d.mode); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	return nil
}

// copyHostFile copies a regular file with its mode, owner (when root) and
// modification time.
func copyHostFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && err == nil && os.Geteuid() == 0 {
		err = out.Chown(int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = out.Chmod(fi.Mode().Perm())
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
}

// gcSkeletons deletes skeletons superseded for longer than the grace
// period and abandoned builds, best effort. A superseded skeleton gets a
// "<name>.superseded" stamp file beside it the first time it is seen
// superseded; the current one loses its stamp.
func gcSkeletons(dir, current string) {
	_ = os.Remove(filepath.Join(dir, current+".superseded"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	now := time.Now()
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(dir, name)
		switch {
		case strings.HasPrefix(name, ".build-"):
			if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > time.Hour {
				_ = os.RemoveAll(path)
			}
		case strings.HasPrefix(name, "skel-") && e.IsDir() && name != current:
			stamp := path + ".superseded"
			fi, err := os.Stat(stamp)
			if errors.Is(err, fs.ErrNotExist) {
				_ = os.WriteFile(stamp, nil, 0o600)
				continue
			}
			if err == nil && now.Sub(fi.ModTime()) > hostSupersededGrace {
				if os.RemoveAll(path) == nil {
					_ = os.Remove(stamp)
				}
			}
		case strings.HasSuffix(name, ".superseded"):
			if _, err := os.Lstat(strings.TrimSuffix(path, ".superseded")); errors.Is(err, fs.ErrNotExist) {
				_ = os.Remove(path)
			}
		}
	}
}
