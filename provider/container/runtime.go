package container

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/tai42/sandbox/internal/nsthread"
	"golang.org/x/sys/unix"
)

// ociRuntime drives an OCI runtime binary (runc or crun) by its command
// line: run a container detached, delete it. Its state lives under root,
// apart from any other user of the same runtime.
type ociRuntime struct {
	name string // "runc" or "crun"
	bin  string
	root string
	// ns is crun's mount namespace (nil for runc): crun refuses a host
	// whose cgroups are in hybrid mode (v1 with a cgroup2 mount beside),
	// so it runs, and its sessions' root overlays are mounted, in a
	// mount namespace of our own where that cgroup2 mount is hidden.
	ns *nsthread.Worker
}

// newRuntime finds the runtime named name (runc or crun, or a path to one
// of them) and prepares its state directory.
func newRuntime(name, stateDir string) (*ociRuntime, error) {
	if name == "" {
		name = "runc"
	}
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("OCI runtime %q not found (install it: apt-get install -y %s): %w", name, filepath.Base(name), err)
	}
	kind := filepath.Base(bin)
	if kind != "runc" && kind != "crun" {
		return nil, fmt.Errorf("OCI runtime %q: only runc and crun are supported", name)
	}
	rt := &ociRuntime{name: kind, bin: bin, root: filepath.Join(stateDir, kind)}
	if err := os.MkdirAll(rt.root, 0o700); err != nil {
		return nil, err
	}
	if kind == "crun" && hybridCgroups() {
		if rt.ns, err = nsthread.NewMountNS("/sys/fs/cgroup/unified"); err != nil {
			return nil, fmt.Errorf("crun on a host with hybrid cgroups: %w", err)
		}
	}
	return rt, nil
}

// hybridCgroups reports cgroups v1 with a cgroup2 mount beside them.
func hybridCgroups() bool {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup/unified", &st) != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}

// do runs fn where the runtime runs: in crun's mount namespace, or here.
func (rt *ociRuntime) do(fn func() error) error {
	if rt.ns != nil {
		return rt.ns.Do(fn)
	}
	return fn()
}

// command runs the runtime with args, its output going to out. extra are
// files the container inherits from fd 3 on. With ownKeyring the runtime
// starts with a new, empty session keyring (see run). tmp is the
// directory the runtime makes its temporary files in: the session's
// bundle.
//
// crun, to run a copy of itself the container cannot overwrite, makes a
// file (crun.XXXXXX), bind-mounts its own binary there, opens it and
// removes it, in $_LIBCONTAINER_STATEDIR, else /tmp: a crun killed in
// between (a create cancelled) leaves the file. In the bundle, the
// session's destroy or the next start's sweep removes it with the rest;
// in the host's /tmp nothing would.
func (rt *ociRuntime) command(ctx context.Context, tmp string, out *stdioLog, extra []*os.File, ownKeyring bool, args ...string) error {
	var errBuf bytes.Buffer
	cmd := exec.CommandContext(ctx, rt.bin, append([]string{"--root", rt.root}, args...)...)
	cmd.Env = append(os.Environ(), "_LIBCONTAINER_STATEDIR="+tmp)
	cmd.ExtraFiles = extra
	if out != nil {
		// The container's PID 1 inherits these: a pipe's end of our own
		// (an *os.File), not one exec makes, so that our wait is not held
		// by a process that outlives the call.
		cmd.Stdout, cmd.Stderr = out.w, out.w
		defer out.handedOn()
	} else {
		cmd.Stdout, cmd.Stderr = &errBuf, &errBuf
	}
	start := cmd.Start
	if ownKeyring {
		// A session keyring is the joining thread's: the fork follows on
		// it. That thread is the runtime's own mount namespace's, or one
		// that ends after the fork, so that nothing else this process
		// starts gets the container's keyring.
		start = func() error {
			if _, _, errno := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); errno != 0 {
				return fmt.Errorf("%s %s: a new session keyring: %w", rt.name, args[0], errno)
			}
			return cmd.Start()
		}
	}
	var err error
	if ownKeyring && rt.ns == nil {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			errc <- start()
		}()
		err = <-errc
	} else {
		// Only the fork needs the namespace's thread; the wait does not
		// hold it.
		err = rt.do(start)
	}
	if err == nil {
		err = cmd.Wait()
	}
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(errBuf.String())
	if out != nil {
		msg = out.text(2048)
	}
	if msg == "" {
		return fmt.Errorf("%s %s: %w", rt.name, args[0], err)
	}
	return fmt.Errorf("%s %s: %w: %s", rt.name, args[0], err, msg)
}

// run creates and starts container id from bundle, detached, handing it
// listener as fd 3.
//
// A remapped container (remapped) gets a session keyring made here, new
// and empty, host root's, instead of the one the runtime would make: runc
// makes it in the container's user namespace, where it counts against
// the key quota of the container's root, a user every remapped session
// on the host shares (kernel.keys.maxkeys, 200 by default), and fails
// ("disk quota exceeded") past that many sessions. (crun makes it as
// host root; both runtimes get the same here.) Nothing in a session
// reaches a keyring anyway: the seccomp profile refuses keyctl, add_key
// and request_key.
func (rt *ociRuntime) run(ctx context.Context, id, bundle string, out *stdioLog, listener *os.File, remapped bool) error {
	args := []string{"run", "--detach", "--preserve-fds", "1", "--bundle", bundle, "--pid-file", filepath.Join(bundle, initPidFile)}
	if remapped {
		args = append(args, "--no-new-keyring")
	}
	return rt.command(ctx, bundle, out, []*os.File{listener}, remapped, append(args, id)...)
}

// initPidFile, in a session's bundle, holds its container's PID 1 as this
// process's pid namespace sees it.
const initPidFile = "init.pid"

// delete kills every process of container id, whose bundle is bundle, and
// removes it; a container that does not exist is not an error.
func (rt *ociRuntime) delete(ctx context.Context, id, bundle string) error {
	err := rt.command(ctx, bundle, nil, nil, false, "delete", "--force", id)
	if err != nil && (strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found")) {
		return nil
	}
	return err
}

// close releases the runtime's mount namespace: mounts still in it go
// with it.
func (rt *ociRuntime) close() {
	if rt.ns != nil {
		rt.ns.Close()
	}
}
