package main

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/server"
)

const metricsText = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 42
go_gc_duration_seconds{quantile="0.5"} 1.5e-05
tai42_sessions_live 7
tai42_execs_started_total{mode="exec"} 3
`

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(metricsText), "go_goroutines", "tai42_sessions_live")
	if err != nil || m["go_goroutines"] != 42 || m["tai42_sessions_live"] != 7 || len(m) != 2 {
		t.Fatalf("%v, %v", m, err)
	}
	if _, err := parseMetrics(strings.NewReader(metricsText), "go_threads"); err == nil || !strings.Contains(err.Error(), "no go_threads") {
		t.Errorf("a missing metric: %v", err)
	}
	if _, err := parseMetrics(strings.NewReader(metricsText), "tai42_execs_started_total"); err == nil || !strings.Contains(err.Error(), "no tai42_execs_started_total") {
		t.Errorf("a metric with labelled series only: %v", err)
	}
	if _, err := parseMetrics(strings.NewReader("go_goroutines many\n"), "go_goroutines"); err == nil {
		t.Error("a value that is not a number is accepted")
	}
}

func TestProc(t *testing.T) {
	rss, err := readRSS(os.Getpid())
	if err != nil || rss <= 0 {
		t.Errorf("readRSS of this process: %v MiB, %v", rss, err)
	}
	before, err := countFDs(os.Getpid())
	if err != nil || before < 3 {
		t.Fatalf("countFDs: %d, %v", before, err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	after, err := countFDs(os.Getpid())
	f.Close()
	if err != nil || after != before+1 {
		t.Errorf("countFDs with one more file open: %d, was %d (%v)", after, before, err)
	}
	// A process that does not exist: the daemon is gone.
	if _, err := readRSS(1 << 30); !errors.Is(err, errDaemonGone) {
		t.Errorf("readRSS of no process: %v", err)
	}
	if _, err := countFDs(1 << 30); !errors.Is(err, errDaemonGone) {
		t.Errorf("countFDs of no process: %v", err)
	}
}

// metricsServer answers /metrics with metricsText to the bearer token
// "tok", 401 to anything else.
func metricsServer(t *testing.T) http.Handler {
	t.Helper()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "the bearer token is not valid", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(metricsText))
	})
}

func TestProberRead(t *testing.T) {
	ts := httptest.NewServer(metricsServer(t))
	defer ts.Close()
	s, err := newProber(ts.URL, "tok", os.Getpid()).read(context.Background(), 12.5)
	if err != nil {
		t.Fatal(err)
	}
	if s.T != 12.5 || s.RSSMiB <= 0 || s.FDs < 3 || s.Goroutines != 42 || s.Sessions != 7 {
		t.Errorf("%+v", s)
	}
	// A wrong token: the scrape's values are missing, the error says why.
	s, err = newProber(ts.URL, "wrong", os.Getpid()).read(context.Background(), 1)
	if err == nil || !strings.Contains(err.Error(), "401") || s.Goroutines == s.Goroutines || s.RSSMiB <= 0 {
		t.Errorf("wrong token: %+v, %v", s, err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error shows the token: %v", err)
	}
	// The daemon gone.
	if _, err := newProber(ts.URL, "tok", 1<<30).read(context.Background(), 1); !errors.Is(err, errDaemonGone) {
		t.Errorf("no process: %v", err)
	}
}

func TestProberUnix(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: metricsServer(t)}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	m, err := newProber("unix:"+sock, "tok", os.Getpid()).scrape(context.Background(), "go_goroutines")
	if err != nil || m["go_goroutines"] != 42 {
		t.Errorf("%v, %v", m, err)
	}
}

func TestParseFlags(t *testing.T) {
	var stderr bytes.Buffer
	c, err := parseFlags([]string{"-url", "http://x", "-token-file", "f", "-pid", "3", "-d", "2m", "-n", "20", "-interval", "1s", "-network", "egress"}, &stderr)
	if err != nil || c.duration != 2*time.Minute || c.sessions != 20 || c.interval != time.Second || c.seed == 0 ||
		c.network != sandbox.NetworkEgress || c.image != "host" {
		t.Errorf("%+v, %v", c, err)
	}
	for _, args := range [][]string{
		{"-token-file", "f", "-pid", "3"},
		{"-url", "http://x", "-pid", "3"},
		{"-url", "http://x", "-token-file", "f"},
		{"-url", "http://x", "-token-file", "f", "-pid", "3", "-n", "0"},
		{"-url", "http://x", "-token-file", "f", "-pid", "3", "-interval", "0s"},
		{"-url", "http://x", "-token-file", "f", "-pid", "3", "-network", "internal"},
		{"-url", "http://x", "-token-file", "f", "-pid", "3", "extra"},
	} {
		if _, err := parseFlags(args, &stderr); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// TestRun runs the whole driver for two seconds against a host sandbox
// served in this process (network egress: no root needed), this process
// standing for the daemon's: every answer is right, the table, CSV and PNG
// are written. The verdict itself is not asserted (it judges the test
// process, -race and all).
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a two-second load")
	}
	policy := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
	sb, err := host.New(host.Options{Options: kit.Options{Policy: policy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	srv, err := server.New(sb, server.Options{Token: "soak-test-token", Policy: policy, Provider: host.Name})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("soak-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), config{
		url: ts.URL, tokenFile: tokenFile, pid: os.Getpid(), duration: 2 * time.Second, sessions: 4,
		interval: 100 * time.Millisecond, out: out, image: sandbox.HostImage, pause: time.Millisecond,
		settle: 100 * time.Millisecond, seed: 7, network: sandbox.NetworkEgress,
	}, &stdout, &stderr)
	report := stdout.String()
	if code != 0 && code != 1 || stderr.Len() > 0 {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr.String(), report)
	}
	for _, want := range []string{"unexpected errors: none", "    time   rss_mib", "rss_mib    ", "goroutines ", "fds        ",
		"\n  create ", "\n  exec_echo ", "\n  exec_stdin ", "\n  stream ", "\n  put_file ", "\n  get_file ", "\n  open_file ", "\n  touch "} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "soak-test-token") {
		t.Error("the report shows the token")
	}
	csv, err := os.ReadFile(filepath.Join(out, "samples.csv"))
	if err != nil {
		t.Fatal(err)
	}
	// The header, the sample before the load, and samples through it: 20
	// at the 100 ms interval on a quiet machine, fewer on a loaded one
	// (each sample waits for /metrics and /proc); 5 show it samples on.
	if lines := strings.Count(string(csv), "\n"); lines < 7 || !strings.HasPrefix(string(csv), "t_s,rss_mib,goroutines,fds,sessions,ops_per_s\n") {
		t.Errorf("samples.csv: %d lines; want the header and at least 6 samples:\n%s", lines, csv)
	}
	f, err := os.Open(filepath.Join(out, "soak.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("soak.png: %v", err)
	}
	// Every session was destroyed.
	if infos, err := sb.ListSessions(context.Background()); err != nil || len(infos) != 0 {
		t.Errorf("sessions left: %v, %v", infos, err)
	}
}
