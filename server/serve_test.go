package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// served is a Server running Serve on a real listener.
type served struct {
	srv    *Server
	base   string // http(s)://addr
	addr   string
	cancel context.CancelFunc
	done   chan error
	logs   *syncBuffer
}

func serve(t *testing.T, ln net.Listener, tlsConfig *tls.Config, grace time.Duration) *served {
	t.Helper()
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	logs := &syncBuffer{}
	srv, err := New(sb, Options{Token: testToken, ShutdownGrace: grace, Logger: newJSONLogger(logs)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{srv: srv, addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1), logs: logs}
	s.base = "http://" + s.addr
	if tlsConfig != nil {
		s.base = "https://" + s.addr
	}
	go func() { s.done <- srv.Serve(ctx, ln, tlsConfig) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return s
}

func authGet(t *testing.T, c *http.Client, url string) (int, []byte) {
	t.Helper()
	r, _ := http.NewRequest("GET", url, nil)
	r.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := c.Do(r)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func authPost(c *http.Client, url string, in any) (int, []byte, error) {
	b, _ := json.Marshal(in)
	r, _ := http.NewRequest("POST", url, bytes.NewReader(b))
	r.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := c.Do(r)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// TestServeShutdown: at shutdown a short exec in flight completes with its
// result, a plain exec and an interactive one past the grace are killed and
// told why, Serve returns within a few seconds and the port refuses new
// connections.
func TestServeShutdown(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, ln, nil, time.Second)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}

	// The http.Server's header limit.
	r, _ := http.NewRequest("GET", s.base+"/healthz", nil)
	r.Header.Set("X-Big", strings.Repeat("b", MaxHeaderBytes+4096))
	resp, err := c.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a header over %d bytes: %d", MaxHeaderBytes, resp.StatusCode)
	}

	status, b, err := authPost(c, s.base+"/v1/sessions", hostSpec())
	var info sandbox.SessionInfo
	if err != nil || status != http.StatusCreated || json.Unmarshal(b, &info) != nil {
		t.Fatalf("create: %d %s %v", status, b, err)
	}
	marker := "done-" + randHex(t)
	type execOut struct {
		status int
		body   []byte
		err    error
	}
	execDone := make(chan execOut, 1)
	go func() {
		st, b, err := authPost(c, s.base+"/v1/sessions/"+info.ID+"/exec", api.ExecRequest{
			Argv: []string{"sh", "-c", "sleep 0.4; echo " + marker}, TimeoutSeconds: 10,
		})
		execDone <- execOut{st, b, err}
	}()

	longArg := uniqueSleep(t, 30)
	longDone := make(chan execOut, 1)
	go func() {
		st, b, err := authPost(c, s.base+"/v1/sessions/"+info.ID+"/exec", api.ExecRequest{
			Argv: []string{"sleep", longArg}, TimeoutSeconds: 60,
		})
		longDone <- execOut{st, b, err}
	}()

	arg := uniqueSleep(t, 30)
	ctx, cancelDial := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelDial()
	wc, _, err := websocket.Dial(ctx, "ws://"+s.addr+"/v1/sessions/"+info.ID+"/exec/stream", &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: tr},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + testToken}},
		Subprotocols: []string{api.ExecSubprotocol},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = wc.CloseNow() }()
	w := wsClient{t, wc}
	w.start([]string{"sleep", arg}, 60, nil)
	w.expectStarted()
	waitProcs(t, arg, true, 5*time.Second)
	waitProcs(t, marker, true, 5*time.Second) // the short exec runs
	waitProcs(t, longArg, true, 5*time.Second)

	t0 := time.Now()
	s.cancel()
	out := <-execDone
	var res api.ExecResult
	if out.err != nil || out.status != http.StatusOK || json.Unmarshal(out.body, &res) != nil || res.Stdout != marker+"\n" {
		t.Errorf("the exec in flight: %d %s %v", out.status, out.body, out.err)
	}
	long := <-longDone
	var eb api.ErrorBody
	if long.err != nil || long.status != http.StatusServiceUnavailable || json.Unmarshal(long.body, &eb) != nil || eb.Error.Kind != api.KindShuttingDown {
		t.Errorf("the exec past the grace: %d %s %v", long.status, long.body, long.err)
	}
	rr := w.readToEnd(10 * time.Second)
	if rr.last.Type != api.FrameError || rr.last.Error == nil || rr.last.Error.Kind != api.KindShuttingDown ||
		rr.last.ExitCode == nil || *rr.last.ExitCode != 137 {
		t.Errorf("the stream's last frame %+v", rr.last)
	}
	if rr.closeStatus != websocket.StatusGoingAway {
		t.Errorf("the stream closed with %v (%v)", rr.closeStatus, rr.closeErr)
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		s.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if d := time.Since(t0); d < time.Second || d > 5*time.Second {
		t.Errorf("Serve returned %v after the cancel (grace 1s)", d)
	}
	waitProcs(t, arg, false, 2*time.Second)
	waitProcs(t, longArg, false, 2*time.Second)
	if conn, err := net.DialTimeout("tcp", s.addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("a new connection was accepted after the shutdown")
	}
}

// TestListenUnix: a unix socket of mode 0600, a stale socket replaced, a
// live one or a plain file refused.
func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tai42.sock")

	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	ln, err := Listen("unix:" + path)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, %v", fi.Mode(), err)
	}
	if _, err := Listen("unix:" + path); err == nil {
		t.Errorf("a second Listen on a live socket succeeded")
	}
	s := serve(t, ln, nil, time.Second)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}
	defer tr.CloseIdleConnections()
	if st, b := authGet(t, &http.Client{Transport: tr}, "http://unix/v1/policy"); st != http.StatusOK {
		t.Errorf("over the socket: %d %s", st, b)
	}
	s.cancel()
	if err := <-s.done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	s.done <- nil
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket file is left after Serve: %v", err)
	}

	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix:" + plain); err == nil {
		t.Errorf("Listen over a regular file succeeded")
	}
	if b, _ := os.ReadFile(plain); string(b) != "x" {
		t.Errorf("the regular file was touched")
	}
	for _, bad := range []string{"", "unix:"} {
		if _, err := Listen(bad); err == nil {
			t.Errorf("Listen(%q) succeeded", bad)
		}
	}
}

// TestServeTLS: Serve with a TLS config answers HTTPS and the WebSocket
// exec over it (HTTP/1.1).
func TestServeTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, time.Second)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	status, b, err := authPost(c, s.base+"/v1/sessions", hostSpec())
	var info sandbox.SessionInfo
	if err != nil || status != http.StatusCreated || json.Unmarshal(b, &info) != nil {
		t.Fatalf("create over TLS: %d %s %v", status, b, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc, _, err := websocket.Dial(ctx, "wss://"+s.addr+"/v1/sessions/"+info.ID+"/exec/stream", &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + testToken}},
		Subprotocols: []string{api.ExecSubprotocol},
	})
	if err != nil {
		t.Fatalf("wss: %v", err)
	}
	defer func() { _ = wc.CloseNow() }()
	w := wsClient{t, wc}
	w.start([]string{"echo", "secure"}, 10, nil)
	w.expectStarted()
	r := w.readToEnd(10 * time.Second)
	checkExit(t, r, 0)
	if r.stdout.String() != "secure\n" {
		t.Errorf("stdout %q", r.stdout.String())
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "tai42 test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// TestNewOptions: New refuses what it cannot serve and resolves defaults.
func TestNewOptions(t *testing.T) {
	sb, err := host.New(host.Options{Options: kit.Options{Policy: testPolicy}, ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	other := testPolicy
	other.Durable = false
	for name, opts := range map[string]Options{
		"no token":         {},
		"token with space": {Token: "a b"},
		"negative body":    {Token: "t", MaxBodyBytes: -1},
		"negative grace":   {Token: "t", ShutdownGrace: -1},
		"other policy":     {Token: "t", Policy: other},
		"invalid policy":   {Token: "t", Policy: sandbox.Policy{Egress: "lan", Isolation: sandbox.IsolationNone}},
	} {
		if _, err := New(sb, opts); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := New(nil, Options{Token: "t"}); err == nil {
		t.Errorf("New(nil) succeeded")
	}
	srv, err := New(sb, Options{Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if srv.policy != testPolicy || srv.maxBody != DefaultMaxBodyBytes || srv.grace != DefaultShutdownGrace {
		t.Errorf("defaults: %+v %d %v", srv.policy, srv.maxBody, srv.grace)
	}
	// Two servers cannot share a registry: their metrics would collide.
	if _, err := New(sb, Options{Token: "t", Registry: srv.reg}); err == nil {
		t.Errorf("a second server on the same registry succeeded")
	}
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, nil) }()
	waitFor(t, 5*time.Second, "the first Serve to answer", func() bool {
		resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	http.DefaultClient.CloseIdleConnections()
	ln2, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if err := srv.Serve(context.Background(), ln2, nil); err == nil {
		t.Errorf("a second Serve succeeded")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
