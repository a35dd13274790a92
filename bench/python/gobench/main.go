// Command gobench measures the Go client's round trip of an exec of
// /bin/true against a running daemon, the yardstick of the Python client's
// benchmark (bench/python.sh runs both against the same daemon in one run).
//
//	gobench -url unix:/path.sock -token TOKEN -n 2000
//
// It prints one JSON object: {"n": N, "p50_us": ..., "p99_us": ...,
// "cpu_us": ...}, cpu_us being the process's CPU time (user + system, all
// threads) over the timed execs, per exec.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
)

func main() {
	url := flag.String("url", os.Getenv("TAI42_URL"), "the daemon's URL")
	token := flag.String("token", os.Getenv("TAI42_TOKEN"), "the daemon's token")
	n := flag.Int("n", 2000, "execs to time (after 20 untimed)")
	files := flag.Bool("files", false, "also time PutFile and GetFile of 64 MiB (put_mbs, get_mbs)")
	flag.Parse()
	if err := run(*url, *token, *n, *files); err != nil {
		fmt.Fprintln(os.Stderr, "gobench:", err)
		os.Exit(1)
	}
}

func run(url, token string, n int, files bool) error {
	ctx := context.Background()
	c := client.New(url, token)
	defer c.Close()
	s, err := c.CreateSession(ctx, sandbox.SessionSpec{Image: "host", Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: 600})
	if err != nil {
		return err
	}
	defer s.Destroy(ctx) //nolint:errcheck // best effort at exit
	const warm = 20
	opts := sandbox.ExecOptions{Timeout: 10 * time.Second}
	for range warm {
		if _, err := s.Exec(ctx, []string{"/bin/true"}, opts); err != nil {
			return err
		}
	}
	lat := make([]time.Duration, 0, n)
	cpu0 := cpuTime()
	for range n {
		t := time.Now()
		if _, err := s.Exec(ctx, []string{"/bin/true"}, opts); err != nil {
			return err
		}
		lat = append(lat, time.Since(t))
	}
	cpu := cpuTime() - cpu0
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	out := map[string]any{
		"n": n, "p50_us": us(lat[len(lat)/2]), "p99_us": us(lat[len(lat)*99/100]),
		"cpu_us": us(cpu) / float64(n),
	}
	if files {
		data := make([]byte, 64<<20)
		mbs := func(d time.Duration) float64 { return float64(len(data)) / d.Seconds() / 1e6 }
		t := time.Now()
		if err := s.PutFile(ctx, "gobench.bin", data); err != nil {
			return err
		}
		out["put_mbs"] = mbs(time.Since(t))
		t = time.Now()
		if _, err := s.GetFile(ctx, "gobench.bin"); err != nil {
			return err
		}
		out["get_mbs"] = mbs(time.Since(t))
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
