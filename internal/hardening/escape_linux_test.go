package hardening

// The escape battery: the probe, inside a hardened container run by runc
// and by crun, attempts what a session must not do, and the control runs
// prove that each attempt succeeds where the hardening is absent, so that
// a refusal seen here is the hardening's work and not the probe's failure.

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// namespaceFlags are the probe's unshare items.
var namespaceFlags = []string{
	"CLONE_NEWUSER", "CLONE_NEWNS", "CLONE_NEWNET", "CLONE_NEWPID",
	"CLONE_NEWIPC", "CLONE_NEWUTS", "CLONE_NEWCGROUP", "CLONE_NEWTIME",
}

// escapeCase is one probe run and what it must show.
type escapeCase struct {
	name  string
	args  []string // the container's process
	check func(t *testing.T, p probeResult)
}

// refusedAll wants every attempt refused with errno.
func refusedAll(errno string, wantItems ...string) func(*testing.T, probeResult) {
	return func(t *testing.T, p probeResult) {
		t.Helper()
		if p.OK {
			t.Fatalf("succeeded: %+v", p)
		}
		items := p.items()
		for _, name := range wantItems {
			if items[name] != errno {
				t.Errorf("%s = %q, want %s (detail %q)", name, items[name], errno, p.Detail)
			}
		}
		if len(items) != len(wantItems) {
			t.Errorf("attempts %v, want exactly %v", items, wantItems)
		}
	}
}

// refused wants a single attempt refused with errno.
func refused(errno string) func(*testing.T, probeResult) {
	return func(t *testing.T, p probeResult) {
		t.Helper()
		if p.OK || p.Err != errno {
			t.Fatalf("got %+v, want refused with %s", p, errno)
		}
	}
}

func succeeded(t *testing.T, p probeResult) {
	t.Helper()
	if !p.OK || p.Err != "" {
		t.Fatalf("got %+v, want success", p)
	}
}

func probeCmd(args ...string) []string { return append([]string{probeInside}, args...) }

// underShell runs the probe as a child of a shell that stays PID 1.
func underShell(args ...string) []string { return underShellAt(probeInside, args...) }

func underShellAt(probe string, args ...string) []string {
	return []string{"/bin/sh", "-c", probe + " " + strings.Join(args, " ") + "; :"}
}

// hardenedCases are the battery, for the probe at probe inside the
// container.
func hardenedCases(t *testing.T, probe string) []escapeCase {
	probeCmd := func(args ...string) []string { return append([]string{probe}, args...) }
	underShell := func(args ...string) []string { return underShellAt(probe, args...) }
	unshareItems := make([]string, 0, 2*len(namespaceFlags))
	for _, f := range namespaceFlags {
		unshareItems = append(unshareItems, "unshare("+f+")", "clone("+f+")")
	}
	wantCaps, ok := capMask(Capabilities().Effective)
	if !ok {
		t.Fatalf("unknown capability name in %v", Capabilities().Effective)
	}
	cases := []escapeCase{
		{"mount", probeCmd("mount"), refusedAll("EPERM", "tmpfs", "bind", "proc", "fsopen")},
		{"unshare", probeCmd("unshare"), func(t *testing.T, p probeResult) {
			if p.OK {
				t.Fatalf("a namespace was made: %+v", p)
			}
			items := p.items()
			for _, name := range unshareItems {
				want := "EPERM"
				if name == "clone(CLONE_NEWTIME)" {
					want = "ENOSYS" // Go makes this child with clone3
				}
				if items[name] != want {
					t.Errorf("%s = %q, want %s", name, items[name], want)
				}
			}
		}},
		{"ptrace pid 1", underShell("ptrace", "1"), refusedAll("EPERM", "PTRACE_SEIZE", "PTRACE_ATTACH")},
		{"setns", probeCmd("setns"), refusedAll("EPERM", "net", "uts", "ipc", "pid", "mnt", "cgroup", "user", "time")},
		{"raw sockets", probeCmd("rawsock"), refusedAll("EPERM", "AF_INET/SOCK_RAW/ICMP", "AF_INET6/SOCK_RAW/ICMPV6", "AF_PACKET/SOCK_RAW")},
		{"vsock", probeCmd("vsock"), refused("EPERM")},
		{"keyctl", probeCmd("keyctl"), refusedAll("EPERM", "keyctl", "add_key", "request_key")},
		{"bpf", probeCmd("bpf"), refused("EPERM")},
		{"kernel modules", probeCmd("kmod"), refusedAll("EPERM", "init_module", "finit_module")},
		{"mknod devices", probeCmd("mknod"), refusedAll("EPERM", "char-1:3", "block-7:0")},
		{"sysrq-trigger", probeCmd("sysrq"), onHostOr("/proc/sysrq-trigger", refused("EROFS"))},
		{"proc sys read-only", probeCmd("write", "/proc/sys/kernel/hostname"), refused("EROFS")},
		{"sethostname", probeCmd("hostname"), refused("EPERM")},
		{"clone3", probeCmd("clone3"), refused("ENOSYS")},
		{"kcore masked", probeCmd("read", "/proc/kcore"), onHostOr("/proc/kcore", readsEmpty)},
		{"keys masked", probeCmd("read", "/proc/keys"), onHostOr("/proc/keys", readsEmpty)},
		{"timer_list masked", probeCmd("read", "/proc/timer_list"), onHostOr("/proc/timer_list", readsEmpty)},
		{"cgroup write", probeCmd("cgroup-write"), func(t *testing.T, p probeResult) {
			if p.OK || p.Err != "EROFS" {
				t.Fatalf("got %+v, want every open and mkdir refused with EROFS", p)
			}
			var files, opened, made int
			var errs string
			if _, err := fmt.Sscanf(p.Detail, "files=%d opened=%d mkdir=%d errors=%s", &files, &opened, &made, &errs); err != nil {
				t.Fatalf("detail %q: %v", p.Detail, err)
			}
			if files == 0 || opened != 0 || made != 0 || strings.Contains(strings.ReplaceAll(errs, "EROFS", ""), "E") {
				t.Errorf("files %d, opened %d, made %d, errors %s; want files > 0, none opened or made, only EROFS", files, opened, made, errs)
			}
		}},
		{"chroot escape", probeCmd("chroot-escape"), refused("stayed inside")},
		{"status", probeCmd("read", "/proc/self/status"), func(t *testing.T, p probeResult) {
			if !p.OK {
				t.Fatalf("reading status: %+v", p)
			}
			st := statusFields(p.Detail)
			for field, want := range map[string]string{"NoNewPrivs": "1", "Seccomp": "2", "CapInh": "0", "CapAmb": "0"} {
				if st[field] != want {
					t.Errorf("%s = %q, want %s", field, st[field], want)
				}
			}
			for _, field := range []string{"CapEff", "CapPrm", "CapBnd"} {
				got, err := strconv.ParseUint(st[field], 16, 64)
				if err != nil || got != wantCaps {
					t.Errorf("%s = %q, want %016x", field, st[field], wantCaps)
				}
			}
		}},
		{"pids", underShell("pids"), func(t *testing.T, p probeResult) {
			if !p.OK {
				t.Fatalf("listing pids: %+v", p)
			}
			lines := strings.Split(p.Detail, "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "1 /bin/sh -c") || !strings.Contains(lines[1], probe+" pids") {
				t.Errorf("processes seen: %q; want only the shell as PID 1 and the probe", lines)
			}
		}},
		{"listen on a privileged port", probeCmd("listen", "127.0.0.1:80"), succeeded},
		{"write to the read-only root", probeCmd("write", "/etc/escapeprobe"), refused("EROFS")},
		{"write to tmp", probeCmd("write", "/tmp/escapeprobe"), succeeded},
		{"threads", probeCmd("threads"), succeeded},
	}
	for _, pc := range []struct {
		value string
		ok    bool
	}{
		{"0", true}, {"8", true}, {"0x20000", true}, {"0x20008", true}, {"0xffffffff", true},
		{"0x0040000", false}, // ADDR_NO_RANDOMIZE
		{"0x0400000", false}, // READ_IMPLIES_EXEC
		{"0x0100000", false}, // MMAP_PAGE_ZERO
	} {
		check := succeeded
		if !pc.ok {
			check = refused("EPERM")
		}
		cases = append(cases, escapeCase{"personality " + pc.value, probeCmd("personality", pc.value), check})
	}
	return cases
}

// readsEmpty wants a successful empty read: the file is /dev/null.
func readsEmpty(t *testing.T, p probeResult) {
	t.Helper()
	if !p.OK || p.Detail != "" {
		t.Fatalf("got %+v, want an empty read (/dev/null)", p)
	}
}

// onHostOr applies check when the host has path; a kernel without it (this
// host's has no /proc/kcore or /proc/sysrq-trigger) has nothing to hide,
// and the container must not have it either.
func onHostOr(path string, check func(*testing.T, probeResult)) func(*testing.T, probeResult) {
	if _, err := os.Stat(path); err == nil {
		return check
	}
	return func(t *testing.T, p probeResult) {
		t.Helper()
		t.Logf("the host's kernel has no %s: checking that the container has none either", path)
		refused("ENOENT")(t, p)
	}
}

// hostCapabilities are the capabilities of this process's bounding set,
// which a container of its making can hold at most.
func hostCapabilities(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	bnd, err := strconv.ParseUint(statusFields(string(b))["CapBnd"], 16, 64)
	if err != nil {
		t.Fatalf("CapBnd: %v", err)
	}
	var names []string
	for name, bit := range capNumbers {
		if bnd&(1<<bit) != 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// statusFields parses /proc/PID/status.
func statusFields(status string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			v = strings.TrimSpace(v)
			if strings.HasPrefix(k, "Cap") {
				v = strings.TrimLeft(v, "0")
				if v == "" {
					v = "0"
				}
			}
			m[k] = v
		}
	}
	return m
}

func TestEscapeBattery(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		root := sharedRootfs(t)
		for _, c := range hardenedCases(t, probeInside) {
			t.Run(c.name, func(t *testing.T) {
				c.check(t, rt.probe(t, hardenedSpec(root, true), c.args...))
			})
		}
	})
}

// TestControl runs the probe in a container without the hardening (every
// capability this process holds, no seccomp, nothing masked or read-only):
// each attempt the battery sees refused succeeds here, which shows that the
// probe would notice an escape.
func TestControl(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		root := sharedRootfs(t)
		all := hostCapabilities(t)
		control := func() *specs.Spec {
			s := baseSpec(root, true)
			s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: all, Effective: all, Permitted: all}
			return s
		}
		item := func(name, want string) func(*testing.T, probeResult) {
			return func(t *testing.T, p probeResult) {
				if got := p.items()[name]; got != want {
					t.Errorf("%s = %q, want %s (detail %q)", name, got, want, p.Detail)
				}
			}
		}
		notEPERM := func(t *testing.T, p probeResult) {
			if p.Err == "EPERM" || strings.Contains(p.Detail, "=EPERM") {
				t.Errorf("got %+v; without the hardening nothing answers EPERM", p)
			}
		}
		cases := []escapeCase{
			{"mount", probeCmd("mount"), item("tmpfs", "OK")},
			{"unshare", probeCmd("unshare"), func(t *testing.T, p probeResult) {
				for _, f := range namespaceFlags {
					item("unshare("+f+")", "OK")(t, p)
					item("clone("+f+")", "OK")(t, p)
				}
			}},
			{"ptrace pid 1", underShell("ptrace", "1"), item("PTRACE_ATTACH", "OK")},
			{"setns", probeCmd("setns"), item("net", "OK")},
			{"raw sockets", probeCmd("rawsock"), item("AF_INET/SOCK_RAW/ICMP", "OK")},
			{"vsock", probeCmd("vsock"), notEPERM},
			{"keyctl", probeCmd("keyctl"), item("add_key", "OK")},
			{"bpf", probeCmd("bpf"), notEPERM},
			{"kernel modules", probeCmd("kmod"), notEPERM},
			{"mknod devices", probeCmd("mknod"), item("char-1:3", "OK")},
			{"sysrq-trigger", probeCmd("sysrq"), onHostOr("/proc/sysrq-trigger", succeeded)},
			{"sethostname", probeCmd("hostname"), succeeded},
			{"clone3", probeCmd("clone3"), succeeded},
			{"personality ADDR_NO_RANDOMIZE", probeCmd("personality", "0x0040000"), succeeded},
			{"keys", probeCmd("stat", "/proc/keys"), func(t *testing.T, p probeResult) {
				if !p.OK || !strings.HasPrefix(p.Detail, "type=file") {
					t.Errorf("got %+v, want the real /proc/keys", p)
				}
			}},
			{"status", probeCmd("read", "/proc/self/status"), func(t *testing.T, p probeResult) {
				st := statusFields(p.Detail)
				if st["NoNewPrivs"] != "0" || st["Seccomp"] != "0" {
					t.Errorf("NoNewPrivs %q, Seccomp %q; want 0, 0", st["NoNewPrivs"], st["Seccomp"])
				}
			}},
			// Every capability does not get a process out of a pivot_root'd
			// mount namespace by chroot alone.
			{"chroot escape", probeCmd("chroot-escape"), refused("stayed inside")},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				c.check(t, rt.probe(t, control(), c.args...))
			})
		}
	})
}

// TestMaskedPaths checks inside the container that every masked path the
// host has is hidden: a file behind /dev/null (character device 1:3), a
// directory behind an empty tmpfs.
func TestMaskedPaths(t *testing.T) {
	var script strings.Builder
	var onHost []string
	for _, p := range MaskedPaths() {
		if _, err := os.Stat(p); err == nil {
			onHost = append(onHost, p)
		}
		fmt.Fprintf(&script, `p=%s; if [ -d $p ]; then echo "$p dir $(ls -A $p | wc -l)"; elif [ -e $p ]; then echo "$p $(stat -c '%%F %%t:%%T' $p)"; else echo "$p absent"; fi; `, p)
	}
	var files, dirs int
	for _, p := range onHost {
		if fi, _ := os.Stat(p); fi.IsDir() {
			dirs++
		} else {
			files++
		}
	}
	if files == 0 || dirs == 0 {
		t.Fatalf("the host has %v of the masked paths: too few files or directories for the test to prove much", onHost)
	}
	t.Logf("masked paths on this host: %v", onHost)
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		r := rt.run(t, hardenedSpec(sharedRootfs(t), true, "/bin/sh", "-c", script.String()))
		if r.code != 0 {
			t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
		}
		seen := map[string]string{}
		for line := range strings.SplitSeq(strings.TrimSpace(r.stdout), "\n") {
			p, state, _ := strings.Cut(line, " ")
			seen[p] = state
		}
		for _, p := range onHost {
			switch seen[p] {
			case "dir 0", "character special file 1:3":
			default:
				t.Errorf("%s is %q inside, want masked", p, seen[p])
			}
		}
	})
}

// TestReadonlyPaths checks in the container's mountinfo that each read-only
// path the host has is a read-only mount.
func TestReadonlyPaths(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		p := rt.probe(t, hardenedSpec(sharedRootfs(t), true), probeCmd("read", "/proc/self/mountinfo")...)
		if !p.OK {
			t.Fatalf("reading mountinfo: %+v", p)
		}
		opts := map[string]string{} // mount point -> per-mount options, the last mount winning
		for line := range strings.SplitSeq(p.Detail, "\n") {
			f := strings.Fields(line)
			if len(f) > 5 {
				opts[f[4]] = f[5]
			}
		}
		for _, path := range ReadonlyPaths() {
			if _, err := os.Stat(path); err != nil {
				continue
			}
			o, ok := opts[path]
			if !ok || !slices.Contains(strings.Split(o, ","), "ro") {
				t.Errorf("%s: mount options %q (mounted: %v), want a read-only mount", path, o, ok)
			}
		}
		if o := opts["/sys"]; !slices.Contains(strings.Split(o, ","), "ro") {
			t.Errorf("/sys mount options %q, want ro", o)
		}
	})
}

// TestNetworkIsolation: a listener on the host's loopback is out of reach
// from the container's own network namespace. Only loopback is dialled.
func TestNetworkIsolation(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted sync.WaitGroup
	var mu sync.Mutex
	conns := 0
	accepted.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns++
			mu.Unlock()
			c.Close()
		}
	})
	t.Cleanup(func() {
		l.Close()
		accepted.Wait()
	})
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		p := rt.probe(t, hardenedSpec(sharedRootfs(t), true), probeCmd("dial", l.Addr().String())...)
		if p.OK || p.Err != "ECONNREFUSED" {
			t.Errorf("dialling the host's %s from inside: %+v, want ECONNREFUSED (the container's own loopback)", l.Addr(), p)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if conns != 0 {
		t.Errorf("the host's listener accepted %d connections from containers", conns)
	}
}

// TestWritableRoot: with a writable root the container writes its own
// rootfs, and the hardening still holds.
func TestWritableRoot(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		root := privateRootfs(t)
		succeeded(t, rt.probe(t, hardenedSpec(root, false), probeCmd("write", "/etc/escapeprobe")...))
		if b, err := os.ReadFile(filepath.Join(root, "etc", "escapeprobe")); err != nil || string(b) != "tai42-escapeprobe\n" {
			t.Errorf("the rootfs holds %q, %v; want the probe's line", b, err)
		}
		refusedAll("EPERM", "tmpfs", "bind", "proc", "fsopen")(t, rt.probe(t, hardenedSpec(root, false), probeCmd("mount")...))
	})
}

// TestNormalPrograms: the hardening leaves ordinary work alone: a shell
// with pipes, subshells, background jobs and FIFOs, coreutils, sleeping,
// the clock, fork and exec, and a multi-threaded Go program.
func TestNormalPrograms(t *testing.T) {
	script := `set -e
echo hello world | tr a-z A-Z
seq 1 100 | grep 7 | wc -l
(echo a; echo c; echo b) | sort -r | head -n 1
ls /bin | grep -c '^busybox$'
test "$(date +%Y)" -ge 2024 && echo clock-ok
sleep 0.05 && echo slept
for i in 1 2 3 4 5 6 7 8; do /bin/true & done; wait; echo forked
mkfifo /tmp/fifo; (echo through-fifo > /tmp/fifo &); cat /tmp/fifo
echo data > /tmp/file; cat /tmp/file
id -u
cat /proc/self/status | grep -c '^NoNewPrivs:	1$'
` + probeInside + ` threads
` + probeInside + ` listen 127.0.0.1:0 | grep -c '"ok":true'
`
	want := `HELLO WORLD
19
c
1
clock-ok
slept
forked
through-fifo
data
0
1
{"ok":true,"err":"","detail":"threads=8 distinct-tids=8"}
1
`
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		r := rt.run(t, hardenedSpec(sharedRootfs(t), true, "/bin/sh", "-c", script))
		if r.code != 0 || r.stdout != want {
			t.Errorf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", r.code, r.stdout, want, r.stderr)
		}
	})
}
