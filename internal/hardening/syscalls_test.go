package hardening

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// sysnumLine matches a system call of golang.org/x/sys/unix's tables,
// generated from the kernel's headers: "\tSYS_NEWFSTATAT = 262".
var sysnumLine = regexp.MustCompile(`(?m)^\s+SYS_([A-Z0-9_]+)\s+=\s+\d+`)

// nativeSyscalls returns the system call names of GOARCH goarch's native
// architecture, as libseccomp spells them, read from the zsysnum table of
// the golang.org/x/sys this module requires (go list finds it in the
// module cache). It skips t when no go command is on PATH.
func nativeSyscalls(t *testing.T, goarch string) map[string]bool {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH to find golang.org/x/sys's tables with: %v", err)
	}
	out, err := exec.Command(gobin, "list", "-m", "-f", "{{.Dir}}", "golang.org/x/sys").Output()
	if err != nil {
		t.Fatalf("go list -m golang.org/x/sys: %v", err)
	}
	path := filepath.Join(strings.TrimSpace(string(out)), "unix", "zsysnum_linux_"+goarch+".go")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the %s system call table: %v", goarch, err)
	}
	names := map[string]bool{}
	for _, m := range sysnumLine.FindAllStringSubmatch(string(src), -1) {
		names[strings.ToLower(m[1])] = true
	}
	// A sanity check of the parse: both tables hold some 300 calls.
	if len(names) < 250 || !names["openat"] || !names["newfstatat"] {
		t.Fatalf("%s: parsed %d system calls (openat %v, newfstatat %v); the table's format changed",
			path, len(names), names["openat"], names["newfstatat"])
	}
	return names
}

// TestSeccompNamesNative checks that every name in the profile and in
// refusedSyscalls is a system call of a native architecture (x86_64 or
// aarch64), none a name of the 32-bit modes alone, which the profile does
// not cover; and that each architecture's own calls are its own.
func TestSeccompNamesNative(t *testing.T) {
	tables := map[string]map[string]bool{
		"amd64": nativeSyscalls(t, "amd64"),
		"arm64": nativeSyscalls(t, "arm64"),
	}
	native := func(n string) bool { return tables["amd64"][n] || tables["arm64"][n] }
	for goarch := range archs {
		if tables[goarch] == nil {
			t.Fatalf("archs lists %s, whose table this test does not read", goarch)
		}
		for _, r := range seccompFor(goarch).Syscalls {
			for _, n := range r.Names {
				if !native(n) {
					t.Errorf("%s: the profile names %s, a system call of neither x86_64 nor aarch64", goarch, n)
				}
			}
		}
	}
	for goarch, names := range archSyscalls {
		for _, n := range names {
			if !tables[goarch][n] {
				t.Errorf("archSyscalls[%s] holds %s, which is no %s system call", goarch, n, goarch)
			}
		}
	}
	for _, n := range refusedSyscalls {
		if !native(n) {
			t.Errorf("refusedSyscalls holds %s, a system call of neither x86_64 nor aarch64", n)
		}
	}
}
