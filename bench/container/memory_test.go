package container_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const cgroupRoot = "/sys/fs/cgroup"

// cgroupV2 reports a unified (v2) cgroup hierarchy at /sys/fs/cgroup.
func cgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// memoryDir is the directory of cgroup path (as /proc/PID/cgroup names
// it) in the memory hierarchy.
func memoryDir(path string) string {
	if cgroupV2() {
		return filepath.Join(cgroupRoot, path)
	}
	return filepath.Join(cgroupRoot, "memory", path)
}

// cgroupMemory is the memory charged to cgroup path: memory.usage_in_bytes
// (v1) or memory.current (v2).
func cgroupMemory(path string) (int64, error) {
	file := filepath.Join(memoryDir(path), "memory.usage_in_bytes")
	if cgroupV2() {
		file = filepath.Join(memoryDir(path), "memory.current")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("the memory charge of cgroup %s: %w", path, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the memory charge of cgroup %s: %s: %w", path, file, err)
	}
	return n, nil
}

// cgroupProcs lists the processes of cgroup path.
func cgroupProcs(path string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(memoryDir(path), "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("the processes of cgroup %s: %w", path, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("the processes of cgroup %s: %q: %w", path, f, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// procMemoryCgroup is the memory cgroup of process pid, as /proc/PID/cgroup
// names it ("/docker/ID"): the memory controller's line (v1) or the
// unified one (v2).
func procMemoryCgroup(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	return parseProcCgroup(string(b), cgroupV2())
}

func parseProcCgroup(s string, v2 bool) (string, error) {
	for _, line := range strings.Split(s, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[0] == "0" && parts[1] == "" {
			return parts[2], nil
		}
		if !v2 {
			for _, c := range strings.Split(parts[1], ",") {
				if c == "memory" {
					return parts[2], nil
				}
			}
		}
	}
	return "", errors.New("no memory cgroup in /proc/PID/cgroup")
}

// pssOf is process pid's proportional set size in bytes, from
// /proc/PID/smaps_rollup: the whole, and its anonymous and file-backed
// parts.
type pssOf struct{ total, anon, file int64 }

func pss(pid int) (pssOf, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return pssOf{}, fmt.Errorf("the PSS of process %d: %w", pid, err)
	}
	var p pssOf
	for _, f := range []struct {
		key string
		v   *int64
	}{{"Pss", &p.total}, {"Pss_Anon", &p.anon}, {"Pss_File", &p.file}} {
		if *f.v, err = meminfoField(string(b), f.key); err != nil {
			return pssOf{}, fmt.Errorf("the PSS of process %d: %w", pid, err)
		}
	}
	return p, nil
}

// cgroupStat is the anonymous and the file (page cache) memory charged to
// cgroup path, from its memory.stat: rss and cache (v1), anon and file
// (v2).
func cgroupStat(path string) (anon, file int64, err error) {
	b, err := os.ReadFile(filepath.Join(memoryDir(path), "memory.stat"))
	if err != nil {
		return 0, 0, fmt.Errorf("the memory.stat of cgroup %s: %w", path, err)
	}
	anonKey, fileKey := "rss", "cache"
	if cgroupV2() {
		anonKey, fileKey = "anon", "file"
	}
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok || k != anonKey && k != fileKey {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("the memory.stat of cgroup %s: %q: %w", path, line, err)
		}
		if k == anonKey {
			anon = n
		} else {
			file = n
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("the memory.stat of cgroup %s has no %s or %s line", path, anonKey, fileKey)
	}
	return anon, file, nil
}

// memAvailable is the machine's MemAvailable in bytes.
func memAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return meminfoField(string(b), "MemAvailable")
}

// meminfoField is the "Key:   N kB" line key of s, in bytes.
func meminfoField(s, key string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("%s: %q is not \"N kB\"", key, v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", key, err)
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("no %s line", key)
}

// parentPid is the parent of process pid.
func parentPid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatPpid(string(b))
}

// parseStatPpid reads the ppid of a /proc/PID/stat line: the field after
// the state, which follows the command in parentheses (which may itself
// hold spaces and parentheses).
func parseStatPpid(s string) (int, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/PID/stat %q has no command", s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/PID/stat %q is short", s)
	}
	return strconv.Atoi(f[1])
}

// comm is process pid's command name.
func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// idleMemory is what one idle session or container costs: the memory
// charged to its cgroup, and the PSS of the processes that serve it (our
// agent, in the cgroup; docker's containerd-shim, outside it). The parts
// say where it goes: the cgroup's anonymous and page cache charge (the
// rest of its charge is kernel memory), the PSS's anonymous and
// file-backed parts.
type idleMemory struct {
	cgroup, pss            int64
	cgroupAnon, cgroupFile int64
	pssAnon, pssFile       int64
	// pssInCgroup: the processes of pss are in the cgroup (our agent), so
	// their anonymous memory is counted in both.
	pssInCgroup bool
}

// total is the measure of the issue: the cgroup's charge plus the PSS.
func (m idleMemory) total() int64 { return m.cgroup + m.pss }

// unique is total without counting anything twice: the anonymous part of
// the PSS of processes in the cgroup is already in its charge.
func (m idleMemory) unique() int64 {
	if m.pssInCgroup {
		return m.cgroup + m.pss - m.pssAnon
	}
	return m.total()
}

// measureCgroup fills in m's cgroup figures from cgroup path.
func (m *idleMemory) measureCgroup(path string) error {
	var err error
	if m.cgroup, err = cgroupMemory(path); err != nil {
		return err
	}
	m.cgroupAnon, m.cgroupFile, err = cgroupStat(path)
	return err
}

// addPss adds process pid's PSS to m.
func (m *idleMemory) addPss(pid int) error {
	p, err := pss(pid)
	if err != nil {
		return err
	}
	m.pss += p.total
	m.pssAnon += p.anon
	m.pssFile += p.file
	return nil
}

// oursIdleMemory measures session id of the container provider: its
// cgroup (/tai42/ID) and the PSS of every process in it (the agent alone,
// when idle).
func oursIdleMemory(id string) (idleMemory, error) {
	path := "/tai42/" + id
	m := idleMemory{pssInCgroup: true}
	if err := m.measureCgroup(path); err != nil {
		return idleMemory{}, err
	}
	pids, err := cgroupProcs(path)
	if err != nil {
		return idleMemory{}, err
	}
	if len(pids) == 0 {
		return idleMemory{}, fmt.Errorf("session %s: no process in cgroup %s", id, path)
	}
	for _, pid := range pids {
		if err := m.addPss(pid); err != nil {
			return idleMemory{}, err
		}
	}
	return m, nil
}

// dockerIdleMemory measures the docker container whose init is pid: its
// memory cgroup, and the PSS of its parent, the containerd shim.
func dockerIdleMemory(pid int) (idleMemory, error) {
	path, err := procMemoryCgroup(pid)
	if err != nil {
		return idleMemory{}, err
	}
	var m idleMemory
	if err := m.measureCgroup(path); err != nil {
		return idleMemory{}, err
	}
	shim, err := parentPid(pid)
	if err != nil {
		return idleMemory{}, err
	}
	if c := comm(shim); !strings.HasPrefix(c, "containerd-shim") {
		return idleMemory{}, fmt.Errorf("the parent of the container's init %d is %d (%q), not a containerd shim", pid, shim, c)
	}
	if err := m.addPss(shim); err != nil {
		return idleMemory{}, err
	}
	return m, nil
}
