//go:build linux

// Command escapeprobe is a tiny static program the escape tests run inside a
// container: it attempts one thing a sandboxed process should (or should
// not) be able to do and says how that went. internal/escapeprobe/escapeprobetest
// builds it (CGO_ENABLED=0, so it runs in a rootfs with no libc).
//
// Usage: escapeprobe SUBCOMMAND [ARG]. It prints exactly one JSON line
//
//	{"ok":bool,"err":"...","detail":"..."}
//
// and exits 0, whatever the attempt's outcome; it exits 1 only on bad usage,
// a malformed PID or VALUE included (after printing a JSON line whose err
// starts "usage: ", and the usage on stderr).
// ok is true when the attempt succeeded; for a subcommand that makes several
// attempts, when any of them did. err is empty when every attempt succeeded,
// otherwise the first failure: the errno's name ("EPERM", "EROFS", ...) when
// the failure is an errno, else the error's text. detail says more: for
// several attempts, space-separated NAME=RESULT items, RESULT being OK or
// the errno's name.
//
// Every attempt undoes what it did when it succeeds (unmounts, closes,
// removes, detaches), and none of them changes anything outside the
// container when the container holds: sysrq and cgroup-write only open
// files for writing and write nothing, hostname sets the current name again,
// kmod offers the kernel an empty module. Only write writes, to the path the
// caller names.
//
// Subcommands:
//
//	read PATH        read a file (detail: its first 64 KiB)
//	write PATH       create or truncate PATH and write a line to it
//	stat PATH        lstat PATH (detail: type, mode, size, rdev)
//	pids             list /proc's processes (detail: "PID CMDLINE" lines)
//	ptrace PID       PTRACE_SEIZE then PTRACE_ATTACH PID, detaching after each
//	unshare          for each namespace flag, unshare(2) it and clone(2)
//	                 with it, each in a child that then execs this program
//	setns            open each /proc/1/ns/* and setns(2) into it
//	mount            mount a tmpfs, a bind of / and a proc on a temp dir,
//	                 and fsopen(2) a tmpfs
//	rawsock          socket(2) raw AF_INET ICMP, AF_INET6 ICMPv6, AF_PACKET
//	vsock            socket(2) AF_VSOCK
//	dial ADDR        TCP connect to ADDR, 2 s timeout (detail: took=DURATION,
//	                 measured here, as for the other network subcommands)
//	udp ADDR         send a datagram to ADDR and wait 2 s for its echo
//	ping ADDR        ICMP echo to the IPv4 ADDR on an ICMP datagram socket
//	dns QUERY        ask NAME[@SERVER][*N] for A records (miekg/dns; SERVER
//	                 defaults to resolv.conf's first; N times in a row):
//	                 detail rcode=, addrs=, took= per query
//	resolve NAME     look NAME up with Go's resolver (detail: addresses)
//	download ADDR    connect to ADDR, read to EOF (detail: bytes=, took=)
//	nft TABLE        over NETLINK_NETFILTER, list nftables' tables, then
//	                 delete the inet table TABLE (of the probe's namespace)
//	routing          add a route, an address and a policy rule (192.0.2.0/24,
//	                 undone when made), set eth0 up
//	spoof SRC>DST    send UDP to DST from SRC, bound with IP_FREEBIND, and
//	                 with IP_TRANSPARENT
//	listen ADDR      listen on ADDR and connect to it once
//	keyctl           keyctl(GET_KEYRING_ID), add_key to the process
//	                 keyring, request_key without an upcall
//	bpf              bpf(BPF_MAP_CREATE) of a one-entry array
//	chroot-escape    chroot into a new directory, chdir("..") 64 times,
//	                 chroot("."): ok when the final root differs from the
//	                 starting root
//	mknod            mknod a character (1:3) and a block (7:0) device node
//	sysrq            open /proc/sysrq-trigger for writing (writes nothing)
//	kmod             init_module and finit_module of an empty module
//	hostname         sethostname(2) to the current host name
//	cgroup-write     open every file under /sys/fs/cgroup for writing
//	                 (writes nothing) and mkdir a child cgroup in each
//	                 hierarchy (removed when made)
//	threads          run 8 OS threads at once (detail: distinct thread ids)
//	clone3           clone3(2) with an invalid size: ok when the call
//	                 reaches the kernel (EINVAL), err ENOSYS when a filter
//	                 answers for it
//	personality VAL  personality(2) to VAL (decimal or 0x hex), then back
//	fsadmin PATH     on the filesystem of PATH: ioctl FITRIM of an empty
//	                 range, ioctl EXT4_IOC_RESIZE_FS to its statfs block
//	                 count (never more than it has: a shrink, which ext4
//	                 refuses), quotactl(Q_SYNC) of every filesystem and
//	                 quotactl_fd(Q_GETINFO) of PATH's (detail: each one's
//	                 errno; ok when any succeeded)
//	inotify N:DIR    inotify_init1 until it fails, as root and then as
//	                 uids 1 to N-1 in turn (each a user of its own in the
//	                 kernel's per-user counts), holding every instance;
//	                 write the detail to DIR/held, wait (20 s at most) for
//	                 DIR/release, then close them (detail: root=N others=N
//	                 total=N err=ERRNO; ok when any opened)
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// result is the one JSON line the probe prints.
type result struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	Detail string `json:"detail"`
}

type command struct {
	arg string // the argument's name, or "" for none
	run func(arg string) result
}

// commands are the subcommands by name; set in init because usage, which
// lists them, is called from some of them.
var commands map[string]command

func init() {
	commands = map[string]command{
		"read":          {"PATH", readFile},
		"write":         {"PATH", writeFile},
		"stat":          {"PATH", statPath},
		"pids":          {"", listPids},
		"ptrace":        {"PID", ptraceAttach},
		"unshare":       {"", unshareAll},
		"setns":         {"", setnsAll},
		"mount":         {"", mountAll},
		"rawsock":       {"", rawSockets},
		"vsock":         {"", vsockSocket},
		"dial":          {"ADDR", dial},
		"udp":           {"ADDR", udpEcho},
		"ping":          {"ADDR", ping},
		"dns":           {"QUERY", dnsQuery},
		"resolve":       {"NAME", resolve},
		"download":      {"ADDR", download},
		"nft":           {"TABLE", nftables},
		"routing":       {"", routing},
		"spoof":         {"SRC>DST", spoof},
		"listen":        {"ADDR", listen},
		"keyctl":        {"", keyctl},
		"bpf":           {"", bpfMapCreate},
		"chroot-escape": {"", chrootEscape},
		"mknod":         {"", mknodDevices},
		"sysrq":         {"", sysrq},
		"kmod":          {"", kmod},
		"hostname":      {"", hostname},
		"cgroup-write":  {"", cgroupWrite},
		"threads":       {"", threads},
		"clone3":        {"", clone3},
		"personality":   {"VALUE", personality},
		"fsadmin":       {"PATH", fsAdmin},
		"inotify":       {"N:DIR", inotifyHold},
	}
}

// nopCommand is what unshare's children exec: it exits 0 and prints nothing.
const nopCommand = "_nop"

func main() {
	if len(os.Args) == 2 && os.Args[1] == nopCommand {
		os.Exit(0)
	}
	if len(os.Args) < 2 {
		usage("no subcommand")
	}
	c, ok := commands[os.Args[1]]
	switch {
	case !ok:
		usage(fmt.Sprintf("unknown subcommand %q", os.Args[1]))
	case c.arg == "" && len(os.Args) != 2:
		usage(fmt.Sprintf("%s takes no argument", os.Args[1]))
	case c.arg != "" && len(os.Args) != 3:
		usage(fmt.Sprintf("%s takes one argument, %s", os.Args[1], c.arg))
	}
	var arg string
	if c.arg != "" {
		arg = os.Args[2]
	}
	emit(c.run(arg))
}

func emit(r result) {
	line, err := json.Marshal(r)
	if err != nil { // cannot happen: three plain fields
		panic(err)
	}
	os.Stdout.Write(append(line, '\n'))
}

func usage(why string) {
	emit(result{Err: "usage: " + why})
	names := make([]string, 0, len(commands))
	for n, c := range commands {
		if c.arg != "" {
			n += " " + c.arg
		}
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "escapeprobe: %s\nusage: escapeprobe SUBCOMMAND [ARG]; subcommands:\n  %s\n", why, strings.Join(names, "\n  "))
	os.Exit(1)
}

// errName names err: the errno's name when err is or wraps an errno.
func errName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return n
		}
		return fmt.Sprintf("errno%d", int(errno))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return err.Error()
}

func single(err error, detail string) result {
	if err != nil {
		return result{Err: errName(err), Detail: detail}
	}
	return result{OK: true, Detail: detail}
}

// attempts gathers the outcomes of a subcommand's several attempts.
type attempts struct {
	items    []string
	ok       bool
	firstErr string
}

func (a *attempts) add(name string, err error) {
	if err == nil {
		a.ok = true
		a.items = append(a.items, name+"=OK")
		return
	}
	e := strings.ReplaceAll(errName(err), " ", "_")
	a.items = append(a.items, name+"="+e)
	if a.firstErr == "" {
		a.firstErr = e
	}
}

func (a *attempts) result() result {
	return result{OK: a.ok, Err: a.firstErr, Detail: strings.Join(a.items, " ")}
}

// scratchDir makes a new directory in the first writable temporary place.
func scratchDir(pattern string) (string, error) {
	var firstErr error
	for _, base := range []string{os.TempDir(), "/tmp", "/dev/shm", "/run"} {
		d, err := os.MkdirTemp(base, pattern)
		if err == nil {
			return d, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return "", firstErr
}

const readLimit = 64 << 10

func readFile(path string) result {
	f, err := os.Open(path)
	if err != nil {
		return single(err, "")
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, readLimit))
	return single(err, string(b))
}

const writeContent = "tai42-escapeprobe\n"

func writeFile(path string) result {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return single(err, "")
	}
	n, err := f.WriteString(writeContent)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return single(err, fmt.Sprintf("wrote %d bytes", n))
}

func statPath(path string) result {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return single(err, "")
	}
	var kind string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		kind = "file"
	case unix.S_IFDIR:
		kind = "dir"
	case unix.S_IFCHR:
		kind = "char"
	case unix.S_IFBLK:
		kind = "block"
	case unix.S_IFLNK:
		kind = "symlink"
	case unix.S_IFIFO:
		kind = "fifo"
	case unix.S_IFSOCK:
		kind = "socket"
	}
	return single(nil, fmt.Sprintf("type=%s mode=%04o size=%d rdev=%d:%d",
		kind, st.Mode&0o7777, st.Size, unix.Major(st.Rdev), unix.Minor(st.Rdev)))
}

func listPids(string) result {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return single(err, "")
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	lines := make([]string, 0, len(pids))
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue // gone since the listing
		}
		cmd := strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
		lines = append(lines, fmt.Sprintf("%d %s", pid, cmd))
	}
	return single(nil, strings.Join(lines, "\n"))
}

// ptraceAttach tries PTRACE_SEIZE and PTRACE_ATTACH on pid, each followed,
// when it succeeds, by a stop, a wait and PTRACE_DETACH, so that the tracee
// runs on. ptrace binds the tracer to one thread, so it all happens on one.
func ptraceAttach(arg string) result {
	pid, err := strconv.Atoi(arg)
	if err != nil || pid <= 0 {
		usage(fmt.Sprintf("bad PID %q", arg))
	}
	var a attempts
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		err := unix.PtraceSeize(pid)
		if err == nil {
			if unix.PtraceInterrupt(pid) == nil {
				waitStop(pid)
			}
			_ = unix.PtraceDetach(pid)
		}
		a.add("PTRACE_SEIZE", err)
		err = unix.PtraceAttach(pid)
		if err == nil {
			waitStop(pid)
			_ = unix.PtraceDetach(pid)
		}
		a.add("PTRACE_ATTACH", err)
	}()
	<-done
	return a.result()
}

func waitStop(pid int) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// namespaces are the CLONE_NEW* flags, by name.
var namespaces = []struct {
	name string
	flag uintptr
}{
	{"CLONE_NEWUSER", unix.CLONE_NEWUSER},
	{"CLONE_NEWNS", unix.CLONE_NEWNS},
	{"CLONE_NEWNET", unix.CLONE_NEWNET},
	{"CLONE_NEWPID", unix.CLONE_NEWPID},
	{"CLONE_NEWIPC", unix.CLONE_NEWIPC},
	{"CLONE_NEWUTS", unix.CLONE_NEWUTS},
	{"CLONE_NEWCGROUP", unix.CLONE_NEWCGROUP},
	{"CLONE_NEWTIME", unix.CLONE_NEWTIME},
}

// unshareAll tries each namespace flag twice, each time in a child that
// then execs this program's nop: unshare(2) after the fork (a Go process has
// many threads, and unshare(CLONE_NEWUSER) needs a single one), and clone(2)
// with the flag (Go uses clone3 for CLONE_NEWTIME). An error from the fork
// is the kernel's (or the filter's) answer.
func unshareAll(string) result {
	var a attempts
	for _, ns := range namespaces {
		a.add("unshare("+ns.name+")", runNop(&syscall.SysProcAttr{Unshareflags: ns.flag}))
		a.add("clone("+ns.name+")", runNop(&syscall.SysProcAttr{Cloneflags: ns.flag}))
	}
	return a.result()
}

// runNop starts a child with attr's namespace flags and reaps it. Go's fork
// reports a failure of the child's clone or unshare as Start's error, before
// any exec, so a child that started made its namespace. How it then exits
// does not matter: after unshare(CLONE_NEWPID) the exec'd Go runtime cannot
// start threads (the kernel refuses CLONE_THREAD while the children's PID
// namespace differs from the process's own) and dies.
func runNop(attr *syscall.SysProcAttr) error {
	cmd := exec.Command("/proc/self/exe", nopCommand)
	cmd.SysProcAttr = attr
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return err
	}
	_ = cmd.Wait()
	return nil
}

// setnsAll opens each of /proc/1/ns/* and tries setns(2) into it, each on a
// thread of its own that dies afterwards, so that a namespace joined does not
// leak into the rest of the probe. A multi-threaded process cannot join a
// mount or user namespace (EINVAL) even where it is allowed to.
func setnsAll(string) result {
	var a attempts
	for _, ns := range []string{"net", "uts", "ipc", "pid", "mnt", "cgroup", "user", "time"} {
		fd, err := unix.Open("/proc/1/ns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			a.items = append(a.items, ns+"=open-"+errName(err))
			if a.firstErr == "" {
				a.firstErr = errName(err)
			}
			continue
		}
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
			errc <- unix.Setns(fd, 0)
		}()
		a.add(ns, <-errc)
		unix.Close(fd)
	}
	return a.result()
}

func mountAll(string) result {
	dir, err := scratchDir("escapeprobe-mnt")
	if err != nil {
		return single(err, "no directory to mount on")
	}
	defer os.Remove(dir)
	var a attempts
	try := func(name, source, fstype string, flags uintptr) {
		err := unix.Mount(source, dir, fstype, flags, "")
		if err == nil {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
		a.add(name, err)
	}
	try("tmpfs", "tmpfs", "tmpfs", 0)
	try("bind", "/", "", unix.MS_BIND)
	try("proc", "proc", "proc", 0)
	fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	a.add("fsopen", err)
	return a.result()
}

func rawSockets(string) result {
	var a attempts
	try := func(name string, domain, typ, proto int) {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd) // nothing is ever sent
		}
		a.add(name, err)
	}
	try("AF_INET/SOCK_RAW/ICMP", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	try("AF_INET6/SOCK_RAW/ICMPV6", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
	try("AF_PACKET/SOCK_RAW", unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	return a.result()
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func vsockSocket(string) result {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return single(err, "")
}

const dialTimeout = 2 * time.Second

// listen listens on addr and proves it by connecting to itself and passing
// one byte.
func listen(addr string) result {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return single(err, "")
	}
	defer l.Close()
	bound := l.Addr().String()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			accepted <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(dialTimeout))
		_, err = c.Write([]byte{'x'})
		accepted <- err
	}()
	c, err := net.DialTimeout("tcp", bound, dialTimeout)
	if err != nil {
		return single(err, "listening on "+bound+"; connecting to it failed")
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dialTimeout))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return single(err, "listening on "+bound+"; no byte came back")
	}
	if err := <-accepted; err != nil {
		return single(err, "listening on "+bound+"; accepting failed")
	}
	return single(nil, "listening on "+bound+"; connected to it")
}

func keyctl(string) result {
	var a attempts
	_, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	a.add("keyctl", err)
	_, err = unix.AddKey("user", "tai42-escapeprobe", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	a.add("add_key", err)
	// A NULL callout: an absent key fails with ENOKEY instead of starting
	// /sbin/request-key on the host.
	typ, desc := cstr("user"), cstr("tai42-escapeprobe-absent")
	dest := int32(unix.KEY_SPEC_PROCESS_KEYRING) // a key_serial_t, negative
	_, _, errno := unix.Syscall6(unix.SYS_REQUEST_KEY, uintptr(unsafe.Pointer(typ)), uintptr(unsafe.Pointer(desc)),
		0, uintptr(dest), 0, 0)
	a.add("request_key", errnoErr(errno))
	return a.result()
}

func cstr(s string) *byte {
	p, err := unix.BytePtrFromString(s)
	if err != nil { // only for a NUL inside s; the callers' constants have none
		panic(err)
	}
	return p
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func bpfMapCreate(string) result {
	// union bpf_attr for BPF_MAP_CREATE starts map_type, key_size,
	// value_size, max_entries (u32 each); the rest stays zero.
	var attr [16]uint32
	attr[0] = unix.BPF_MAP_TYPE_ARRAY
	attr[1], attr[2], attr[3] = 4, 4, 1
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno == 0 {
		unix.Close(int(fd))
	}
	return single(errnoErr(errno), "BPF_MAP_CREATE")
}

// chrootEscape is the classic escape from a chroot: chroot into a
// subdirectory while the working directory stays outside it, climb with
// chdir(".."), and chroot(".") wherever the climb ends. It gets out of a
// chroot, never out of a mount namespace's root.
func chrootEscape(string) result {
	var start unix.Stat_t
	if err := unix.Stat("/", &start); err != nil {
		return single(err, "stat /")
	}
	dir, err := scratchDir("escapeprobe-chroot")
	if err != nil {
		return single(err, "no directory to chroot into")
	}
	if err := unix.Chdir("/"); err != nil {
		os.Remove(dir)
		return single(err, "chdir /")
	}
	err = unix.Chroot(dir)
	// The working directory is still the old root, so the relative path
	// names the directory whichever root is in force.
	os.Remove(strings.TrimPrefix(dir, "/"))
	if err != nil {
		return single(err, "chroot into "+dir)
	}
	for range 64 {
		if err := unix.Chdir(".."); err != nil {
			return single(err, "chdir ..")
		}
	}
	if err := unix.Chroot("."); err != nil {
		return single(err, "chroot .")
	}
	var end unix.Stat_t
	if err := unix.Stat("/", &end); err != nil {
		return single(err, "stat / after the climb")
	}
	if end.Dev == start.Dev && end.Ino == start.Ino {
		return result{Err: "stayed inside", Detail: "the climb ended at the starting root"}
	}
	return result{OK: true, Detail: fmt.Sprintf("escaped: root is now dev %d inode %d, was dev %d inode %d",
		end.Dev, end.Ino, start.Dev, start.Ino)}
}

func mknodDevices(string) result {
	dir, err := scratchDir("escapeprobe-mknod")
	if err != nil {
		return single(err, "no directory to make nodes in")
	}
	defer os.RemoveAll(dir)
	var a attempts
	try := func(name string, mode uint32, major, minor uint32) {
		p := filepath.Join(dir, name)
		err := unix.Mknod(p, mode|0o600, int(unix.Mkdev(major, minor)))
		if err == nil {
			os.Remove(p)
		}
		a.add(name, err)
	}
	try("char-1:3", unix.S_IFCHR, 1, 3)
	try("block-7:0", unix.S_IFBLK, 7, 0)
	return a.result()
}

// sysrq opens /proc/sysrq-trigger for writing and writes nothing: a written
// key would act on the host's kernel. The open is where a read-only mount
// refuses.
func sysrq(string) result {
	f, err := os.OpenFile("/proc/sysrq-trigger", os.O_WRONLY, 0)
	if err != nil {
		return single(err, "")
	}
	f.Close()
	return single(nil, "opened /proc/sysrq-trigger for writing; wrote nothing")
}

// kmod offers the kernel an empty module, which it cannot load whatever the
// privileges: a refusal other than EPERM means the call got past the
// permission checks.
func kmod(string) result {
	var a attempts
	var image [1]byte
	params := cstr("")
	_, _, errno := unix.Syscall(unix.SYS_INIT_MODULE, uintptr(unsafe.Pointer(&image[0])), 0, uintptr(unsafe.Pointer(params)))
	a.add("init_module", errnoErr(errno))
	f, err := os.Open("/dev/null")
	if err != nil {
		a.add("finit_module", err)
		return a.result()
	}
	defer f.Close()
	_, _, errno = unix.Syscall(unix.SYS_FINIT_MODULE, f.Fd(), uintptr(unsafe.Pointer(params)), 0)
	a.add("finit_module", errnoErr(errno))
	return a.result()
}

// hostname sets the host name to what it already is, so that success
// changes nothing even outside a UTS namespace.
func hostname(string) result {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return single(err, "uname")
	}
	name := unix.ByteSliceToString(u.Nodename[:])
	return single(unix.Sethostname([]byte(name)), "hostname "+name)
}

// cgroupWrite opens every file under /sys/fs/cgroup for writing, writing
// nothing (a value written would change a real cgroup), and tries to make a
// child cgroup in each directory right under it, removing any it makes.
func cgroupWrite(string) result {
	const root = "/sys/fs/cgroup"
	var files, opened, made int
	errs := map[string]int{}
	var firstErr string
	note := func(err error) {
		n := errName(err)
		errs[n]++
		if firstErr == "" {
			firstErr = n
		}
	}
	walkErr := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			note(err)
			return nil
		}
		if d.Type().IsRegular() {
			files++
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				note(err)
				return nil
			}
			f.Close()
			opened++
			return nil
		}
		if d.IsDir() && filepath.Dir(p) == root {
			child := filepath.Join(p, "tai42-escapeprobe")
			if err := os.Mkdir(child, 0o755); err != nil {
				note(err)
			} else {
				made++
				os.Remove(child)
			}
		}
		return nil
	})
	if walkErr != nil {
		note(walkErr)
	}
	keys := make([]string, 0, len(errs))
	for k := range errs {
		keys = append(keys, fmt.Sprintf("%s:%d", k, errs[k]))
	}
	sort.Strings(keys)
	detail := fmt.Sprintf("files=%d opened=%d mkdir=%d errors=%s", files, opened, made, strings.Join(keys, ","))
	r := result{OK: opened > 0 || made > 0, Err: firstErr, Detail: detail}
	if files == 0 && firstErr == "" {
		r.Err = "no cgroup files found"
	}
	return r
}

func threads(string) result {
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	tids := map[int]bool{}
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			mu.Lock()
			tids[unix.Gettid()] = true
			mu.Unlock()
			wg.Done()
			<-release // hold the thread until all have reported
		}()
	}
	wg.Wait()
	close(release)
	mu.Lock()
	distinct := len(tids)
	mu.Unlock()
	r := result{OK: distinct == n, Detail: fmt.Sprintf("threads=%d distinct-tids=%d", n, distinct)}
	if !r.OK {
		r.Err = "threads shared an id"
	}
	return r
}

func clone3(string) result {
	// A size below the first version's is EINVAL once the call reaches the
	// kernel; nothing is ever cloned.
	_, _, errno := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	switch errno {
	case unix.ENOSYS:
		return result{Err: "ENOSYS", Detail: "clone3 answered ENOSYS (a filter, or a kernel older than 5.3)"}
	case 0:
		return result{Err: "clone3 returned success for an invalid size", Detail: "unexpected"}
	default:
		return result{OK: true, Detail: "clone3 reached the kernel: " + errName(errno)}
	}
}

func personality(arg string) result {
	v, err := strconv.ParseUint(arg, 0, 32)
	if err != nil {
		usage(fmt.Sprintf("bad VALUE %q", arg))
	}
	old, _, errno := unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	if errno != 0 {
		return single(errno, "querying the personality")
	}
	_, _, errno = unix.Syscall(unix.SYS_PERSONALITY, uintptr(v), 0, 0)
	if errno == 0 {
		_, _, _ = unix.Syscall(unix.SYS_PERSONALITY, old, 0, 0)
	}
	return single(errnoErr(errno), fmt.Sprintf("personality 0x%x (was 0x%x)", v, old))
}

// The filesystem administration calls fsadmin tries, from the kernel's
// headers: FITRIM is _IOWR('X', 121, struct fstrim_range),
// EXT4_IOC_RESIZE_FS _IOW('f', 16, __u64); a quotactl command is
// QCMD(cmd, type) = cmd<<8 | type, Q_SYNC 0x800001 and Q_GETINFO 0x800005,
// USRQUOTA 0.
const (
	ioctlFITRIM      = 0xc0185879
	ioctlExt4Resize  = 0x40086610
	quotaSyncUser    = 0x800001 << 8
	quotaGetInfoUser = 0x800005 << 8
)

// fsAdmin tries what only a filesystem's administrator may do on PATH's
// filesystem, each so that it changes nothing even where it is allowed: a
// trim of a range shorter than a block (EINVAL once permitted), a resize
// to fewer blocks than the filesystem has (ext4 cannot shrink online:
// EINVAL once permitted), a quota sync and a quota info read.
func fsAdmin(path string) result {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return single(err, "opening "+path)
	}
	defer unix.Close(fd)
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return single(err, "statfs of "+path)
	}
	var a attempts
	ioctl := func(req uintptr, arg unsafe.Pointer) error {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		return errnoErr(errno)
	}
	// struct fstrim_range { __u64 start, len, minlen; }: len 0 is below a
	// block.
	trim := [3]uint64{0, 0, 0}
	a.add("fitrim", ioctl(ioctlFITRIM, unsafe.Pointer(&trim)))
	blocks := st.Blocks
	a.add("ext4-resize", ioctl(ioctlExt4Resize, unsafe.Pointer(&blocks)))
	_, _, errno := unix.Syscall6(unix.SYS_QUOTACTL, quotaSyncUser, 0, 0, 0, 0, 0)
	a.add("quotactl-sync", errnoErr(errno))
	var info [6]uint64 // struct if_dqinfo, and room to spare
	_, _, errno = unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), quotaGetInfoUser, 0, uintptr(unsafe.Pointer(&info)), 0, 0)
	a.add("quotactl_fd-info", errnoErr(errno))
	return a.result()
}

// inotifyHold opens inotify instances until the kernel refuses, as root
// and as other users, and holds them until DIR/release exists.
func inotifyHold(arg string) result {
	n, dir, ok := strings.Cut(arg, ":")
	users, err := strconv.Atoi(n)
	if !ok || err != nil || users < 1 {
		usage("inotify wants N:DIR, N a count of users")
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	var last error
	open := func() int {
		n := 0
		for {
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				last = err
				return n
			}
			fds = append(fds, fd)
			n++
		}
	}
	root := open()
	// Another effective uid on this thread alone (the raw call, not Go's
	// all-threads one); back to root after.
	runtime.LockOSThread()
	others := 0
	for uid := 1; uid < users; uid++ {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			last = e
			break
		}
		others += open()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			return single(e, "cannot become root again")
		}
	}
	runtime.UnlockOSThread()
	detail := fmt.Sprintf("root=%d others=%d total=%d err=%s", root, others, root+others, errName(last))
	if err := os.WriteFile(filepath.Join(dir, "held"), []byte(detail), 0o644); err != nil {
		return single(err, detail)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "release")); err == nil {
			break
		}
	}
	return result{OK: root+others > 0, Err: errName(last), Detail: detail}
}
