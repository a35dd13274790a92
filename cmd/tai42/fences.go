package main

import (
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
)

// egressReporter is what a provider that fences egress tells the daemon
// (the container provider).
type egressReporter interface {
	Egress() container.EgressInfo
	EgressStats() (container.EgressStats, error)
}

// providerOf is the kit-built sandbox's provider, nil for another sandbox.
func providerOf(sb sandbox.Sandbox) kit.Provider {
	if k, ok := sb.(interface{ Provider() kit.Provider }); ok {
		return k.Provider()
	}
	return nil
}

// enforced is what the served provider enforces beyond the policy, as GET
// /v1/policy reports it: a provider that does not fence egress (the host
// runner) or cap disks says so with Enforced false.
func enforced(sb sandbox.Sandbox, cfg serveConfig) (*api.EgressFences, *api.DiskCap) {
	fences := &api.EgressFences{Refused: []string{}, Allow: []string{}, Deny: []string{}, AllowDomains: []string{}, Upstreams: []string{}}
	disk := &api.DiskCap{}
	p := providerOf(sb)
	if e, ok := p.(egressReporter); ok {
		info := e.Egress()
		fences.Enforced = true
		fences.Refused = append(prefixStrings(info.Refused), "host-networks")
		fences.Allow = prefixStrings(info.Allow)
		fences.Deny = prefixStrings(info.Deny)
		fences.AllowDomains = append(fences.AllowDomains, info.AllowDomains...)
		if info.Resolver.IsValid() {
			fences.Resolver = info.Resolver.String()
		}
		for _, u := range info.Upstreams {
			fences.Upstreams = append(fences.Upstreams, u.String())
		}
	}
	return fences, disk
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// logFences says at start what the provider enforces beyond the policy.
func logFences(log *slog.Logger, f *api.EgressFences, d *api.DiskCap) {
	if f.Enforced {
		log.Info("egress fences", "refused", f.Refused, "allow", f.Allow, "deny", f.Deny,
			"allow_domains", f.AllowDomains, "resolver", f.Resolver, "upstreams", f.Upstreams)
	}
	if d.Enforced {
		log.Info("disk cap per session", "mb", d.MB, "inodes", d.Inodes, "reserve_mb", d.ReserveMB)
	}
}

// registerEgressMetrics adds the fences' and the sessions' resolver's
// counts to reg, for a provider that fences egress.
func registerEgressMetrics(reg *prometheus.Registry, sb sandbox.Sandbox) error {
	e, ok := providerOf(sb).(egressReporter)
	if !ok {
		return nil
	}
	return reg.Register(egressCollector{e})
}

var (
	egressBlockedDesc = prometheus.NewDesc("tai42_egress_blocked_total",
		"Attempts of egress sessions the fences refused, by reason.", []string{"reason"}, nil)
	egressDNSDesc = prometheus.NewDesc("tai42_egress_dns_queries_total",
		"Queries of egress sessions to their resolver, by outcome (refused: a name the allowlist does not hold).", []string{"outcome"}, nil)
)

// egressCollector reads the counts when /metrics is scraped: they live in
// the kernel's nftables counters and the resolver.
type egressCollector struct{ e egressReporter }

func (egressCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- egressBlockedDesc
	ch <- egressDNSDesc
}

func (c egressCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.e.EgressStats()
	if err != nil {
		// Before the network manager is up, every series is 0.
		st.Blocked = map[string]uint64{}
	}
	for _, r := range sessnet.BlockReasons() {
		ch <- prometheus.MustNewConstMetric(egressBlockedDesc, prometheus.CounterValue, float64(st.Blocked[r]), r)
	}
	for outcome, n := range map[string]uint64{
		"answered":          st.DNS.Forwarded,
		"refused":           st.DNS.Refused,
		"malformed":         st.DNS.Malformed,
		"upstream_failures": st.DNS.UpstreamFailures,
		"hook_failures":     st.DNS.HookFailures,
		"overloaded":        st.DNS.Overloaded,
	} {
		ch <- prometheus.MustNewConstMetric(egressDNSDesc, prometheus.CounterValue, float64(n), outcome)
	}
}
