package container_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/internal/sessnet/sessnettest"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/container/containertest"
)

// The names the test DNS server knows.
const (
	allowedName = "allowed.test"
	deniedName  = "denied.test"
)

// dnsTTL is the TTL (seconds) of the test DNS server's answers, and allowFor how
// long an address stays reachable after an answer with the providers'
// EgressAllowMinTTL and EgressAllowGrace of these tests.
const (
	dnsTTL      = 1
	allowFor    = dnsTTL*time.Second + allowGrace
	allowMinTTL = time.Millisecond
	// allowGrace lets a probe connect after the lookup it made: the exec
	// starting it is not part of the time an address is allowed for.
	allowGrace = 500 * time.Millisecond
)

// egressSetup is a provider whose egress sessions may reach only
// allowed.test (EgressAllowDomains) through the resolver it runs, which
// forwards to the test DNS server; and the upstream of test hosts.
type egressSetup struct {
	up   *sessnettest.Upstream
	dns  *sessnettest.DNSServer
	opts container.Options // a network manager of the provider's own
	// allowed and denied are what allowed.test and denied.test resolve
	// to: the upstream's two public-looking hosts.
	allowed, denied sessnettest.Host
}

// newEgressSetup makes an egressSetup's upstream and DNS server, and the
// options of its provider on runtime rt; domains are the allowlist (nil:
// none, unfiltered egress).
func newEgressSetup(t *testing.T, rt string, domains []string) *egressSetup {
	t.Helper()
	opts := recoverOptions(t, rt, container.UserNamespaceOff)
	up := newUpstream(t, opts.EgressSubnet)
	e := &egressSetup{up: up, allowed: up.Hosts[sessnettest.Public], denied: up.Hosts[sessnettest.Public2]}
	e.dns = up.ServeDNS(t, up.RouterAddr, dnsTTL, map[string]netip.Addr{allowedName: e.allowed.Addr, deniedName: e.denied.Addr})
	opts.EgressDNS = []netip.AddrPort{e.dns.Addr}
	opts.EgressAllowDomains = domains
	opts.EgressAllowMinTTL, opts.EgressAllowGrace = allowMinTTL, allowGrace
	e.opts = opts
	return e
}

func egressStats(t testing.TB, sb *kit.Sandbox) container.EgressStats {
	t.Helper()
	st, err := container.EgressStatsOf(sb)
	if err != nil {
		t.Fatalf("EgressStats: %v", err)
	}
	return st
}

// checkDomainFilter runs the allowlist's checks from sess (the probe
// installed), an egress session of e's provider sb, which allows
// allowed.test alone.
func checkDomainFilter(t *testing.T, e *egressSetup, sb *kit.Sandbox, sess sandbox.Session) {
	t.Helper()
	info := container.EgressOf(sb)
	if !info.Resolver.IsValid() || !slices.Equal(info.Upstreams, []netip.AddrPort{e.dns.Addr}) {
		t.Fatalf("Egress: resolver %s, upstreams %v; want one, forwarding to %s", info.Resolver, info.Upstreams, e.dns.Addr)
	}
	if r := probe(t, sess, "read", "/etc/resolv.conf"); r.Detail != "nameserver "+info.Resolver.String()+"\n" {
		t.Errorf("the session's /etc/resolv.conf reads %q (%s), want nameserver %s (its gateway)", r.Detail, r.Err, info.Resolver)
	}
	if r := probe(t, sess, "write", "/etc/resolv.conf"); r.OK || r.Err != "EROFS" {
		t.Errorf("writing the session's /etc/resolv.conf: %+v, want EROFS (bound read-only)", r)
	}
	before := egressStats(t, sb)

	// The allowed name: resolved through the gateway, then reachable.
	if r := reached(t, sess, "Go's resolver, "+allowedName, "resolve", allowedName); r.Detail != e.allowed.Addr.String() {
		t.Errorf("%s resolved to %q, want %s", allowedName, r.Detail, e.allowed.Addr)
	}
	port := e.allowed.TCP.Addr.Port()
	reached(t, sess, "TCP to "+allowedName+" by name", "dial", net.JoinHostPort(allowedName, itoa(int(port))))
	reached(t, sess, "TCP to "+allowedName+"'s address", "dial", e.allowed.TCP.Addr.String())
	// The denied name: no answer, and its address unreachable.
	if r := notReached(t, sess, "DNS for "+deniedName, "dns", deniedName); r.Err != "rcode REFUSED" {
		t.Errorf("the resolver answered %s with %s (%s), want REFUSED", deniedName, r.Err, r.Detail)
	}
	refusedFast(t, sess, "TCP to "+deniedName+"'s address, a public IP no allowed name gave", e.denied.TCP.Addr)
	notReached(t, sess, "UDP to "+deniedName+"'s address", "udp", e.denied.UDP.String())
	// Around the resolver: the test DNS server itself (on a host
	// network), and a DNS server on a public address.
	if r := notReached(t, sess, "DNS straight to the test DNS server", "dns", allowedName+"@"+e.dns.Addr.String()); strings.HasPrefix(r.Err, "rcode") {
		t.Errorf("the test DNS server answered the session directly: %+v", r)
	}
	public := e.up.ServeDNS(t, e.denied.Addr, dnsTTL, map[string]netip.Addr{allowedName: e.denied.Addr})
	if r := notReached(t, sess, "DNS straight to a server on a public address", "dns", allowedName+"@"+public.Addr.String()); strings.HasPrefix(r.Err, "rcode") {
		t.Errorf("a DNS server on a public address answered the session: %+v", r)
	}
	for _, d := range []*sessnettest.DNSServer{e.dns, public} {
		for _, from := range d.Sources() {
			if from != e.up.HostAddr {
				t.Errorf("the DNS server on %s got a query from %s; only the host's resolver (%s) may ask", d.Addr, from, e.up.HostAddr)
			}
		}
	}

	// The allowed address's time runs out; the connection is refused again.
	time.Sleep(allowFor + 500*time.Millisecond)
	refusedFast(t, sess, "TCP to "+allowedName+"'s address after its TTL", e.allowed.TCP.Addr)
	// A new answer lets it through again.
	reached(t, sess, "TCP to "+allowedName+" by name, looked up again", "dial", net.JoinHostPort(allowedName, itoa(int(port))))

	after := egressStats(t, sb)
	for _, c := range []struct {
		what    string
		got     uint64
		atLeast uint64
	}{
		{"blocked not_allowed_domain", after.Blocked[sessnet.ReasonNotAllowedDomain] - before.Blocked[sessnet.ReasonNotAllowedDomain], 4},
		{"blocked host_network", after.Blocked[sessnet.ReasonHostNetwork] - before.Blocked[sessnet.ReasonHostNetwork], 1},
		{"DNS refused", after.DNS.Refused - before.DNS.Refused, 1},
		{"DNS forwarded", after.DNS.Forwarded - before.DNS.Forwarded, 3},
	} {
		if c.got < c.atLeast {
			t.Errorf("EgressStats: %s went up by %d, want at least %d (before %+v, after %+v)", c.what, c.got, c.atLeast, before, after)
		}
	}
	t.Logf("EgressStats after: %+v", after)
}

// TestEgressDomains: a provider with a domain allowlist (allowed.test)
// runs the egress sessions' resolver on their gateway, forwarding to the
// test DNS server: a session's /etc/resolv.conf names the gateway, read
// only; allowed.test resolves and its address is reachable, for the
// answer's TTL (and the grace) only; denied.test is REFUSED and its
// address refused; DNS around the resolver gets nowhere; EgressStats
// counts it all.
func TestEgressDomains(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		e := newEgressSetup(t, rt, []string{allowedName})
		sb := containertest.New(t, e.opts)
		for _, image := range images {
			t.Run(imageName(image), func(t *testing.T) {
				sess := (&testProvider{sb: sb, opts: e.opts, rt: rt}).session(t, spec(image, sandbox.NetworkEgress))
				installProbe(t, sess)
				checkDomainFilter(t, e, sb, sess)
			})
		}
	})
}

// TestEgressRecover: after a crash, a kept egress session of a provider
// with a domain allowlist is fenced as before, and its DNS works again:
// the new provider's resolver listens on a new port, and the table it
// reinstalls redirects the gateway's port 53 there.
func TestEgressRecover(t *testing.T) {
	containertest.Require(t)
	e := newEgressSetup(t, "runc", []string{allowedName})
	sbA, ledger, crash := crashable(t, e.opts)
	sess, err := sbA.CreateSession(ctxFor(t), spec(containertest.Busybox, sandbox.NetworkEgress))
	if err != nil {
		t.Fatal(err)
	}
	id := sess.ID()
	installProbe(t, sess)
	reached(t, sess, "before the crash: TCP to "+allowedName, "dial", net.JoinHostPort(allowedName, itoa(int(e.allowed.TCP.Addr.Port()))))
	crash()
	// The resolver died with the provider: the redirect leads nowhere.
	if r := probeAsync(sess, "dns", allowedName); r.OK {
		t.Errorf("DNS answered while no provider runs: %+v", r)
	}

	opts := e.opts
	opts.Ledger = ledger
	sb, err := container.New(opts)
	if err != nil {
		t.Fatalf("a new provider with the crashed one's ledger: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the recovered provider: %v", err)
		}
	})
	kept, err := sb.GetSession(ctxFor(t), id)
	if err != nil {
		t.Fatalf("GetSession(%s) after the recovery: %v", id, err)
	}
	checkDomainFilter(t, e, sb, kept)
	// And the built-in fences, as for every egress session.
	for _, name := range refusedHosts {
		refusedFast(t, kept, "after the recovery: "+name, e.up.Hosts[name].TCP.Addr)
	}
}

// TestEgressSetFences: the operator's fences change for a running session:
// an exception opens a private host, a denial closes a public one, the
// domain allowlist goes on (a public address no allowed name gave is
// refused, the allowed name reachable) and off again; a malformed change
// is refused and changes nothing.
func TestEgressSetFences(t *testing.T) {
	containertest.Require(t)
	e := newEgressSetup(t, "crun", nil)
	sb := containertest.New(t, e.opts)
	sess := (&testProvider{sb: sb, opts: e.opts, rt: "crun"}).session(t, spec(containertest.Busybox, sandbox.NetworkEgress))
	installProbe(t, sess)
	private := e.up.Hosts[sessnettest.Private10]
	host := func(h sessnettest.Host) []netip.Prefix { return []netip.Prefix{netip.PrefixFrom(h.Addr, 32)} }
	set := func(allow, deny []netip.Prefix, domains []string) {
		t.Helper()
		if err := container.SetEgressFencesOf(sb, allow, deny, domains); err != nil {
			t.Fatalf("SetEgressFences(%v, %v, %v): %v", allow, deny, domains, err)
		}
		if info := container.EgressOf(sb); !slices.Equal(info.Allow, allow) || !slices.Equal(info.Deny, deny) || !slices.Equal(info.AllowDomains, domains) {
			t.Errorf("Egress after SetEgressFences: %+v", info)
		}
	}

	reached(t, sess, "a public host, no fences of the operator's", "dial", e.denied.TCP.Addr.String())
	refusedFast(t, sess, "a private host, no fences of the operator's", private.TCP.Addr)

	set(host(private), host(e.denied), nil)
	reached(t, sess, "the private host, now an exception", "dial", private.TCP.Addr.String())
	refusedFast(t, sess, "the public host, now denied", e.denied.TCP.Addr)

	set(nil, nil, []string{allowedName})
	refusedFast(t, sess, "a public address no allowed name gave, the allowlist on", e.denied.TCP.Addr)
	refusedFast(t, sess, "the private host, its exception gone", private.TCP.Addr)
	reached(t, sess, allowedName+" by name, the allowlist on", "dial", net.JoinHostPort(allowedName, itoa(int(e.allowed.TCP.Addr.Port()))))
	if r := notReached(t, sess, "DNS for "+deniedName+", the allowlist on", "dns", deniedName); r.Err != "rcode REFUSED" {
		t.Errorf("%s: %s, want REFUSED", deniedName, r.Err)
	}

	if err := container.SetEgressFencesOf(sb, []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8")}, nil, nil); err == nil || !strings.Contains(err.Error(), "10.1.2.3/8") {
		t.Errorf("SetEgressFences with host bits set: %v, want an error naming the prefix", err)
	}
	if err := container.SetEgressFencesOf(sb, nil, nil, []string{"bad..test"}); err == nil || !strings.Contains(err.Error(), "bad..test") {
		t.Errorf("SetEgressFences with a bad pattern: %v, want an error naming it", err)
	}
	refusedFast(t, sess, "a public address no allowed name gave, after refused changes", e.denied.TCP.Addr)

	set(nil, nil, nil)
	reached(t, sess, "the public host, the allowlist off", "dial", e.denied.TCP.Addr.String())
	if r := reached(t, sess, "DNS for "+deniedName+", the allowlist off", "resolve", deniedName); r.Detail != e.denied.Addr.String() {
		t.Errorf("%s resolved to %q, want %s", deniedName, r.Detail, e.denied.Addr)
	}
}
