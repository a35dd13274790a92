package kubernetes

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/agent"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/streaming/pkg/httpstream"
	httpstreamspdy "k8s.io/streaming/pkg/httpstream/spdy"
)

// A fake apiserver for the tunnel's tests without a cluster: it serves
// pods/<pod>/portforward with the kubelet's own port-forward server (the
// code the container runtimes' streaming servers run), forwarding port
// testAgentPort to an agent served in this process, any other port to a
// port nobody listens on; any other pod is a 404 with the apiserver's
// Status body.
type fakeAPI struct {
	srv       *httptest.Server
	agentAddr string
	oldAddr   string // an agent of a tai42 before op "mux" (oldAgentPort)
	// late is the agent lateAgentPort forwards to once set; until then
	// nothing listens there, as in a Pod running before its agent does.
	late    atomic.Pointer[string]
	refused string
	dir     string
	stop    func()
	// stopped ends every forward still copying: the kubelet's server
	// hands PortForward a background context, and a stream whose
	// connection died while one of its frame workers was blocked is
	// never closed by spdystream, so its Read would block for good.
	mu       sync.Mutex
	stopped  chan struct{}
	forwards sync.WaitGroup
	// unread are the data streams of containerd 1.6's failed forwards,
	// reset when the fake stops (see serveContainerd16).
	unread []httpstream.Stream
}

const fakePod = "tai42-fake"

// fakePodContainerd16's port-forwards are served as containerd 1.6's
// streaming server serves them (see serveContainerd16).
const fakePodContainerd16 = "tai42-fake-containerd16"

// oldAgentPort is forwarded to an agent that does not know op "mux".
const oldAgentPort = 7422

// lateAgentPort is forwarded to fakeAPI.late's agent once it is set.
const lateAgentPort = 7423

func newFakeAPI(t testing.TB) *fakeAPI {
	t.Helper()
	f := &fakeAPI{dir: t.TempDir(), stopped: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.agentAddr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = agent.Serve(ctx, ln, agent.Options{})
	}()
	nl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.refused = nl.Addr().String()
	nl.Close()
	f.oldAddr = oldAgent(t, f.agentAddr)
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/namespaces/{ns}/pods/{pod}/portforward", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("pod") == fakePodContainerd16 {
			f.serveContainerd16(w, r)
			return
		}
		if r.PathValue("pod") != fakePod {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			msg, _ := json.Marshal(fmt.Sprintf("pods %q not found", r.PathValue("pod")))
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":%s,"reason":"NotFound","code":404}`, msg)
			return
		}
		portforward.ServePortForward(w, r, f, fakePod, "uid", nil, time.Hour, 30*time.Second, []string{portForwardProtocol})
	})
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.Listener.Close()
	f.srv.Listener = &trackingListener{Listener: pfListen(t)}
	f.srv.Start()
	f.stop = func() {
		f.mu.Lock()
		close(f.stopped)
		for _, s := range f.unread {
			_ = s.Reset()
		}
		f.mu.Unlock()
		f.killConns()
		f.forwards.Wait()
		f.srv.Close()
		cancel()
		<-served
	}
	t.Cleanup(f.stop)
	return f
}

// trackingListener remembers every connection it accepted: the
// port-forward's are hijacked, and httptest forgets those.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func pfListen(t testing.TB) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// killConns closes every connection to the fake apiserver: the apiserver
// went away.
func (f *fakeAPI) killConns() {
	l := f.srv.Listener.(*trackingListener)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// PortForward copies between stream and the port, as a runtime's
// streaming server does.
func (f *fakeAPI) PortForward(ctx context.Context, _ string, _ string, port int32, stream io.ReadWriteCloser) error {
	addr := f.refused
	switch port {
	case testAgentPort:
		addr = f.agentAddr
	case oldAgentPort:
		addr = f.oldAddr
	case lateAgentPort:
		if a := f.late.Load(); a != nil {
			addr = *a
		}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	f.mu.Lock()
	select {
	case <-f.stopped:
		f.mu.Unlock()
		return errors.New("the fake apiserver stopped")
	default:
	}
	f.forwards.Add(1)
	f.mu.Unlock()
	defer f.forwards.Done()
	var copies sync.WaitGroup
	copies.Go(func() {
		_, _ = io.Copy(c, stream)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	copies.Go(func() { _, _ = io.Copy(stream, c) })
	finished := make(chan struct{})
	go func() { copies.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-f.stopped:
		// Reset unblocks the stream's Read; closing c the other copy.
		_ = stream.(interface{ Reset() error }).Reset()
		c.Close()
		<-finished
	}
	return nil
}

// serveContainerd16 serves a port-forward as containerd 1.6's streaming
// server does (Debian 12's containerd, the harness cluster's), whose copy
// of the kubelet's server predates the kubelet's resetting the streams of
// a failed forward: it writes why on the error stream and half-closes
// both. What the client wrote to the data stream then stays unread, and
// its frame holds the one of the connection's five spdystream frame
// workers that serves that stream (and every stream whose id falls to
// it), for as long as the connection lives: the client's reset of the
// stream is queued behind it. The fake resets those streams when it stops
// (containerd never does), so that its workers end.
func (f *fakeAPI) serveContainerd16(w http.ResponseWriter, r *http.Request) {
	if _, err := httpstream.Handshake(r, w, []string{portForwardProtocol}); err != nil {
		return
	}
	streams := make(chan httpstream.Stream, 16)
	conn := httpstreamspdy.NewResponseUpgrader().UpgradeResponse(w, r, func(s httpstream.Stream, _ <-chan struct{}) error {
		streams <- s
		return nil
	})
	if conn == nil {
		return
	}
	defer conn.Close()
	pairs := map[string][2]httpstream.Stream{} // error, data
	for {
		select {
		case <-conn.CloseChan():
			return
		case s := <-streams:
			id := s.Headers().Get(corev1.PortForwardRequestIDHeader)
			p := pairs[id]
			if s.Headers().Get(corev1.StreamType) == corev1.StreamTypeError {
				p[0] = s
			} else {
				p[1] = s
			}
			pairs[id] = p
			if p[0] != nil && p[1] != nil {
				delete(pairs, id)
				go f.forwardContainerd16(p[0], p[1])
			}
		}
	}
}

func (f *fakeAPI) forwardContainerd16(es, ds httpstream.Stream) {
	defer ds.Close()
	defer es.Close()
	port, _ := strconv.Atoi(ds.Headers().Get(corev1.PortHeader))
	if err := f.PortForward(context.Background(), fakePodContainerd16, "uid", int32(port), ds); err != nil {
		f.mu.Lock()
		f.unread = append(f.unread, ds)
		f.mu.Unlock()
		fmt.Fprintf(es, "error forwarding port %d to pod %s, uid uid: %v", port, fakePodContainerd16, err)
	}
}

// oldAgent serves, until t ends, an agent as a tai42 before op "mux" was:
// it answers a mux request with the protocol error an unknown op gets and
// hands every other connection to the agent at addr.
func oldAgent(t testing.TB, addr string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				hdr := make([]byte, 5)
				if _, err := io.ReadFull(c, hdr); err != nil {
					return
				}
				req := make([]byte, int(hdr[1])<<24|int(hdr[2])<<16|int(hdr[3])<<8|int(hdr[4]))
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				if bytes.Contains(req, []byte(`"op":"mux"`)) {
					msg := []byte(`{"kind":"protocol","message":"agent protocol: unknown operation \"mux\""}`)
					_, _ = c.Write(append([]byte{'E', 0, 0, 0, byte(len(msg))}, msg...))
					return
				}
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				if _, err := up.Write(append(hdr, req...)); err != nil {
					return
				}
				go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			})
		}
	})
	return ln.Addr().String()
}

func (f *fakeAPI) tunnel(t testing.TB, pod string, port int) *tunnel {
	tun := newTunnel(&rest.Config{Host: f.srv.URL}, "ns", pod, port)
	t.Cleanup(func() { tun.Close() })
	return tun
}

func pfRunIn(ctx context.Context, c *agent.Client, dir string, stdin []byte, argv ...string) (string, agent.Result, error) {
	var mu sync.Mutex
	var out bytes.Buffer
	p, err := c.Start(ctx, agent.ExecSpec{Argv: argv, Env: pfEnv, Dir: dir, Stdin: stdin},
		func(_ int, b []byte) bool { mu.Lock(); out.Write(b); mu.Unlock(); return true })
	if err != nil {
		return "", agent.Result{}, err
	}
	defer p.Close()
	select {
	case <-p.Done():
	case <-ctx.Done():
		return "", agent.Result{}, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	return out.String(), p.Result(), nil
}

// TestTunnelAgentLate: a Pod runs before its agent listens, and the pings
// made meanwhile fail (the forward refused); once the agent listens, the
// next ping through the same tunnel answers. On containerd 1.6 each
// failed forward left the request written to its data stream unread,
// holding one of the SPDY connection's five frame workers on the server
// (see serveContainerd16); once every worker was held, no stream could
// be made on the connection, and every ping after the agent started
// timed out (TestTunnel's "the agent of pod ... does not answer").
func TestTunnelAgentLate(t *testing.T) {
	f := newFakeAPI(t)
	tun := f.tunnel(t, fakePodContainerd16, lateAgentPort)
	cl := &agent.Client{Dial: tun.Dial}
	for i := range 12 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := cl.Ping(ctx)
		cancel()
		var te *TunnelError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("ping %d before the agent listens: %v, want the forward refused", i, err)
		}
	}
	f.late.Store(&f.agentAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := cl.Ping(ctx); err != nil {
		t.Fatalf("the first ping once the agent listens: %v after %v", err, time.Since(start))
	}
}

func TestTunnelFake(t *testing.T) {
	f := newFakeAPI(t)
	tun := f.tunnel(t, fakePod, testAgentPort)
	cl := &agent.Client{Dial: tun.Dial}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	out, res, err := pfRunIn(ctx, cl, f.dir, []byte("in"), "sh", "-c", "echo hello; cat; exit 3")
	if err != nil || res.ExitCode != 3 || out != "hello\nin" {
		t.Errorf("exec: %q %+v %v", out, res, err)
	}

	t.Run("PutGet", func(t *testing.T) {
		data := make([]byte, 20<<20)
		rand.Read(data)
		ref := agent.FileRef{Root: f.dir, Rel: "big", Orig: "big"}
		if err := cl.PutFile(ctx, ref, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		r, size, err := cl.OpenFile(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got, err := io.ReadAll(r)
		if err != nil || size != int64(len(data)) || sha256.Sum256(got) != sha256.Sum256(data) {
			t.Fatalf("get: %d bytes, size %d, %v", len(got), size, err)
		}
	})

	t.Run("Concurrent50", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for i := range 50 {
			wg.Go(func() {
				out, res, err := pfRunIn(ctx, cl, f.dir, nil, "echo", fmt.Sprint(i))
				if err != nil || res.ExitCode != 0 || out != fmt.Sprintln(i) {
					errs <- fmt.Errorf("exec %d: %q %+v %v", i, out, res, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("SlowReaderDoesNotStallOthers", func(t *testing.T) {
		// A get nobody reads holds its stream; execs on the same
		// connection go on.
		data := make([]byte, 4<<20)
		ref := agent.FileRef{Root: f.dir, Rel: "held", Orig: "held"}
		if err := cl.PutFile(ctx, ref, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		var held []io.ReadCloser
		for range 10 {
			r, _, err := cl.OpenFile(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, r)
		}
		defer func() {
			for _, r := range held {
				r.Close()
			}
		}()
		time.Sleep(200 * time.Millisecond)
		ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
		defer ecancel()
		for i := range 10 {
			if out, _, err := pfRunIn(ectx, cl, f.dir, nil, "echo", "ok"); err != nil || out != "ok\n" {
				t.Fatalf("exec %d beside unread gets: %q %v", i, out, err)
			}
		}
	})

	t.Run("CancelWhileReading", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		p, err := cl.Start(cctx, agent.ExecSpec{Argv: []string{"sleep", "100"}, Env: pfEnv, Dir: f.dir}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ccancel()
		p.Close()
		select {
		case <-p.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not end the exec")
		}
		// A ping whose ctx is cancelled while it waits fails at once.
		pctx, pcancel := context.WithTimeout(ctx, 0)
		defer pcancel()
		if err := cl.Ping(pctx); err == nil {
			t.Error("a ping with a done ctx succeeded")
		}
	})

	t.Run("Reconnect", func(t *testing.T) {
		tun.mu.Lock()
		old := tun.conn
		tun.mu.Unlock()
		tun.dropConnection()
		if err := cl.Ping(ctx); err != nil {
			t.Fatalf("ping after the connection closed: %v", err)
		}
		tun.mu.Lock()
		now := tun.conn
		tun.mu.Unlock()
		if now == nil || now == old {
			t.Error("no new connection")
		}
	})

	t.Run("ServerGoneMidStream", func(t *testing.T) {
		p, err := cl.Start(ctx, agent.ExecSpec{Argv: []string{"sleep", "100"}, Env: pfEnv, Dir: f.dir}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		start := time.Now()
		f.killConns()
		select {
		case <-p.Done():
			if p.Result().Err == nil {
				t.Error("the exec ended without an error")
			}
			t.Logf("exec failed %v after the apiserver went: %v", time.Since(start), p.Result().Err)
		case <-time.After(5 * time.Second):
			t.Fatal("the exec did not fail within 5 s")
		}
		if err := cl.Ping(ctx); err != nil {
			t.Fatalf("ping after the server came back: %v", err)
		}
	})

	t.Run("AgentWithoutMux", func(t *testing.T) {
		// An agent of an older tai42: a stream pair per connection.
		other := f.tunnel(t, fakePod, oldAgentPort)
		ocl := &agent.Client{Dial: other.Dial}
		for i := range 3 {
			if out, res, err := pfRunIn(ctx, ocl, f.dir, nil, "echo", fmt.Sprint(i)); err != nil || res.ExitCode != 0 || out != fmt.Sprintln(i) {
				t.Fatalf("exec %d on an agent without mux: %q %+v %v", i, out, res, err)
			}
		}
		other.mu.Lock()
		plain, m := other.plain, other.mux
		other.mu.Unlock()
		if !plain || m != nil {
			t.Errorf("the tunnel to an agent without mux: plain %v, mux %v", plain, m)
		}
		tun.mu.Lock()
		plain, m = tun.plain, tun.mux
		tun.mu.Unlock()
		if plain || m == nil {
			t.Errorf("the tunnel to a current agent: plain %v, mux %v; want it multiplexed", plain, m)
		}
	})

	t.Run("NobodyListens", func(t *testing.T) {
		other := f.tunnel(t, fakePod, 7999)
		err := (&agent.Client{Dial: other.Dial}).Ping(ctx)
		var te *TunnelError
		if !errors.As(err, &te) || te.What != "forwarding" || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "7999") {
			t.Fatalf("ping on a port nobody listens on: %v", err)
		}
	})

	t.Run("MissingPod", func(t *testing.T) {
		other := f.tunnel(t, "tai42-nope", testAgentPort)
		_, err := other.Dial(ctx)
		if !errors.Is(err, ErrPodNotFound) || !strings.Contains(err.Error(), `pods "tai42-nope" not found`) || !strings.Contains(err.Error(), other.host) {
			t.Fatalf("dial a missing pod: %v", err)
		}
	})

	t.Run("Closed", func(t *testing.T) {
		other := f.tunnel(t, fakePod, testAgentPort)
		c, err := other.Dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		other.Close()
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("a read on a closed tunnel's conn succeeded")
		}
		c.Close()
		if _, err := other.Dial(ctx); err == nil {
			t.Error("a dial on a closed tunnel succeeded")
		}
	})
}

// TestDeadline: the conn's read deadline wakes a blocked Read with
// os.ErrDeadlineExceeded, and clearing it lets reads go on.
func TestTunnelDeadline(t *testing.T) {
	f := newFakeAPI(t)
	tun := f.tunnel(t, fakePod, testAgentPort)
	c, err := tun.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("read past the deadline: %v after %v", err, time.Since(start))
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	// A ping request by hand: the agent answers, the read goes on.
	req := []byte(`{"v":1,"op":"ping"}`)
	frame := append([]byte{'Q', 0, 0, 0, byte(len(req))}, req...)
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(c, hdr); err != nil || hdr[0] != 'R' {
		t.Fatalf("the ping's reply: %q %v", hdr, err)
	}
}

// TestTunnelProxyAndDial: the tunnel reaches the apiserver through the
// rest.Config's Proxy (a CONNECT proxy here) and with its Dial, as
// client-go's own transports do; without them it dialed the apiserver
// directly.
func TestTunnelProxyAndDial(t *testing.T) {
	f := newFakeAPI(t)
	var connects, dials atomic.Int32
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var pwg sync.WaitGroup
	t.Cleanup(func() { pl.Close(); pwg.Wait() })
	pwg.Go(func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			pwg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || req.Method != http.MethodConnect {
					return
				}
				connects.Add(1)
				up, err := net.Dial("tcp", req.Host)
				if err != nil {
					fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
					return
				}
				defer up.Close()
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\n\r\n")
				go func() { _, _ = io.Copy(up, br); up.Close() }()
				_, _ = io.Copy(c, up)
			})
		}
	})
	purl, _ := url.Parse("http://" + pl.Addr().String())
	cfg := &rest.Config{Host: f.srv.URL, Proxy: http.ProxyURL(purl),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
	tun := newTunnel(cfg, "ns", fakePod, testAgentPort)
	defer tun.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := (&agent.Client{Dial: tun.Dial}).Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if connects.Load() != 1 || dials.Load() != 1 {
		t.Errorf("%d CONNECTs to the proxy, %d dials with the config's Dial; want 1 and 1", connects.Load(), dials.Load())
	}
}
