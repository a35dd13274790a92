package host

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

var probeSeq atomic.Uint64

const (
	cfsPeriodUS = 100000
	minQuotaUS  = 1000
)

// cgroupRoot is where session cgroups are made: below this process's own
// cgroup, in cgroups v1 (one directory per controller) or v2 (one).
type cgroupRoot struct {
	v2   bool
	base map[string]string // controller ("memory", "cpu", or "" for v2) -> parent directory
}

// cgroup is one session's cgroup.
type cgroup struct {
	dirs []string // one per hierarchy
}

// findCgroups locates writable memory and cpu controllers, or says why
// there are none.
func findCgroups() (*cgroupRoot, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	paths := map[string]string{} // controller -> path in its hierarchy
	for line := range strings.SplitSeq(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			paths[""] = parts[2]
			continue
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			paths[c] = parts[2]
		}
	}
	v1 := &cgroupRoot{base: map[string]string{}}
	for _, c := range []string{"memory", "cpu"} {
		m, ok := mounts[c]
		p, ok2 := paths[c]
		if !ok || !ok2 {
			break
		}
		v1.base[c] = filepath.Join(m, p)
	}
	if len(v1.base) == 2 {
		if err := v1.probe(); err != nil {
			return nil, err
		}
		return v1, nil
	}
	if m, ok := mounts[""]; ok {
		v2 := &cgroupRoot{v2: true, base: map[string]string{"": filepath.Join(m, paths[""])}}
		if err := v2.probe(); err != nil {
			return nil, err
		}
		return v2, nil
	}
	return nil, errors.New("no cgroup hierarchy with the memory and cpu controllers is mounted")
}

// cgroupMounts maps each v1 controller to its mount point, and "" to the v2
// mount, from /proc/self/mountinfo.
func cgroupMounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 >= len(fields) || len(fields) < 5 || fields[3] != "/" {
			continue // only whole hierarchies mounted at their root
		}
		switch fields[sep+1] {
		case "cgroup":
			for o := range strings.SplitSeq(fields[sep+3], ",") {
				if o == "memory" || o == "cpu" {
					out[o] = fields[4]
				}
			}
		case "cgroup2":
			out[""] = fields[4]
		}
	}
	return out, sc.Err()
}

func (r *cgroupRoot) probe() error {
	name := fmt.Sprintf("tai42-probe-%d-%d", os.Getpid(), probeSeq.Add(1))
	cg, err := r.create(name, 0, 0)
	if err != nil {
		return err
	}
	return cg.destroy()
}

// create makes a session cgroup with the given caps (0 = none).
func (r *cgroupRoot) create(name string, cpu float64, memMB int) (_ *cgroup, err error) {
	cg := &cgroup{}
	defer func() {
		if err != nil {
			_ = cg.destroy()
		}
	}()
	quota := int64(cpu * cfsPeriodUS)
	mem := int64(memMB) << 20
	if r.v2 {
		dir := filepath.Join(r.base[""], name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cannot create a cgroup: %w", err)
		}
		cg.dirs = append(cg.dirs, dir)
		ctrls, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err != nil {
			return nil, err
		}
		have := strings.Fields(string(ctrls))
		for _, c := range []string{"memory", "cpu"} {
			if !slices.Contains(have, c) {
				return nil, fmt.Errorf("cgroup v2: the %s controller is not delegated to %s", c, r.base[""])
			}
		}
		if quota > 0 {
			if err := write(dir, "cpu.max", fmt.Sprintf("%d %d", quota, cfsPeriodUS)); err != nil {
				return nil, err
			}
		}
		if mem > 0 {
			if err := write(dir, "memory.max", strconv.FormatInt(mem, 10)); err != nil {
				return nil, err
			}
			if err := write(dir, "memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
		}
		return cg, nil
	}
	for _, c := range []string{"memory", "cpu"} {
		dir := filepath.Join(r.base[c], name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cannot create a %s cgroup: %w", c, err)
		}
		cg.dirs = append(cg.dirs, dir)
	}
	if mem > 0 {
		if err := write(cg.dirs[0], "memory.limit_in_bytes", strconv.FormatInt(mem, 10)); err != nil {
			return nil, err
		}
		// No swap: memory+swap capped at the same figure, where swap is
		// accounted; a host without swap accounting has none to cap.
		if err := write(cg.dirs[0], "memory.memsw.limit_in_bytes", strconv.FormatInt(mem, 10)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if quota > 0 {
		if err := write(cg.dirs[1], "cpu.cfs_period_us", strconv.Itoa(cfsPeriodUS)); err != nil {
			return nil, err
		}
		if err := write(cg.dirs[1], "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)); err != nil {
			return nil, err
		}
	}
	return cg, nil
}

// remove ends every process in the session cgroup name and removes it, in
// every hierarchy; missing is not an error.
func (r *cgroupRoot) remove(name string) error {
	cg := &cgroup{}
	for _, base := range r.base {
		if dir := filepath.Join(base, name); dirExists(dir) {
			cg.dirs = append(cg.dirs, dir)
		}
	}
	return cg.destroy()
}

func dirExists(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}

// procsFiles are the files a process writes its pid to, to join the cgroup.
func (cg *cgroup) procsFiles() []string {
	out := make([]string, len(cg.dirs))
	for i, d := range cg.dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
}

// destroy kills every process in the cgroup and removes it.
func (cg *cgroup) destroy() error {
	var errs []error
	for i := len(cg.dirs) - 1; i >= 0; i-- {
		dir := cg.dirs[i]
		deadline := time.Now().Add(5 * time.Second)
		for {
			pids := readPids(filepath.Join(dir, "cgroup.procs"))
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dir, err))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	cg.dirs = nil
	return errors.Join(errs...)
}

func readPids(file string) []int {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func write(dir, file, value string) error {
	return os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644)
}
