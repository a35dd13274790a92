package container

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// crun compiles a config's seccomp profile with libseccomp at every run
// (about 2.3 ms of a real create's run here; 5.5 ms of bench/container's
// CreateSteps run), and writes the program it loads to
// seccomp.bpf in the container's state directory. Its annotation
// run.oci.seccomp_bpf_data hands it a compiled program instead (base64 of
// the raw sock_filter array, as seccomp(SECCOMP_SET_MODE_FILTER) takes
// it), and then it compiles nothing. seccompCache keeps the program crun
// compiled for a profile and gives it to the next runs of the same
// profile: crun's own output for that very profile, so the filter is the
// one it would have compiled.
const (
	seccompBPFAnnotation = "run.oci.seccomp_bpf_data"
	seccompBPFFile       = "seccomp.bpf"
	// A classic BPF program is at most BPF_MAXINSNS (4096) instructions
	// of 8 bytes.
	bpfInsnSize, bpfMaxInsns = 8, 4096
)

type seccompCache struct {
	mu   sync.Mutex
	key  [32]byte // the profile (its JSON) whose program data is
	data string   // base64; "": none yet
}

// profileKey identifies a seccomp profile.
func profileKey(p *specs.LinuxSeccomp) ([32]byte, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// annotate puts the compiled program of s's profile in s's annotations
// when the cache holds it; it reports the profile's key, and whether it
// did.
func (c *seccompCache) annotate(s *specs.Spec) ([32]byte, bool) {
	if s.Linux == nil || s.Linux.Seccomp == nil {
		return [32]byte{}, false
	}
	key, err := profileKey(s.Linux.Seccomp)
	if err != nil {
		return key, false
	}
	c.mu.Lock()
	data := c.data
	hit := data != "" && c.key == key
	c.mu.Unlock()
	if !hit {
		return key, false
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[seccompBPFAnnotation] = data
	return key, true
}

// learn keeps the program crun compiled for the profile of key, from the
// state directory stateDir of a container it has just run. A file that is
// not a whole program is not kept (the next run compiles again).
func (c *seccompCache) learn(key [32]byte, stateDir string) error {
	b, err := os.ReadFile(filepath.Join(stateDir, seccompBPFFile))
	if err != nil {
		return err
	}
	if n := len(b); n == 0 || n%bpfInsnSize != 0 || n/bpfInsnSize > bpfMaxInsns || bytes.Count(b, []byte{0}) == n {
		return fmt.Errorf("crun's %s holds %d bytes, not a seccomp program", seccompBPFFile, n)
	}
	c.mu.Lock()
	c.key, c.data = key, base64.StdEncoding.EncodeToString(b)
	c.mu.Unlock()
	return nil
}
