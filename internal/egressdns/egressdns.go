// Package egressdns is the DNS resolver the tai42 daemon runs for the
// container sessions of network tier egress. The host's own resolver often
// sits at an address the egress fences refuse to sessions (a loopback stub
// such as 127.0.0.53, a VPC resolver at 10.x), so sessions ask this server
// instead (their DNS to the egress gateway is redirected to it); it forwards
// to the host's resolvers, from the host, and hands back their answers.
//
// With an allowlist of domains (Config.Allow) it is also the egress domain
// filter: a query for a name not on the list is refused without asking
// upstream, whatever its type (so DNS itself is no channel out to other
// domains), and the A/AAAA addresses of each answer to an allowed name are
// handed to Config.OnAnswer, with how long to keep them, before the answer
// is sent, so the fences can let the session reach exactly those addresses.
//
// The server keeps no cache: every query is forwarded, and the TTLs of the
// answers drive how long their addresses stay allowed.
//
// Refusal. A name not allowed gets REFUSED (with an extended DNS error,
// Prohibited, when the query carried EDNS0), not NXDOMAIN: the name may
// well exist, the server declines by policy, and a stub resolver reports
// REFUSED as a failure it does not retry (glibc: "Non-recoverable failure
// in name resolution"), not as "no such name".
package egressdns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// Defaults for the zero values of Config's fields.
const (
	DefaultMinTTL      = 5 * time.Second
	DefaultGrace       = 30 * time.Second
	DefaultTimeout     = 2 * time.Second
	DefaultMaxInFlight = 128
	// DefaultClientShare is the fraction of MaxInFlight one client may
	// hold when MaxInFlightPerClient is 0: 1/8, 16 queries of the default
	// 128, far more than a stub resolver sends at once.
	DefaultClientShare = 8
)

// Config says where a Server listens, where it forwards and what it lets
// through.
type Config struct {
	// Listen is the address to serve on, UDP and TCP on the same port.
	// Port 0 picks a free port, the same for both. The sockets are bound
	// with IP_FREEBIND, so the address need not exist yet (the egress
	// bridge's address is added when the first egress session is set up).
	Listen netip.AddrPort

	// Upstreams are the resolvers to forward to, tried in order. Empty
	// means the host's: the nameserver lines of ResolvConf (default
	// /etc/resolv.conf), on port 53. New fails, saying so, when it finds
	// none.
	Upstreams  []netip.AddrPort
	ResolvConf string

	// Allow is the domain allowlist: names ("example.org", only itself)
	// and wildcards ("*.example.org", every name below example.org but not
	// example.org itself); see ValidPattern. Empty means no filter: every
	// query is forwarded, every answer returned as it is, and OnAnswer is
	// never called.
	Allow []string

	// OnAnswer, when Allow is set, is called with the A/AAAA addresses of
	// each answer to an allowed A or AAAA question (those the question's
	// name resolves to, through the answer's CNAME chain) and how long to
	// keep them: the least TTL of the chain's records, floored at MinTTL,
	// plus Grace. It is called before the answer is sent, so a connection
	// made right after the answer finds its address allowed; an error from
	// it turns the answer into SERVFAIL (the session never gets an address
	// it would then be refused). Called from many goroutines at once; its
	// ctx ends after Timeout, or at Close. Nil: names are filtered,
	// addresses are not reported.
	OnAnswer func(ctx context.Context, addrs []netip.Addr, ttl time.Duration) error

	// MinTTL and Grace shape the TTL given to OnAnswer (defaults
	// DefaultMinTTL and DefaultGrace; a negative Grace is an error).
	MinTTL, Grace time.Duration

	// Timeout bounds each exchange with one upstream (default
	// DefaultTimeout; past it the next upstream is tried), and each call
	// of OnAnswer.
	Timeout time.Duration

	// MaxInFlight caps the queries being answered at once, and the TCP
	// connections open at once (default DefaultMaxInFlight). A query over
	// the cap gets SERVFAIL at once, unless a client (a source address:
	// one session) holds at least two more than the query's: then that
	// client's oldest query gives its slot up and gets SERVFAIL. TCP
	// connections share the same way: one over the cap is closed at once,
	// or the oldest of a client holding two more is.
	MaxInFlight int

	// MaxInFlightPerClient caps the queries one client (source address)
	// has being answered at once, and its TCP connections open at once;
	// a query over it gets SERVFAIL, a connection is closed, at once. 0
	// means MaxInFlight/DefaultClientShare (at least 1); more than
	// MaxInFlight means MaxInFlight.
	MaxInFlightPerClient int

	// Logger gets, at debug level, refused names with the querying
	// address, and failures to forward or report an answer; never more of
	// a query than its name and type, never an answer's records. Nil
	// discards.
	Logger *slog.Logger
}

// Stats are counts since New, for metrics.
type Stats struct {
	Queries          uint64 // queries received (responses sent to the server are ignored, not counted)
	Malformed        uint64 // messages that are not one well-formed QUERY: answered FORMERR or NOTIMP, or dropped when unparsable
	Refused          uint64 // queries for names not allowed, answered REFUSED
	Forwarded        uint64 // queries answered with an upstream's answer
	UpstreamFailures uint64 // queries no upstream answered: SERVFAIL
	HookFailures     uint64 // answers OnAnswer failed for: SERVFAIL
	Overloaded       uint64 // queries over MaxInFlight or MaxInFlightPerClient, or whose slot another client's query took: SERVFAIL
}

// Server is a running resolver. Its methods are safe for concurrent use.
type Server struct {
	addr      netip.AddrPort
	upstreams []string                  // host:port
	allow     atomic.Pointer[allowlist] // nil: no filter
	onAnswer  func(context.Context, []netip.Addr, time.Duration) error
	minTTL    time.Duration
	grace     time.Duration
	timeout   time.Duration
	log       *slog.Logger
	udpClient *dns.Client
	tcpClient *dns.Client
	slots     *slots

	ctx    context.Context // cancelled by Close: aborts in-flight upstream exchanges
	cancel context.CancelFunc

	udp, tcp *runner

	closeOnce sync.Once
	closeErr  error

	queries, malformed, refused, forwarded, upstreamFailures, hookFailures, overloaded atomic.Uint64
}

// New starts a Server on cfg.Listen; it is serving when New returns. It
// errs, saying why, when cfg is not valid (a bad pattern is a
// *PatternError), when no upstream is given and the host's resolv.conf has
// none, or when the address cannot be bound.
func New(cfg Config) (*Server, error) {
	if !cfg.Listen.IsValid() {
		return nil, errors.New("egressdns: Config.Listen is not set: give the address to serve on (port 0 picks one)")
	}
	if cfg.Grace < 0 || cfg.MinTTL < 0 || cfg.Timeout < 0 || cfg.MaxInFlight < 0 || cfg.MaxInFlightPerClient < 0 {
		return nil, fmt.Errorf("egressdns: MinTTL (%v), Grace (%v), Timeout (%v), MaxInFlight (%d) and MaxInFlightPerClient (%d) must not be negative",
			cfg.MinTTL, cfg.Grace, cfg.Timeout, cfg.MaxInFlight, cfg.MaxInFlightPerClient)
	}
	allow, err := newAllowlist(cfg.Allow)
	if err != nil {
		return nil, err
	}
	s := &Server{
		onAnswer: cfg.OnAnswer,
		minTTL:   orDefault(cfg.MinTTL, DefaultMinTTL),
		grace:    orDefault(cfg.Grace, DefaultGrace),
		timeout:  orDefault(cfg.Timeout, DefaultTimeout),
		log:      cfg.Logger,
	}
	s.allow.Store(allow)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	ups := cfg.Upstreams
	if len(ups) == 0 {
		path := cfg.ResolvConf
		if path == "" {
			path = DefaultResolvConf
		}
		if ups, err = readResolvConf(path); err != nil {
			return nil, err
		}
	}
	for _, u := range ups {
		if !u.IsValid() || u.Port() == 0 {
			return nil, fmt.Errorf("egressdns: upstream resolver %s has no address or no port", u)
		}
		s.upstreams = append(s.upstreams, u.String())
	}
	inFlight := cfg.MaxInFlight
	if inFlight == 0 {
		inFlight = DefaultMaxInFlight
	}
	perClient := cfg.MaxInFlightPerClient
	if perClient == 0 {
		perClient = max(1, inFlight/DefaultClientShare)
	}
	s.slots = newSlots(inFlight, min(perClient, inFlight))
	// Without a Timeout of its own, a dns.Client reads for 2 s at most
	// whatever the context's deadline: Config.Timeout would be capped.
	s.udpClient = &dns.Client{Net: "udp", Timeout: s.timeout}
	s.tcpClient = &dns.Client{Net: "tcp", Timeout: s.timeout}

	pc, ln, err := listen(cfg.Listen)
	if err != nil {
		return nil, err
	}
	bound := ln.Addr().(*net.TCPAddr).AddrPort()
	s.addr = netip.AddrPortFrom(bound.Addr().Unmap(), bound.Port())
	for _, u := range ups {
		if u.Addr().Unmap() == s.addr.Addr() && u.Port() == s.addr.Port() {
			pc.Close()
			ln.Close()
			return nil, fmt.Errorf("egressdns: upstream resolver %s is this server's own address: queries would loop", u)
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.serve(pc, &fairListener{Listener: ln, conns: newSlots(inFlight, min(perClient, inFlight))}); err != nil {
		s.cancel()
		return nil, err
	}
	return s, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// serve starts a miekg/dns server on each socket and returns once both
// listen, or, when one fails to start, stops the other and returns why.
// From here on the servers own the sockets.
func (s *Server) serve(pc net.PacketConn, ln net.Listener) error {
	mk := func() *runner {
		r := &runner{started: make(chan struct{}, 1), done: make(chan error, 1)}
		r.srv = &dns.Server{
			Handler:           s,
			UDPSize:           dns.DefaultMsgSize,
			IdleTimeout:       func() time.Duration { return 3 * time.Second },
			MsgAcceptFunc:     s.accept,
			MsgInvalidFunc:    func([]byte, error) { s.malformed.Add(1) },
			NotifyStartedFunc: func() { r.started <- struct{}{} },
		}
		return r
	}
	s.udp, s.tcp = mk(), mk()
	s.udp.srv.PacketConn, s.tcp.srv.Listener = pc, ln
	for _, r := range []*runner{s.udp, s.tcp} {
		go func() { r.done <- r.srv.ActivateAndServe() }()
	}
	failed := false
	for _, r := range []*runner{s.udp, s.tcp} {
		select {
		case <-r.started:
		case r.err = <-r.done:
			r.exited, failed = true, true
		}
	}
	if !failed {
		return nil
	}
	s.closeErr = s.stop()
	return fmt.Errorf("egressdns: cannot serve on %s: %w", s.addr, s.closeErr)
}

// runner is one miekg/dns server and what its goroutine reported.
type runner struct {
	srv     *dns.Server
	started chan struct{} // sent to once it listens
	done    chan error    // its result, once it has stopped
	exited  bool          // done has been received from, into err
	err     error
}

// accept counts what comes in and keeps miekg/dns's checks (one question,
// no updates, responses ignored).
func (s *Server) accept(h dns.Header) dns.MsgAcceptAction {
	a := dns.DefaultMsgAcceptFunc(h)
	switch a {
	case dns.MsgIgnore:
	case dns.MsgAccept:
		s.queries.Add(1)
	default:
		s.queries.Add(1)
		s.malformed.Add(1)
	}
	return a
}

// Addr returns the address the server listens on (with the port picked
// when Config.Listen's was 0).
func (s *Server) Addr() netip.AddrPort { return s.addr }

// SetAllow replaces the domain allowlist (see Config.Allow; empty turns the
// filter off) for every query from now on; a query in flight is decided by
// the list it began with. It errs, changing nothing, on a bad pattern (a
// *PatternError).
func (s *Server) SetAllow(patterns []string) error {
	allow, err := newAllowlist(patterns)
	if err != nil {
		return err
	}
	s.allow.Store(allow)
	return nil
}

// Upstreams are the resolvers the server forwards to, in the order it
// tries them.
func (s *Server) Upstreams() []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(s.upstreams))
	for _, u := range s.upstreams {
		if ap, err := netip.ParseAddrPort(u); err == nil {
			out = append(out, ap)
		}
	}
	return out
}

// Stats returns the counts so far.
func (s *Server) Stats() Stats {
	return Stats{
		Queries:          s.queries.Load(),
		Malformed:        s.malformed.Load(),
		Refused:          s.refused.Load(),
		Forwarded:        s.forwarded.Load(),
		UpstreamFailures: s.upstreamFailures.Load(),
		HookFailures:     s.hookFailures.Load(),
		Overloaded:       s.overloaded.Load(),
	}
}

// Close stops serving: it closes both sockets, cancels the upstream
// exchanges and OnAnswer calls in flight (their queries get SERVFAIL) and
// waits for every query being answered. It returns what stopped a server
// early, if anything did. Idempotent: later calls return the first one's
// result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.stop() })
	return s.closeErr
}

// stop shuts both servers down and waits for their goroutines.
func (s *Server) stop() error {
	s.cancel()
	var errs []error
	for _, r := range []*runner{s.udp, s.tcp} {
		if !r.exited {
			// Errs only for a server not started, which serve has
			// ruled out, or one that has exited (its result says why).
			_ = r.srv.Shutdown()
			r.err, r.exited = <-r.done, true
		}
		if r.err != nil {
			errs = append(errs, fmt.Errorf("egressdns: %s server on %s stopped: %w", r.name(), s.addr, r.err))
		}
	}
	// Shutdown closes a started server's socket only; one that never
	// started left its own.
	s.udp.srv.PacketConn.Close()
	s.tcp.srv.Listener.Close()
	return errors.Join(errs...)
}

func (r *runner) name() string {
	if r.srv.PacketConn != nil {
		return "udp"
	}
	return "tcp"
}

// listen binds UDP and TCP on addr, on the same port (a free one when
// addr's is 0), with IP_FREEBIND.
func listen(addr netip.AddrPort) (*net.UDPConn, net.Listener, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	udpNet, tcpNet := "udp4", "tcp4"
	if addr.Addr().Is6() {
		udpNet, tcpNet = "udp6", "tcp6"
	}
	lc := net.ListenConfig{Control: freebind}
	ctx := context.Background()
	// With port 0, the free UDP port may be taken for TCP: try others.
	var err error
	for range 16 {
		var pc net.PacketConn
		if pc, err = lc.ListenPacket(ctx, udpNet, addr.String()); err != nil {
			return nil, nil, fmt.Errorf("egressdns: binding udp %s: %w", addr, err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		var ln net.Listener
		ln, err = lc.Listen(ctx, tcpNet, netip.AddrPortFrom(addr.Addr(), uint16(port)).String())
		if err == nil {
			return pc.(*net.UDPConn), ln, nil
		}
		pc.Close()
		if addr.Port() != 0 || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, nil, fmt.Errorf("egressdns: binding tcp %s: %w", addr, err)
}

// freebind lets a socket bind an address the host does not have (yet).
func freebind(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if network == "udp6" || network == "tcp6" {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1); serr == nil {
				return
			}
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setting IP_FREEBIND: %w", serr)
	}
	return nil
}
