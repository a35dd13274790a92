package hardening

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
)

// compatGOARCH is the 32-bit mode of each 64-bit GOARCH's kernel.
var compatGOARCH = map[string]string{"amd64": "386", "arm64": "arm"}

// compatArchs are the seccomp architectures of those modes, which the
// profile no longer lists.
var compatArchs = map[string][]specs.Arch{
	"amd64": {specs.ArchX86, specs.ArchX32},
	"arm64": {specs.ArchARM},
}

// compat32Syscalls are the calls of the 32-bit modes alone that the profile
// allowed while it covered them: Docker's names, on top of the native
// allowlist. With compatArchs they make the profile as it was before it
// went native-only, the "before" of the control and of the timing test.
var compat32Syscalls = map[string][]string{
	"amd64": {
		"_llseek", "_newselect", "chown32", "clock_adjtime64", "clock_getres_time64",
		"clock_gettime64", "clock_nanosleep_time64", "fadvise64_64", "fchown32",
		"fcntl64", "fstat64", "fstatat64", "fstatfs64", "ftruncate64", "futex_time64",
		"getegid32", "geteuid32", "getgid32", "getgroups32", "getresgid32",
		"getresuid32", "getuid32", "io_pgetevents_time64", "ipc", "lchown32",
		"lstat64", "mmap2", "mq_timedreceive_time64", "mq_timedsend_time64",
		"ppoll_time64", "pselect6_time64", "recv", "recvmmsg_time64",
		"rt_sigtimedwait_time64", "sched_rr_get_interval_time64",
		"semtimedop_time64", "send", "sendfile64", "setfsgid32", "setfsuid32",
		"setgid32", "setgroups32", "setregid32", "setresgid32", "setresuid32",
		"setreuid32", "setuid32", "sigprocmask", "sigreturn", "stat64", "statfs64",
		"timer_gettime64", "timer_settime64", "timerfd_gettime64",
		"timerfd_settime64", "truncate64", "ugetrlimit", "utimensat_time64", "waitpid",
	},
}

func init() {
	// arm's are amd64's (the 32-bit generic names) and arm's private calls.
	compat32Syscalls["arm64"] = slices.Concat(compat32Syscalls["amd64"],
		[]string{"arm_fadvise64_64", "arm_sync_file_range", "breakpoint", "cacheflush", "set_tls", "sync_file_range2"})
}

// withCompatModes turns a hardened spec's profile into the profile as it
// was before it went native-only: this GOARCH's 32-bit modes listed, and
// their calls allowed.
func withCompatModes(t *testing.T, s *specs.Spec) *specs.Spec {
	t.Helper()
	sc := s.Linux.Seccomp
	if len(sc.Syscalls) == 0 || sc.Syscalls[0].Action != specs.ActAllow || len(sc.Syscalls[0].Args) != 0 {
		t.Fatalf("the profile's first rule is %+v, not the unconditional allowlist", sc.Syscalls)
	}
	sc.Architectures = slices.Concat(sc.Architectures, compatArchs[runtime.GOARCH])
	sc.Syscalls[0].Names = slices.Concat(sc.Syscalls[0].Names, compat32Syscalls[runtime.GOARCH])
	return s
}

// compatSubcommands are the probe runs the 32-bit probe attempts inside:
// the vsock socket the native-only profile is there to stop, escapes the
// battery covers, and harmless work, all of which must fail alike.
var compatSubcommands = []string{"vsock", "threads", "mount", "unshare", "keyctl", "bpf", "rawsock", "hostname", "clone3"}

// sigsysExit is the exit status of a process killed by SIGSYS, as the
// runtimes and sh report it: 128 + 31 = 159.
const sigsysExit = 128 + int(unix.SIGSYS)

const probe32Inside = "/probe32"

// TestCompat32 runs the escape probe built for this machine's 32-bit mode
// (386 on amd64, arm on arm64) in a hardened container under each runtime.
// The profile lists the native architecture alone, so the process must be
// killed by SIGSYS at its first system call: it prints nothing, in
// particular no AF_VSOCK socket made, whatever it was asked to do. The
// controls show the binary runs in 32-bit mode on the host and, under the
// profile as it was with the 32-bit modes listed, in the same container,
// where it reaches AF_VSOCK through socketcall: the hole this closes. The
// test fails when a 32-bit architecture is put back into the profile.
func TestCompat32(t *testing.T) {
	goarch, ok := compatGOARCH[runtime.GOARCH]
	if !ok {
		t.Skipf("no 32-bit mode known for GOARCH %s", runtime.GOARCH)
	}
	probe := escapeprobetest.BuildFor(t, goarch)
	if out, err := exec.Command(probe, "threads").CombinedOutput(); err != nil {
		t.Skipf("this kernel does not run %s binaries (%v: %s): no 32-bit program can run in a session either", goarch, err, out)
	}
	// Whether this host's kernel makes AF_VSOCK sockets at all, asked of the
	// native probe, and whether the 32-bit one does outside any container
	// (a socket made and closed).
	vsockHere := probeOnHost(t, escapeprobetest.Build(t), "vsock").OK
	if vsock32 := probeOnHost(t, probe, "vsock"); vsock32.OK != vsockHere {
		t.Fatalf("on the host the 32-bit probe's vsock gives %+v, the native one ok=%v", vsock32, vsockHere)
	}
	t.Logf("this host makes AF_VSOCK sockets: %v", vsockHere)

	// One shell (native busybox, the container's PID 1) runs each
	// subcommand and reports its exit status and output on one line.
	var script strings.Builder
	for _, c := range compatSubcommands {
		fmt.Fprintf(&script, "out=$(%s %s 2>&1); echo \"%s $? $out\"\n", probe32Inside, c, c)
	}
	noCore := func(s *specs.Spec) *specs.Spec {
		// SIGSYS dumps core: not into the rootfs.
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_CORE"})
		return s
	}

	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		root := privateRootfs(t)
		if err := copyFile(probe, filepath.Join(root, probe32Inside[1:]), 0o755); err != nil {
			t.Fatal(err)
		}

		t.Run("as PID 1", func(t *testing.T) {
			r := rt.run(t, noCore(hardenedSpec(root, true, probe32Inside, "vsock")))
			if r.code != sigsysExit || r.stdout != "" {
				t.Errorf("the 32-bit probe's vsock: exit %d, stdout %q, stderr %q; want exit %d (SIGSYS) and no output",
					r.code, r.stdout, r.stderr, sigsysExit)
			}
		})

		t.Run("each subcommand", func(t *testing.T) {
			r := rt.run(t, noCore(hardenedSpec(root, true, "/bin/sh", "-c", script.String())))
			if r.code != 0 {
				t.Fatalf("the shell: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
			}
			if strings.Contains(r.stdout, `"ok":true`) {
				t.Errorf("a 32-bit probe run succeeded:\n%s", r.stdout)
			}
			lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
			if len(lines) != len(compatSubcommands) {
				t.Fatalf("%d lines, want one per subcommand %v:\n%s", len(lines), compatSubcommands, r.stdout)
			}
			for i, line := range lines {
				want := compatSubcommands[i] + " " + strconv.Itoa(sigsysExit) + " "
				if line != want {
					t.Errorf("got %q, want %q: killed by SIGSYS before any output", line, want)
				}
			}
		})

		t.Run("control: with the 32-bit modes listed", func(t *testing.T) {
			before := func() *specs.Spec { return noCore(withCompatModes(t, hardenedSpec(root, true))) }
			succeeded(t, rt.probe(t, before(), probe32Inside, "threads"))
			p := rt.probe(t, before(), probe32Inside, "vsock")
			switch {
			case vsockHere && !p.OK:
				t.Errorf("got %+v; want the AF_VSOCK socket that socketcall lets through, the hole the native-only profile closes", p)
			case !vsockHere && p.Err == "EPERM":
				t.Errorf("got %+v; without a vsock transport the kernel, not the filter, should refuse", p)
			}
		})
	})
}
