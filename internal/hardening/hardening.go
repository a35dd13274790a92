// Package hardening is the hardening half of each container session's OCI
// runtime config: the capabilities, the seccomp profile, no_new_privs and the
// /proc and /sys paths hidden or made read-only. Apply puts all of it on a
// spec; the other functions return the parts. Every function returns fresh
// values (the caller may change them) and is safe for concurrent use.
//
// The model is Docker's default (moby profiles/seccomp/default.json, runc's
// masked and read-only paths), tightened where a sandbox for untrusted code
// needs it. A session's PID 1 is root in the container but holds no user
// namespace, so each refusal below stands between a root process and the
// host's kernel.
//
// # Capabilities
//
// All capabilities are dropped but these twelve, the same set for bounding,
// effective and permitted; inheritable and ambient are empty, so an
// unprivileged program started in the session gains nothing on exec:
//
//   - CAP_CHOWN: chown(2) files of the session's own root and workspace
//     (package managers, tar, cp -a).
//   - CAP_DAC_OVERRIDE: root may read and write any file in the session
//     whatever its mode, as programs run as root expect.
//   - CAP_FOWNER: chmod, utime and xattrs on files root does not own (tar
//     extraction, package installs).
//   - CAP_FSETID: keep set-user/group-ID bits when root writes or chowns a
//     file.
//   - CAP_KILL: signal processes of other users, all of them inside the
//     session's PID namespace.
//   - CAP_SETGID, CAP_SETUID: switch to another user (su, setpriv, and the
//     programs that drop root for a worker, like apt's _apt sandbox).
//   - CAP_SETPCAP: drop capabilities from the bounding set and change
//     securebits, so that programs can shed privilege further.
//   - CAP_SETFCAP: set file capabilities (package installs that setcap a
//     binary). With no_new_privs set they grant nothing on exec.
//   - CAP_NET_BIND_SERVICE: bind ports below 1024 in the session's own
//     network namespace.
//   - CAP_SYS_CHROOT: chroot(2), used by build and packaging tools. The
//     session's root is a pivot_root'd mount namespace, whose root ".."
//     cannot climb above, so the classic chroot-and-chdir escape ends where
//     it began.
//   - CAP_AUDIT_WRITE: send user-space audit records (PAM's login, su and
//     sudo refuse to work when the audit socket answers EPERM). It lets a
//     session add records to the host's audit log while auditing is on;
//     controlling auditing needs CAP_AUDIT_CONTROL, which is dropped.
//
// Docker's default set also holds CAP_NET_RAW and CAP_MKNOD; both are
// dropped. CAP_NET_RAW allows raw and packet sockets, with which a session
// could forge packets (ICMP, ARP, spoofed sources) onto the bridge it shares
// with other sessions. ping(8) works without it through ICMP datagram
// sockets when the session's network namespace sets the sysctl
// net.ipv4.ping_group_range to include root (Docker sets "0 2147483647"), a
// setting of the caller's spec (Linux.Sysctl), not of Apply. CAP_MKNOD allows device nodes, and no session
// needs one that runc does not already create in /dev. Everything else stays
// dropped as in Docker: CAP_SYS_ADMIN (mounts, namespaces and most of the
// kernel's privileged interfaces), CAP_SYS_PTRACE, CAP_SYS_MODULE,
// CAP_SYS_RAWIO, CAP_SYS_BOOT, CAP_SYS_TIME, CAP_NET_ADMIN,
// CAP_DAC_READ_SEARCH (open_by_handle_at, the "shocker" escape),
// CAP_SYS_RESOURCE, CAP_BPF, CAP_PERFMON, CAP_SYSLOG and the rest.
//
// Root in a session is root on the host for the files it can reach: it can
// leave set-user-ID root binaries in its workspace. A provider must never
// execute from a workspace on the host side and should mount workspaces
// nosuid,nodev wherever the host or another session sees them.
//
// # Seccomp
//
// The profile (Seccomp) is an allowlist: any call it does not allow fails
// with EPERM. It covers the native architecture alone: x86_64 on amd64,
// aarch64 on arm64 (see "32-bit programs" below). Among what it refuses:
//
//   - mounts and namespaces: mount, umount2, pivot_root, the new mount API
//     (fsopen, fsmount, fspick, fsconfig, move_mount, open_tree,
//     mount_setattr), unshare, setns, and clone with any CLONE_NEW* flag;
//     clone3 gets ENOSYS (its flags live in memory a filter cannot read), so
//     libc falls back to clone;
//   - other processes' memory: ptrace, process_vm_readv, process_vm_writev,
//     process_madvise, pidfd_getfd, kcmp (Docker allows ptrace on kernels
//     from 4.8; a sandbox has no debugger to serve, so strace and gdb do not
//     work in a session);
//   - the kernel's programmable and privileged interfaces: bpf,
//     perf_event_open, userfaultfd, io_uring_setup, io_uring_enter,
//     io_uring_register (Docker allows io_uring), keyctl, add_key,
//     request_key, init_module, finit_module, delete_module, kexec_load,
//     kexec_file_load;
//   - the host's state: reboot, swapon, swapoff, acct, settimeofday,
//     clock_settime, sethostname, setdomainname, syslog, quotactl, iopl,
//     ioperm, vhangup, NUMA policy (mbind, set_mempolicy, get_mempolicy,
//     move_pages, migrate_pages), open_by_handle_at and obsolete calls
//     (uselib, ustat, sysfs, _sysctl, nfsservctl);
//   - sockets of any family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK:
//     no AF_VSOCK (a channel to the hypervisor or host that bypasses the
//     network namespace; this machine, a VM with a virtio-vsock device, has
//     one), no AF_PACKET, AF_ALG, AF_CAN, AF_RDS, AF_TIPC, AF_BLUETOOTH, ...
//     (Docker refuses only AF_VSOCK; the rare families are a steady source
//     of kernel bugs, and making their sockets loads their modules);
//   - personality(2) values other than PER_LINUX, PER_LINUX32, UNAME26,
//     their combination and the 0xffffffff query (no ADDR_NO_RANDOMIZE,
//     READ_IMPLIES_EXEC, ...).
//
// mknod stays allowed (FIFOs, sockets) because device nodes need the dropped
// CAP_MKNOD; raw AF_INET and AF_INET6 sockets are refused by the dropped
// CAP_NET_RAW.
//
// # 32-bit programs
//
// 32-bit x86 and arm programs do not run in a session. The profile lists no
// compatibility mode (no x86 or x32 on amd64, no arm on arm64), so a system
// call made in one matches no architecture of the filter, and the process
// is killed by SIGSYS at its first system call, before it can do anything
// (measured here on amd64 under runc 1.1.5 and crun 1.8.1 with libseccomp
// 2.5.4: a 386 program exits 159). This is deliberate, for two reasons,
// both measured here:
//
//   - A hole, Docker's too: 32-bit x86 socket calls can go through
//     socketcall(2), whose arguments sit in memory behind a pointer, and
//     libseccomp turns every rule for socket(2) into one that allows
//     socketcall(SYS_SOCKET) with the arguments unchecked (its condition on
//     the first argument is replaced by the call number). With x86 listed,
//     a 32-bit program made sockets of the refused families, AF_VSOCK, the
//     channel to this VM's hypervisor, included. No rule in an OCI profile
//     closes it: a socketcall rule of its own is overridden.
//   - Start time: the runtime compiles the filter for every architecture
//     listed, and with x86 and x32 beside x86_64 a container started
//     markedly slower: medians of `runc run /bin/true` of 51 to 57 ms
//     against 39 to 44 ms, of `crun run` 31 to 34 ms against 28 to 30 ms
//     (four runs of TestRunTimings on this 2-core VM).
//
// x32 is not built into this machine's kernel (CONFIG_X86_X32_ABI unset),
// so no x32 program runs here at all and that mode went unmeasured; on a
// kernel with it, its calls carry x86_64's architecture with the x32 bit
// set, which libseccomp's x86_64 filter does not take for x86_64 calls. A
// session that needs a 32-bit program must use a 64-bit build of it.
//
// # Paths
//
// MaskedPaths hides runc's and Docker's list of kernel interfaces that leak
// host information or act on the host (a file under /dev/null, a directory
// under an empty read-only tmpfs); ReadonlyPaths makes /proc/sys and its
// siblings read-only, so sysctls and /proc/sysrq-trigger cannot be written.
// Both act on the /proc and /sys the caller's spec mounts, which should
// mount /sys read-only. A path the host's kernel lacks is skipped (this
// machine's has no /proc/kcore and no /proc/sysrq-trigger).
//
// # What Apply does not set
//
// Apply never sets Process.OOMScoreAdj: root here lacks CAP_SYS_RESOURCE and
// a runtime fails to lower it. It adds no user namespace, AppArmor profile or
// SELinux label; the caller owns namespaces, mounts, cgroups and resources.
package hardening

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// keptCapabilities is the capability set of every session; the package doc
// says why each is kept.
var keptCapabilities = []string{
	"CAP_AUDIT_WRITE",
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_NET_BIND_SERVICE",
	"CAP_SETFCAP",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
}

// maskedPaths are runc's and Docker's defaults.
var maskedPaths = []string{
	"/proc/acpi",
	"/proc/asound",
	"/proc/interrupts",
	"/proc/kcore",
	"/proc/keys",
	"/proc/latency_stats",
	"/proc/sched_debug",
	"/proc/scsi",
	"/proc/timer_list",
	"/proc/timer_stats",
	"/sys/devices/virtual/powercap",
	"/sys/firmware",
}

// readonlyPaths are runc's and Docker's defaults.
var readonlyPaths = []string{
	"/proc/bus",
	"/proc/fs",
	"/proc/irq",
	"/proc/sys",
	"/proc/sysrq-trigger",
}

// Capabilities returns the capability sets of a session: the twelve
// capabilities the package doc lists (Docker's default less CAP_NET_RAW and
// CAP_MKNOD) as the bounding, effective and permitted sets, each its own
// slice; Inheritable and Ambient are nil, which runtimes apply as empty.
func Capabilities() *specs.LinuxCapabilities {
	return &specs.LinuxCapabilities{
		Bounding:  slices.Clone(keptCapabilities),
		Effective: slices.Clone(keptCapabilities),
		Permitted: slices.Clone(keptCapabilities),
	}
}

// MaskedPaths returns the paths the runtime hides: runc's and Docker's
// defaults (/proc/acpi, /proc/asound, /proc/interrupts, /proc/kcore,
// /proc/keys, /proc/latency_stats, /proc/sched_debug, /proc/scsi,
// /proc/timer_list, /proc/timer_stats, /sys/devices/virtual/powercap,
// /sys/firmware). Paths that do not exist on a host are skipped by the
// runtime.
func MaskedPaths() []string { return slices.Clone(maskedPaths) }

// ReadonlyPaths returns the paths the runtime makes read-only: /proc/bus,
// /proc/fs, /proc/irq, /proc/sys, /proc/sysrq-trigger.
func ReadonlyPaths() []string { return slices.Clone(readonlyPaths) }

// Apply puts the hardening on s: Process.NoNewPrivileges = true,
// Process.Capabilities = Capabilities(), Linux.Seccomp = Seccomp(),
// Linux.MaskedPaths = MaskedPaths(), Linux.ReadonlyPaths = ReadonlyPaths().
// It creates s.Process and s.Linux when they are nil, replaces those five
// fields (a caller adding paths of its own appends them after Apply), and
// leaves every other field alone; in particular it never sets
// Process.OOMScoreAdj. s must not be nil (Apply panics on a nil spec, a
// programming error). Apply does not synchronise: the caller must not use s
// concurrently.
func Apply(s *specs.Spec) {
	if s.Process == nil {
		s.Process = &specs.Process{}
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Process.NoNewPrivileges = true
	s.Process.Capabilities = Capabilities()
	s.Linux.Seccomp = Seccomp()
	s.Linux.MaskedPaths = MaskedPaths()
	s.Linux.ReadonlyPaths = ReadonlyPaths()
}
