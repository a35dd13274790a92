package kubernetes

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// hangingAPI is a client of an apiserver that never answers.
func hangingAPI(t *testing.T) k8s.Interface {
	quit := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-quit:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(quit) })
	cs, err := k8s.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestTeardownCallsBounded: against an apiserver that never answers, the
// teardown's writes (the env Secret's delete, the workspace's release, the
// ledger's Put and Delete) each end by their own bound, under a context
// that is never cancelled (as the kit hands them). Not parallel: it
// shortens apiCallTimeout.
func TestTeardownCallsBounded(t *testing.T) {
	old := apiCallTimeout
	apiCallTimeout = 300 * time.Millisecond
	t.Cleanup(func() { apiCallTimeout = old })

	cs := hangingAPI(t)
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	ws, err := newWorkspaces(cs, "ns", wsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := &ledger{client: cs, ns: "ns", local: map[string]localRecord{}, env: map[string]map[string]sandbox.Secret{}}
	r := &session{p: &provider{cs: cs, cfg: cfg, ns: "ns"}, id: "s1"}
	ctx := context.WithoutCancel(context.Background())
	for name, call := range map[string]func() error{
		"deleteSecret":     func() error { return r.deleteSecret(ctx) },
		"releaseWorkspace": func() error { return ws.releaseWorkspace(ctx, "s1", "k") },
		"ledger.Put":       func() error { return l.Put(ctx, kit.Record{ID: "s1", State: kit.StateDestroying}) },
		"ledger.Delete":    func() error { return l.Delete(ctx, "s1") },
	} {
		t0 := time.Now()
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: no error from an apiserver that never answered", name)
			}
			t.Logf("%s: %v after %v", name, err, time.Since(t0))
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not ended 10 s in: unbounded", name)
		}
	}
}

// TestNetworkRunBounded: the standing policies' ensure, against an
// apiserver that never answers, ends by the probe's Timeout as a failed
// probe, under the network's own context (never cancelled but by close).
func TestNetworkRunBounded(t *testing.T) {
	cs := hangingAPI(t)
	n := newNetwork(cs, "ns", networkOptions{ProbeImage: "bb:1", Timeout: 300 * time.Millisecond})
	done := make(chan probeResult, 1)
	go func() { done <- n.run(context.Background()) }()
	select {
	case r := <-done:
		if r.err == nil || r.enforced {
			t.Errorf("enforced %v err %v; want a failed probe", r.enforced, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run has not ended 10 s in: unbounded")
	}
}

// TestPingRetryable: connect retries a ping the network failed (the
// agent not listening yet) and fails at once on an answer that will not
// change (retried, a protocol version mismatch waited out CreateTimeout).
func TestPingRetryable(t *testing.T) {
	tun := &tunnel{host: "h:1", ns: "ns", pod: "p", port: AgentPort}
	refused := tun.errorf("the apiserver refused the port-forward", errors.New("forbidden"))
	refused.Status = http.StatusForbidden
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{sandbox.WrapError("ping", "cannot reach the agent", tun.errorf("forwarding", errors.New("connection refused"))), true},
		{sandbox.WrapError("ping", "no answer to the ping: lost the connection to the agent", io.EOF), true},
		{sandbox.WrapError("ping", "no answer", syscall.ECONNRESET), true},
		{sandbox.WrapError("ping", "cancelled", context.DeadlineExceeded), true},
		{sandbox.WrapError("ping", "cannot reach the agent", refused), false},
		{sandbox.Errorf("ping", "protocol version mismatch: the client pinged in version 1, the agent answered in version 2"), false},
		{&sandbox.SandboxError{Op: "ping", Message: "unknown op", Err: errors.New("the agent's cause")}, false},
	} {
		if got := pingRetryable(tc.err); got != tc.want {
			t.Errorf("%v: retryable %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestPFDeadlineSetAfterStop: a deadline set after stop (a conn's
// SetDeadline after its Close) returns; it waited for good on the close
// of a channel the stopped timer would never close.
func TestPFDeadlineSetAfterStop(t *testing.T) {
	d := newPFDeadline()
	d.set(time.Now().Add(time.Hour))
	d.stop()
	done := make(chan struct{})
	go func() { d.set(time.Now().Add(time.Hour)); d.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("set after stop has not returned 5 s in")
	}
}
