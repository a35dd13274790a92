package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tai42/sandbox"
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
	// logger receives the provider's lifecycle events; nil discards them.
	logger *slog.Logger
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
			StateDir:           c.stateDir,
			Policy:             c.policy,
			ReapInterval:       c.reapInterval,
			ExecDefaultTimeout: c.execTimeout,
			MaxOutputBytes:     c.maxOutputBytes,
			Logger:             c.logger,
		})
	}},
}

// openProvider builds the embedded providers, registers each under its
// name in a registry, and Requires name there: an unknown name is the
// registry's *sandbox.UnavailableError. The returned close function closes
// every provider built (destroying any session still live).
func openProvider(name string, cfg providerConfig) (sandbox.Sandbox, func(context.Context) error, error) {
	var reg sandbox.Registry
	var opened []closableSandbox
	closeAll := func(ctx context.Context) error {
		var errs []error
		for _, sb := range opened {
			errs = append(errs, sb.Close(ctx))
		}
		return errors.Join(errs...)
	}
	for _, p := range embeddedProviders {
		sb, err := p.open(cfg)
		if err != nil {
			_ = closeAll(context.Background())
			return nil, nil, err
		}
		opened = append(opened, sb)
		if err := reg.Register(p.name, sb); err != nil {
			_ = closeAll(context.Background())
			return nil, nil, err
		}
	}
	sb, err := reg.Require(name)
	if err != nil {
		_ = closeAll(context.Background())
		return nil, nil, err
	}
	return sb, closeAll, nil
}
