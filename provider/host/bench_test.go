package host_test

// Benchmarks of the host runner through the kit, each beside a bare
// standard-library peer doing the same work in the same process, so that
// the ratio kit/bare is the runner's own overhead. bench/run.sh runs them
// and prints medians, ratios and the targets.

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

const (
	benchExecTimeout   = 30 * time.Second
	benchStreamTimeout = 5 * time.Minute
	benchStreamBytes   = 1 << 30
	benchFileBytes     = 64 << 20
	benchParallelExecs = 32 // concurrent execs in the parallel variants
)

var (
	benchPolicy = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	trueArgv    = []string{"/bin/true"}
	// dd writes 1 MiB at a time, so the producer is cheap and the reading
	// side (the runner's, or the bare peer's) is what is measured.
	streamArgv = []string{"/bin/dd", "if=/dev/zero", "bs=1M", "count=1024", "status=none"}
)

// sub is one sub-benchmark of a kit/bare comparison.
type sub struct {
	name string
	f    func(*testing.B)
}

// runSubs runs subs in order, or in reverse when BENCH_BARE_FIRST is set:
// bench/run.sh alternates between rounds so that neither side always pays
// for going first (page cache, writeback and heap state left by what ran
// before).
func runSubs(b *testing.B, subs ...sub) {
	if os.Getenv("BENCH_BARE_FIRST") != "" {
		slices.Reverse(subs)
	}
	for _, s := range subs {
		b.Run(s.name, s.f)
	}
}

// benchSandbox returns a host runner in a fresh state directory, closed
// (every session destroyed) when the benchmark ends.
func benchSandbox(b *testing.B) *kit.Sandbox {
	b.Helper()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: benchPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: b.TempDir()}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			b.Errorf("close: %v", err)
		}
	})
	return sb
}

func benchSpec(network sandbox.Network) sandbox.SessionSpec {
	return sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: network, TTLSeconds: 600}
}

// benchSession returns a live session in a fresh runner, destroyed when the
// benchmark ends (before the runner is closed).
func benchSession(b *testing.B, network sandbox.Network) sandbox.Session {
	b.Helper()
	s, err := benchSandbox(b).CreateSession(context.Background(), benchSpec(network))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := s.Destroy(context.Background()); err != nil {
			b.Errorf("destroy: %v", err)
		}
	})
	return s
}

// benchOps times op after one untimed warm-up; size > 0 reports MB/s.
func benchOps(b *testing.B, size int64, op func() error) {
	b.Helper()
	if err := op(); err != nil {
		b.Fatal(err)
	}
	if size > 0 {
		b.SetBytes(size)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
}

func kitTrue(ctx context.Context, s sandbox.Session) error {
	res, err := s.Exec(ctx, trueArgv, sandbox.ExecOptions{Timeout: benchExecTimeout})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Stdout != "" || res.Stderr != "" {
		return fmt.Errorf("/bin/true: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	return nil
}

func bareTrue() error { return exec.Command(trueArgv[0]).Run() }

// bareTrueCaptured is os/exec doing what the runner's exec must: stdout
// and stderr captured through pipes into memory (os/exec then makes the
// pipes and one copying goroutine per stream).
func bareTrueCaptured() error {
	var out, errb bytes.Buffer
	cmd := exec.Command(trueArgv[0])
	cmd.Stdout, cmd.Stderr = &out, &errb
	return cmd.Run()
}

// BenchmarkExecTrue is one /bin/true to completion, one at a time: the
// runner's exec on the host network and in a network namespace, os/exec
// with output discarded (the baseline), and os/exec capturing
// output as the runner must.
func BenchmarkExecTrue(b *testing.B) {
	ctx := context.Background()
	kitSub := func(name string, network sandbox.Network) sub {
		return sub{name, func(b *testing.B) {
			s := benchSession(b, network)
			benchOps(b, 0, func() error { return kitTrue(ctx, s) })
		}}
	}
	runSubs(b,
		kitSub("kit", sandbox.NetworkEgress),
		kitSub("kit-netns-none", sandbox.NetworkNone),
		sub{"bare", func(b *testing.B) { benchOps(b, 0, bareTrue) }},
		sub{"bare-captured", func(b *testing.B) { benchOps(b, 0, bareTrueCaptured) }},
	)
}

// BenchmarkExecTrueParallel runs 32 goroutines (whatever GOMAXPROCS is)
// each doing /bin/true to completion, all in one session for the kit;
// ns/op is wall time per exec at that concurrency.
func BenchmarkExecTrueParallel(b *testing.B) {
	ctx := context.Background()
	par := max(1, benchParallelExecs/runtime.GOMAXPROCS(0)) // 16 at GOMAXPROCS=2
	run := func(b *testing.B, one func() error) {
		b.ReportAllocs()
		b.SetParallelism(par)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := one(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	runSubs(b,
		sub{"kit", func(b *testing.B) {
			s := benchSession(b, sandbox.NetworkEgress)
			run(b, func() error { return kitTrue(ctx, s) })
		}},
		sub{"bare", func(b *testing.B) { run(b, bareTrue) }},
	)
}

// BenchmarkCreateDestroy is one ephemeral session created and destroyed:
// on the host network, and with its own network namespace; bare-mkdir is
// the filesystem work alone (two directories made, one opened as an
// os.Root, both removed), the floor of any create in this state directory.
func BenchmarkCreateDestroy(b *testing.B) {
	ctx := context.Background()
	kitSub := func(name string, network sandbox.Network) sub {
		return sub{name, func(b *testing.B) {
			sb, spec := benchSandbox(b), benchSpec(network)
			benchOps(b, 0, func() error {
				s, err := sb.CreateSession(ctx, spec)
				if err != nil {
					return err
				}
				return s.Destroy(ctx)
			})
		}}
	}
	runSubs(b,
		kitSub("egress", sandbox.NetworkEgress),
		kitSub("none", sandbox.NetworkNone),
		sub{"bare-mkdir", func(b *testing.B) {
			dir := b.TempDir()
			wsDir, tmpDir := filepath.Join(dir, "sessions"), filepath.Join(dir, "tmp")
			for _, d := range []string{wsDir, tmpDir} {
				if err := os.Mkdir(d, 0o700); err != nil {
					b.Fatal(err)
				}
			}
			i := 0
			benchOps(b, 0, func() error {
				i++
				name := "sb-" + strconv.Itoa(i)
				ws, tmp := filepath.Join(wsDir, name), filepath.Join(tmpDir, name)
				if err := os.Mkdir(ws, 0o700); err != nil {
					return err
				}
				root, err := os.OpenRoot(ws)
				if err != nil {
					return err
				}
				if err := os.Mkdir(tmp, 0o700); err != nil {
					return err
				}
				if err := root.Close(); err != nil {
					return err
				}
				if err := os.RemoveAll(tmp); err != nil {
					return err
				}
				return os.RemoveAll(ws)
			})
		}},
	)
}

// BenchmarkStream1GiB reads 1 GiB of a command's stdout: through exec_start
// (every chunk taken with Next), and through an os/exec stdout pipe copied
// into io.Discard.
func BenchmarkStream1GiB(b *testing.B) {
	ctx := context.Background()
	runSubs(b,
		sub{"kit", func(b *testing.B) {
			s := benchSession(b, sandbox.NetworkEgress)
			var chunks, ops int
			benchOps(b, benchStreamBytes, func() error {
				c, err := kitStream(ctx, s)
				chunks += c
				ops++
				return err
			})
			b.ReportMetric(float64(chunks)/float64(ops), "chunks/op")
		}},
		sub{"bare", func(b *testing.B) { benchOps(b, benchStreamBytes, bareStream) }},
	)
}

// kitStream runs streamArgv through exec_start and drains it, returning the
// number of chunks. Short output, anything on stderr or a non-zero exit is
// an error.
func kitStream(ctx context.Context, s sandbox.Session) (chunks int, err error) {
	h, err := s.ExecStart(ctx, streamArgv, sandbox.StartOptions{Timeout: benchStreamTimeout})
	if err != nil {
		return 0, err
	}
	defer func() {
		if kerr := h.Kill(ctx); err == nil {
			err = kerr
		}
	}()
	var n int64
	exit := -1
	for {
		it, err := h.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return chunks, err
		}
		switch v := it.(type) {
		case *sandbox.StreamChunk:
			if v.Stream != sandbox.Stdout {
				return chunks, fmt.Errorf("unexpected %s: %q", v.Stream, v.Data)
			}
			n += int64(len(v.Data))
			chunks++
		case *sandbox.StreamExit:
			exit = v.ExitCode
		}
	}
	if exit != 0 || n != benchStreamBytes {
		return chunks, fmt.Errorf("exit %d after %d bytes, want 0 after %d", exit, n, benchStreamBytes)
	}
	return chunks, nil
}

func bareStream() error {
	cmd := exec.Command(streamArgv[0], streamArgv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, out)
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err == nil && n != benchStreamBytes {
		err = fmt.Errorf("read %d bytes, want %d", n, benchStreamBytes)
	}
	return err
}

func benchData(b *testing.B) []byte {
	b.Helper()
	data := make([]byte, benchFileBytes)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkPutFile64MiB replaces a 64 MiB file (the untimed warm-up makes
// it): put_file, and os.WriteFile on the same filesystem.
func BenchmarkPutFile64MiB(b *testing.B) {
	ctx := context.Background()
	data := benchData(b)
	runSubs(b,
		sub{"kit", func(b *testing.B) {
			s := benchSession(b, sandbox.NetworkEgress)
			benchOps(b, benchFileBytes, func() error { return s.PutFile(ctx, "blob.bin", data) })
		}},
		sub{"bare", func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "blob.bin")
			benchOps(b, benchFileBytes, func() error { return os.WriteFile(path, data, 0o644) })
		}},
	)
}

// BenchmarkGetFile64MiB reads a 64 MiB file (in the page cache): get_file,
// and os.ReadFile on the same filesystem.
func BenchmarkGetFile64MiB(b *testing.B) {
	ctx := context.Background()
	data := benchData(b)
	check := func(got []byte, err error) error {
		if err == nil && len(got) != benchFileBytes {
			err = fmt.Errorf("read %d bytes, want %d", len(got), benchFileBytes)
		}
		return err
	}
	runSubs(b,
		sub{"kit", func(b *testing.B) {
			s := benchSession(b, sandbox.NetworkEgress)
			if err := s.PutFile(ctx, "blob.bin", data); err != nil {
				b.Fatal(err)
			}
			benchOps(b, benchFileBytes, func() error { return check(s.GetFile(ctx, "blob.bin")) })
		}},
		sub{"bare", func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "blob.bin")
			if err := os.WriteFile(path, data, 0o644); err != nil {
				b.Fatal(err)
			}
			benchOps(b, benchFileBytes, func() error { return check(os.ReadFile(path)) })
		}},
	)
}
