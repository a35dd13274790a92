package imagestore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/tai42/sandbox"
)

// ErrRegistryNotAllowed is matched (errors.Is) by a Pull's error when the
// operator's settings keep the pull from a registry: one not listed in
// RegistryOptions.Registries when that is set, or a host (a registry, its
// token service, a server it redirects to) at a loopback, link-local or
// unspecified address that the operator did not name. Nothing was sent to
// it.
var ErrRegistryNotAllowed = errors.New("registry not allowed")

// ErrUnreachable is matched (errors.Is) by a Pull's error when a registry
// could not be reached, or what answered is not a registry. The error's
// text is the same whatever the cause (a name that does not resolve, a
// closed port, a timeout, a TLS failure, an HTTP server that is not a
// registry): a pull must not tell its caller what listens on the daemon's
// network. The cause is kept in the error chain, for the daemon's own use.
var ErrUnreachable = errors.New("registry unreachable")

// registryFlag names the setting that lists allowed registries, for the
// errors that tell an operator what to change.
const registryFlag = "--registries (TAI42_REGISTRIES, registry.allowed)"

// named reports whether host ("host[:port]") is one the operator named:
// in Registries, Insecure or Mirrors, as it is or by its host name alone.
func (r *regConfig) named(host string) bool {
	hn := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		hn = h
	}
	return slices.Contains(r.names, host) || slices.Contains(r.names, hn)
}

// listNames returns the hosts the operator named, as references spell
// their registries (docker.io is index.docker.io).
func listNames(opts RegistryOptions, mirrors []string) []string {
	var out []string
	for _, h := range slices.Concat(opts.Registries, opts.Insecure, mirrors) {
		out = append(out, h)
		if reg, err := name.NewRegistry(h); err == nil && reg.RegistryStr() != h {
			out = append(out, reg.RegistryStr())
		}
	}
	return out
}

// allow refuses a registry a reference names when the operator listed
// the registries pulls may reach and this is not one of them.
func (r *regConfig) allow(reg string) error {
	if len(r.opts.Registries) == 0 || r.named(reg) {
		return nil
	}
	return &policyError{msg: fmt.Sprintf("registry %s is not one this daemon pulls from (it allows %s; the operator sets them with %s)",
		reg, strings.Join(r.opts.Registries, ", "), registryFlag)}
}

// policyError is a pull refused by the operator's settings, before
// anything was sent.
type policyError struct{ msg string }

func (e *policyError) Error() string   { return e.msg }
func (e *policyError) Is(t error) bool { return t == ErrRegistryNotAllowed }

// blockedAddr reports whether a pull may not connect to ip unless the
// operator named its host: the daemon's own loopback, a link-local
// address (cloud metadata services live at 169.254.169.254), an
// unspecified one (0.0.0.0 reaches the local host).
func blockedAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	return !ip.IsValid() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsUnspecified() || (ip.Is4() && ip.As4()[0] == 0)
}

func blockedError(host string, ip netip.Addr) error {
	return &policyError{msg: fmt.Sprintf("%s is at %s, a loopback, link-local or unspecified address, which pulls do not reach unless the operator names the registry in %s", host, ip.Unmap(), registryFlag)}
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// guard keeps a pull's connections off the addresses blockedAddr refuses,
// for every host the operator did not name. The check is made on the
// address a connection is made to, after the name is resolved, so a name
// that resolves to another address the second time (DNS rebinding) gains
// nothing.
type guard struct {
	r       *regConfig
	proxies sync.Map // host:port of the proxies the transport chose: the operator's
	// proxy is the transport's own choice of proxy, nil for none.
	proxy func(*http.Request) (*url.URL, error)
}

// install guards t's connections. A transport without a dialer of its
// own (the default) gets one that checks each address before connecting
// to it; a dialer of the caller's is checked on the address it connected
// to, and the connection closed at once if it is refused.
func (g *guard) install(t *http.Transport, own bool) {
	if p := t.Proxy; p != nil {
		g.proxy = p
		t.Proxy = func(req *http.Request) (*url.URL, error) {
			u, err := p(req)
			if u != nil {
				g.proxies.Store(proxyAddr(u), true)
			}
			return u, err
		}
	}
	inner := t.DialContext
	if own {
		inner = nil
	}
	t.DialContext = g.dial(inner)
	if t.DialTLSContext != nil {
		t.DialTLSContext = g.dial(t.DialTLSContext)
	}
}

func proxyAddr(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
	return net.JoinHostPort(u.Hostname(), port)
}

func (g *guard) dial(inner dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, exempt := g.proxies.Load(addr)
		if exempt || g.r.named(addr) {
			if inner == nil {
				return defaultDialer(nil).DialContext(ctx, network, addr)
			}
			return inner(ctx, network, addr)
		}
		if inner == nil {
			return defaultDialer(func(_, address string, _ syscall.RawConn) error {
				ap, err := netip.ParseAddrPort(address)
				if err != nil || blockedAddr(ap.Addr()) {
					return blockedError(addr, ap.Addr())
				}
				return nil
			}).DialContext(ctx, network, addr)
		}
		// An address given as it is is checked before the caller's dialer
		// tries it: its failure would tell a closed port from an open
		// one. A name is resolved by that dialer, and checked after.
		if ap, err := netip.ParseAddrPort(addr); err == nil && blockedAddr(ap.Addr()) {
			return nil, blockedError(addr, ap.Addr())
		}
		conn, err := inner(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if ap, err := netip.ParseAddrPort(conn.RemoteAddr().String()); err != nil || blockedAddr(ap.Addr()) {
			conn.Close()
			return nil, blockedError(addr, ap.Addr())
		}
		return conn, nil
	}
}

// defaultDialer is http.DefaultTransport's dialer, with control called
// before each connection.
func defaultDialer(control func(network, address string, c syscall.RawConn) error) *net.Dialer {
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: control}
}

// proxied reports whether req goes through a proxy, which resolves and
// connects to its host itself: the guard sees only the proxy's address.
func (g *guard) proxied(req *http.Request) bool {
	if g.proxy == nil {
		return false
	}
	u, err := g.proxy(req)
	return err == nil && u != nil
}

// precheck is the guard of a request whose connection it cannot see (a
// transport that is not an *http.Transport, a proxy): it resolves host
// and refuses it when any of its addresses is refused. The name is
// resolved again to connect, so this one does not stop a DNS rebinding.
func (g *guard) precheck(ctx context.Context, host string) error {
	if g.r.named(host) {
		return nil
	}
	hn := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		hn = h
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", hn)
	if err != nil {
		// A name only the proxy can resolve (split DNS) is the proxy's to
		// refuse; without one the transport fails to resolve it too.
		return nil
	}
	for _, ip := range addrs {
		if blockedAddr(ip) {
			return blockedError(host, ip)
		}
	}
	return nil
}

// unreachableError is a registry that could not be reached or did not
// answer as one, said the same way whatever the cause.
type unreachableError struct {
	host     string
	insecure bool // the host is one of the insecure registries
	err      error
}

func (e *unreachableError) Error() string {
	hint := ""
	if !e.insecure {
		hint = fmt.Sprintf("; if it serves plain HTTP or a TLS certificate this daemon does not trust, and you trust it, add --insecure-registry %s", e.host)
	}
	return fmt.Sprintf("registry %s could not be reached, or did not answer as a registry (check its name and port, and that it serves the registry API at /v2/%s)", e.host, hint)
}
func (e *unreachableError) Unwrap() []error { return []error{ErrUnreachable, e.err} }

// uniform turns err, a failure of reaching host, into an
// unreachableError when it is the network's or an answer that is not a
// registry's; other errors (a registry's refusal or not-found, an image
// it cannot use, the operator's refusal) are kept as they are.
func (r *regConfig) uniform(host string, err error) error {
	var pe *policyError
	if errors.As(err, &pe) {
		// Said alone: the requests it stopped add nothing to it.
		return pe
	}
	if err == nil || errors.Is(err, ErrUnreachable) || reason(err) != sandbox.PullUnreachable {
		return err
	}
	return &unreachableError{host: host, insecure: r.isInsecure(host), err: err}
}

// notRegistryError is an answer to a manifest request that is no
// manifest: a web server answering every path.
type notRegistryError struct{ mediaType string }

func (e *notRegistryError) Error() string {
	return fmt.Sprintf("the answer to a manifest request is %q, not a manifest", e.mediaType)
}

// checkManifestType refuses an answer to a manifest request whose type
// is no manifest's: a registry sends an image's, an index's or (of old) a
// schema 1 manifest's media type, or at least JSON.
func checkManifestType(mt types.MediaType) error {
	if mt.IsImage() || mt.IsIndex() || mt.IsSchema1() || strings.Contains(string(mt), "json") {
		return nil
	}
	return &notRegistryError{mediaType: string(mt)}
}
