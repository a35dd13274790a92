package container

import (
	"encoding/json"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/tai42/sandbox/internal/hardening"
)

// In-container paths.
const (
	workspaceDir = "/workspace"
	agentPath    = "/.tai42/agent"
)

// ociVersion is the config's runtime-spec version: crun 1.8.1 refuses any
// version it does not know ("1.3.0" among them); the fields used here are
// all in 1.0.2.
const ociVersion = "1.0.2"

// cfsPeriodUS is the CFS period a cpu cap is a quota of.
const cfsPeriodUS = 100000

// bind is a read-only bind mount of a host path into the container.
type bind struct{ source, dest string }

// specInput is what one session's OCI config is made of.
type specInput struct {
	remap       bool      // a user namespace of UserNamespaceBase's mapping
	userns      string    // when remapped, the user namespace to join; "": the runtime makes it
	limits      []string  // when the runtime makes it, its limits (see limitsHook)
	tmpfs       bool      // /tmp is a tmpfs (no disk cap); else a directory of the root's upper layer
	sysfs       string    // when remapped, the session's sysfs, mounted
	rootfs      string    // the session's root overlay, mounted
	workspace   string    // the host directory bind-mounted at /workspace
	agent       agentLoad // the tai42 binary, its loader and libraries, bound read-only
	netns       string    // the network namespace to join
	binds       []bind    // the host image's read-only views
	resolvConf  string    // the file bound read-only at /etc/resolv.conf; "" for none
	hostname    string
	cgroupsPath string
	cpu         float64
	memoryMB    int
	pids        int64
}

// buildSpec is the session's container: the agent as PID 1 (through its
// own loader and libraries when it is dynamically linked) in new pid,
// ipc, uts, mount and cgroup namespaces (and a user namespace when
// remapped), the session's network namespace, a private /tmp (a tmpfs
// without a disk cap; with one, a directory of the root's upper layer, on
// the session's disk), the
// workspace, the caps as cgroup limits, and the hardening (no new
// privileges, a seccomp allowlist, few capabilities, masked and read-only
// /proc paths).
func buildSpec(in specInput) *specs.Spec {
	s := &specs.Spec{
		Version:  ociVersion,
		Root:     &specs.Root{Path: in.rootfs},
		Hostname: in.hostname,
		Process: &specs.Process{
			Args: in.agent.args(),
			// One P: the agent idles in every session and its work is
			// I/O; a P's caches are a quarter megabyte of each session's
			// memory. (Commands get the environment their request gives,
			// not this one.)
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GOMAXPROCS=1"},
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: workspaceDir, Type: "bind", Source: in.workspace, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			{Destination: agentPath, Type: "bind", Source: in.agent.binary, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: in.cgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.CgroupNamespace},
				{Type: specs.NetworkNamespace, Path: in.netns},
			},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Pids:    &specs.LinuxPids{Limit: &in.pids},
			},
		},
	}
	if in.remap {
		ids := []specs.LinuxIDMapping{{ContainerID: 0, HostID: UserNamespaceBase, Size: UserNamespaceSize}}
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: in.userns})
		s.Linux.UIDMappings, s.Linux.GIDMappings = ids, ids
		if in.userns == "" && len(in.limits) > 0 {
			s.Hooks = &specs.Hooks{CreateContainer: []specs.Hook{limitsHook(in.limits)}}
		}
		// The provider mounted the sysfs, which the user namespace could
		// not (see prepareNetns).
		for i := range s.Mounts {
			if s.Mounts[i].Destination == "/sys" {
				s.Mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: in.sysfs, Options: []string{"bind", "ro", "nosuid", "noexec", "nodev"}}
			}
		}
	}
	for _, b := range in.agent.libs {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: b.dest, Type: "bind", Source: b.source, Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	if in.tmpfs {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}})
	}
	for _, b := range in.binds {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: b.dest, Type: "bind", Source: b.source, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if in.resolvConf != "" {
		// Over the image's own (the host image's copy names the host's
		// resolvers, which the egress fences refuse).
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: in.resolvConf, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	if in.memoryMB > 0 {
		limit := int64(in.memoryMB) << 20
		// Swap equal to the limit: memory+swap may not exceed the memory
		// limit, so nothing is swapped (cgroups v1 memsw; v2 swap.max 0).
		s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	}
	if in.cpu > 0 {
		quota := int64(in.cpu * cfsPeriodUS)
		period := uint64(cfsPeriodUS)
		s.Linux.Resources.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	hardening.Apply(s)
	return s
}

// writeSpec writes s as dir/config.json.
func writeSpec(dir string, s *specs.Spec) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}
