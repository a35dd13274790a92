// Package escapeprobetest builds the escape probe (internal/escapeprobe)
// for tests: a static binary, built once per test binary run and
// architecture.
package escapeprobetest

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/tai42/sandbox/internal/buildtest"
)

// probePackage is the probe's import path; go build resolves it from the
// test's working directory, which is inside this module.
const probePackage = "github.com/tai42/sandbox/internal/escapeprobe"

// outcome is one architecture's build, made once.
type outcome struct {
	once sync.Once
	path string // the binary, when built
	skip string // why tests skip: no go command
	err  error  // why the build failed
}

var (
	mu     sync.Mutex
	builds = map[string]*outcome{} // by GOARCH
	dir    string                  // the binaries' temporary directory, "" before the first build and after Cleanup
)

// Build returns the path of the escape probe for this machine's
// architecture (runtime.GOARCH): a static Linux binary (CGO_ENABLED=0, no
// program interpreter). It is BuildFor(t, runtime.GOARCH).
func Build(t testing.TB) string {
	t.Helper()
	return BuildFor(t, runtime.GOARCH)
}

// BuildFor returns the path of the escape probe built for goarch (for
// example "386", to run in amd64's 32-bit mode), building it on the first
// call for that goarch in the test binary's run, into a temporary directory,
// and returning the same path afterwards. It skips t when no go command is
// on PATH, and fails t (with the compiler's output) when the build fails;
// every later call for goarch gets the same outcome. Safe for concurrent
// use; callers must not change or remove the binary. Call Cleanup from
// TestMain to remove it.
func BuildFor(t testing.TB, goarch string) string {
	t.Helper()
	mu.Lock()
	o := builds[goarch]
	if o == nil {
		o = &outcome{}
		builds[goarch] = o
	}
	mu.Unlock()
	o.once.Do(func() { o.path, o.skip, o.err = build(goarch) })
	switch {
	case o.skip != "":
		t.Skip(o.skip)
	case o.err != nil:
		t.Fatal(o.err)
	}
	return o.path
}

func build(goarch string) (path, skip string, err error) {
	if _, err := exec.LookPath("go"); err != nil {
		return "", "escape probe: no go command on PATH to build it with: " + err.Error(), nil
	}
	mu.Lock()
	if dir == "" {
		dir, err = os.MkdirTemp("", "tai42-escapeprobe-")
	}
	d := dir
	mu.Unlock()
	if err != nil {
		return "", "", fmt.Errorf("escape probe: temporary directory: %w", err)
	}
	out := filepath.Join(d, "escapeprobe-"+goarch)
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if err := buildtest.Go(context.Background(), "", env, "build", "-trimpath", "-o", out, probePackage); err != nil {
		return "", "", fmt.Errorf("escape probe: %w", err)
	}
	if err := checkStatic(out); err != nil {
		return "", "", fmt.Errorf("escape probe: %s: %w", out, err)
	}
	return out, "", nil
}

// checkStatic reports an error unless path is an ELF file without a program
// interpreter, that is one that runs in a rootfs without a libc.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("built dynamically linked (has a program interpreter); want static")
		}
	}
	return nil
}

// Cleanup removes the probes' temporary directory, if a build made one.
// Call it from TestMain after m.Run; a path Build returned before Cleanup
// no longer exists after it. Safe for concurrent use.
func Cleanup() error {
	mu.Lock()
	defer mu.Unlock()
	if dir == "" {
		return nil
	}
	err := os.RemoveAll(dir)
	dir = ""
	builds = map[string]*outcome{}
	return err
}
