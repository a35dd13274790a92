package kubetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

const cgroupFS = "/sys/fs/cgroup"

// hierarchies are the mounted cgroup hierarchies' directories: each v1
// controller's (cgroups v1 or hybrid) or the one v2 root.
func hierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupFS, "cgroup.controllers")); err == nil {
		return []string{cgroupFS}
	}
	entries, _ := os.ReadDir(cgroupFS)
	var out []string
	for _, e := range entries {
		p := filepath.Join(cgroupFS, e.Name())
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() { // symlinks (cpu -> cpu,cpuacct) skipped
			out = append(out, p)
		}
	}
	return out
}

// makeCgroupRoot makes the kubelet's cgroup root in every hierarchy (the
// kubelet requires it to exist).
func makeCgroupRoot(root string) error {
	for _, h := range hierarchies() {
		d := filepath.Join(h, root)
		if _, err := os.Stat(d); err == nil {
			continue
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		// A new cpuset takes no task until it has cpus and mems: its
		// parent's.
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err == nil {
					_ = os.WriteFile(filepath.Join(d, f), b, 0o644)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot removes the cgroups under root in every hierarchy,
// deepest first, root itself included (the harness's own name, one
// cluster at a time), killing what still runs in them (the pods'
// processes only: nothing else is in the kubelet's root).
func removeCgroupRoot(root string) error {
	var errs []error
	for _, h := range hierarchies() {
		d := filepath.Join(h, root)
		if _, err := os.Stat(d); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, dir := range dirs {
			if err := rmdirCgroup(dir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func rmdirCgroup(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if b, rerr := os.ReadFile(filepath.Join(dir, "cgroup.procs")); rerr == nil {
			for _, f := range strings.Fields(string(b)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CgroupsLeft lists the cgroups under root, for a test that Close left
// none.
func CgroupsLeft(root string) []string {
	root = "/" + strings.Trim(root, "/")
	var left []string
	for _, h := range hierarchies() {
		if _, err := os.Stat(filepath.Join(h, root)); err == nil {
			left = append(left, filepath.Join(h, root))
		}
	}
	return left
}
