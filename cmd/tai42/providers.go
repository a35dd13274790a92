package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/ledger"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/host"
)

// cliReapInterval is the reaper cadence of the CLI's sandbox: a session
// that outlives --ttl is gone within about a second.
const cliReapInterval = time.Second

// providerConfig is what every embedded provider is built from.
type providerConfig struct {
	stateDir     string
	policy       sandbox.Policy
	reapInterval time.Duration
	// execTimeout is the default exec timeout; 0: the kit's (60s).
	execTimeout time.Duration
	// maxOutputBytes bounds each stream a non-interactive exec holds in
	// memory; 0: the provider's default.
	maxOutputBytes int64
	// runtime is the container provider's OCI runtime ("" for runc).
	runtime string
	// netPrefix names the container provider's bridges, veths and
	// nftables table ("" for its default).
	netPrefix string
	// egress are the container provider's fences of the operator's.
	egress egressConfig
	// disk is the container provider's disk cap; the zero value is its
	// defaults (the cap on).
	disk diskConfig
	// logger receives the provider's lifecycle events; nil discards them.
	logger *slog.Logger
	// durable makes the provider keep its sessions in a durable ledger,
	// <stateDir>/<provider>/ledger.db, and bring them back after a crash
	// (the daemon); else the ledger is in memory (a one-shot run).
	durable bool
	ledger  kit.Ledger
}

// openLedger opens provider name's durable ledger in stateDir.
func openLedger(stateDir, name string) (kit.Ledger, error) {
	dir := filepath.Join(stateDir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	l, err := ledger.Open(filepath.Join(dir, ledger.FileName))
	if errors.Is(err, ledger.ErrInUse) {
		return nil, fmt.Errorf("state directory %s is in use by another tai42 process (its %s session ledger is locked): stop it, or give this one another --state-dir", stateDir, name)
	}
	return l, err
}

// closableSandbox is a provider that must be closed when done (a kit-built
// sandbox: Close stops its reaper and destroys its sessions).
type closableSandbox interface {
	sandbox.Sandbox
	Close(ctx context.Context) error
}

// embeddedProvider is a provider compiled into the binary.
type embeddedProvider struct {
	name string
	open func(providerConfig) (closableSandbox, error)
}

// embeddedProviders lists the providers the CLI can run on, by name.
var embeddedProviders = []embeddedProvider{
	{name: host.Name, open: func(c providerConfig) (closableSandbox, error) {
		return host.New(host.Options{
			Options: kit.Options{
				Policy:             c.policy,
				ReapInterval:       c.reapInterval,
				ExecDefaultTimeout: c.execTimeout,
				Logger:             c.logger,
				Ledger:             c.ledger,
			},
			ProviderOptions: kit.ProviderOptions{
				StateDir:       c.stateDir,
				MaxOutputBytes: c.maxOutputBytes,
			},
		})
	}},
	{name: container.Name, open: func(c providerConfig) (closableSandbox, error) {
		return container.New(container.Options{
			Options: kit.Options{
				Policy:             c.policy,
				ReapInterval:       c.reapInterval,
				ExecDefaultTimeout: c.execTimeout,
				Logger:             c.logger,
				Ledger:             c.ledger,
			},
			ProviderOptions: kit.ProviderOptions{
				StateDir:       c.stateDir,
				MaxOutputBytes: c.maxOutputBytes,
			},
			Runtime:            c.runtime,
			NetPrefix:          c.netPrefix,
			EgressAllow:        c.egress.allow,
			EgressDeny:         c.egress.deny,
			EgressAllowDomains: c.egress.domains,
			EgressDNS:          c.egress.dns,
			DiskOff:            c.disk.off(),
			DiskMB:             c.disk.mb,
			DiskInodes:         int(c.disk.inodes),
			DiskReserveMB:      c.disk.reserve(),
			DiskPool:           c.disk.pool(c.durable),
		})
	}},
}

// defaultProviderName is the provider used when none is named: the
// container provider where an OCI runtime is installed and we are root
// (it needs namespaces, mounts and cgroups), else the host runner.
func defaultProviderName() string {
	if os.Geteuid() != 0 {
		return host.Name
	}
	for _, rt := range []string{"runc", "crun"} {
		if _, err := exec.LookPath(rt); err == nil {
			return container.Name
		}
	}
	return host.Name
}

// openProvider builds the embedded provider name, registers it in a
// registry and Requires it there: an unknown name is the registry's
// *sandbox.UnavailableError, listing the embedded providers. The returned
// close function closes it (destroying any session still live).
func openProvider(name string, cfg providerConfig) (sandbox.Sandbox, func(context.Context) error, error) {
	var reg sandbox.Registry
	var opened closableSandbox
	var err error
	for _, p := range embeddedProviders {
		if p.name != name {
			// Listed, so that an unknown name's error names them all;
			// never opened.
			if err := reg.Register(p.name, unopened{}); err != nil {
				return nil, nil, err
			}
			continue
		}
		if cfg.durable {
			if cfg.ledger, err = openLedger(cfg.stateDir, p.name); err != nil {
				return nil, nil, err
			}
		}
		sb, err := p.open(cfg)
		if err != nil {
			if cfg.ledger != nil {
				cfg.ledger.Close() // the kit closed it already if it got that far; twice is harmless
			}
			return nil, nil, fmt.Errorf("provider %s: %w", p.name, err)
		}
		opened = sb
		if err := reg.Register(p.name, sb); err != nil {
			_ = sb.Close(context.Background())
			return nil, nil, err
		}
	}
	sb, err := reg.Require(name)
	if err != nil {
		return nil, nil, err
	}
	return sb, opened.Close, nil
}

// unopened stands for an embedded provider that was not asked for: it is
// registered only so that the registry can name it, and is never used.
type unopened struct{ sandbox.Sandbox }
