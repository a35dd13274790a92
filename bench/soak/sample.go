package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one reading of the daemon. A value that could not be read is
// NaN (the reason is counted as an error of kind "sample").
type Sample struct {
	// T is the time since the load started, in seconds.
	T float64
	// RSSMiB is VmRSS from /proc/PID/status, in MiB (2^20 bytes).
	RSSMiB float64
	// Goroutines is go_goroutines from the daemon's /metrics.
	Goroutines float64
	// FDs is the number of entries of /proc/PID/fd.
	FDs float64
	// Sessions is tai42_sessions_live from the daemon's /metrics.
	Sessions float64
	// OpsPerSec is the client calls completed since the last sample, per
	// second.
	OpsPerSec float64
}

// errDaemonGone reports that the daemon's process no longer exists.
var errDaemonGone = errors.New("the daemon's process is gone")

// prober reads one daemon: its /proc entries and its /metrics. Its methods
// may be called from one goroutine at a time.
type prober struct {
	pid     int
	metrics string // the /metrics URL
	token   string
	hc      *http.Client
}

// newProber returns the prober of the daemon at url (http://HOST:PORT,
// https://HOST:PORT or unix:/path/to.sock) whose process is pid.
func newProber(url, token string, pid int) *prober {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	metrics := strings.TrimSuffix(url, "/") + "/metrics"
	if path, ok := strings.CutPrefix(url, "unix:"); ok {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
		tr.Proxy = nil
		metrics = "http://unix/metrics"
	}
	return &prober{pid: pid, metrics: metrics, token: token, hc: &http.Client{Transport: tr}}
}

// readRSS returns VmRSS of pid in MiB. A missing process is errDaemonGone.
func readRSS(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, errDaemonGone
		}
		return 0, fmt.Errorf("reading the daemon's status: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc/%d/status: VmRSS line %q is not \"N kB\"", pid, strings.TrimSpace(line))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status: VmRSS %q: %w", pid, f[0], err)
		}
		return float64(kb) / 1024, nil
	}
	// A zombie has no VmRSS line: it has exited.
	return 0, errDaemonGone
}

// countFDs returns the number of open file descriptors of pid.
func countFDs(pid int) (int, error) {
	d, err := os.Open(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, errDaemonGone
		}
		return 0, fmt.Errorf("listing the daemon's file descriptors: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, fmt.Errorf("listing the daemon's file descriptors: %w", err)
	}
	return len(names), nil
}

// scrapeTimeout bounds one GET /metrics.
const scrapeTimeout = 10 * time.Second

// scrape fetches the daemon's /metrics and returns the values of the named
// metrics (series without labels); a name it does not find is an error.
func (p *prober) scrape(ctx context.Context, names ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metrics, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET /metrics: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return parseMetrics(resp.Body, names...)
}

// parseMetrics reads the Prometheus text format from r and returns the
// values of the named unlabelled series. A name it does not find, or text
// that is not the format (a value that is not a number), is an error.
func parseMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("reading /metrics: %w", err)
	}
	out := make(map[string]float64, len(names))
	for _, n := range names {
		v, ok := unlabelledValue(families[n])
		if !ok {
			return nil, fmt.Errorf("/metrics has no %s", n)
		}
		out[n] = v
	}
	return out, nil
}

// unlabelledValue is the value of f's series without labels (a gauge, a
// counter or an untyped one), if f has one.
func unlabelledValue(f *dto.MetricFamily) (float64, bool) {
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) > 0 {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

// read takes one sample at t seconds (OpsPerSec is left for the caller).
// Every value it could not read is NaN and its error is returned, joined;
// errDaemonGone among them means the daemon has exited.
func (p *prober) read(ctx context.Context, t float64) (Sample, error) {
	s := Sample{T: t, RSSMiB: math.NaN(), Goroutines: math.NaN(), FDs: math.NaN(), Sessions: math.NaN(), OpsPerSec: math.NaN()}
	var errs []error
	if rss, err := readRSS(p.pid); err != nil {
		errs = append(errs, err)
	} else {
		s.RSSMiB = rss
	}
	if n, err := countFDs(p.pid); err != nil {
		if !errors.Is(err, errDaemonGone) || len(errs) == 0 {
			errs = append(errs, err)
		}
	} else {
		s.FDs = float64(n)
	}
	if m, err := p.scrape(ctx, "go_goroutines", "tai42_sessions_live"); err != nil {
		errs = append(errs, err)
	} else {
		s.Goroutines, s.Sessions = m["go_goroutines"], m["tai42_sessions_live"]
	}
	return s, errors.Join(errs...)
}
