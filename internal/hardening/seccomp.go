package hardening

import (
	"runtime"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Errno values the profile returns, and the argument values its rules test.
// They are Linux's numbers, written out so that this package builds on any
// GOOS (the specs it produces are for Linux hosts); seccomp_linux_test.go
// checks each against golang.org/x/sys/unix.
const (
	errnoEPERM  = 1  // EPERM: what every refused call returns
	errnoENOSYS = 38 // ENOSYS: clone3's answer, so that libc falls back to clone

	// The socket families socket(2) may make. Every other family is
	// refused: AF_VSOCK (a channel to the hypervisor or host beside the
	// network namespace), AF_PACKET (raw frames; CAP_NET_RAW is dropped
	// anyway), and the rarely used families that have been a steady source
	// of kernel bugs (AF_ALG, AF_CAN, AF_RDS, AF_TIPC, AF_BLUETOOTH, AF_KEY,
	// AF_XDP, ...).
	afUNIX    = 1
	afINET    = 2
	afINET6   = 10
	afNETLINK = 16

	// cloneNamespaceFlags are the CLONE_NEW* flags clone(2) may not carry:
	// CLONE_NEWNS 0x00020000, CLONE_NEWCGROUP 0x02000000, CLONE_NEWUTS
	// 0x04000000, CLONE_NEWIPC 0x08000000, CLONE_NEWUSER 0x10000000,
	// CLONE_NEWPID 0x20000000, CLONE_NEWNET 0x40000000 (Docker's mask,
	// 2114060288). CLONE_NEWTIME (0x80) overlaps clone's exit-signal byte and
	// only takes effect through clone3 or unshare, both refused.
	cloneNamespaceFlags = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 |
		0x10000000 | 0x20000000 | 0x40000000

	// personality(2) values programs use: PER_LINUX, PER_LINUX32, UNAME26,
	// PER_LINUX32|UNAME26, and 0xffffffff, which only queries. Everything
	// else (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...)
	// weakens the process's own memory protections and is refused.
	perLinux       = 0x0
	perLinux32     = 0x8
	perUname26     = 0x0020000
	perLinux32U26  = perLinux32 | perUname26
	personalityGet = 0xffffffff
)

// allowedSyscalls are the calls allowed whatever their arguments, on both
// native architectures: Docker's default allowlist for a container without
// CAP_SYS_ADMIN, less io_uring (io_uring_setup, io_uring_enter,
// io_uring_register: a large kernel attack surface with a long run of
// privilege-escalation bugs; programs fall back to epoll/read/write) and
// less the calls that exist only in the 32-bit modes the profile does not
// cover (chown32, fcntl64, mmap2, socketcall, ipc, the *_time64 calls, ...),
// plus recent calls that only do what allowed calls already do (cachestat,
// fchmodat2, futex_wait, futex_wake, futex_requeue, map_shadow_stack,
// mseal). Every name is a system call of x86_64, of aarch64 or of both (a
// test checks it against golang.org/x/sys's tables); a runtime skips the
// names its architecture lacks (open, stat, ... on aarch64), and the names
// its libseccomp does not know (mseal, for Debian 12's libseccomp 2.5.4),
// and the call is then refused.
var allowedSyscalls = []string{
	"accept",
	"accept4",
	"access",
	"adjtimex", // reading the clock state; changing it needs CAP_SYS_TIME
	"alarm",
	"bind",
	"brk",
	"cachestat",
	"capget",
	"capset",
	"chdir",
	"chmod",
	"chown",
	"chroot", // CAP_SYS_CHROOT is kept; see the package doc
	"clock_adjtime",
	"clock_getres",
	"clock_gettime",
	"clock_nanosleep",
	"close",
	"close_range",
	"connect",
	"copy_file_range",
	"creat",
	"dup",
	"dup2",
	"dup3",
	"epoll_create",
	"epoll_create1",
	"epoll_ctl",
	"epoll_ctl_old",
	"epoll_pwait",
	"epoll_pwait2",
	"epoll_wait",
	"epoll_wait_old",
	"eventfd",
	"eventfd2",
	"execve",
	"execveat",
	"exit",
	"exit_group",
	"faccessat",
	"faccessat2",
	"fadvise64",
	"fallocate",
	"fanotify_mark",
	"fchdir",
	"fchmod",
	"fchmodat",
	"fchmodat2",
	"fchown",
	"fchownat",
	"fcntl",
	"fdatasync",
	"fgetxattr",
	"flistxattr",
	"flock",
	"fork",
	"fremovexattr",
	"fsetxattr",
	"fstat",
	"fstatfs",
	"fsync",
	"ftruncate",
	"futex",
	"futex_requeue",
	"futex_wait",
	"futex_waitv",
	"futex_wake",
	"futimesat",
	"get_robust_list",
	"get_thread_area",
	"getcpu",
	"getcwd",
	"getdents",
	"getdents64",
	"getegid",
	"geteuid",
	"getgid",
	"getgroups",
	"getitimer",
	"getpeername",
	"getpgid",
	"getpgrp",
	"getpid",
	"getppid",
	"getpriority",
	"getrandom",
	"getresgid",
	"getresuid",
	"getrlimit",
	"getrusage",
	"getsid",
	"getsockname",
	"getsockopt",
	"gettid",
	"gettimeofday",
	"getuid",
	"getxattr",
	"inotify_add_watch",
	"inotify_init",
	"inotify_init1",
	"inotify_rm_watch",
	"io_cancel",
	"io_destroy",
	"io_getevents",
	"io_pgetevents",
	"io_setup",
	"io_submit",
	"ioctl",
	"ioprio_get",
	"ioprio_set",
	"kill",
	"landlock_add_rule",
	"landlock_create_ruleset",
	"landlock_restrict_self",
	"lchown",
	"lgetxattr",
	"link",
	"linkat",
	"listen",
	"listxattr",
	"llistxattr",
	"lremovexattr",
	"lseek",
	"lsetxattr",
	"lstat",
	"madvise",
	"map_shadow_stack",
	"membarrier",
	"memfd_create",
	"memfd_secret",
	"mincore",
	"mkdir",
	"mkdirat",
	"mknod",   // FIFOs and sockets; device nodes need CAP_MKNOD, which is dropped
	"mknodat", // likewise
	"mlock",
	"mlock2",
	"mlockall",
	"mmap",
	"mprotect",
	"mq_getsetattr",
	"mq_notify",
	"mq_open",
	"mq_timedreceive",
	"mq_timedsend",
	"mq_unlink",
	"mremap",
	"mseal",
	"msgctl",
	"msgget",
	"msgrcv",
	"msgsnd",
	"msync",
	"munlock",
	"munlockall",
	"munmap",
	"name_to_handle_at", // harmless without open_by_handle_at, which is refused
	"nanosleep",
	"newfstatat",
	"open",
	"openat",
	"openat2",
	"pause",
	"pidfd_open",
	"pidfd_send_signal",
	"pipe",
	"pipe2",
	"pkey_alloc",
	"pkey_free",
	"pkey_mprotect",
	"poll",
	"ppoll",
	"prctl",
	"pread64",
	"preadv",
	"preadv2",
	"prlimit64",
	"process_mrelease",
	"pselect6",
	"pwrite64",
	"pwritev",
	"pwritev2",
	"read",
	"readahead",
	"readlink",
	"readlinkat",
	"readv",
	"recvfrom",
	"recvmmsg",
	"recvmsg",
	"remap_file_pages",
	"removexattr",
	"rename",
	"renameat",
	"renameat2",
	"restart_syscall",
	"rmdir",
	"rseq",
	"rt_sigaction",
	"rt_sigpending",
	"rt_sigprocmask",
	"rt_sigqueueinfo",
	"rt_sigreturn",
	"rt_sigsuspend",
	"rt_sigtimedwait",
	"rt_tgsigqueueinfo",
	"sched_get_priority_max",
	"sched_get_priority_min",
	"sched_getaffinity",
	"sched_getattr",
	"sched_getparam",
	"sched_getscheduler",
	"sched_rr_get_interval",
	"sched_setaffinity",
	"sched_setattr",
	"sched_setparam",
	"sched_setscheduler",
	"sched_yield",
	"seccomp", // a process may only add filters, never remove one
	"select",
	"semctl",
	"semget",
	"semop",
	"semtimedop",
	"sendfile",
	"sendmmsg",
	"sendmsg",
	"sendto",
	"set_robust_list",
	"set_thread_area",
	"set_tid_address",
	"setfsgid",
	"setfsuid",
	"setgid",
	"setgroups",
	"setitimer",
	"setpgid",
	"setpriority",
	"setregid",
	"setresgid",
	"setresuid",
	"setreuid",
	"setrlimit",
	"setsid",
	"setsockopt",
	"setuid",
	"setxattr",
	"shmat",
	"shmctl",
	"shmdt",
	"shmget",
	"shutdown",
	"sigaltstack",
	"signalfd",
	"signalfd4",
	"socketpair",
	"splice",
	"stat",
	"statfs",
	"statx",
	"symlink",
	"symlinkat",
	"sync",
	"sync_file_range",
	"syncfs",
	"sysinfo",
	"tee",
	"tgkill",
	"time",
	"timer_create",
	"timer_delete",
	"timer_getoverrun",
	"timer_gettime",
	"timer_settime",
	"timerfd_create",
	"timerfd_gettime",
	"timerfd_settime",
	"times",
	"tkill",
	"truncate",
	"umask",
	"uname",
	"unlink",
	"unlinkat",
	"utime",
	"utimensat",
	"utimes",
	"vfork",
	"vmsplice",
	"wait4",
	"waitid",
	"write",
	"writev",
}

// archSyscalls are the architecture-specific calls allowed on each GOARCH,
// as Docker allows them. aarch64 has none: the calls Docker lists for arm64
// (arm_fadvise64_64, arm_sync_file_range, breakpoint, cacheflush, set_tls,
// sync_file_range2) are 32-bit arm's, a mode the profile does not cover.
var archSyscalls = map[string][]string{
	"amd64": {"arch_prctl", "modify_ldt"},
}

// archs are the seccomp architectures a filter covers on each GOARCH: the
// native one alone. A call made in any other mode (x86 or x32 on amd64, arm
// on arm64) matches no architecture of the filter, and the runtime kills
// the process or refuses the call; the package doc says why.
var archs = map[string][]specs.Arch{
	"amd64": {specs.ArchX86_64},
	"arm64": {specs.ArchAARCH64},
}

// refusedSyscalls are native calls (each a system call of x86_64 or
// aarch64) the profile refuses (EPERM; clone3 ENOSYS) that a container
// escape or a kernel attack would want, listed so that tests and reviewers
// can check that none of them is allowed. The profile is an allowlist: every
// call not allowed is refused, listed here or not.
var refusedSyscalls = []string{
	"acct", "add_key", "bpf", "clock_settime", "clone3",
	"create_module", "delete_module", "finit_module", "fsconfig", "fsmount",
	"fsopen", "fspick", "get_kernel_syms", "get_mempolicy", "init_module",
	"io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm", "iopl",
	"kcmp", "kexec_file_load", "kexec_load", "keyctl", "listmount",
	"lookup_dcookie", "mbind", "mount", "mount_setattr", "move_mount",
	"move_pages", "migrate_pages", "nfsservctl", "open_by_handle_at",
	"open_tree", "perf_event_open", "pidfd_getfd", "pivot_root",
	"process_madvise", "process_vm_readv", "process_vm_writev", "ptrace",
	"query_module", "quotactl", "quotactl_fd", "reboot", "request_key",
	"set_mempolicy", "setdomainname", "sethostname", "setns", "settimeofday",
	"statmount", "swapoff", "swapon", "syslog", "umount2", "unshare",
	"uselib", "userfaultfd", "ustat", "vhangup", "_sysctl", "sysfs",
	"fanotify_init", "lsm_set_self_attr",
}

// Seccomp returns the default seccomp profile, a fresh value the caller may
// change: an allowlist whose default action is SCMP_ACT_ERRNO with EPERM,
// modelled on Docker's default profile for a container without
// CAP_SYS_ADMIN. It allows the calls of allowedSyscalls (and the
// architecture's own, archSyscalls), socket(2) for the families AF_UNIX,
// AF_INET, AF_INET6 and AF_NETLINK, clone(2) without any CLONE_NEW* flag,
// personality(2) with the values programs use, and answers clone3(2) with
// ENOSYS so that libc falls back to clone. The package doc lists what it
// refuses.
//
// Architectures holds the native architecture of runtime.GOARCH alone
// (amd64: x86_64; arm64: aarch64), none of its compatibility modes (x86,
// x32, arm); on any other GOARCH it is empty, which runtimes read as the
// native architecture alone. So 32-bit x86 and arm programs do not run in a
// session: the filter kills a process at its first system call in a mode it
// does not list (measured under runc and crun on amd64: a 386 program dies
// of SIGSYS, exit 159, before any output). That is deliberate, as the
// package doc details: with x86 listed, libseccomp turns the socket(2)
// family rules into an unchecked socketcall(SYS_SOCKET) rule, through which
// a 32-bit program made AF_VSOCK sockets (a channel to the hypervisor), and
// compiling the filter for three architectures instead of one slowed every
// container's start. Safe for concurrent use.
func Seccomp() *specs.LinuxSeccomp {
	return seccompFor(runtime.GOARCH)
}

func seccompFor(goarch string) *specs.LinuxSeccomp {
	eperm, enosys := uint(errnoEPERM), uint(errnoENOSYS)
	names := slices.Concat(allowedSyscalls, archSyscalls[goarch])
	slices.Sort(names)
	calls := []specs.LinuxSyscall{
		{Names: names, Action: specs.ActAllow},
		{
			// Allowed when (flags & cloneNamespaceFlags) == 0. amd64 and
			// arm64 both pass clone's flags first (s390 would not).
			Names:  []string{"clone"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: cloneNamespaceFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}},
		},
		{
			// clone3 passes its flags in memory, where a filter cannot look.
			Names:    []string{"clone3"},
			Action:   specs.ActErrno,
			ErrnoRet: &enosys,
		},
	}
	// Separate rules for one call are alternatives: any one that matches
	// allows it.
	for _, family := range []uint64{afUNIX, afINET, afINET6, afNETLINK} {
		calls = append(calls, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: family, Op: specs.OpEqualTo}},
		})
	}
	for _, v := range []uint64{perLinux, perLinux32, perUname26, perLinux32U26, personalityGet} {
		calls = append(calls, specs.LinuxSyscall{
			Names:  []string{"personality"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: v, Op: specs.OpEqualTo}},
		})
	}
	return &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   slices.Clone(archs[goarch]),
		Syscalls:        calls,
	}
}
