// Command soak drives a running TAI42 daemon (tai42 serve) with mixed load
// from many concurrent sessions for a long time, samples the daemon's RSS,
// goroutines and open file descriptors at a fixed interval, and fails when
// any of them keeps growing. bench/soak.sh builds the binary, starts the
// daemon and runs it; see the "Soak" section of bench/README.md.
//
//	soak -url http://127.0.0.1:PORT -token-file STATE/token -pid PID \
//	    [-d 30m] [-n 100] [-interval 10s] [-out DIR]
//
// Each of the N workers holds one session and loops over a mix: execs
// (echo, cat with stdin, non-zero exit, one that times out), interactive
// cats (written, closed and read; or killed), files of up to 256 KiB put
// and read back (whole and streamed), a missing file, touch, and now and
// then its session destroyed and created again (a fifth of them
// persistent, keyed by the worker, which must find what the worker last
// wrote there). Every answer is checked.
//
// It prints a table (one row per sample, as they are taken) and the
// verdict on stdout, and writes them to report.txt, and the samples to
// samples.csv and soak.png, in -out. SIGINT or SIGTERM ends the load early:
// the sessions are destroyed, the report printed, and the run fails.
//
// Exit status: 0 when no series keeps growing and no call failed
// unexpectedly; 1 when one grows, a series has too few samples to judge,
// a call failed, the daemon exited or the run was interrupted; 2 when the
// run could not start (a bad flag, no daemon, an unreadable token).
//
// The token is read from -token-file and never printed.
package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
)

// config is the command line.
type config struct {
	url       string
	tokenFile string
	pid       int
	duration  time.Duration
	sessions  int
	interval  time.Duration
	out       string
	image     string
	pause     time.Duration
	settle    time.Duration
	seed      uint64
	provider  string
	network   sandbox.Network
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.url, "url", "", "the daemon's URL (http://HOST:PORT or unix:/path); required")
	fs.StringVar(&c.tokenFile, "token-file", "", "a file holding the daemon's token; required")
	fs.IntVar(&c.pid, "pid", 0, "the daemon's process id, for /proc/PID; required")
	fs.DurationVar(&c.duration, "d", 30*time.Minute, "how long the load runs")
	fs.IntVar(&c.sessions, "n", 100, "concurrent sessions (one worker each)")
	fs.DurationVar(&c.interval, "interval", 10*time.Second, "sampling interval")
	fs.StringVar(&c.out, "out", ".", "directory for samples.csv and soak.png (made if missing)")
	fs.StringVar(&c.image, "image", "host", "the sessions' image")
	fs.DurationVar(&c.pause, "pause", 20*time.Millisecond, "mean pause of a worker between steps (uniform in [0, 2×pause)); 0: none")
	fs.DurationVar(&c.settle, "settle", 5*time.Second, "wait after the load, its sessions destroyed, before the last reading")
	fs.Uint64Var(&c.seed, "seed", 0, "seed of the workers' random choices; 0: a random one (printed)")
	fs.StringVar(&c.provider, "provider", "", "the daemon's provider, for the report only")
	network := "none"
	if os.Geteuid() != 0 {
		network = "egress" // the host runner's network none needs root
	}
	fs.StringVar(&network, "network", network, "the sessions' network: none (the default as root) or egress")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.url == "":
		return c, errors.New("-url is required")
	case c.tokenFile == "":
		return c, errors.New("-token-file is required")
	case c.pid <= 0:
		return c, errors.New("-pid is required (the daemon's process id)")
	case c.duration <= 0:
		return c, errors.New("-d must be > 0")
	case c.sessions <= 0:
		return c, errors.New("-n must be > 0")
	case c.interval <= 0:
		return c, errors.New("-interval must be > 0")
	case c.pause < 0:
		return c, errors.New("-pause must be ≥ 0")
	}
	c.network = sandbox.Network(network)
	if c.network != sandbox.NetworkNone && c.network != sandbox.NetworkEgress {
		return c, fmt.Errorf("-network %q is not none or egress", network)
	}
	if c.seed == 0 {
		c.seed = rand.Uint64() | 1
	}
	return c, nil
}

func main() {
	c, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "soak: the output directory:", err)
		os.Exit(2)
	}
	report, err := os.Create(filepath.Join(c.out, "report.txt"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, c, io.MultiWriter(os.Stdout, report), os.Stderr)
	stop()
	if err := report.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// run is the whole soak: set-up, load and sampling, teardown, report. It
// returns the exit status.
func run(ctx context.Context, c config, stdout, stderr io.Writer) int {
	setupErr := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "soak: "+format+"\n", args...)
		return 2
	}
	tb, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return setupErr("reading the token: %v", err)
	}
	token := strings.TrimSpace(string(tb))
	if token == "" {
		return setupErr("the token file %s is empty", c.tokenFile)
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return setupErr("the output directory: %v", err)
	}
	if _, err := readRSS(c.pid); err != nil {
		return setupErr("the daemon's process %d: %v", c.pid, err)
	}
	cl := client.New(c.url, token)
	defer cl.Close()
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = cl.Health(hctx)
	cancel()
	if err != nil {
		return setupErr("the daemon at %s does not answer: %v", c.url, err)
	}
	pr := newProber(c.url, token, c.pid)
	if _, err := pr.scrape(ctx, "go_goroutines"); err != nil {
		return setupErr("the daemon's metrics: %v", err)
	}

	fmt.Fprintf(stdout, "soak: %d sessions for %v against %s (pid %d%s), image %s, network %s, a sample every %v, pause %v, seed %d\n",
		c.sessions, c.duration, c.url, c.pid, providerNote(c.provider), c.image, c.network, c.interval, c.pause, c.seed)
	fmt.Fprintf(stdout, "machine: %d CPUs, load average %s\n", runtime.NumCPU(), loadavg())

	l := &load{sb: cl, image: c.image, network: c.network}
	start := time.Now()

	sampleErrs := newStats()
	var samples []Sample
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, tableHeader)
	daemonGone := false
	tenths := c.interval < time.Second
	var lastOps int64
	lastT := 0.0
	take := func() {
		t := time.Since(start).Seconds()
		s, err := pr.read(context.Background(), t)
		ops := l.ops.Load()
		if len(samples) > 0 && t > lastT {
			s.OpsPerSec = float64(ops-lastOps) / (t - lastT)
		}
		lastOps, lastT = ops, t
		if err != nil {
			if errors.Is(err, errDaemonGone) {
				daemonGone = true
			}
			k := "sample: reading the daemon"
			sampleErrs.errors[k]++
			if _, ok := sampleErrs.first[k]; !ok {
				sampleErrs.first[k] = err.Error()
			}
		}
		samples = append(samples, s)
		fmt.Fprintln(stdout, tableRow(s, tenths))
	}
	take() // before the load

	// The load, until the deadline, a signal or the daemon's exit.
	runCtx, endRun := context.WithTimeout(ctx, c.duration)
	defer endRun()
	workers := make([]*worker, c.sessions)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{l: l, id: i, rng: rand.New(rand.NewPCG(c.seed, uint64(i))), st: newStats(), key: fmt.Sprintf("soak-w%03d", i)}
		workers[i] = w
		wg.Go(func() { w.run(runCtx, c.pause, len(workers)) })
	}
	tick := time.NewTicker(c.interval)
	for runCtx.Err() == nil && !daemonGone {
		select {
		case <-runCtx.Done():
		case <-tick.C:
			take()
		}
	}
	tick.Stop()
	endRun()
	interrupted := ctx.Err() != nil
	loadTime := time.Since(start)
	fmt.Fprintf(stdout, "\nload ended after %v; waiting for the workers to finish their calls and destroy their sessions\n", loadTime.Round(time.Second))
	wg.Wait()

	// After the load: every session destroyed and the client's idle
	// connections closed (each holds a goroutine and a socket in the
	// daemon), a reading once settled.
	cl.Close()
	pr.hc.CloseIdleConnections()
	var after Sample
	var afterErr error
	if !daemonGone {
		sleepCtx(ctx, c.settle)
		after, afterErr = pr.read(context.Background(), time.Since(start).Seconds())
		daemonGone = errors.Is(afterErr, errDaemonGone)
	}

	all := newStats()
	for _, w := range workers {
		all.merge(w.st)
	}
	all.merge(sampleErrs)

	// Files.
	t := make([]float64, len(samples))
	rss, gor, fds := make([]float64, len(samples)), make([]float64, len(samples)), make([]float64, len(samples))
	for i, s := range samples {
		t[i], rss[i], gor[i], fds[i] = s.T, s.RSSMiB, s.Goroutines, s.FDs
	}
	verdicts := []Verdict{
		judge("rss_mib", t, rss, ruleRSS),
		judge("goroutines", t, gor, ruleGoroutines),
		judge("fds", t, fds, ruleFDs),
	}
	csvPath, pngPath := filepath.Join(c.out, "samples.csv"), filepath.Join(c.out, "soak.png")
	fileErr := writeCSV(csvPath, samples)
	if fileErr == nil {
		fileErr = writePNG(pngPath, plot(t, []panel{
			{title: "RSS (MIB)", y: rss, v: verdicts[0]},
			{title: "GOROUTINES", y: gor, v: verdicts[1]},
			{title: "OPEN FDS", y: fds, v: verdicts[2]},
		}))
	}

	// The report.
	fmt.Fprintf(stdout, "\nranges: %s\n", ranges(samples))
	fmt.Fprintf(stdout, "before the load: %s\n", reading(samples[0], nil))
	if !daemonGone {
		fmt.Fprintf(stdout, "after the load, its sessions destroyed and connections closed, %v later: %s\n", c.settle, reading(after, afterErr))
	}
	fmt.Fprintf(stdout, "load average at the end: %s\n", loadavg())
	fmt.Fprintln(stdout, "\noperations (client calls; latency of each call, all workers):")
	printOps(stdout, all, loadTime)
	unexpected := 0
	for _, n := range all.errors {
		unexpected += n
	}
	if unexpected > 0 {
		fmt.Fprintf(stdout, "\nunexpected errors: %d\n", unexpected)
		keys := slices.Sorted(maps.Keys(all.errors))
		for _, k := range keys {
			fmt.Fprintf(stdout, "  %6d  %s; first: %s\n", all.errors[k], k, clip(all.first[k]))
		}
	} else {
		fmt.Fprintln(stdout, "\nunexpected errors: none")
	}
	fmt.Fprintln(stdout, "\nverdict (after a warm-up of the first 20% of samples, at least 3: growing = the least-squares rise over the judged")
	fmt.Fprintln(stdout, "span and the last quarter's median over the second quarter's both exceed max(10% of the median, RSS 8 MiB / goroutines 20 / fds 10)):")
	var failures []string
	for _, v := range verdicts {
		fmt.Fprintln(stdout, "  "+v.String())
		switch {
		case v.Insufficient:
			failures = append(failures, v.Series+" not judged (too few samples)")
		case v.Growing:
			failures = append(failures, v.Series+" keeps growing")
		}
	}
	if fileErr != nil {
		failures = append(failures, "writing the results: "+fileErr.Error())
	} else {
		fmt.Fprintf(stdout, "\nwrote %s and %s\n", csvPath, pngPath)
	}
	if unexpected > 0 {
		failures = append(failures, fmt.Sprintf("%d unexpected errors", unexpected))
	}
	if daemonGone {
		failures = append(failures, "the daemon exited during the run")
	}
	if interrupted {
		failures = append(failures, fmt.Sprintf("interrupted after %v of %v", loadTime.Round(time.Second), c.duration))
	}
	if len(failures) > 0 {
		fmt.Fprintf(stdout, "\nFAIL: %s\n", strings.Join(failures, "; "))
		return 1
	}
	fmt.Fprintln(stdout, "\nPASS: nothing keeps growing, no unexpected error")
	return 0
}

func providerNote(p string) string {
	if p == "" {
		return ""
	}
	return ", provider " + p
}

const tableHeader = "    time   rss_mib  goroutines    fds  sessions     ops/s"

// tableRow formats s under tableHeader; a missing value is "-". tenths
// shows the time to a tenth of a second.
func tableRow(s Sample, tenths bool) string {
	return fmt.Sprintf("%8s  %8s  %10s  %5s  %8s  %8s", clock(s.T, tenths), cell(s.RSSMiB, 1), cell(s.Goroutines, 0),
		cell(s.FDs, 0), cell(s.Sessions, 0), cell(s.OpsPerSec, 1))
}

// clock formats seconds as M:SS, or M:SS.s with tenths.
func clock(sec float64, tenths bool) string {
	if tenths {
		d := int(math.Round(sec * 10))
		return fmt.Sprintf("%d:%02d.%d", d/600, d/10%60, d%10)
	}
	d := int(math.Round(sec))
	return fmt.Sprintf("%d:%02d", d/60, d%60)
}

func cell(v float64, decimals int) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// ranges is the min–max of each sampled series.
func ranges(samples []Sample) string {
	var parts []string
	for _, s := range []struct {
		name string
		get  func(Sample) float64
	}{
		{"rss_mib", func(s Sample) float64 { return s.RSSMiB }},
		{"goroutines", func(s Sample) float64 { return s.Goroutines }},
		{"fds", func(s Sample) float64 { return s.FDs }},
		{"sessions", func(s Sample) float64 { return s.Sessions }},
		{"ops/s", func(s Sample) float64 { return s.OpsPerSec }},
	} {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, x := range samples {
			if v := s.get(x); !math.IsNaN(v) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
		if math.IsInf(lo, 0) {
			parts = append(parts, s.name+" -")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f–%.1f", s.name, lo, hi))
	}
	return strings.Join(parts, ", ")
}

// reading formats one sample's levels.
func reading(s Sample, err error) string {
	out := fmt.Sprintf("rss %s MiB, %s goroutines, %s fds, %s sessions", cell(s.RSSMiB, 1), cell(s.Goroutines, 0), cell(s.FDs, 0), cell(s.Sessions, 0))
	if err != nil {
		out += " (" + err.Error() + ")"
	}
	return out
}

func printOps(w io.Writer, st *stats, d time.Duration) {
	names := slices.Sorted(maps.Keys(st.ops))
	errs := map[string]int{}
	for k, n := range st.errors {
		op, _, _ := strings.Cut(k, ": ")
		errs[op] += n
	}
	fmt.Fprintf(w, "  %-14s %9s %8s %7s %10s %10s %10s\n", "op", "calls", "per s", "errors", "p50 ms", "p99 ms", "max ms")
	total := 0
	for _, n := range names {
		o := st.ops[n]
		total += o.count
		ms := func(p float64) string { return fmt.Sprintf("%.2f", float64(percentile(o.latencies, p))/1e6) }
		fmt.Fprintf(w, "  %-14s %9d %8.1f %7d %10s %10s %10s\n", n, o.count, float64(o.count)/d.Seconds(), errs[n], ms(0.5), ms(0.99), ms(1))
	}
	fmt.Fprintf(w, "  %-14s %9d %8.1f\n", "all", total, float64(total)/d.Seconds())
}

// writeCSV writes the samples to path, a missing value as an empty field.
func writeCSV(path string, samples []Sample) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"t_s", "rss_mib", "goroutines", "fds", "sessions", "ops_per_s"})
	for _, s := range samples {
		rec := []string{cell(s.T, 1), cell(s.RSSMiB, 2), cell(s.Goroutines, 0), cell(s.FDs, 0), cell(s.Sessions, 0), cell(s.OpsPerSec, 1)}
		for i, v := range rec {
			if v == "-" {
				rec[i] = ""
			}
		}
		_ = w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
