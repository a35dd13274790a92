package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tai42/sandbox"
)

// Label values.
const (
	modeExec   = "exec"
	modeStream = "stream"

	dirStdin  = "stdin"
	dirStdout = "stdout"
	dirStderr = "stderr"
	dirPut    = "put"
	dirGet    = "get"
)

// metrics are the server's Prometheus metrics, all prefixed tai42_.
type metrics struct {
	created      prometheus.Counter
	rejectedVec  *prometheus.CounterVec
	reaped       prometheus.Counter // nil when the sandbox counts its own reaps
	destroyed    prometheus.Counter
	execsStarted *prometheus.CounterVec
	execDuration *prometheus.HistogramVec
	bytes        *prometheus.CounterVec
	requests     *prometheus.CounterVec
	pulls        *prometheus.CounterVec
}

// Results of a pull beyond the PullReasons.
const (
	pullOK    = "ok"
	pullOther = "other" // an error that is not an *ImagePullError (a cancelled pull, a provider without images)
)

// pullReasons are the PullReason label values, every one a series from the start.
var pullReasons = []sandbox.PullReason{sandbox.PullInvalidReference, sandbox.PullNotFound, sandbox.PullUnauthorized,
	sandbox.PullNoPlatform, sandbox.PullInvalidImage, sandbox.PullUnreachable, sandbox.PullStorage}

// listTimeout bounds the ListSessions of one scrape of sessions_live.
const listTimeout = 5 * time.Second

func newMetrics(reg *prometheus.Registry, sb sandbox.Sandbox) (*metrics, error) {
	m := &metrics{
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tai42_sessions_created_total", Help: "Sessions created through the API.",
		}),
		rejectedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tai42_sessions_rejected_total", Help: "Session specs rejected, by reason (invalid, policy, unenforceable, conflict).",
		}, []string{"reason"}),
		destroyed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tai42_sessions_destroyed_total", Help: "Live sessions destroyed through the API.",
		}),
		execsStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tai42_execs_started_total", Help: "Execs started, by mode (exec: to completion; stream: interactive).",
		}, []string{"mode"}),
		execDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tai42_exec_duration_seconds",
			Help:    "Wall time of execs, by mode.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}, []string{"mode"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tai42_bytes_streamed_total", Help: "Bytes moved, by direction (stdin, stdout, stderr of execs; put, get of files).",
		}, []string{"direction"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tai42_http_requests_total", Help: "HTTP requests, by route (operation id, or unknown) and status code.",
		}, []string{"route", "code"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tai42_image_pulls_total", Help: "Image pulls through the API, by result (ok, a pull error's reason, or other).",
		}, []string{"result"}),
	}
	live := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tai42_sessions_live", Help: "Live sessions.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
		defer cancel()
		infos, err := sb.ListSessions(ctx)
		if err != nil {
			return 0
		}
		return float64(len(infos))
	})
	var reaped prometheus.Collector
	if rc, ok := sb.(interface{ ReapedCount() uint64 }); ok {
		reaped = prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tai42_sessions_reaped_total", Help: "Expired sessions reaped (by the background reaper and POST /v1/reap).",
		}, func() float64 { return float64(rc.ReapedCount()) })
	} else {
		m.reaped = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tai42_sessions_reaped_total", Help: "Expired sessions reaped by POST /v1/reap.",
		})
		reaped = m.reaped
	}
	cs := []prometheus.Collector{m.created, m.rejectedVec, reaped, m.destroyed, m.execsStarted,
		m.execDuration, m.bytes, m.requests, m.pulls, live}
	if pr, ok := sb.(sandbox.PoolReporter); ok && len(pr.PoolStats()) > 0 {
		cs = append(cs, poolCollector{pr})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: registering metrics: %w", err)
		}
	}
	// The runtime's collectors may already be in a registry the caller
	// shares; that is fine.
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &are) {
			return nil, fmt.Errorf("server: registering metrics: %w", err)
		}
	}
	// Every series exists from the start, at zero.
	for _, r := range []sandbox.RejectReason{sandbox.ReasonInvalid, sandbox.ReasonPolicy, sandbox.ReasonUnenforceable, sandbox.ReasonConflict} {
		m.rejectedVec.WithLabelValues(string(r))
	}
	for _, mode := range []string{modeExec, modeStream} {
		m.execsStarted.WithLabelValues(mode)
		m.execDuration.WithLabelValues(mode)
	}
	for _, d := range []string{dirStdin, dirStdout, dirStderr, dirPut, dirGet} {
		m.bytes.WithLabelValues(d)
	}
	for _, r := range pullReasons {
		m.pulls.WithLabelValues(string(r))
	}
	m.pulls.WithLabelValues(pullOK)
	m.pulls.WithLabelValues(pullOther)
	return m, nil
}

// poolCollector reports a warm pool's figures, per shape (labels image
// and network), as the sandbox counts them.
type poolCollector struct{ pr sandbox.PoolReporter }

var (
	poolLabels    = []string{"image", "network"}
	poolSize      = prometheus.NewDesc("tai42_pool_size", "Sessions the warm pool keeps ready of a shape.", poolLabels, nil)
	poolReady     = prometheus.NewDesc("tai42_pool_ready", "Sessions of a shape ready in the warm pool now.", poolLabels, nil)
	poolHits      = prometheus.NewDesc("tai42_pool_hits_total", "Creates of a pooled shape served from the warm pool.", poolLabels, nil)
	poolMisses    = prometheus.NewDesc("tai42_pool_misses_total", "Creates of a pooled shape made cold: none was ready.", poolLabels, nil)
	poolDiscarded = prometheus.NewDesc("tai42_pool_discarded_total", "Pooled sessions never handed out: dead at their take, or their image removed or replaced.", poolLabels, nil)
	poolFailures  = prometheus.NewDesc("tai42_pool_refill_failures_total", "Creates of the warm pool's refill that failed.", poolLabels, nil)
	poolRefill    = prometheus.NewDesc("tai42_pool_refill_seconds", "Time the warm pool's refill took to make a session.", poolLabels, nil)
)

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolSize, poolReady, poolHits, poolMisses, poolDiscarded, poolFailures, poolRefill} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.pr.PoolStats() {
		lv := []string{st.Image, string(st.Network)}
		ch <- prometheus.MustNewConstMetric(poolSize, prometheus.GaugeValue, float64(st.Size), lv...)
		ch <- prometheus.MustNewConstMetric(poolReady, prometheus.GaugeValue, float64(st.Ready), lv...)
		ch <- prometheus.MustNewConstMetric(poolHits, prometheus.CounterValue, float64(st.Hits), lv...)
		ch <- prometheus.MustNewConstMetric(poolMisses, prometheus.CounterValue, float64(st.Misses), lv...)
		ch <- prometheus.MustNewConstMetric(poolDiscarded, prometheus.CounterValue, float64(st.Discarded), lv...)
		ch <- prometheus.MustNewConstMetric(poolFailures, prometheus.CounterValue, float64(st.RefillFailures), lv...)
		ch <- prometheus.MustNewConstSummary(poolRefill, st.Refills, st.RefillSeconds, nil, lv...)
	}
}

// pulled counts a pull by its result.
func (m *metrics) pulled(err error) {
	var pe *sandbox.ImagePullError
	switch {
	case err == nil:
		m.pulls.WithLabelValues(pullOK).Inc()
	case errors.As(err, &pe) && slices.Contains(pullReasons, pe.Reason):
		m.pulls.WithLabelValues(string(pe.Reason)).Inc()
	default:
		m.pulls.WithLabelValues(pullOther).Inc()
	}
}

// rejected counts a create refused with a *sandbox.SpecRejectedError.
func (m *metrics) rejected(err error) {
	var rej *sandbox.SpecRejectedError
	if errors.As(err, &rej) {
		m.rejectedVec.WithLabelValues(string(rej.Reason)).Inc()
	}
}

// reapedByRoute counts the reap route's sessions when the sandbox does not
// count its own.
func (m *metrics) reapedByRoute(n int) {
	if m.reaped != nil {
		m.reaped.Add(float64(n))
	}
}

func (m *metrics) streamed(direction string, n int) {
	if n > 0 {
		m.bytes.WithLabelValues(direction).Add(float64(n))
	}
}

func (m *metrics) request(route string, status int) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
}

func (s *Server) metricsHandler() http.HandlerFunc {
	h := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	return h.ServeHTTP
}
