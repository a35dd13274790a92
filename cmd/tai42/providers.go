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
	"github.com/tai42/sandbox/provider/kubernetes"
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
	// images are the container provider's pull policy, registries and
	// image size bound; the zero value is its defaults.
	images imageConfig
	// kube are the kubernetes provider's settings.
	kube kubeConfig
	// logger receives the provider's lifecycle events; nil discards them.
	logger *slog.Logger
	// pool are the shapes of session kept ready ahead (the daemon's), made
	// poolRefills at a time; none in a one-shot run.
	pool        []kit.PoolShape
	poolRefills int
	// durable makes the provider keep its sessions in a durable ledger,
	// <stateDir>/<provider>/ledger.db, and bring them back after a crash
	// (the daemon); else the ledger is in memory (a one-shot run).
	durable bool
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

// embeddedProvider is a provider compiled into the binary: its name, and
// how it registers itself in a registry with the CLI's configuration.
type embeddedProvider struct {
	name     string
	register func(*sandbox.Registry, providerConfig) error
}

// embeddedProviders lists the providers the CLI can run on, by name. Each
// registers itself (host.Register, container.Register,
// kubernetes.Register) to be opened on its first Require, its durable
// ledger opened then.
var embeddedProviders = []embeddedProvider{
	{name: host.Name, register: func(reg *sandbox.Registry, c providerConfig) error {
		return host.Register(reg, func() (host.Options, error) {
			l, err := c.openLedger(host.Name)
			return host.Options{Options: c.kitOptions(l), ProviderOptions: c.providerOptions()}, err
		})
	}},
	{name: container.Name, register: func(reg *sandbox.Registry, c providerConfig) error {
		return container.Register(reg, func() (container.Options, error) {
			l, err := c.openLedger(container.Name)
			return c.containerOptions(l), err
		})
	}},
	{name: kubernetes.Name, register: func(reg *sandbox.Registry, c providerConfig) error {
		return kubernetes.Register(reg, c.kubernetesOptions)
	}},
}

// kubernetesOptions are the kubernetes provider's options. Its ledger is
// the apiserver (the provider's own, shared by every daemon of the
// namespace), never one in the state directory: durable or not, the kit
// gets none from here.
func (c providerConfig) kubernetesOptions() (kubernetes.Options, error) {
	if err := c.kube.check(); err != nil {
		return kubernetes.Options{}, usagef(err)
	}
	o := c.kube.options()
	o.Options = c.kitOptions(nil)
	o.ProviderOptions = c.providerOptions()
	// The same cap as the container provider's, as a Pod's
	// ephemeral-storage limit: --disk-mb 0 is none, unset the default.
	o.DiskOff, o.DiskMB = c.disk.off(), c.disk.mb
	return o, nil
}

// containerOptions are the container provider's options, on ledger l.
func (c providerConfig) containerOptions(l kit.Ledger) container.Options {
	return container.Options{
		Options:            c.kitOptions(l),
		ProviderOptions:    c.providerOptions(),
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
		Pull:               c.images.pull,
		Registry:           c.images.registry,
		MaxImageSize:       c.images.maxSize,
		MaxImageInodes:     c.images.maxInodes,
	}
}

// kitOptions are the kit's options of every embedded provider, on ledger
// l (nil: in memory).
func (c providerConfig) kitOptions(l kit.Ledger) kit.Options {
	return kit.Options{
		Policy:             c.policy,
		ReapInterval:       c.reapInterval,
		ExecDefaultTimeout: c.execTimeout,
		Logger:             c.logger,
		Ledger:             l,
		Pool:               c.pool,
		PoolRefills:        c.poolRefills,
	}
}

// providerOptions are the options every embedded provider shares.
func (c providerConfig) providerOptions() kit.ProviderOptions {
	return kit.ProviderOptions{StateDir: c.stateDir, MaxOutputBytes: c.maxOutputBytes}
}

// openLedger is provider name's durable ledger when c asks for one, else
// nil (the kit's in-memory one). Each open opens its own: a retry after a
// failed open (which closed it) opens it again.
func (c providerConfig) openLedger(name string) (kit.Ledger, error) {
	if !c.durable {
		return nil, nil
	}
	return openLedger(c.stateDir, name)
}

// registerProviders registers every embedded provider in reg under its
// name, each opened only when Required.
func registerProviders(reg *sandbox.Registry, providers []embeddedProvider, cfg providerConfig) error {
	for _, p := range providers {
		if err := p.register(reg, cfg); err != nil {
			return err
		}
	}
	return nil
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

// openProvider registers the embedded providers and Requires name: an
// unknown name is the registry's *sandbox.UnavailableError, listing them,
// and only the provider asked for is opened. The returned close function
// is the sandbox's own Close (destroying any session still live).
func openProvider(name string, cfg providerConfig) (sandbox.Sandbox, func(context.Context) error, error) {
	return requireProvider(embeddedProviders, name, cfg)
}

// requireProvider is openProvider on a list of providers of the caller's.
// The registry is this call's own, not the process-wide one: the CLI runs
// once per process, and its tests run it many times in one.
func requireProvider(providers []embeddedProvider, name string, cfg providerConfig) (sandbox.Sandbox, func(context.Context) error, error) {
	var reg sandbox.Registry
	if err := registerProviders(&reg, providers, cfg); err != nil {
		return nil, nil, err
	}
	sb, err := reg.Require(name)
	if err != nil {
		return nil, nil, err
	}
	// Every embedded provider's open returns a closableSandbox.
	return sb, sb.(closableSandbox).Close, nil
}
