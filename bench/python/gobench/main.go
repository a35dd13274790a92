// Command gobench measures the Go client's round trip of an exec of
// /bin/true against a running daemon, the yardstick of the Python client's
// benchmark (bench/python.sh runs both against the same daemon in one run).
//
//	gobench -url unix:/path.sock -token TOKEN -n 2000
//
// It prints one JSON object: {"n": N, "p50_us": ..., "p99_us": ...}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
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
	lat := make([]time.Duration, 0, n)
	for i := range n + warm {
		t := time.Now()
		if _, err := s.Exec(ctx, []string{"/bin/true"}, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
			return err
		}
		if i >= warm {
			lat = append(lat, time.Since(t))
		}
	}
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	out := map[string]any{"n": n, "p50_us": us(lat[len(lat)/2]), "p99_us": us(lat[len(lat)*99/100])}
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
