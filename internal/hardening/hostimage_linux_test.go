package hardening

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestHostImagePrograms runs glibc programs under the hardening, from a
// read-only view of the host's /usr as the container provider's "host"
// image has it: glibc makes threads with clone3 first and must fall back to
// clone on the profile's ENOSYS (sort --parallel, Python's threading),
// Python forks and execs and opens sockets, perl and sed run.
func TestHostImagePrograms(t *testing.T) {
	for _, p := range []string{"/usr/bin/bash", "/usr/bin/sort", "/usr/bin/perl", "/usr/bin/python3", "/usr/bin/sed"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("the host lacks %s: %v", p, err)
		}
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"usr", "etc", "proc", "dev", "sys", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/bash\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `set -eo pipefail
echo hi | sed s/hi/ho/
seq 200000 | sort --parallel=4 -S 1M -n | tail -n 1
perl -e 'print "perl\n"'
python3 -c '
import socket, subprocess, threading
got = []
ts = [threading.Thread(target=got.append, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print("threads", len(got))
print("exit", subprocess.run(["/usr/bin/true"]).returncode)
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print("listening"); s.close()
'
`
	want := "ho\n200000\nperl\nthreads 8\nexit 0\nlistening\n"
	forEachRuntime(t, func(t *testing.T, rt ociRuntime) {
		s := hardenedSpec(root, true, "/usr/bin/bash", "-c", script)
		s.Process.Env = []string{"PATH=/usr/bin:/bin", "HOME=/root", "LANG=C", "TMPDIR=/tmp"}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro", "nosuid", "nodev"}})
		r := rt.run(t, s)
		if r.code != 0 || r.stdout != want {
			t.Errorf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", r.code, r.stdout, want, r.stderr)
		}
	})
}
