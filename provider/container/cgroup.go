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
		if e.Name() == "unified" {
			continue
		}
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
func (l cgroupLayout) remove(path string) error {
	var errs []error
	for _, d := range l.paths(path) {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// removeParent removes the provider's shared parent cgroup where it is
// empty.
func (l cgroupLayout) removeParent() {
	for _, d := range l.paths("/" + cgroupParent) {
		_ = os.Remove(d)
	}
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

// leftovers lists the session cgroups below the provider's parent, for
// tests that check nothing is left.
func (l cgroupLayout) leftovers() []string {
	var out []string
	for _, d := range l.paths("/" + cgroupParent) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, filepath.Join(d, e.Name()))
			}
		}
	}
	return out
}
