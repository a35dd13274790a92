package kubernetes

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	xproxy "golang.org/x/net/proxy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/streaming/pkg/httpstream"
	httpstreamspdy "k8s.io/streaming/pkg/httpstream/spdy"

	"github.com/tai42/sandbox/internal/agent"
)

// The transport to a session's agent: the apiserver's port-forward to the
// Pod (the agent listens on the Pod's own loopback, AgentPort), over ONE
// long-lived SPDY connection per Pod, and on it ONE stream pair (the error
// and the data stream of one port-forward request: one TCP connection to
// the agent in the Pod) that the agent multiplexes (its op "mux", yamux):
// every agent connection is a yamux stream on it, opened without a round
// trip. A new stream pair per agent connection would cost two SPDY stream
// creations through the apiserver, the kubelet and the runtime, and a TCP
// connection the runtime makes in the Pod, for every exec and file. An
// agent that cannot multiplex (an older tai42's) gets a stream pair per
// connection.
//
// Why port-forward rather than one long-lived exec running a relay: port-
// forward needs nothing in the session's image or in the Pod but the agent
// itself, and reaches it without a process of its own, which would have to
// survive everything the session does to its processes.

const (
	// portForwardProtocol is the port-forward subprotocol
	// (k8s.io/client-go/tools/portforward.PortForwardProtocolV1Name).
	portForwardProtocol = "portforward.k8s.io"
	// defaultDialTimeout bounds a Dial whose ctx has no sooner deadline:
	// the connection (TCP, TLS, upgrade) and the stream pair.
	defaultDialTimeout = 10 * time.Second
	// pingPeriod: SPDY pings keep the connection alive through idle
	// timeouts of proxies and load balancers between us and the apiserver.
	pingPeriod = 5 * time.Second
	// errorStreamWait is how long a data stream's end waits for its error
	// stream to say why (the two streams end independently).
	errorStreamWait = time.Second
	// maxBuffered bounds what a tunnel conn holds that its reader has not
	// read yet. spdystream hands a stream's data frames to one of five
	// frame workers that block until the stream's reader takes them, so a
	// conn whose reader pauses (an exec's output under back-pressure, a
	// get read slowly) would stall its worker and with it every fifth
	// stream of the connection; each conn therefore drains its stream into
	// a buffer of its own, and stalls the worker only past this bound.
	maxBuffered = 8 << 20
)

// ErrPodNotFound: the apiserver knows no such Pod (errors.Is on a
// *TunnelError).
var ErrPodNotFound = errors.New("the pod does not exist")

// TunnelError is a failure of the transport to a session Pod's agent. It
// names the apiserver and the Pod; never a credential.
type TunnelError struct {
	// Host is the apiserver (host:port).
	Host string
	// Namespace, Pod and Port name the forwarded port.
	Namespace, Pod string
	Port           int
	// What says what failed: "connecting to the apiserver", "opening a
	// stream", "forwarding", "the connection to the apiserver was lost".
	What string
	// Status is the HTTP status of a refused upgrade (404: the Pod does not
	// exist; 403: RBAC forbids pods/portforward), else 0.
	Status int
	// Reason is the apiserver's metav1.StatusReason of a refused upgrade.
	Reason metav1.StatusReason
	Err    error
}

func (e *TunnelError) Error() string {
	s := fmt.Sprintf("port-forward to pod %s/%s port %d through the apiserver %s: %s", e.Namespace, e.Pod, e.Port, e.Host, e.What)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *TunnelError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPodNotFound) true for a refused upgrade whose
// Pod does not exist.
func (e *TunnelError) Is(target error) bool {
	return target == ErrPodNotFound && (e.Status == http.StatusNotFound || e.Reason == metav1.StatusReasonNotFound)
}

// tunnel dials the agent of one Pod through the apiserver's port-forward.
// Safe for concurrent use: many Dials share the one SPDY connection.
type tunnel struct {
	cfg  *rest.Config
	ns   string
	pod  string
	port int
	host string   // the apiserver, for messages
	url  *url.URL // pods/<pod>/portforward

	// dialTimeout bounds a Dial (a variable for tests).
	dialTimeout time.Duration
	// noMux dials a stream pair per connection, as for an agent that
	// cannot multiplex (benchmarks compare).
	noMux bool

	nextID atomic.Uint64

	mu         sync.Mutex
	conn       httpstream.Connection // nil: none (yet, or it closed)
	raw        net.Conn              // conn's TCP connection
	connecting chan struct{}         // non-nil while a connect runs; closed at its end
	connErr    error                 // the last connect's error, for its waiters
	closed     bool
	stop       chan struct{} // closed by Close
	wg         sync.WaitGroup

	// The multiplexed agent connection, on the SPDY connection muxOn.
	// muxLock (a token) is held while one is opened, so that concurrent
	// Dials open one; a Dial can give up waiting for it.
	muxLock chan struct{}
	mux     *agent.Mux
	muxOn   httpstream.Connection
	carrier *tunnelConn // the stream pair mux runs on
	plain   bool        // the agent cannot multiplex: a stream pair per Dial
}

// newTunnel makes the tunnel to port of Pod ns/pod; it connects on the
// first Dial.
func newTunnel(cfg *rest.Config, ns, pod string, port int) *tunnel {
	t := &tunnel{cfg: cfg, ns: ns, pod: pod, port: port, dialTimeout: defaultDialTimeout,
		stop: make(chan struct{}), muxLock: make(chan struct{}, 1)}
	t.host = apiserverHost(cfg.Host)
	if base, err := apiserverURL(cfg.Host); err == nil {
		u := *base
		u.User = nil
		u.Path = pfJoinPath(base.Path, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(pod)+"/portforward")
		t.url = &u
	}
	return t
}

// apiserverURL parses a rest.Config's Host: a URL, or "host:port" without
// a scheme, as rest.Config allows.
func apiserverURL(host string) (*url.URL, error) {
	u, err := url.Parse(host)
	if err == nil && u.Host == "" {
		u, err = url.Parse("https://" + host)
	}
	return u, err
}

// apiserverHost is a rest.Config's Host as messages name it: host:port,
// never a userinfo the URL may carry (a password).
func apiserverHost(host string) string {
	if u, err := apiserverURL(host); err == nil {
		return u.Host
	}
	if i := strings.LastIndex(host, "@"); i >= 0 {
		return host[i+1:]
	}
	return host
}

func pfJoinPath(a, b string) string {
	for len(a) > 0 && a[len(a)-1] == '/' {
		a = a[:len(a)-1]
	}
	return a + b
}

func (t *tunnel) errorf(what string, err error) *TunnelError {
	return &TunnelError{Host: t.host, Namespace: t.ns, Pod: t.pod, Port: t.port, What: what, Err: err}
}

// Close closes the connection; every conn it carries fails, and Dial fails
// from now on. It returns once every goroutine of the tunnel ended.
func (t *tunnel) Close() error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.stop)
		if t.conn != nil {
			pfHardClose(t.conn, t.raw)
			t.conn, t.raw = nil, nil
		}
	}
	m := t.mux
	t.mux, t.muxOn, t.carrier = nil, nil, nil
	t.mu.Unlock()
	if m != nil {
		m.Close()
	}
	t.wg.Wait()
	return nil
}

// Dial opens a new connection to the agent: a new stream on the tunnel's
// multiplexed agent connection, which it opens first if there is none (the
// first Dial, or the last one failed), and with it the SPDY connection. It
// waits at most until ctx is done or the tunnel's dial timeout passed.
// Errors are *TunnelError.
func (t *tunnel) Dial(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, t.errorf("dialing", context.Cause(ctx))
	}
	ctx, cancel := context.WithTimeout(ctx, t.dialTimeout)
	defer cancel()
	for retried := false; ; retried = true {
		c, err := t.connection(ctx)
		if err != nil {
			return nil, err
		}
		t.mu.Lock()
		plain := t.plain || t.noMux
		t.mu.Unlock()
		if plain {
			return t.dialPair(ctx, c)
		}
		m, carrier, err := t.muxFor(ctx, c)
		if err != nil {
			return nil, err
		}
		if m == nil { // the agent cannot multiplex
			return t.dialPair(ctx, c)
		}
		st, err := m.Dial(ctx)
		if err == nil {
			return &muxConn{Conn: st, t: t, m: m, carrier: carrier}, nil
		}
		// The session failed since it was opened (its connection lost):
		// open a new one, once.
		t.forgetMux(m)
		if retried {
			return nil, t.errorf("opening a stream", err)
		}
	}
}

// muxFor returns the multiplexed agent connection on c, opening it if
// there is none there: a stream pair, and the agent's op "mux" on it. It
// returns a nil Mux once the agent answered that it cannot multiplex.
func (t *tunnel) muxFor(ctx context.Context, c httpstream.Connection) (*agent.Mux, *tunnelConn, error) {
	select {
	case t.muxLock <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, t.errorf("opening a stream", fmt.Errorf("no stream within the dial's bound: %w", context.Cause(ctx)))
	}
	defer func() { <-t.muxLock }()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, nil, t.errorf("dialing", errors.New("the tunnel is closed"))
	}
	if t.plain {
		t.mu.Unlock()
		return nil, nil, nil
	}
	if m := t.mux; m != nil && t.muxOn == c && !pfIsClosed(m.Done()) {
		carrier := t.carrier
		t.mu.Unlock()
		return m, carrier, nil
	}
	old := t.mux
	t.mux, t.muxOn, t.carrier = nil, nil, nil
	t.mu.Unlock()
	if old != nil {
		old.Close()
	}
	carrier, err := t.dialPair(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	// A forward the server could not make says so on the error stream;
	// the data stream's reset may wait behind the request written to it
	// (one of the server's frame workers holds it), so the error ends
	// the exchange.
	octx, ocancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-carrier.errDone:
			if carrier.errMsg != "" {
				ocancel()
			}
		case <-octx.Done():
		}
	}()
	m, err := agent.OpenMux(octx, carrier)
	ocancel()
	if err != nil && ctx.Err() == nil {
		if ferr := carrier.forwardErr(); ferr != nil {
			carrier.Close()
			return nil, nil, ferr
		}
	}
	if errors.Is(err, agent.ErrMuxUnsupported) {
		t.mu.Lock()
		t.plain = true
		t.mu.Unlock()
		return nil, nil, nil
	}
	if err != nil {
		// The carrier's own failure (the forward refused, the connection
		// lost) says more than the exchange's.
		if cerr := carrier.err(); cerr != nil {
			err = cerr
		}
		var te *TunnelError
		if !errors.As(err, &te) {
			err = t.errorf("forwarding", err)
		}
		return nil, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		m.Close()
		return nil, nil, t.errorf("dialing", errors.New("the tunnel is closed"))
	}
	t.mux, t.muxOn, t.carrier = m, c, carrier
	return m, carrier, nil
}

// forgetMux closes m and forgets it if it is the tunnel's.
func (t *tunnel) forgetMux(m *agent.Mux) {
	t.mu.Lock()
	if t.mux == m {
		t.mux, t.muxOn, t.carrier = nil, nil, nil
	}
	t.mu.Unlock()
	m.Close()
}

// muxConn is one agent connection on the multiplexed one: a yamux
// stream, whose errors, once the multiplexed connection failed, say why
// as the transport does (a *TunnelError), and whose deadline errors are
// os.ErrDeadlineExceeded, as net.Conn's contract has them.
type muxConn struct {
	net.Conn
	t       *tunnel
	m       *agent.Mux
	carrier *tunnelConn
}

func (c *muxConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	return n, c.why(err)
}

func (c *muxConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	return n, c.why(err)
}

func (c *muxConn) why(err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return os.ErrDeadlineExceeded
	}
	if !pfIsClosed(c.m.Done()) {
		return err // the stream's own end (io.EOF: the agent closed it)
	}
	if cerr := c.carrier.err(); cerr != nil {
		return cerr
	}
	return c.t.errorf("the connection to the agent was lost", err)
}

func (c *muxConn) RemoteAddr() net.Addr { return c.carrier.RemoteAddr() }

// dialPair opens a stream pair on c: a new agent connection.
func (t *tunnel) dialPair(ctx context.Context, c httpstream.Connection) (*tunnelConn, error) {
	id := strconv.FormatUint(t.nextID.Add(1), 10)
	h := func(typ string) http.Header {
		h := http.Header{}
		h.Set(corev1.StreamType, typ)
		h.Set(corev1.PortHeader, strconv.Itoa(t.port))
		h.Set(corev1.PortForwardRequestIDHeader, id)
		return h
	}
	// Both streams at once: each CreateStream waits for the server's
	// reply, a round trip through the apiserver and the kubelet; the
	// server pairs the two by request id in whatever order they come.
	type created struct {
		s   httpstream.Stream
		err error
	}
	// A creator whose Dial gave up (ctx, the connection's loss) resets
	// its stream itself once it comes. CreateStream cannot be cancelled:
	// it waits up to 30 s for a reply, even on a connection that closed
	// (spdystream does not wake it), so Close does not wait for the
	// creators; each ends within that bound.
	errc, datac := make(chan created), make(chan created)
	abandon := make(chan struct{})
	for _, x := range []struct {
		typ string
		ch  chan created
	}{{corev1.StreamTypeError, errc}, {corev1.StreamTypeData, datac}} {
		go func() {
			s, err := c.CreateStream(h(x.typ))
			select {
			case x.ch <- created{s, err}:
			case <-abandon:
				pfResetAll(c, s)
			}
		}()
	}
	var es, ds httpstream.Stream
	var firstErr error
	giveUp := func(what string, err error) (*tunnelConn, error) {
		close(abandon)
		pfResetAll(c, es, ds)
		return nil, t.errorf(what, err)
	}
	for es == nil || ds == nil {
		select {
		case r := <-errc:
			errc = nil
			if r.err != nil && firstErr == nil {
				firstErr = r.err
			}
			es = pfOrFailed(r.s, r.err)
		case r := <-datac:
			datac = nil
			if r.err != nil && firstErr == nil {
				firstErr = r.err
			}
			ds = pfOrFailed(r.s, r.err)
		case <-c.CloseChan():
			return giveUp("the connection to the apiserver was lost", errors.New("while opening a stream"))
		case <-ctx.Done():
			return giveUp("opening a stream", fmt.Errorf("no stream within the dial's bound: %w", context.Cause(ctx)))
		}
	}
	if firstErr != nil {
		// The server resets the pair once it failed to forward (nothing
		// listens on the port): the error stream, if it was made, says
		// why.
		if es != pfFailed {
			if msg := pfReadBounded(es, errorStreamWait); msg != "" {
				firstErr = errors.New(msg)
				pfResetAll(c, ds, es)
				return nil, t.errorf("forwarding", firstErr)
			}
		}
		pfResetAll(c, es, ds)
		what := "opening a stream"
		select {
		case <-c.CloseChan():
			what = "the connection to the apiserver was lost"
		default:
		}
		return nil, t.errorf(what, firstErr)
	}
	es.Close() // nothing is written to the error stream
	return t.newConn(c, es, ds), nil
}

// pfReadBounded reads s to its end, waiting at most d; it returns what
// came (the reader is left to end when s is reset).
func pfReadBounded(s httpstream.Stream, d time.Duration) string {
	ch := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(s, 64<<10))
		ch <- string(b)
	}()
	select {
	case m := <-ch:
		return m
	case <-time.After(d):
		return ""
	}
}

// pfResetAll resets and forgets the streams that were made.
func pfResetAll(c httpstream.Connection, ss ...httpstream.Stream) {
	for _, s := range ss {
		if s != nil && s != pfFailed {
			// A reset that fails finds the stream already gone.
			_ = s.Reset()
			c.RemoveStreams(s)
		}
	}
}

// pfFailed stands for a stream that could not be created.
var pfFailed httpstream.Stream = pfFailedStream{}

type pfFailedStream struct{ httpstream.Stream }

func pfOrFailed(s httpstream.Stream, err error) httpstream.Stream {
	if err != nil || s == nil {
		return pfFailed
	}
	return s
}

// connection returns the live SPDY connection, opening one if there is
// none: one connect at a time, which every Dial meanwhile waits for.
func (t *tunnel) connection(ctx context.Context) (httpstream.Connection, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, t.errorf("dialing", errors.New("the tunnel is closed"))
		}
		if c := t.conn; c != nil {
			select {
			case <-c.CloseChan():
				t.conn = nil
			default:
				t.mu.Unlock()
				return c, nil
			}
		}
		wait := t.connecting
		if wait == nil {
			wait = make(chan struct{})
			t.connecting = wait
			t.wg.Add(1)
			go t.connect(wait)
		}
		t.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, t.errorf("connecting to the apiserver", fmt.Errorf("not connected within the dial's bound: %w", context.Cause(ctx)))
		}
		t.mu.Lock()
		c, err := t.conn, t.connErr
		t.mu.Unlock()
		if c == nil && err != nil {
			return nil, err
		}
	}
}

// connect opens the SPDY connection; done is closed at its end. It is
// bounded by the dial timeout and by Close, not by the Dial that started
// it: the Dials waiting for it may have longer bounds.
func (t *tunnel) connect(done chan struct{}) {
	defer t.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), t.dialTimeout)
	defer cancel()
	go func() {
		select {
		case <-t.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, raw, err := t.upgrade(ctx)
	t.mu.Lock()
	t.connecting = nil
	t.connErr = err
	if err == nil {
		if t.closed {
			pfHardClose(c, raw)
			t.connErr = t.errorf("dialing", errors.New("the tunnel is closed"))
		} else {
			t.conn, t.raw = c, raw
			t.wg.Add(1)
			go t.watch(c, raw)
		}
	}
	t.mu.Unlock()
	close(done)
}

// watch forgets c once it closed, so the next Dial reconnects.
func (t *tunnel) watch(c httpstream.Connection, raw net.Conn) {
	defer t.wg.Done()
	select {
	case <-c.CloseChan():
	case <-t.stop:
		pfHardClose(c, raw)
		<-c.CloseChan()
	}
	t.mu.Lock()
	if t.conn == c {
		t.conn = nil
	}
	t.mu.Unlock()
}

// pfHardClose closes c at once: its streams reset, then its TCP connection
// closed. spdystream's own Close alone waits, without a bound, for every
// stream to end, and a stream whose creation is still awaiting its reply
// is in no list Close resets; the closed TCP connection ends spdystream's
// reader, which ends every stream and closes CloseChan.
func pfHardClose(c httpstream.Connection, raw net.Conn) {
	c.Close()
	if raw != nil {
		raw.Close()
	}
}

// dropConnection closes the live connection, if any, as its loss would:
// every conn on it fails, the next Dial reconnects.
func (t *tunnel) dropConnection() {
	t.mu.Lock()
	c, raw := t.conn, t.raw
	t.conn, t.raw = nil, nil
	t.mu.Unlock()
	if c != nil {
		pfHardClose(c, raw)
		<-c.CloseChan()
	}
}

// dropConnectionOf closes c, if it is still the tunnel's connection, as
// its loss would: every conn on it fails, the next Dial reconnects.
func (t *tunnel) dropConnectionOf(c httpstream.Connection) {
	t.mu.Lock()
	if t.conn != c {
		t.mu.Unlock()
		return
	}
	raw := t.raw
	t.conn, t.raw = nil, nil
	t.mu.Unlock()
	pfHardClose(c, raw)
}

// upgrade makes the port-forward request and upgrades it to SPDY. The
// TCP connection it dials is closed if ctx ends before the upgrade did:
// client-go's SPDY round tripper reads the response without a deadline.
func (t *tunnel) upgrade(ctx context.Context) (httpstream.Connection, net.Conn, error) {
	if t.url == nil {
		return nil, nil, t.errorf("connecting to the apiserver", errors.New("the apiserver's address does not parse"))
	}
	tlsConfig, err := rest.TLSConfigFor(t.cfg)
	if err != nil {
		return nil, nil, t.errorf("connecting to the apiserver", fmt.Errorf("the TLS configuration: %w", err))
	}
	var mu sync.Mutex
	var raw []net.Conn
	// The config's Dial and Proxy, as client-go's own transports take
	// them (a nil Proxy is the environment's). The SPDY round tripper
	// ignores an upgrade transport's Proxy, so the proxy is dialed here.
	dial := (&net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3}}).DialContext
	if t.cfg.Dial != nil {
		dial = t.cfg.Dial
	}
	proxy := http.ProxyFromEnvironment
	if t.cfg.Proxy != nil {
		proxy = t.cfg.Proxy
	}
	proxyURL, err := proxy(&http.Request{Method: http.MethodPost, URL: t.url, Header: http.Header{}})
	if err != nil {
		return nil, nil, t.errorf("connecting to the apiserver", fmt.Errorf("choosing the proxy: %w", err))
	}
	transport := &http.Transport{
		TLSClientConfig: tlsConfig,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialThrough(ctx, dial, proxyURL, network, addr)
			if err == nil {
				mu.Lock()
				raw = append(raw, c)
				mu.Unlock()
			}
			return c, err
		},
	}
	if t.url.Scheme == "http" {
		transport.TLSClientConfig = nil
	}
	rt, err := httpstreamspdy.NewRoundTripperWithConfig(httpstreamspdy.RoundTripperConfig{
		UpgradeTransport: transport,
		PingPeriod:       pingPeriod,
	})
	if err != nil {
		return nil, nil, t.errorf("connecting to the apiserver", err)
	}
	wrapped, err := rest.HTTPWrappersForConfig(t.cfg, rt)
	if err != nil {
		return nil, nil, t.errorf("connecting to the apiserver", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url.String(), nil)
	if err != nil {
		return nil, nil, t.errorf("connecting to the apiserver", err)
	}
	req.Header.Add(httpstream.HeaderProtocolVersion, portForwardProtocol)
	abort := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range raw {
			c.Close()
		}
	})
	resp, err := (&http.Client{Transport: wrapped}).Do(req)
	if err != nil {
		abort()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", context.Cause(ctx), err)
		}
		return nil, nil, t.errorf("connecting to the apiserver", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		abort()
		for _, c := range raw {
			c.Close()
		}
		e := t.errorf("the apiserver refused the port-forward", nil)
		e.Status = resp.StatusCode
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Message != "" {
			e.Reason = st.Reason
			e.Err = errors.New(st.Message)
		} else {
			e.Err = fmt.Errorf("HTTP status %s", resp.Status)
		}
		return nil, nil, e
	}
	c, err := rt.NewConnection(resp)
	if !abort() {
		if c != nil {
			c.Close()
		}
		return nil, nil, t.errorf("connecting to the apiserver", fmt.Errorf("not upgraded within the dial's bound: %w", context.Cause(ctx)))
	}
	if err != nil {
		for _, c := range raw {
			c.Close()
		}
		return nil, nil, t.errorf("connecting to the apiserver", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(raw) == 0 {
		c.Close()
		return nil, nil, t.errorf("connecting to the apiserver", errors.New("the upgraded connection is not one the tunnel dialed"))
	}
	return c, raw[len(raw)-1], nil
}

// newConn makes the net.Conn of a stream pair and starts draining both.
func (t *tunnel) newConn(c httpstream.Connection, es, ds httpstream.Stream) *tunnelConn {
	tc := &tunnelConn{
		t: t, c: c, es: es, ds: ds,
		notify:  make(chan struct{}, 1),
		space:   make(chan struct{}, 1),
		closed:  make(chan struct{}),
		errDone: make(chan struct{}),
		rd:      newPFDeadline(),
		wd:      newPFDeadline(),
	}
	t.wg.Add(2)
	go tc.readErrors()
	go tc.pump()
	return tc
}

// tunnelConn is one agent connection: the data stream of a port-forward
// request, whose error stream's text becomes its read error.
//
// Deadlines: a read deadline wakes a blocked Read; a write deadline fails
// the Writes that start after it passed, and one that passes during a
// Write resets the stream (the conn is then unusable: SPDY cannot take
// back a half-sent frame). agent.Client uses deadlines only to abort
// an operation whose ctx ended, which is what this gives.
type tunnelConn struct {
	t      *tunnel
	c      httpstream.Connection
	es, ds httpstream.Stream

	mu       sync.Mutex
	buf      [][]byte // read from ds, not yet read by Read
	buffered int
	readErr  error // set once the pump ended: io.EOF or why
	notify   chan struct{}
	space    chan struct{}

	errDone chan struct{} // the error stream ended; errMsg is set
	errMsg  string

	closeOnce sync.Once
	closed    chan struct{}
	rd, wd    *pfDeadline
}

// forwardErr is the server's word on the error stream that it could not
// forward, once it came (nil before, or when it said nothing).
func (tc *tunnelConn) forwardErr() error {
	select {
	case <-tc.errDone:
		if tc.errMsg != "" {
			return tc.t.errorf("forwarding", errors.New(tc.errMsg))
		}
	default:
	}
	return nil
}

// err is why the conn's data stream ended, once it did (nil before).
func (tc *tunnelConn) err() error {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.readErr == io.EOF {
		return nil
	}
	return tc.readErr
}

// readErrors reads the error stream to its end: the server writes there
// why it could not forward (nothing listens on the port, ...).
//
// A failed forward ends the SPDY connection too. What the client wrote
// to the data stream before the failure came (an agent request goes out
// at once: no reply says a forward was made) is never read on the server
// side, and a streaming server that half-closes rather than resets the
// streams of a failed forward (containerd 1.6's, older than the kubelet's
// own) keeps it: its frame holds the one of the connection's five
// spdystream frame workers that serves that stream id, and the stream's
// reset waits behind it. Every stream whose id falls to a held worker is
// never answered, so after a few failed forwards (the agent of a Pod that
// runs before its agent listens) no stream could be made on the
// connection at all. The next Dial connects anew.
func (tc *tunnelConn) readErrors() {
	defer tc.t.wg.Done()
	b, _ := io.ReadAll(io.LimitReader(tc.es, 64<<10))
	tc.errMsg = string(b)
	close(tc.errDone)
	if tc.errMsg != "" {
		tc.t.dropConnectionOf(tc.c)
	}
}

// pump drains the data stream into buf.
func (tc *tunnelConn) pump() {
	defer tc.t.wg.Done()
	var err error
	scratch := make([]byte, 32<<10)
	for {
		var n int
		n, err = tc.ds.Read(scratch)
		if n > 0 {
			p := append([]byte(nil), scratch[:n]...)
			tc.mu.Lock()
			tc.buf = append(tc.buf, p[:n])
			tc.buffered += n
			full := tc.buffered >= maxBuffered
			tc.mu.Unlock()
			pfWake(tc.notify)
			for full {
				select {
				case <-tc.space:
				case <-tc.closed:
					return
				}
				tc.mu.Lock()
				full = tc.buffered >= maxBuffered
				tc.mu.Unlock()
			}
		}
		if err != nil {
			break
		}
	}
	// Why the stream ended: the error stream's text, or the connection's
	// loss; else a plain end.
	select {
	case <-tc.errDone:
	case <-tc.closed:
	case <-time.After(errorStreamWait):
	}
	select {
	case <-tc.errDone:
		if tc.errMsg != "" {
			err = tc.t.errorf("forwarding", errors.New(tc.errMsg))
		}
	default:
	}
	if !errors.As(err, new(*TunnelError)) {
		select {
		case <-tc.c.CloseChan():
			err = tc.t.errorf("the connection to the apiserver was lost", nil)
		default:
			if err == nil {
				err = io.EOF
			}
		}
	}
	tc.mu.Lock()
	tc.readErr = err
	tc.mu.Unlock()
	pfWake(tc.notify)
}

func pfWake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (tc *tunnelConn) Read(p []byte) (int, error) {
	for {
		tc.mu.Lock()
		if len(tc.buf) > 0 {
			n := 0
			for len(tc.buf) > 0 && n < len(p) {
				m := copy(p[n:], tc.buf[0])
				n += m
				if m == len(tc.buf[0]) {
					tc.buf[0] = nil
					tc.buf = tc.buf[1:]
				} else {
					tc.buf[0] = tc.buf[0][m:]
				}
			}
			tc.buffered -= n
			tc.mu.Unlock()
			pfWake(tc.space)
			return n, nil
		}
		err := tc.readErr
		tc.mu.Unlock()
		select {
		case <-tc.closed:
			return 0, net.ErrClosed
		default:
		}
		if err != nil {
			return 0, err
		}
		if tc.rd.passed() {
			return 0, os.ErrDeadlineExceeded
		}
		select {
		case <-tc.notify:
		case <-tc.closed:
		case <-tc.rd.wait():
		}
	}
}

func (tc *tunnelConn) Write(p []byte) (int, error) {
	select {
	case <-tc.closed:
		return 0, net.ErrClosed
	default:
	}
	if tc.wd.passed() {
		return 0, os.ErrDeadlineExceeded
	}
	// A write blocked in SPDY (the apiserver does not read) ends when the
	// write deadline resets the stream or the connection closes.
	stop := context.AfterFunc(tc.wd.ctx(), func() { _ = tc.ds.Reset() })
	n, err := tc.ds.Write(p)
	if !stop() {
		return n, os.ErrDeadlineExceeded
	}
	if err != nil {
		select {
		case <-tc.c.CloseChan():
			return n, tc.t.errorf("the connection to the apiserver was lost", err)
		default:
		}
		return n, tc.t.errorf("forwarding", err)
	}
	return n, nil
}

// Close resets both streams (the agent sees its connection close) and
// lets the connection forget them.
func (tc *tunnelConn) Close() error {
	tc.closeOnce.Do(func() {
		close(tc.closed)
		pfResetAll(tc.c, tc.ds, tc.es)
		tc.rd.stop()
		tc.wd.stop()
	})
	return nil
}

// tunnelAddr is a tunnel conn's address: the Pod's port.
type tunnelAddr string

func (tunnelAddr) Network() string  { return "kubernetes-portforward" }
func (a tunnelAddr) String() string { return string(a) }

func (tc *tunnelConn) LocalAddr() net.Addr { return tunnelAddr("local") }
func (tc *tunnelConn) RemoteAddr() net.Addr {
	return tunnelAddr(fmt.Sprintf("%s/%s:%d", tc.t.ns, tc.t.pod, tc.t.port))
}

func (tc *tunnelConn) SetDeadline(t time.Time) error {
	tc.rd.set(t)
	tc.wd.set(t)
	return nil
}
func (tc *tunnelConn) SetReadDeadline(t time.Time) error  { tc.rd.set(t); return nil }
func (tc *tunnelConn) SetWriteDeadline(t time.Time) error { tc.wd.set(t); return nil }

// deadline is a settable deadline whose passing closes a channel (the
// pattern of net.Pipe's).
type pfDeadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	ch     chan struct{} // closed when the deadline passes
	cctx   context.Context
	cancel context.CancelFunc
}

func newPFDeadline() *pfDeadline {
	d := &pfDeadline{ch: make(chan struct{})}
	d.cctx, d.cancel = context.WithCancel(context.Background())
	return d
}

func (d *pfDeadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the timer fired: wait for its close
	}
	d.timer = nil
	closed := pfIsClosed(d.ch)
	if t.IsZero() {
		if closed {
			d.ch = make(chan struct{})
			d.cctx, d.cancel = context.WithCancel(context.Background())
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.ch = make(chan struct{})
			d.cctx, d.cancel = context.WithCancel(context.Background())
		}
		ch, cancel := d.ch, d.cancel
		d.timer = time.AfterFunc(dur, func() { close(ch); cancel() })
		return
	}
	if !closed {
		close(d.ch)
		d.cancel()
	}
}

func (d *pfDeadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

func (d *pfDeadline) ctx() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cctx
}

func (d *pfDeadline) passed() bool { return pfIsClosed(d.wait()) }

func (d *pfDeadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		// A stopped timer's Stop says false, as a fired one's: set would
		// then wait for a close of ch that never comes.
		d.timer = nil
	}
	d.cancel()
}

func pfIsClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// dialThrough dials addr with dial, through proxyURL when it is not nil:
// an HTTP(S) proxy's CONNECT or a SOCKS5 proxy, the schemes client-go's
// SPDY dialer takes.
func dialThrough(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), proxyURL *url.URL, network, addr string) (net.Conn, error) {
	if proxyURL == nil {
		return dial(ctx, network, addr)
	}
	paddr := proxyURL.Host
	if proxyURL.Port() == "" {
		port := map[string]string{"http": "80", "": "80", "https": "443", "socks5": "1080"}[proxyURL.Scheme]
		paddr = net.JoinHostPort(proxyURL.Hostname(), port)
	}
	switch proxyURL.Scheme {
	case "socks5":
		var auth *xproxy.Auth
		if u := proxyURL.User; u != nil {
			pw, _ := u.Password()
			auth = &xproxy.Auth{User: u.Username(), Password: pw}
		}
		d, err := xproxy.SOCKS5("tcp", paddr, auth, ctxDialer(dial))
		if err != nil {
			return nil, err
		}
		return d.(xproxy.ContextDialer).DialContext(ctx, network, addr)
	case "http", "https", "":
	default:
		return nil, fmt.Errorf("the proxy %s: scheme %q is not supported", proxyURL.Redacted(), proxyURL.Scheme)
	}
	c, err := dial(ctx, "tcp", paddr)
	if err != nil {
		return nil, fmt.Errorf("the proxy %s: %w", proxyURL.Redacted(), err)
	}
	pc := c
	if proxyURL.Scheme == "https" {
		tc := tls.Client(c, &tls.Config{ServerName: proxyURL.Hostname(), MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("the proxy %s: %w", proxyURL.Redacted(), err)
		}
		pc = tc
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: addr}, Host: addr, Header: http.Header{}}
	if u := proxyURL.User; u != nil {
		pw, _ := u.Password()
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw)))
	}
	if err := req.Write(pc); err != nil {
		c.Close()
		return nil, fmt.Errorf("the proxy %s: %w", proxyURL.Redacted(), err)
	}
	br := bufio.NewReader(pc)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("the proxy %s: %w", proxyURL.Redacted(), err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		c.Close()
		return nil, fmt.Errorf("the proxy %s refused CONNECT %s: %s", proxyURL.Redacted(), addr, resp.Status)
	}
	if br.Buffered() > 0 {
		// The apiserver speaks only after the tunnel's request: bytes now
		// are the proxy's, and would be lost with br.
		c.Close()
		return nil, fmt.Errorf("the proxy %s sent data after its CONNECT reply", proxyURL.Redacted())
	}
	if !stop() {
		c.Close()
		return nil, context.Cause(ctx)
	}
	if pc != c {
		return &proxiedConn{Conn: pc, raw: c}, nil
	}
	return c, nil
}

// proxiedConn is a connection through an HTTPS proxy: closing it closes
// the TCP connection under the proxy's TLS at once.
type proxiedConn struct {
	net.Conn
	raw net.Conn
}

func (c *proxiedConn) Close() error {
	err := c.Conn.Close()
	c.raw.Close()
	return err
}

type ctxDialer func(context.Context, string, string) (net.Conn, error)

func (d ctxDialer) Dial(network, addr string) (net.Conn, error) {
	return d(context.Background(), network, addr)
}

func (d ctxDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d(ctx, network, addr)
}
