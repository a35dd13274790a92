package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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
	// resolvConf is the file every egress session gets at /etc/resolv.conf,
	// bound read-only: one for all, written once at the start.
	resolvConf string
}

// operatorFences are the operator's egress fences, as Options gave them
// or SetEgressFences changed them.
type operatorFences struct {
	allow, deny []netip.Prefix
	domains     []string
}

// fences are the operator's fences as the network manager takes them, with
// the resolver's port once it listens.
func (p *provider) fences() sessnet.Fences {
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	return p.fencesLocked()
}

func (p *provider) fencesLocked() sessnet.Fences {
	f := sessnet.Fences{Allow: p.opFences.allow, Deny: p.opFences.deny, DomainFilter: len(p.opFences.domains) > 0}
	if p.egress != nil && p.egress.dns != nil {
		f.ResolverPort = p.egress.dns.Addr().Port()
	}
	return f
}

// SetEgressFences replaces the operator's egress fences (see
// Options.EgressAllow, EgressDeny and EgressAllowDomains) for the sessions
// that run now and those to come: the rules change in one nftables
// transaction, the resolver's allowlist with the next query. The resolver
// changes first when the domain filter goes on (so that the sets fill as
// names resolve), the rules first when it goes off. It errs, changing
// nothing, on a malformed value, a domain allowlist without a resolver, or
// a provider given its network manager (Options.Network), whose fences are
// its owner's.
func (p *provider) SetEgressFences(allow, deny []netip.Prefix, domains []string) error {
	if err := sessnet.ValidateFences(sessnet.Fences{Allow: allow, Deny: deny}); err != nil {
		return fmt.Errorf("container: egress fences: %w", err)
	}
	for _, d := range domains {
		if err := egressdns.ValidPattern(d); err != nil {
			return fmt.Errorf("container: egress domain allowlist: %w", err)
		}
	}
	if !p.ready.Load() || !p.ownNet {
		return errors.New("container: the egress fences belong to the network manager's owner (Options.Network), or the provider is not up yet")
	}
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	hasDNS := p.egress != nil && p.egress.dns != nil
	if len(domains) > 0 && !hasDNS {
		return errors.New("container: a domain allowlist needs the egress sessions' resolver, which could not start (see the log at start)")
	}
	old := p.opFences
	p.opFences = operatorFences{allow: slices.Clone(allow), deny: slices.Clone(deny), domains: slices.Clone(domains)}
	filterOff := len(old.domains) > 0 && len(domains) == 0
	setDNS := func() error {
		if !hasDNS {
			return nil
		}
		return p.egress.dns.SetAllow(domains)
	}
	var err error
	if filterOff {
		if err = p.net.SetFences(p.fencesLocked()); err == nil {
			err = setDNS()
		}
	} else if err = setDNS(); err == nil {
		err = p.net.SetFences(p.fencesLocked())
	}
	if err != nil {
		// Back to the old fences, as far as they had changed.
		p.opFences = old
		if hasDNS {
			_ = p.egress.dns.SetAllow(old.domains)
		}
		return fmt.Errorf("container: changing the egress fences: %w", err)
	}
	return nil
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
		Allow:      p.opFences.domains,
		MinTTL:     p.opts.EgressAllowMinTTL,
		Grace:      p.opts.EgressAllowGrace,
		OnAnswer: func(_ context.Context, addrs []netip.Addr, ttl time.Duration) error {
			return e.net.Load().AllowAddrs(addrs, ttl)
		},
		Logger: p.log,
	})
	if err != nil {
		if len(p.opFences.domains) > 0 {
			return fmt.Errorf("the egress sessions' resolver, which the domain allowlist needs: %w", err)
		}
		p.log.Warn("container: egress sessions get no DNS: their resolver cannot start (give upstreams with --egress-dns)", "err", err)
		return nil
	}
	if e.resolvConf, err = p.writeResolvConf(m.EgressGateway()); err != nil {
		srv.Close()
		return err
	}
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	e.dns = srv
	p.egress = e
	if err := m.SetFences(p.fencesLocked()); err != nil {
		srv.Close()
		p.egress = nil
		return fmt.Errorf("pointing the egress fences at the sessions' resolver: %w", err)
	}
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

// writeResolvConf writes the resolv.conf egress sessions get, naming the
// gateway (DNS has no port in resolv.conf: the fences redirect port 53 of
// the gateway to the resolver), and returns its path. A file that already
// says so is left as it is: sessions an earlier run left bind it. One that
// says otherwise (the egress subnet changed) is replaced by a rename, so a
// session binding the old one never reads it half written.
func (p *provider) writeResolvConf(gw netip.Addr) (string, error) {
	path := filepath.Join(p.root, "resolv.conf")
	text := []byte("nameserver " + gw.String() + "\n")
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, text) {
		return path, nil
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, text, 0o644); err != nil {
		return "", fmt.Errorf("the egress sessions' resolv.conf: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("the egress sessions' resolv.conf: %w", err)
	}
	return path, nil
}

// resolvConf is the file an egress session gets at /etc/resolv.conf; ""
// when the provider runs no resolver.
func (p *provider) resolvConf() string {
	if p.egress == nil || p.egress.dns == nil {
		return ""
	}
	return p.egress.resolvConf
}

// Egress reports what the provider enforces on network "egress".
func (p *provider) Egress() EgressInfo {
	p.fenceMu.Lock()
	defer p.fenceMu.Unlock()
	info := EgressInfo{
		HostNetworks: true,
		Allow:        slices.Clone(p.opFences.allow),
		Deny:         slices.Clone(p.opFences.deny),
		AllowDomains: slices.Clone(p.opFences.domains),
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
