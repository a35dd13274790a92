package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/ledger"
	"github.com/tai42/sandbox/provider/host"
)

// fakeProvider is a closable sandbox that counts its Closes.
type fakeProvider struct {
	sandbox.Sandbox
	closes int
}

func (f *fakeProvider) Close(context.Context) error { f.closes++; return nil }

// TestRequireProviderOpensOnlyTheOneNamed: every embedded provider is
// registered, the one named is opened once and closed through its own
// Close, and the others are never opened; an unknown name is the
// registry's UnavailableError naming them all, opening none.
func TestRequireProviderOpensOnlyTheOneNamed(t *testing.T) {
	opens := map[string]int{}
	made := map[string]*fakeProvider{}
	var providers []embeddedProvider
	for _, name := range []string{"a", "b"} {
		providers = append(providers, embeddedProvider{name: name, register: func(reg *sandbox.Registry, _ providerConfig) error {
			return reg.RegisterFunc(name, func() (sandbox.Sandbox, error) {
				opens[name]++
				made[name] = &fakeProvider{}
				return made[name], nil
			})
		}})
	}
	sb, closeSB, err := requireProvider(providers, "b", providerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if sb != made["b"] || opens["a"] != 0 || opens["b"] != 1 {
		t.Fatalf("Require(b) = %v; opens %v; want b's sandbox, b opened once and a never", sb, opens)
	}
	if err := closeSB(context.Background()); err != nil || made["b"].closes != 1 {
		t.Errorf("close = %v, b closed %d times; want its own Close, once", err, made["b"].closes)
	}

	_, _, err = requireProvider(providers, "docker", providerConfig{})
	var ue *sandbox.UnavailableError
	if !errors.As(err, &ue) || ue.Name != "docker" || !strings.Contains(err.Error(), "registered: a, b") {
		t.Errorf("unknown name: want UnavailableError naming a, b; got %v", err)
	}
	if opens["a"] != 0 || opens["b"] != 1 {
		t.Errorf("an unknown name opened %v", opens)
	}
}

// TestRequireProviderFailedOpenReleasesLedger: a durable provider that
// fails after its ledger was opened leaves it closed (the provider owns
// it), so the next open takes the ledger again rather than finding it in
// use; the error is the provider's.
func TestRequireProviderFailedOpenReleasesLedger(t *testing.T) {
	state := t.TempDir()
	// The host runner makes <state>/host/sessions: a file there fails it
	// after the ledger, <state>/host/ledger.db, is open.
	if err := os.MkdirAll(filepath.Join(state, host.Name), 0o700); err != nil {
		t.Fatal(err)
	}
	blocker := filepath.Join(state, host.Name, "sessions")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := providerConfig{stateDir: state, policy: defaultPolicy, reapInterval: -1, durable: true}
	_, _, err := openProvider(host.Name, cfg)
	if err == nil || errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "state directory") {
		t.Fatalf("open over a blocked state directory = %v; want the host runner's error", err)
	}
	l, err := ledger.Open(filepath.Join(state, host.Name, ledger.FileName))
	if err != nil {
		t.Fatalf("the failed open left its ledger open: %v", err)
	}
	l.Close()

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	sb, closeSB, err := openProvider(host.Name, cfg)
	if err != nil {
		t.Fatalf("open once the state directory is fixed: %v", err)
	}
	defer closeSB(context.Background())
	if _, err := sb.ListSessions(context.Background()); err != nil {
		t.Errorf("the opened sandbox: %v", err)
	}
}
