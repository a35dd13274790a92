package container

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/tai42/sandbox/internal/egressdns"
	"github.com/tai42/sandbox/internal/sessnet"
)

// EgressInfo is what the provider enforces on network "egress", for the
// daemon to report (GET /v1/policy, its start log).
type EgressInfo struct {
	// Refused are the destinations always refused, by reason (see
	// sessnet.BlockReasons); HostNetworks says the host's own addresses and
	// subnets are refused too.
	Refused      []netip.Prefix
	HostNetworks bool
	// Allow, Deny and AllowDomains are the operator's (Options).
	Allow, Deny  []netip.Prefix
	AllowDomains []string
	// Resolver is the address egress sessions resolve through (their
	// /etc/resolv.conf); invalid when the provider runs no resolver (it was
	// given a network manager, or the host has no resolver to forward to).
	// Upstreams are where it forwards.
	Resolver  netip.Addr
	Upstreams []netip.AddrPort
}

// egress is the provider's side of the egress fences: the resolver its
// egress sessions use, which feeds the domain filter's sets.
type egress struct {
	dns *egressdns.Server
	net atomic.Pointer[sessnet.Manager] // the manager AllowAddrs goes to
}

// fences are the operator's fences as the network manager takes them;
// ResolverPort is set once the resolver listens.
func (p *provider) fences() sessnet.Fences {
	return sessnet.Fences{
		Allow:        p.opts.EgressAllow,
		Deny:         p.opts.EgressDeny,
		DomainFilter: len(p.opts.EgressAllowDomains) > 0,
	}
}

// startEgress starts the egress sessions' resolver on m's egress gateway
// and points m's fences at it. Without a resolver to forward to (the host
// has none in /etc/resolv.conf and Options.EgressDNS names none), egress
// sessions get no DNS, which the log says; with a domain allowlist that is
// an error, since the allowlist could then let nothing through.
func (p *provider) startEgress(m *sessnet.Manager) error {
	e := &egress{}
	e.net.Store(m)
	srv, err := egressdns.New(egressdns.Config{
		Listen:     netip.AddrPortFrom(m.EgressGateway(), 0),
		Upstreams:  p.opts.EgressDNS,
		ResolvConf: p.opts.EgressResolvConf,
		Allow:      p.opts.EgressAllowDomains,
		MinTTL:     p.opts.EgressAllowMinTTL,
		Grace:      p.opts.EgressAllowGrace,
		OnAnswer: func(_ context.Context, addrs []netip.Addr, ttl time.Duration) error {
			return e.net.Load().AllowAddrs(addrs, ttl)
		},
		Logger: p.log,
	})
	if err != nil {
		if len(p.opts.EgressAllowDomains) > 0 {
			return fmt.Errorf("the egress sessions' resolver, which the domain allowlist needs: %w", err)
		}
		p.log.Warn("container: egress sessions get no DNS: their resolver cannot start (give upstreams with --egress-dns)", "err", err)
		return nil
	}
	f := p.fences()
	f.ResolverPort = srv.Addr().Port()
	if err := m.SetFences(f); err != nil {
		srv.Close()
		return fmt.Errorf("pointing the egress fences at the sessions' resolver: %w", err)
	}
	e.dns = srv
	p.egress = e
	return nil
}

// logBlocked logs an attempt the fences refused, at debug: who, where,
// why; never a payload.
func (p *provider) logBlocked(b sessnet.Blocked) {
	p.log.Debug("container: egress refused", "reason", b.Reason, "id", b.Session, "proto", b.Proto, "dst", b.Dst.String())
}

// closeEgress stops the resolver; idempotent.
func (p *provider) closeEgress() error {
	if p.egress == nil || p.egress.dns == nil {
		return nil
	}
	return p.egress.dns.Close()
}

// writeResolvConf writes the resolv.conf of an egress session into its
// bundle dir and returns its path; "" when the provider runs no resolver.
func (p *provider) writeResolvConf(dir string) (string, error) {
	if p.egress == nil || p.egress.dns == nil {
		return "", nil
	}
	path := filepath.Join(dir, "resolv.conf")
	// The gateway, not the resolver's own port: DNS has no port in
	// resolv.conf, and the fences redirect port 53 of the gateway to it.
	text := "nameserver " + p.net.EgressGateway().String() + "\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("the session's resolv.conf: %w", err)
	}
	return path, nil
}

// Egress reports what the provider enforces on network "egress".
func (p *provider) Egress() EgressInfo {
	info := EgressInfo{
		HostNetworks: true,
		Allow:        p.opts.EgressAllow,
		Deny:         p.opts.EgressDeny,
		AllowDomains: p.opts.EgressAllowDomains,
	}
	info.Refused = sessnet.RefusedPrefixes()
	if p.egress != nil && p.egress.dns != nil {
		info.Resolver = p.net.EgressGateway()
		info.Upstreams = p.egress.dns.Upstreams()
	}
	return info
}

// EgressStats are the fences' and the resolver's counts, for /metrics.
type EgressStats struct {
	// Blocked counts the attempts the fences refused, by reason.
	Blocked map[string]uint64
	// DNS are the resolver's counts; zero without one.
	DNS egressdns.Stats
}

// EgressStats reads the counts; it errs while the provider has no network
// manager yet, or when the kernel cannot be asked.
func (p *provider) EgressStats() (EgressStats, error) {
	if !p.ready.Load() || p.net == nil {
		return EgressStats{}, errors.New("container: the network manager is not up yet")
	}
	blocked, err := p.net.Blocked()
	if err != nil {
		return EgressStats{}, err
	}
	st := EgressStats{Blocked: blocked}
	if p.egress != nil && p.egress.dns != nil {
		st.DNS = p.egress.dns.Stats()
	}
	return st, nil
}
