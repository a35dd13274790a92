// Package api_test benchmarks the daemon's HTTP API (server + Go client over
// loopback TCP) beside the same work done in-process through the kit, in the
// same run. bench/api.sh runs it and prints medians, p50s, the API's
// overhead and the targets.
package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

const (
	execTimeout   = 30 * time.Second
	streamTimeout = 5 * time.Minute
	streamBytes   = 1 << 30
	fileBytes     = 64 << 20
	token         = "bench-token"
)

var (
	policy     = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	trueArgv   = []string{"/bin/true"}
	streamArgv = []string{"/bin/dd", "if=/dev/zero", "bs=1M", "count=1024", "status=none"}
)

// pair is one host sandbox, served on loopback, and a session on each side:
// local (in-process, through the kit) and remote (through the client and
// the server, on the same sandbox).
type pair struct {
	local, remote sandbox.Session
}

func newPair(b *testing.B) pair {
	b.Helper()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: policy, ReapInterval: -1}, ProviderOptions: kit.ProviderOptions{StateDir: b.TempDir()}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Close(context.Background()) })
	srv, err := server.New(sb, server.Options{Token: token, Policy: policy, Provider: host.Name})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	b.Cleanup(ts.Close)
	c := client.New(ts.URL, token)
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	spec := sandbox.SessionSpec{Image: sandbox.HostImage, Durability: sandbox.Ephemeral, Network: sandbox.NetworkEgress, TTLSeconds: 3600}
	local, err := sb.CreateSession(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	remote, err := c.CreateSession(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	return pair{local: local, remote: remote}
}

// sides returns the two sides in order, or the remote one first when
// BENCH_REMOTE_FIRST is set (bench/api.sh alternates between rounds, so
// that neither side always pays for going first).
func (p pair) sides() []struct {
	name string
	sess sandbox.Session
} {
	s := []struct {
		name string
		sess sandbox.Session
	}{{"inprocess", p.local}, {"api", p.remote}}
	if os.Getenv("BENCH_REMOTE_FIRST") != "" {
		slices.Reverse(s)
	}
	return s
}

// reportP50 reports the median of per-op durations as p50-ns, and p99-ns.
func reportP50(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkExecTrue: one exec of /bin/true to completion, round trip.
func BenchmarkExecTrue(b *testing.B) {
	p := newPair(b)
	for _, s := range p.sides() {
		b.Run(s.name, func(b *testing.B) {
			ctx := context.Background()
			d := make([]time.Duration, 0, b.N)
			for b.Loop() {
				t0 := time.Now()
				r, err := s.sess.Exec(ctx, trueArgv, sandbox.ExecOptions{Timeout: execTimeout})
				d = append(d, time.Since(t0))
				if err != nil || r.ExitCode != 0 {
					b.Fatalf("exec /bin/true: %+v, %v", r, err)
				}
			}
			reportP50(b, d)
		})
	}
}

// BenchmarkStream1GiB: exec_start of a command writing 1 GiB to stdout,
// read to the end through Next.
func BenchmarkStream1GiB(b *testing.B) {
	p := newPair(b)
	for _, s := range p.sides() {
		b.Run(s.name, func(b *testing.B) {
			ctx := context.Background()
			b.SetBytes(streamBytes)
			for b.Loop() {
				h, err := s.sess.ExecStart(ctx, streamArgv, sandbox.StartOptions{Timeout: streamTimeout})
				if err != nil {
					b.Fatal(err)
				}
				var n int64
				for {
					it, err := h.Next(ctx)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					switch v := it.(type) {
					case *sandbox.StreamChunk:
						n += int64(len(v.Data))
					case *sandbox.StreamExit:
						if v.ExitCode != 0 {
							b.Fatalf("dd exited %d", v.ExitCode)
						}
					}
				}
				if n != streamBytes {
					b.Fatalf("read %d bytes; want %d", n, streamBytes)
				}
				if err := h.Kill(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func fileData(b *testing.B) []byte {
	data := make([]byte, fileBytes)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkPutFile64MiB: put_file of 64 MiB ([]byte, the contract's call),
// and over the API also streamed from a reader (sandbox.FileStreamer).
func BenchmarkPutFile64MiB(b *testing.B) {
	p := newPair(b)
	data := fileData(b)
	for _, s := range p.sides() {
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(fileBytes)
			for b.Loop() {
				if err := s.sess.PutFile(context.Background(), "f.bin", data); err != nil {
					b.Fatal(err)
				}
			}
		})
		if s.name != "api" {
			continue
		}
		b.Run("api-stream", func(b *testing.B) {
			fs := s.sess.(sandbox.FileStreamer)
			b.SetBytes(fileBytes)
			for b.Loop() {
				if err := fs.PutFileFrom(context.Background(), "f.bin", bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGetFile64MiB: get_file of 64 MiB, and over the API also
// streamed into io.Discard.
func BenchmarkGetFile64MiB(b *testing.B) {
	p := newPair(b)
	data := fileData(b)
	for _, s := range p.sides() {
		if err := s.sess.PutFile(context.Background(), "f.bin", data); err != nil {
			b.Fatal(err)
		}
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(fileBytes)
			for b.Loop() {
				got, err := s.sess.GetFile(context.Background(), "f.bin")
				if err != nil || len(got) != fileBytes {
					b.Fatalf("get: %d bytes, %v", len(got), err)
				}
			}
		})
		if s.name != "api" {
			continue
		}
		b.Run("api-stream", func(b *testing.B) {
			fs := s.sess.(sandbox.FileStreamer)
			b.SetBytes(fileBytes)
			for b.Loop() {
				rc, _, err := fs.OpenFile(context.Background(), "f.bin")
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, rc)
				rc.Close()
				if err != nil || n != fileBytes {
					b.Fatalf("stream get: %d bytes, %v", n, err)
				}
			}
		})
	}
}
