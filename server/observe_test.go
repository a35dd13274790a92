package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// scrape reads /metrics into "name{labels}" -> value.
func (e *env) scrape() map[string]float64 {
	e.t.Helper()
	body := e.call("GET", "/metrics", nil, http.StatusOK, nil)
	m := make(map[string]float64)
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			e.t.Fatalf("metrics line %q: %v", line, err)
		}
		m[line[:i]] = v
	}
	return m
}

// TestMetrics: after some activity every metric is there with plausible
// values.
func TestMetrics(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	gone := e.create(hostSpec()).ID
	short := hostSpec()
	short.TTLSeconds = 1
	e.create(short)
	bad := hostSpec()
	bad.Network = "internal"
	e.callErr("POST", "/v1/sessions", bad, http.StatusUnprocessableEntity, api.KindSpecRejected)
	for range 3 {
		e.exec(id, api.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2"}, TimeoutSeconds: 10})
	}
	w := wsClient{t, e.dial(id, nil)}
	w.start([]string{"echo", "streamed"}, 10, nil)
	w.expectStarted()
	checkExit(t, w.readToEnd(10*time.Second), 0)
	e.call("PUT", "/v1/sessions/"+id+"/files?path=f", "12345", http.StatusNoContent, nil)
	e.call("GET", "/v1/sessions/"+id+"/files?path=f", nil, http.StatusOK, nil)
	e.call("DELETE", "/v1/sessions/"+gone, nil, http.StatusNoContent, nil)
	time.Sleep(1100 * time.Millisecond)
	var reaped api.Reaped
	e.call("POST", "/v1/reap", nil, http.StatusOK, &reaped)
	if len(reaped.Reaped) != 1 {
		t.Fatalf("reaped %v", reaped.Reaped)
	}
	waitIdle(t, e.srv) // the stream's handler has counted its end

	m := e.scrape()
	atLeast := map[string]float64{
		`tai42_sessions_live`:                                         1,
		`tai42_sessions_created_total`:                                3,
		`tai42_sessions_rejected_total{reason="unenforceable"}`:       1,
		`tai42_sessions_rejected_total{reason="policy"}`:              0,
		`tai42_sessions_reaped_total`:                                 1,
		`tai42_sessions_destroyed_total`:                              1,
		`tai42_execs_started_total{mode="exec"}`:                      3,
		`tai42_execs_started_total{mode="stream"}`:                    1,
		`tai42_exec_duration_seconds_count{mode="exec"}`:              3,
		`tai42_exec_duration_seconds_count{mode="stream"}`:            1,
		`tai42_exec_duration_seconds_bucket{mode="exec",le="+Inf"}`:   3,
		`tai42_bytes_streamed_total{direction="stdout"}`:              3*4 + 9,
		`tai42_bytes_streamed_total{direction="stderr"}`:              3 * 4,
		`tai42_bytes_streamed_total{direction="stdin"}`:               0,
		`tai42_bytes_streamed_total{direction="put"}`:                 5,
		`tai42_bytes_streamed_total{direction="get"}`:                 5,
		`tai42_http_requests_total{code="201",route="createSession"}`: 3,
		`tai42_http_requests_total{code="422",route="createSession"}`: 1,
		`tai42_http_requests_total{code="101",route="execStream"}`:    1,
		`tai42_http_requests_total{code="200",route="exec"}`:          3,
		`go_goroutines`:              1,
		`process_start_time_seconds`: 1,
	}
	for k, min := range atLeast {
		v, ok := m[k]
		if !ok {
			t.Errorf("metric %s is missing", k)
			continue
		}
		if v < min {
			t.Errorf("metric %s = %v, want >= %v", k, v, min)
		}
	}
	if v := m[`tai42_sessions_live`]; v != 1 {
		t.Errorf("sessions_live %v, want 1", v)
	}
}

// TestLogs: one JSON line per request with its id, route, status and
// duration; no secret and no token anywhere in the log.
func TestLogs(t *testing.T) {
	e := newEnv(t)
	secret := "hunter2-" + randHex(t)
	execSecret := "swordfish-" + randHex(t)
	spec := hostSpec()
	spec.Env = map[string]string{"SECRET_X": secret}

	n := 0
	reqID := func() string { n++; return fmt.Sprint("req-", n) }
	call := func(method, path string, in any, want int) []byte {
		t.Helper()
		id := reqID()
		var b []byte
		if in != nil {
			b, _ = json.Marshal(in)
		}
		resp := e.req(method, path, strings.NewReader(string(b)), testToken, api.HeaderRequestID, id)
		defer resp.Body.Close()
		var out []byte
		buf := make([]byte, 4096)
		for {
			k, err := resp.Body.Read(buf)
			out = append(out, buf[:k]...)
			if err != nil {
				break
			}
		}
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, out)
		}
		return out
	}
	var info struct{ ID string }
	_ = json.Unmarshal(call("POST", "/v1/sessions", spec, http.StatusCreated), &info)
	out := call("POST", "/v1/sessions/"+info.ID+"/exec", api.ExecRequest{
		Argv: []string{"sh", "-c", `echo "$SECRET_X $EXEC_SECRET"; exit 1`}, Env: map[string]string{"EXEC_SECRET": execSecret}, TimeoutSeconds: 10,
	}, http.StatusOK)
	if !strings.Contains(string(out), secret+" "+execSecret) {
		t.Fatalf("the exec did not see its env: %s", out)
	}
	call("GET", "/v1/sessions/"+info.ID, nil, http.StatusOK)
	call("GET", "/v1/sessions/nope", nil, http.StatusNotFound)
	// A refused token is not logged either.
	resp := e.req("GET", "/v1/sessions", nil, "wrong-"+secret, api.HeaderRequestID, reqID())
	resp.Body.Close()
	// An interactive exec with a secret in its env and its output.
	w := wsClient{t, e.dial(info.ID, nil)}
	n++ // the dial's request carries no id of ours
	w.sendJSON(api.ExecRequest{Type: api.FrameStart, Argv: []string{"sh", "-c", `echo "$S"; exit 2`}, Env: map[string]string{"S": execSecret}, TimeoutSeconds: 10})
	w.expectStarted()
	r := w.readToEnd(10 * time.Second)
	checkExit(t, r, 2)
	waitIdle(t, e.srv)

	logs := e.logs.String()
	for _, s := range []string{secret, execSecret, testToken, "Authorization", "Bearer", "SECRET_X", "EXEC_SECRET"} {
		if strings.Contains(logs, s) {
			t.Errorf("the log holds %q:\n%s", s, logs)
		}
	}
	seen := map[string]int{}
	var streamLine map[string]any
	lines := 0
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] != "request" {
			continue
		}
		lines++
		for _, k := range []string{"request_id", "method", "route", "status", "duration_ms", "bytes_in", "bytes_out"} {
			if _, ok := m[k]; !ok {
				t.Errorf("log line without %s: %s", k, line)
			}
		}
		if d, ok := m["duration_ms"].(float64); !ok || d < 0 {
			t.Errorf("duration_ms %v", m["duration_ms"])
		}
		seen[fmt.Sprint(m["request_id"])]++
		if m["route"] == "execStream" {
			streamLine = m
		}
		if m["route"] == "exec" && m["session_id"] != info.ID {
			t.Errorf("exec line without its session id: %s", line)
		}
	}
	if lines != n {
		t.Errorf("%d request lines for %d requests:\n%s", lines, n, logs)
	}
	for i := 1; i <= n; i++ {
		if id := fmt.Sprint("req-", i); i != n && seen[id] != 1 {
			t.Errorf("request %s has %d lines", id, seen[id])
		}
	}
	if streamLine == nil || streamLine["status"] != float64(101) || streamLine["exit_code"] != float64(2) ||
		streamLine["exec_end"] != "exit" || streamLine["session_id"] != info.ID {
		t.Errorf("stream line %v", streamLine)
	}
}

// pooled is a sandbox that reports a warm pool's figures.
type pooled struct {
	sandbox.Sandbox
	stats []sandbox.PoolStats
}

func (p pooled) PoolStats() []sandbox.PoolStats { return p.stats }

// TestPoolMetrics: a sandbox with a warm pool has its figures in /metrics,
// per shape; one without has no pool series.
func TestPoolMetrics(t *testing.T) {
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	e := newEnvOn(t, sb, pooled{sb, []sandbox.PoolStats{
		{Image: "host", Network: sandbox.NetworkNone, Size: 8, Ready: 7, Hits: 12, Misses: 3, Refills: 19, RefillSeconds: 0.57, RefillFailures: 1, Discarded: 2},
		{Image: "python:3.12", Network: sandbox.NetworkEgress, Size: 2},
	}})
	m := e.scrape()
	for k, want := range map[string]float64{
		`tai42_pool_size{image="host",network="none"}`:                          8,
		`tai42_pool_ready{image="host",network="none"}`:                         7,
		`tai42_pool_hits_total{image="host",network="none"}`:                    12,
		`tai42_pool_misses_total{image="host",network="none"}`:                  3,
		`tai42_pool_discarded_total{image="host",network="none"}`:               2,
		`tai42_pool_refill_failures_total{image="host",network="none"}`:         1,
		`tai42_pool_refill_seconds_count{image="host",network="none"}`:          19,
		`tai42_pool_refill_seconds_sum{image="host",network="none"}`:            0.57,
		`tai42_pool_size{image="python:3.12",network="egress"}`:                 2,
		`tai42_pool_hits_total{image="python:3.12",network="egress"}`:           0,
		`tai42_pool_refill_seconds_count{image="python:3.12",network="egress"}`: 0,
	} {
		if v, ok := m[k]; !ok || v != want {
			t.Errorf("metric %s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	for k := range newEnv(t).scrape() {
		if strings.HasPrefix(k, "tai42_pool_") {
			t.Errorf("a sandbox without a pool has the series %s", k)
		}
	}
}
