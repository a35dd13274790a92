package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

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
	ns *mountNS
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
		if rt.ns, err = newMountNS("/sys/fs/cgroup/unified"); err != nil {
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
		return rt.ns.do(fn)
	}
	return fn()
}

// command runs the runtime with args, its output going to log. extra are
// files the container inherits from fd 3 on.
func (rt *ociRuntime) command(ctx context.Context, log *os.File, extra []*os.File, args ...string) error {
	var errBuf bytes.Buffer
	cmd := exec.CommandContext(ctx, rt.bin, append([]string{"--root", rt.root}, args...)...)
	cmd.ExtraFiles = extra
	if log != nil {
		// The container's PID 1 inherits these: a file, not a pipe, so
		// that our wait is not held by a process that outlives the call.
		cmd.Stdout, cmd.Stderr = log, log
	} else {
		cmd.Stdout, cmd.Stderr = &errBuf, &errBuf
	}
	// Only the fork needs the namespace's thread; the wait does not hold it.
	err := rt.do(cmd.Start)
	if err == nil {
		err = cmd.Wait()
	}
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(errBuf.String())
	if log != nil {
		msg = tail(log.Name(), 2048)
	}
	if msg == "" {
		return fmt.Errorf("%s %s: %w", rt.name, args[0], err)
	}
	return fmt.Errorf("%s %s: %w: %s", rt.name, args[0], err, msg)
}

// run creates and starts container id from bundle, detached, handing it
// listener as fd 3.
func (rt *ociRuntime) run(ctx context.Context, id, bundle string, log, listener *os.File) error {
	return rt.command(ctx, log, []*os.File{listener}, "run", "--detach", "--preserve-fds", "1", "--bundle", bundle, id)
}

// delete kills every process of container id and removes it; a container
// that does not exist is not an error.
func (rt *ociRuntime) delete(ctx context.Context, id string) error {
	err := rt.command(ctx, nil, nil, "delete", "--force", id)
	if err != nil && (strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found")) {
		return nil
	}
	return err
}

// close releases the runtime's mount namespace: mounts still in it go
// with it.
func (rt *ociRuntime) close() {
	if rt.ns != nil {
		rt.ns.close()
	}
}

// tail is the end of file name, for error messages.
func tail(name string, n int64) string {
	f, err := os.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, 0)
	}
	b := make([]byte, n)
	k, _ := f.Read(b)
	return strings.TrimSpace(string(b[:k]))
}

// mountNS is a mount namespace of our own, held by one locked OS thread
// that runs the functions given to do (a process that thread starts is
// born in the namespace). Mounts from the host's namespace reach it as a
// slave; its own mounts and unmounts never reach the host.
type mountNS struct {
	jobs chan func()
	done chan struct{}
}

func newMountNS(hide ...string) (*mountNS, error) {
	ns := &mountNS{jobs: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		// The thread never goes back to the scheduler: it dies with this
		// goroutine, and the namespace with it.
		runtime.LockOSThread()
		defer close(ns.done)
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			ready <- fmt.Errorf("unshare a mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			ready <- fmt.Errorf("make the mount namespace a slave: %w", err)
			return
		}
		for _, m := range hide {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				ready <- fmt.Errorf("hide %s: %w", m, err)
				return
			}
		}
		ready <- nil
		for job := range ns.jobs {
			job()
		}
	}()
	if err := <-ready; err != nil {
		<-ns.done
		return nil, err
	}
	return ns, nil
}

// do runs fn on the namespace's thread and returns its error.
func (ns *mountNS) do(fn func() error) error {
	errc := make(chan error, 1)
	ns.jobs <- func() { errc <- fn() }
	return <-errc
}

func (ns *mountNS) close() {
	close(ns.jobs)
	<-ns.done
}
