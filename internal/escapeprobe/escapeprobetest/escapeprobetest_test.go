package escapeprobetest

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := Cleanup(); err != nil {
		fmt.Fprintf(os.Stderr, "removing the probe: %v\n", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "leaked goroutines: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestBuildOnceStatic(t *testing.T) {
	first := Build(t)
	// Later calls, concurrent ones included, get the same binary.
	paths := make([]string, 4)
	var wg sync.WaitGroup
	for i := range paths {
		wg.Go(func() { paths[i] = Build(t) })
	}
	wg.Wait()
	for _, p := range paths {
		if p != first {
			t.Fatalf("Build returned %q and %q; want one binary per run", first, p)
		}
	}
	fi, err := os.Stat(first)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&0o111 == 0 {
		t.Fatalf("probe %s has mode %v; want an executable", first, fi.Mode())
	}
	if err := checkStatic(first); err != nil {
		t.Fatal(err)
	}
}

func TestCheckStaticRefusesDynamic(t *testing.T) {
	// A binary that names shared libraries it needs is dynamic, whatever
	// checkStatic thinks.
	for _, p := range []string{"/bin/sh", "/usr/bin/env", "/bin/ls"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		libs, err := f.ImportedLibraries()
		f.Close()
		if err != nil || len(libs) == 0 {
			continue
		}
		if err := checkStatic(p); err == nil {
			t.Errorf("checkStatic(%s) = nil; it needs %v, want an error", p, libs)
		}
		return
	}
	t.Skip("no dynamically linked binary here to check against")
}

type probeOutput struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	Detail string `json:"detail"`
}

// runProbe runs the probe on the host: only subcommands that change nothing
// and reach nothing beyond loopback.
func runProbe(t *testing.T, args ...string) (probeOutput, int, string) {
	t.Helper()
	cmd := exec.Command(Build(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("probe %q: %v", args, err)
	}
	if n := strings.Count(stdout.String(), "\n"); n != 1 {
		t.Fatalf("probe %q printed %d lines, want one: %q", args, n, stdout.String())
	}
	var out probeOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("probe %q: %v: %q", args, err, stdout.String())
	}
	return out, code, stderr.String()
}

func TestProbeUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"nonsense"}, {"read"}, {"pids", "extra"}, {"dial", "a", "b"},
		{"personality", "bogus"}, {"ptrace", "0"}, {"ptrace", "x"}} {
		out, code, stderr := runProbe(t, args...)
		if code != 1 || out.OK || !strings.HasPrefix(out.Err, "usage: ") || !strings.Contains(stderr, "subcommands:") {
			t.Errorf("probe %q: exit %d, %+v, stderr %q; want exit 1 with a usage error", args, code, out, stderr)
		}
	}
}

func TestProbeHarmlessSubcommands(t *testing.T) {
	dir := t.TempDir()
	written := filepath.Join(dir, "written")
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close() // nothing listens there now

	cases := []struct {
		args       []string
		ok         bool
		err        string
		detailPart string
	}{
		{[]string{"threads"}, true, "", "distinct-tids=8"},
		{[]string{"stat", "/dev/null"}, true, "", "type=char mode=0666 size=0 rdev=1:3"},
		{[]string{"read", filepath.Join(dir, "absent")}, false, "ENOENT", ""},
		{[]string{"write", written}, true, "", "wrote 18 bytes"},
		{[]string{"read", written}, true, "", "tai42-escapeprobe\n"},
		{[]string{"dial", closedAddr}, false, "ECONNREFUSED", ""},
		{[]string{"listen", "127.0.0.1:0"}, true, "", "connected to it"},
		{[]string{"personality", "0xffffffff"}, true, "", "personality 0xffffffff"},
		{[]string{"pids"}, true, "", fmt.Sprintf("%d ", os.Getpid())},
	}
	for _, c := range cases {
		out, code, stderr := runProbe(t, c.args...)
		if code != 0 || out.OK != c.ok || out.Err != c.err || !strings.Contains(out.Detail, c.detailPart) {
			t.Errorf("probe %q: exit %d, %+v (stderr %q); want exit 0, ok %v, err %q, detail containing %q",
				c.args, code, out, stderr, c.ok, c.err, c.detailPart)
		}
	}
}
