package imagestore

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// probeTargets are what a port scan through pulls tells apart: a closed
// port, an HTTP server that is not a registry (404 to everything, or 200
// to everything), a server that accepts and never answers. hits counts
// the HTTP requests the servers got.
func probeTargets(t *testing.T) (hosts []string, hits *atomic.Int64) {
	t.Helper()
	hits = &atomic.Int64{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	notFound := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(notFound.Close)
	hello := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte("hello"))
	}))
	t.Cleanup(hello.Close)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		for _, c := range conns {
			c.Close()
		}
	})
	return []string{closed, notFound.Listener.Addr().String(), hello.Listener.Addr().String(), silent.Addr().String()}, hits
}

// sameErrors pulls HOST/x:1 of each host and wants errors of one reason,
// matching target, whose texts are the same but for the host.
func sameErrors(t *testing.T, hosts []string, opts PullOptions, reason sandbox.PullReason, target error) string {
	t.Helper()
	var first string
	for _, h := range hosts {
		s := openStore(t)
		pe := pullErr(t, s, h+"/x:1", opts, reason, target)
		text := strings.ReplaceAll(pe.Error(), h, "HOST")
		for _, other := range hosts {
			if strings.Contains(text, other) {
				t.Errorf("error %q names another host", pe)
			}
		}
		if first == "" {
			first = text
			t.Logf("%s: %v", h, pe)
		} else if text != first {
			t.Errorf("pulling from %s: %q\n  differs from %q", h, text, first)
		}
	}
	return first
}

// TestPullPortScan: a pull from a host the operator did not name is
// refused, at loopback, before anything is sent to it, with the same
// error whatever listens there; from hosts the operator listed, a closed
// port, an HTTP server that is not a registry and one that never answers
// fail with one error text.
func TestPullPortScan(t *testing.T) {
	hosts, hits := probeTargets(t)
	for _, own := range []bool{false, true} {
		hits.Store(0)
		opts, _ := pullOpts(t)
		if own {
			opts.Registry.Transport = nil // the daemon's: its own dialer
		}
		opts.Registry.StallTimeout = 500 * time.Millisecond
		text := sameErrors(t, hosts, opts, sandbox.PullInvalidReference, ErrRegistryNotAllowed)
		if !strings.Contains(text, "--registries") {
			t.Errorf("the refusal %q does not name the setting to change", text)
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("the refused pulls sent %d requests", n)
		}
		opts.Registry.Registries = hosts
		text = sameErrors(t, hosts, opts, sandbox.PullUnreachable, ErrUnreachable)
		if !strings.Contains(text, "--insecure-registry HOST") {
			t.Errorf("the error %q does not say how to allow plain HTTP", text)
		}
		// Listed as insecure, they are tried over plain HTTP too.
		opts.Registry.Registries, opts.Registry.Insecure = nil, hosts
		_ = sameErrors(t, hosts, opts, sandbox.PullUnreachable, ErrUnreachable)
	}
}

// TestPullBlockedAddresses: the loopback, link-local and unspecified
// addresses are refused unless named, a host name that resolves to one
// too; --registries lets no other registry through.
func TestPullBlockedAddresses(t *testing.T) {
	for _, own := range []bool{false, true} {
		opts, d := pullOpts(t)
		if own {
			if t.Failed() {
				return // the daemon's own dialer would reach these addresses
			}
			opts.Registry.Transport = nil
		}
		refs := []string{"169.254.169.254/x:1", "[fe80::1]:5000/x:1", "0.0.0.0:5000/x:1", "[::1]:5000/x:1", "127.0.0.2:5000/x:1", "[::ffff:127.0.0.1]:5000/x:1"}
		if own {
			refs = append(refs, "localhost:5000/x:1") // resolved by the dialer
		}
		for _, ref := range refs {
			_ = pullErr(t, openStore(t), ref, opts, sandbox.PullInvalidReference, ErrRegistryNotAllowed)
		}
		opts.Registry.Registries = []string{"registry.test"}
		pe := pullErr(t, openStore(t), "other.invalid/x:1", opts, sandbox.PullInvalidReference, ErrRegistryNotAllowed)
		if !strings.Contains(pe.Error(), "registry.test") {
			t.Errorf("error %q does not list the allowed registries", pe)
		}
		if list := d.list(); len(list) != 0 {
			t.Errorf("dialed %v", list)
		}
	}
}

// TestPullRedirectBlocked: a listed registry that redirects a blob to a
// loopback port the operator did not name gets nothing from it.
func TestPullRedirectBlocked(t *testing.T) {
	var hits atomic.Int64
	// Over TLS: a plain HTTP target is refused before any address is
	// looked at.
	inner := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(inner.Close)
	img := mkImage(t, nil, mkTar(t, tent{name: "f", data: "f"}))
	digest, _ := layerDigest(t, img, 0)
	r := newTestRegistry(t, false, blobFault(digest, func(w http.ResponseWriter, req *http.Request, _ http.Handler) {
		http.Redirect(w, req, inner.URL+"/blob", http.StatusTemporaryRedirect)
	}))
	r.push(t, "x:1", img)
	for _, own := range []bool{false, true} {
		opts, _ := pullOpts(t, r.host)
		if own {
			opts.Registry.Transport = nil
		}
		_ = pullErr(t, openStore(t), r.host+"/x:1", opts, sandbox.PullInvalidReference, ErrRegistryNotAllowed)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests", n)
	}
}

// TestPullUnreachableKeepsRegistryAnswers: a real registry's not-found
// is still told as such.
func TestPullUnreachableKeepsRegistryAnswers(t *testing.T) {
	r := newTestRegistry(t, false, nil)
	opts, _ := pullOpts(t, r.host)
	pe := pullErr(t, openStore(t), r.host+"/nosuch:1", opts, sandbox.PullNotFound, nil)
	if errors.Is(pe, ErrUnreachable) {
		t.Errorf("a registry's not-found %v matches ErrUnreachable", pe)
	}
}

// TestPullProxyBlocked: through a proxy (which resolves and connects by
// itself), a registry host at a refused address is refused before the
// proxy is asked; the proxy itself, the operator's, is reached.
func TestPullProxyBlocked(t *testing.T) {
	var hits atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		http.Error(w, "no", http.StatusBadGateway)
	}))
	t.Cleanup(proxy.Close)
	u, err := url.Parse(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(u)}
	t.Cleanup(tr.CloseIdleConnections)
	opts := PullOptions{Registry: RegistryOptions{Transport: tr, StallTimeout: 10 * time.Second}}
	for _, ref := range []string{"localhost:5000/x:1", "127.0.0.1:5000/x:1", "169.254.169.254/x:1"} {
		_ = pullErr(t, openStore(t), ref, opts, sandbox.PullInvalidReference, ErrRegistryNotAllowed)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the proxy was asked %d times", n)
	}
	// A name the daemon cannot resolve is left to the proxy.
	_ = pullErr(t, openStore(t), "registry.nosuch.invalid/x:1", opts, sandbox.PullUnreachable, ErrUnreachable)
	if hits.Load() == 0 {
		t.Error("the proxy was not asked for a name only it may resolve")
	}
}
