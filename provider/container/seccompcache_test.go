package container_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// TestCrunSeccompProgramReused: crun compiles the seccomp profile at the
// first create; the next ones are handed the program it compiled then
// (run.oci.seccomp_bpf_data) and compile nothing, and their filter is the
// same: clone3 answers the profile's ENOSYS, and the calls it refuses are
// refused.
func TestCrunSeccompProgramReused(t *testing.T) {
	containertest.Require(t)
	if !containertest.HasRuntime("crun") {
		t.Skip("crun is not installed (apt-get install -y crun)")
	}
	p := newProvider(t, "crun")
	first := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
	compiled, err := os.ReadFile(filepath.Join(p.root(), "crun", first.ID(), "seccomp.bpf"))
	if err != nil {
		t.Fatalf("crun's compiled program of the first session: %v", err)
	}
	annotation := func(id string) (string, bool) {
		v, ok := p.config(t, id).Annotations["run.oci.seccomp_bpf_data"]
		return v, ok
	}
	if _, ok := annotation(first.ID()); ok {
		t.Error("the first session's config carries a compiled program, which nothing compiled yet")
	}
	second := p.session(t, spec(containertest.Busybox, sandbox.NetworkNone))
	got, ok := annotation(second.ID())
	if !ok || got != base64.StdEncoding.EncodeToString(compiled) {
		t.Fatalf("the second session's config: compiled program %v (%d bytes of base64), want the first's %d bytes", ok, len(got), len(compiled))
	}
	installProbe(t, second)
	if r := probe(t, second, "clone3"); r.Err != "ENOSYS" {
		t.Errorf("clone3 in the second session: %+v, want the profile's ENOSYS", r)
	}
	for _, args := range [][]string{{"mount"}, {"unshare"}, {"keyctl"}, {"bpf"}} {
		if r := probe(t, second, args...); r.OK {
			t.Errorf("escapeprobe %q in the second session: %+v, want refused", args, r)
		}
	}
}
