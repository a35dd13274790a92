package container

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupLayout is where the runtime puts a session's cgroups: one
// directory per v1 controller, or one in the v2 tree.
type cgroupLayout struct {
	v2   bool
	root string   // /sys/fs/cgroup
	dirs []string // v1: the controller mounts the runtime uses
}

func findCgroupLayout() (cgroupLayout, error) {
	const root = "/sys/fs/cgroup"
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return cgroupLayout{v2: true, root: root}, nil
	}
	l := cgroupLayout{root: root}
	entries, err := os.ReadDir(root)
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroups: %w", err)
	}
	for _, e := range entries {
		// "unified" (hybrid mode's cgroup2 mount) is listed too: runc
		// makes the session's cgroup there as well.
		// Skip the links (cpu -> cpu,cpuacct): the directory they lead
		// to is listed under its own name.
		if fi, err := os.Lstat(filepath.Join(root, e.Name())); err == nil && fi.IsDir() {
			l.dirs = append(l.dirs, filepath.Join(root, e.Name()))
		}
	}
	if _, err := os.Stat(filepath.Join(root, "memory")); err != nil {
		return cgroupLayout{}, errors.New("cgroups v1 without a memory controller: memory_mb cannot be enforced")
	}
	return l, nil
}

// oomKills is how many processes the memory limit of cgroup path has
// killed so far; 0 when it cannot be read.
func (l cgroupLayout) oomKills(path string) int64 {
	file, key := filepath.Join(l.root, "memory", path, "memory.oom_control"), "oom_kill"
	if l.v2 {
		file = filepath.Join(l.root, path, "memory.events")
	}
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// remove removes cgroup path where the runtime left it (it removes its
// own on delete; a failed create may not have). Missing is not an error.
//
// A cgroup whose last processes are still exiting (the kernel ends a pid
// namespace's processes after its init, asynchronously) is busy for a
// moment: removal is retried for up to 5 s.
func (l cgroupLayout) remove(path string) error {
	var errs []error
	for _, d := range l.paths(path) {
		err := os.Remove(d)
		for wait := time.Millisecond; errors.Is(err, unix.EBUSY) && wait < 5*time.Second; wait *= 2 {
			time.Sleep(wait)
			err = os.Remove(d)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func (l cgroupLayout) paths(path string) []string {
	if l.v2 {
		return []string{filepath.Join(l.root, path)}
	}
	out := make([]string, 0, len(l.dirs))
	for _, d := range l.dirs {
		out = append(out, filepath.Join(d, path))
	}
	return out
}

// killAll sends SIGKILL to every process in the cgroup path, in every
// hierarchy, until none is left or 5 s have passed; a missing cgroup has
// none. It is how the sweep ends a container whose pid file is gone: its
// processes are the session's by their cgroup.
func (l cgroupLayout) killAll(path string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := 0
		for _, d := range l.paths(path) {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				continue
			}
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					left++
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %d processes did not end within 5s of SIGKILL", path, left)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
