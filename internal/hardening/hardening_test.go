package hardening

import (
	"encoding/json"
	"runtime"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// wantCapabilities is the documented set: Docker's default less CAP_NET_RAW
// and CAP_MKNOD.
var wantCapabilities = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP",
	"CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
}

func TestCapabilities(t *testing.T) {
	c := Capabilities()
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		got := slices.Sorted(slices.Values(set))
		if !slices.Equal(got, wantCapabilities) {
			t.Errorf("%s = %v, want %v", name, got, wantCapabilities)
		}
	}
	if len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
		t.Errorf("inheritable %v, ambient %v; want both empty", c.Inheritable, c.Ambient)
	}
	for _, dropped := range []string{"CAP_NET_RAW", "CAP_MKNOD", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_MODULE",
		"CAP_DAC_READ_SEARCH", "CAP_NET_ADMIN", "CAP_SYS_RAWIO", "CAP_SYS_RESOURCE", "CAP_BPF", "CAP_PERFMON"} {
		if slices.Contains(c.Bounding, dropped) {
			t.Errorf("%s is in the bounding set", dropped)
		}
	}
	// Each set is its own slice, and each call a fresh value.
	c.Bounding[0] = "CAP_SYS_ADMIN"
	if c.Effective[0] == "CAP_SYS_ADMIN" || c.Permitted[0] == "CAP_SYS_ADMIN" || slices.Contains(Capabilities().Bounding, "CAP_SYS_ADMIN") {
		t.Error("capability sets share storage")
	}
}

func TestPaths(t *testing.T) {
	masked := MaskedPaths()
	for _, p := range []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap", "/proc/interrupts"} {
		if !slices.Contains(masked, p) {
			t.Errorf("MaskedPaths lacks %s", p)
		}
	}
	ro := ReadonlyPaths()
	for _, p := range []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"} {
		if !slices.Contains(ro, p) {
			t.Errorf("ReadonlyPaths lacks %s", p)
		}
	}
	masked[0], ro[0] = "changed", "changed"
	if MaskedPaths()[0] == "changed" || ReadonlyPaths()[0] == "changed" {
		t.Error("path lists share storage between calls")
	}
}

// allowRules returns the profile's unconditional allow rule and every other
// rule by call name.
func allowRules(t *testing.T, s *specs.LinuxSeccomp) (unconditional map[string]bool, conditional map[string][]specs.LinuxSyscall) {
	t.Helper()
	unconditional, conditional = map[string]bool{}, map[string][]specs.LinuxSyscall{}
	for _, r := range s.Syscalls {
		if len(r.Names) == 0 {
			t.Errorf("rule without names: %+v", r)
		}
		for _, n := range r.Names {
			if r.Action == specs.ActAllow && len(r.Args) == 0 {
				if unconditional[n] {
					t.Errorf("%s is allowed twice", n)
				}
				unconditional[n] = true
				continue
			}
			conditional[n] = append(conditional[n], r)
		}
	}
	return unconditional, conditional
}

func TestSeccompProfile(t *testing.T) {
	s := seccompFor("amd64")
	if s.DefaultAction != specs.ActErrno || s.DefaultErrnoRet == nil || *s.DefaultErrnoRet != errnoEPERM {
		t.Fatalf("default action %s errno %v, want SCMP_ACT_ERRNO with EPERM", s.DefaultAction, s.DefaultErrnoRet)
	}
	if want := []specs.Arch{specs.ArchX86_64}; !slices.Equal(s.Architectures, want) {
		t.Errorf("architectures %v, want %v: the native one alone (the package doc says why)", s.Architectures, want)
	}
	allowed, conditional := allowRules(t, s)

	for _, n := range refusedSyscalls {
		if allowed[n] {
			t.Errorf("%s is allowed", n)
		}
		for _, r := range conditional[n] {
			if r.Action == specs.ActAllow {
				t.Errorf("%s is allowed when %+v", n, r.Args)
			}
		}
	}
	for _, n := range []string{"read", "write", "openat", "execve", "mmap", "futex", "rt_sigreturn", "exit_group",
		"wait4", "pipe2", "epoll_pwait", "arch_prctl", "chroot", "mknodat", "sched_yield", "getrandom"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed; normal programs need it", n)
		}
	}

	// Each conditional call has exactly its documented rules.
	for n, rules := range conditional {
		switch n {
		case "socket":
			// One rule per family allowed, by equality.
			var families []uint64
			for _, r := range rules {
				if r.Action != specs.ActAllow || len(r.Args) != 1 || r.Args[0].Index != 0 || r.Args[0].Op != specs.OpEqualTo {
					t.Errorf("socket rule %+v, want allow when arg0 == family", r)
					continue
				}
				families = append(families, r.Args[0].Value)
			}
			slices.Sort(families)
			if want := []uint64{1, 2, 10, 16}; !slices.Equal(families, want) { // AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
				t.Errorf("socket families %v, want %v", families, want)
			}
		case "clone":
			want := []specs.LinuxSeccompArg{{Index: 0, Value: 2114060288, ValueTwo: 0, Op: specs.OpMaskedEqual}}
			if len(rules) != 1 || rules[0].Action != specs.ActAllow || !slices.Equal(rules[0].Args, want) {
				t.Errorf("clone rules %+v, want allowed without namespace flags (Docker's mask)", rules)
			}
		case "clone3":
			if len(rules) != 1 || rules[0].Action != specs.ActErrno || rules[0].ErrnoRet == nil || *rules[0].ErrnoRet != errnoENOSYS || len(rules[0].Args) != 0 {
				t.Errorf("clone3 rules %+v, want ENOSYS", rules)
			}
		case "personality":
			var values []uint64
			for _, r := range rules {
				if r.Action != specs.ActAllow || len(r.Args) != 1 || r.Args[0].Index != 0 || r.Args[0].Op != specs.OpEqualTo {
					t.Errorf("personality rule %+v, want allow when arg0 == value", r)
					continue
				}
				values = append(values, r.Args[0].Value)
			}
			slices.Sort(values)
			if want := []uint64{0, 8, 0x20000, 0x20008, 0xffffffff}; !slices.Equal(values, want) {
				t.Errorf("personality values %#x, want %#x", values, want)
			}
		default:
			t.Errorf("unexpected conditional rules for %s: %+v", n, rules)
		}
	}
	if _, err := json.Marshal(s); err != nil {
		t.Fatal(err)
	}
}

func TestSeccompArchitectures(t *testing.T) {
	arm, _ := allowRules(t, seccompFor("arm64"))
	amd, _ := allowRules(t, seccompFor("amd64"))
	if arm["arch_prctl"] || arm["modify_ldt"] || !amd["arch_prctl"] || !amd["modify_ldt"] {
		t.Errorf("arch_prctl, modify_ldt allowed on arm64 %v %v, on amd64 %v %v; want amd64's alone",
			arm["arch_prctl"], arm["modify_ldt"], amd["arch_prctl"], amd["modify_ldt"])
	}
	if len(arm) != len(amd)-2 {
		t.Errorf("arm64 allows %d calls unconditionally, amd64 %d; want amd64's less its two own", len(arm), len(amd))
	}
	if got := seccompFor("arm64").Architectures; !slices.Equal(got, []specs.Arch{specs.ArchAARCH64}) {
		t.Errorf("arm64 architectures %v, want aarch64 alone", got)
	}
	other := seccompFor("riscv64")
	if len(other.Architectures) != 0 {
		t.Errorf("riscv64 architectures %v, want none (the native one)", other.Architectures)
	}
	if got := Seccomp().Architectures; !slices.Equal(got, archs[runtime.GOARCH]) {
		t.Errorf("Seccomp() architectures %v, want this GOARCH's %v", got, archs[runtime.GOARCH])
	}
}

func TestSeccompFresh(t *testing.T) {
	a := Seccomp()
	*a.DefaultErrnoRet = 99
	a.Syscalls[0].Names[0] = "changed"
	a.Syscalls = a.Syscalls[:1]
	b := Seccomp()
	if *b.DefaultErrnoRet != errnoEPERM || b.Syscalls[0].Names[0] == "changed" || len(b.Syscalls) == 1 {
		t.Error("Seccomp values share storage between calls")
	}
	if slices.Contains(allowedSyscalls, "changed") {
		t.Error("Seccomp exposed the package's table")
	}
}

func TestApply(t *testing.T) {
	t.Run("empty spec", func(t *testing.T) {
		var s specs.Spec
		Apply(&s)
		if s.Process == nil || s.Linux == nil {
			t.Fatal("Apply left Process or Linux nil")
		}
		checkApplied(t, &s)
		if s.Process.OOMScoreAdj != nil {
			t.Errorf("Apply set OOMScoreAdj to %d", *s.Process.OOMScoreAdj)
		}
	})
	t.Run("keeps the rest", func(t *testing.T) {
		oom := 500
		s := specs.Spec{
			Version:  "1.0.2",
			Hostname: "h",
			Process:  &specs.Process{Args: []string{"/bin/true"}, OOMScoreAdj: &oom, Cwd: "/w"},
			Linux: &specs.Linux{
				Namespaces:  []specs.LinuxNamespace{{Type: specs.PIDNamespace}},
				MaskedPaths: []string{"/replaced"},
				CgroupsPath: "/x",
			},
		}
		Apply(&s)
		checkApplied(t, &s)
		if s.Process.OOMScoreAdj != &oom || oom != 500 {
			t.Error("Apply touched OOMScoreAdj")
		}
		if !slices.Equal(s.Process.Args, []string{"/bin/true"}) || s.Process.Cwd != "/w" || s.Hostname != "h" ||
			len(s.Linux.Namespaces) != 1 || s.Linux.CgroupsPath != "/x" || s.Version != "1.0.2" {
			t.Errorf("Apply changed other fields: %+v %+v", s.Process, s.Linux)
		}
		if slices.Contains(s.Linux.MaskedPaths, "/replaced") {
			t.Error("Apply merged MaskedPaths; it replaces them")
		}
	})
}

func checkApplied(t *testing.T, s *specs.Spec) {
	t.Helper()
	if !s.Process.NoNewPrivileges {
		t.Error("NoNewPrivileges not set")
	}
	if s.Process.Capabilities == nil || !slices.Equal(slices.Sorted(slices.Values(s.Process.Capabilities.Effective)), wantCapabilities) {
		t.Errorf("capabilities %+v", s.Process.Capabilities)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno {
		t.Errorf("seccomp %+v", s.Linux.Seccomp)
	}
	if !slices.Equal(s.Linux.MaskedPaths, MaskedPaths()) || !slices.Equal(s.Linux.ReadonlyPaths, ReadonlyPaths()) {
		t.Errorf("masked %v, read-only %v", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
}
