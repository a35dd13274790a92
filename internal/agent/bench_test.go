package agent

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user+system CPU time (its children's not
// counted): on a shared machine a steadier figure than the wall clock.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkExecTrue is an exec round trip of /bin/true through the client
// and an in-process agent: dial, request, fork/exec, reap, output end,
// exit frame. cpu-ns/op is the CPU both sides spent in this process.
func BenchmarkExecTrue(b *testing.B) {
	a := startAgentB(b)
	spec := a.spec("/bin/true")
	ctx := context.Background()
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		p, err := a.c.Start(ctx, spec, nil)
		if err != nil {
			b.Fatal(err)
		}
		<-p.Done()
		if r := p.Result(); r.ExitCode != 0 || r.Err != nil {
			b.Fatalf("%+v", r)
		}
		p.Close()
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkOSExecTrue is the same command through os/exec, for scale.
func BenchmarkOSExecTrue(b *testing.B) {
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}
