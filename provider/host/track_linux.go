package host

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// trackParent is the directory, in the cgroup v2 hierarchy, below which
// each session gets a tracking cgroup. It is shared by every host runner
// on the machine (each only ever touches the ids of its own state
// directory) and never removed.
const trackParent = "tai42-host"

// tracker places every process of a session in one cgroup v2 group from
// its birth (clone3 with CLONE_INTO_CGROUP), with no controller enabled: a
// record, kept by the kernel, of which processes are the session's. It is
// how a restarted runner finds and ends the processes of a daemon that
// was killed, and how a destroy ends processes that left their process
// group. On a hybrid cgroups v1 host it lives in the cgroup2 mount beside
// (/sys/fs/cgroup/unified).
type tracker struct {
	parent string
}

// findTracker locates a writable cgroup v2 hierarchy, or says why there is
// none.
func findTracker() (*tracker, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	m, ok := mounts[""]
	if !ok {
		return nil, errors.New("no cgroup v2 hierarchy is mounted")
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := "/"
	for line := range strings.SplitSeq(strings.TrimSpace(string(self)), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			own = p
		}
	}
	t := &tracker{parent: filepath.Join(m, own, trackParent)}
	if err := os.Mkdir(t.parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cannot make the tracking cgroup %s: %w", t.parent, err)
	}
	// A parent made by another user (a root runner before an unprivileged
	// one) exists but may not take this user's session groups: every
	// create would then fail, so say so here and run untracked instead.
	if err := unix.Access(t.parent, unix.W_OK|unix.X_OK); err != nil {
		return nil, fmt.Errorf("cannot make session groups in the tracking cgroup %s: %w", t.parent, err)
	}
	return t, nil
}

// group is one session's tracking cgroup.
type group struct {
	dir string
	fd  int // open on dir, for CLONE_INTO_CGROUP
}

// create makes the tracking cgroup of session id.
func (t *tracker) create(id string) (*group, error) {
	dir := filepath.Join(t.parent, id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot make the session's tracking cgroup: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("cannot open the session's tracking cgroup: %w", err)
	}
	return &group{dir: dir, fd: fd}, nil
}

// sysProcAttr makes a child start inside the group.
func (g *group) sysProcAttr(a *syscall.SysProcAttr) {
	if g != nil {
		a.UseCgroupFD, a.CgroupFD = true, g.fd
	}
}

// destroy ends every process in the group and removes it.
func (g *group) destroy() error {
	if g == nil {
		return nil
	}
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	return killRemove(g.dir)
}

// killRemove ends every process in the cgroup at dir and removes it,
// waiting up to 5 s for them to go; a missing cgroup is not an error.
func killRemove(dir string) error {
	kill := func() {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
			return
		}
		for _, pid := range readPids(filepath.Join(dir, "cgroup.procs")) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	kill()
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("removing the tracking cgroup %s: %w", dir, err)
		}
		time.Sleep(2 * time.Millisecond)
		kill()
	}
}
