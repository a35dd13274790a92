package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

var (
	_ kit.Pooler  = (*provider)(nil)
	_ kit.Claimer = (*session)(nil)
)

// idleSessionBytes is what the kit counts per pooled session against the
// machine's memory: an idle session measured 4.08 MB (its cgroup's memory
// and its agent's PSS; bench/container.sh, BenchmarkIdleMemory), doubled
// for what the kernel holds for it outside the cgroup (its mounts,
// namespaces and network devices).
const idleSessionBytes = 8 << 20

// IdleBytes implements [kit.Pooler].
func (p *provider) IdleBytes() int64 { return idleSessionBytes }

// Claim implements [kit.Claimer]: the session, made ahead with no caps,
// is checked alive (its agent answers) and given spec's caps, written to
// its cgroup as the runtime writes those of the OCI config at a cold
// create (buildSpec's resources), before it is anyone's.
func (r *session) Claim(ctx context.Context, spec sandbox.SessionSpec) error {
	if err := r.agent.Ping(ctx); err != nil {
		return fmt.Errorf("its agent does not answer: %w", err)
	}
	if err := r.p.cgroups.setCaps(cgroupsPath(r.id), spec.CPU, spec.MemoryMB); err != nil {
		return err
	}
	r.spec = spec
	r.ex.SetSpec(spec)
	return nil
}

// setCaps writes a cpu and a memory cap (0: none) to cgroup path as the
// runtime would from buildSpec's resources: memory and memory+swap both at
// the limit (nothing swapped), a CFS quota of cfsPeriodUS.
func (l cgroupLayout) setCaps(path string, cpu float64, memoryMB int) error {
	type write struct {
		file, value string
		swap        bool // missing without swap accounting: no limit to set
	}
	var ws []write
	if memoryMB > 0 {
		limit := strconv.FormatInt(int64(memoryMB)<<20, 10)
		if l.v2 {
			ws = append(ws, write{filepath.Join(l.root, path, "memory.max"), limit, false},
				write{filepath.Join(l.root, path, "memory.swap.max"), "0", true})
		} else {
			// memory before memory+swap: the second may not be below the first.
			dir := filepath.Join(l.root, "memory", path)
			ws = append(ws, write{filepath.Join(dir, "memory.limit_in_bytes"), limit, false},
				write{filepath.Join(dir, "memory.memsw.limit_in_bytes"), limit, true})
		}
	}
	if cpu > 0 {
		quota := strconv.FormatInt(int64(cpu*cfsPeriodUS), 10)
		if l.v2 {
			ws = append(ws, write{filepath.Join(l.root, path, "cpu.max"), quota + " " + strconv.Itoa(cfsPeriodUS), false})
		} else {
			dir := filepath.Join(l.root, "cpu", path)
			ws = append(ws, write{filepath.Join(dir, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriodUS), false},
				write{filepath.Join(dir, "cpu.cfs_quota_us"), quota, false})
		}
	}
	for _, w := range ws {
		err := os.WriteFile(w.file, []byte(w.value), 0)
		if err != nil && !(w.swap && errors.Is(err, fs.ErrNotExist)) {
			return fmt.Errorf("setting the session's caps (%s): %w", w.file, err)
		}
	}
	return nil
}
