package main

import (
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/server"
)

// egressReporter is what a provider that fences egress tells the daemon
// (the container provider).
type egressReporter interface {
	Egress() container.EgressInfo
	EgressStats() (container.EgressStats, error)
}

// diskReporter is what a provider that caps disks tells the daemon.
type diskReporter interface {
	Disk() container.DiskInfo
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
func enforced(sb sandbox.Sandbox) (*api.EgressFences, *api.DiskCap) {
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
	if d, ok := p.(diskReporter); ok {
		info := d.Disk()
		*disk = api.DiskCap{Enforced: info.MB > 0, MB: info.MB, Inodes: info.Inodes, ReserveMB: info.ReserveMB}
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

// givenFlags are the flags the command line set, as arguments that set
// them again: what a reload parses anew.
func givenFlags(fl *pflag.FlagSet) []string {
	var args []string
	fl.Visit(func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			for _, v := range sv.GetSlice() {
				args = append(args, "--"+f.Name+"="+v)
			}
			return
		}
		args = append(args, "--"+f.Name+"="+f.Value.String())
	})
	return args
}

// resolveAgain resolves the configuration of "tai42 serve" as its start
// did, from the same command line.
func (c *cli) resolveAgain(args []string) (serveConfig, error) {
	fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fl.SetOutput(io.Discard)
	var f serveFlags
	addServeFlags(fl, &f)
	if err := fl.Parse(args); err != nil {
		return serveConfig{}, err
	}
	return resolveServeConfig(fl, &f, c.lookupEnv)
}

// fenceSetter is a provider whose egress fences change while it runs.
type fenceSetter interface {
	SetEgressFences(allow, deny []netip.Prefix, domains []string) error
}

// reloadFences applies the egress fences of the configuration as it is now
// (a SIGHUP: the config file edited) to the running sessions and those to
// come. Everything else needs a restart, which the log says when it
// changed. A configuration that does not resolve, or fences the provider
// refuses, change nothing.
func reloadFences(log *slog.Logger, was serveConfig, sb sandbox.Sandbox, srv *server.Server) {
	cfg, err := was.reload()
	if err != nil {
		log.Error("reload refused: the configuration does not resolve; the egress fences are unchanged", "err", err)
		return
	}
	if !slices.Equal(cfg.egress.dns, was.egress.dns) {
		log.Warn("reload: the resolver's upstreams (--egress-dns, egress.dns) change at the next start only")
	}
	if !reflect.DeepEqual(cfg.images, was.images) {
		log.Warn("reload: the image settings (--pull, --registry-mirror, --insecure-registry, --registries, --max-image-size, --max-image-inodes; [images], [registry]) change at the next start only")
	}
	set, ok := providerOf(sb).(fenceSetter)
	if !ok {
		if cfg.egress.given() {
			log.Error("reload refused: the host runner cannot fence egress; the configuration asks it to")
		}
		return
	}
	if err := set.SetEgressFences(cfg.egress.allow, cfg.egress.deny, cfg.egress.domains); err != nil {
		log.Error("reload refused: the egress fences are unchanged", "err", err)
		return
	}
	fences, _ := enforced(sb)
	srv.SetEgressFences(fences)
	log.Info("reload: the egress fences changed, for running sessions too")
	logFences(log, fences, &api.DiskCap{})
}
