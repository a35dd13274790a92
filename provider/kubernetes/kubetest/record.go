package kubetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tai42/sandbox/internal/imagestore/registrytest"
)

// stateRecord is what the running cluster made, for the next Start to
// sweep if this one dies without its Close (SIGKILL, a crash) or its
// Close failed part of the way.
const stateRecord = MachineLock + ".state"

// record is stateRecord's content: the run's own names (a later run may
// use other ones) and the processes it started, each by PID and start
// time, so that the sweep ends those and no process that took a PID
// since.
type record struct {
	State      string `json:"state"`
	OwnState   bool   `json:"ownState"` // Start made State: the sweep removes it (a given one is emptied)
	Bridge     string `json:"bridge"`
	CgroupRoot string `json:"cgroupRoot"`
	// BridgeNF is bridge-nf-call-iptables's value before the enforcer
	// set it ("": it was 1 already, or no enforcer ran).
	BridgeNF string `json:"bridgeNF,omitempty"`
	// Enforcer: kube-router ran, its chains and sets are to be removed.
	Enforcer bool         `json:"enforcer,omitempty"`
	Procs    []recordProc `json:"procs"`
}

type recordProc struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // StartTime
}

// parseRecord reads stateRecord's content; an older harness's record
// is the state directory's path alone.
func parseRecord(b []byte) (record, bool) {
	var r record
	if err := json.Unmarshal(b, &r); err == nil {
		return r, r.State != ""
	}
	old := strings.TrimSpace(string(b))
	return record{State: old, OwnState: strings.HasPrefix(filepath.Base(old), "kubetest-")}, old != "" && filepath.IsAbs(old)
}

// saveRecord writes c's record (whole, by a rename: a run killed while
// writing leaves the last one).
func (c *Cluster) saveRecord() error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	b, err := json.Marshal(c.rec)
	if err != nil {
		return err
	}
	tmp := stateRecord + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, stateRecord)
}

// recordProc adds a process c started to its record.
func (c *Cluster) recordProc(name string, pid int, start uint64) error {
	c.recMu.Lock()
	c.rec.Procs = append(c.rec.Procs, recordProc{Name: name, PID: pid, Start: start})
	c.recMu.Unlock()
	return c.saveRecord()
}

// StartTime is the start time of process pid (field 22 of
// /proc/PID/stat, clock ticks after boot): with the PID it names one
// process, not whichever reuses the PID later.
func StartTime(pid int) (uint64, error) {
	start, _, err := procStat(pid)
	return start, err
}

// procStat is pid's start time and state (R, S, Z, ...).
func procStat(pid int) (uint64, byte, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, 0, err
	}
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(f))
	}
	start, err := strconv.ParseUint(f[19], 10, 64) // field 22; f[0] is field 3
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: start time %q: %w", pid, f[19], err)
	}
	return start, f[0][0], nil
}

// statFields are the fields of /proc/PID/stat after the command (field
// 2), which is in parentheses and may hold any byte: they are counted
// after its last ')'. The first is field 3.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// runs says whether the process pid started at start still runs (a
// zombie has exited).
func runs(pid int, start uint64) bool {
	s, state, err := procStat(pid)
	return err == nil && s == start && state != 'Z'
}

// killRecorded kills (SIGKILL) the recorded processes that still run,
// each by its PID and only if its start time is the recorded one, and
// waits up to 10s for them to exit.
func killRecorded(procs []recordProc) error {
	for _, p := range procs {
		if p.PID > 1 && runs(p.PID, p.Start) {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, p := range procs {
			if p.PID > 1 && runs(p.PID, p.Start) {
				left = append(left, fmt.Sprintf("%s (pid %d)", p.Name, p.PID))
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still running after SIGKILL: %s", strings.Join(left, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shimPIDs are the running shims of the containerd whose files are in
// state, found from its own records: each task's bundle holds init.pid,
// its container's first process, whose parent is its shim (the runc v2
// shim is its containers' subreaper; containerd 1.6's writes no
// shim.pid). A parent counts only if it started after that containerd
// (at containerdStart) and is a shim serving its socket: a stale PID may
// be another process's by now. A shim whose containers all exited is
// not found: the caller looks while they run.
func shimPIDs(state string, containerdStart uint64) []recordProc {
	files, _ := filepath.Glob(filepath.Join(state, "containerd/state/io.containerd.runtime.v2.task/*/*/init.pid"))
	want := []byte("-address\x00" + filepath.Join(state, "containerd/containerd.sock") + "\x00")
	seen := map[int]bool{}
	var shims []recordProc
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		initPID, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || initPID <= 1 {
			continue
		}
		pid := ppid(initPID)
		if pid <= 1 || seen[pid] {
			continue
		}
		start, st, err := procStat(pid)
		if err != nil || st == 'Z' || start < containerdStart {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte("containerd-shim")) || !bytes.Contains(cmdline, want) {
			continue
		}
		seen[pid] = true
		shims = append(shims, recordProc{Name: "containerd-shim", PID: pid, Start: start})
	}
	return shims
}

// shimSockets are the sockets of the shims of the containerd whose files
// are in state, as each task's bundle names it (its address file):
// containerd 1.6 makes them under /run/containerd/s whatever its state
// directory, and a shim killed leaves its socket there.
func shimSockets(state string) []string {
	files, _ := filepath.Glob(filepath.Join(state, "containerd/state/io.containerd.runtime.v2.task/*/*/address"))
	var socks []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sock := strings.TrimPrefix(strings.TrimSpace(string(b)), "unix://")
		if filepath.Dir(sock) == "/run/containerd/s" {
			socks = append(socks, sock)
		}
	}
	return socks
}

// removeSockets removes the shims' sockets (once the shims are gone).
func removeSockets(socks []string) error {
	var errs []error
	for _, s := range socks {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// procStart is the recorded start time of the process named name (0:
// none).
func (r record) procStart(name string) uint64 {
	for _, p := range r.Procs {
		if p.Name == name {
			return p.Start
		}
	}
	return 0
}

// registryPID finds the registry registrytest.Run just started for c:
// a child of this process running registrytest.Binary with its files
// under dir (registrytest keeps its *exec.Cmd to itself).
func registryPID(dir string) (int, uint64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != registrytest.Binary {
			continue
		}
		if ppid(pid) != self {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(dir+"/")) {
			continue
		}
		start, err := StartTime(pid)
		if err != nil {
			continue
		}
		return pid, start, nil
	}
	return 0, 0, errors.New("the registry's process is not among this process's children")
}

// ppid is pid's parent's PID (0 when it cannot be read).
func ppid(pid int) int {
	f, err := statFields(pid)
	if err != nil || len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// sweepStale removes what a dead run (or a Close that failed part of
// the way) left, by its record: the processes it started that still run
// (its registry and containerd's shims outlive it: they are not killed
// with their parent), its pods' processes (in its cgroup root), its
// mounts (its pods' network namespaces among them), its bridge and the
// bridge's veths, the sysctl its enforcer set and its enforcer's chains
// and sets, its log links, its state directory (removed if Start made
// it, else emptied, as Close does).
func sweepStale(r record) error {
	// The shims are found first, while their containers run (the
	// cgroups' removal below kills those).
	shims, socks := shimPIDs(r.State, r.procStart("containerd")), shimSockets(r.State)
	errs := []error{killRecorded(append(r.Procs, shims...))}
	errs = append(errs, removeSockets(socks))
	if r.CgroupRoot != "" {
		errs = append(errs, removeCgroupRoot(r.CgroupRoot))
	}
	old := &Cluster{StateDir: r.State}
	errs = append(errs, old.unmountAll())
	if r.Bridge != "" {
		errs = append(errs, deleteBridge(r.Bridge))
	}
	if r.BridgeNF != "" {
		errs = append(errs, os.WriteFile(bridgeNF, []byte(r.BridgeNF), 0o644))
	}
	if r.Enforcer {
		errs = append(errs, cleanKubeRouter())
	}
	old.removeLogLinks()
	if r.OwnState {
		errs = append(errs, os.RemoveAll(r.State))
	} else if entries, err := os.ReadDir(r.State); err == nil {
		for _, e := range entries {
			errs = append(errs, os.RemoveAll(filepath.Join(r.State, e.Name())))
		}
	}
	return errors.Join(errs...)
}
