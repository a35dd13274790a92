// Package hosttest is what the conformance suite needs of the host
// runner, shared by the host's own conformance test and the tests that run
// the suite through the daemon's API (client): the options the host
// honours on this machine, and a fresh host runner per clause.
package hosttest

import (
	"context"
	"os"
	"os/user"
	"path/filepath"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/ledger"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/sandboxtest"
)

// Options are the host runner's suite options. Network "none" and caps need
// root (a network namespace, a cgroup); as another user they are declared
// unhonoured, so the suite checks that they are rejected instead.
func Options(t testing.TB) sandboxtest.Options {
	opts := sandboxtest.Options{
		Image:                           sandbox.HostImage,
		Isolation:                       sandbox.IsolationNone,
		Networks:                        []sandbox.Network{sandbox.NetworkEgress},
		Durable:                         true,
		AbsoluteOutsideWorkspaceRefused: true,
		KillStopsLeftovers:              true,
		Logs:                            true,
	}
	if os.Geteuid() == 0 {
		opts.Networks = append(opts.Networks, sandbox.NetworkNone)
		opts.Caps = true
	} else {
		t.Log("not root: network none and caps are checked as rejected, not as enforced")
	}
	opts.User = ExecUser(t)
	return opts
}

// ExecUser is the user the host runner runs an exec as in the suite: as
// root, the host's nobody (root where it has none); as another user, that
// user itself, the only one it can. nil, logged, when the host's
// /etc/passwd does not have it.
func ExecUser(t testing.TB) *sandboxtest.UserOptions {
	names := []string{"nobody", "root"}
	if os.Geteuid() != 0 {
		me, err := user.Current()
		if err != nil {
			t.Logf("no user to run execs as in the suite: %v", err)
			return nil
		}
		names = []string{me.Username}
	}
	for _, name := range names {
		if u := sandboxtest.HostUser(name); u != nil {
			return u
		}
	}
	t.Logf("no user to run execs as in the suite: the host's /etc/passwd has none of %v", names)
	return nil
}

// New builds a host runner with cfg's policy, reap interval and logger in a
// temporary state directory, with a durable ledger there; it is closed
// (every session destroyed) at cleanup.
func New(t testing.TB, cfg sandboxtest.Config) *kit.Sandbox {
	t.Helper()
	return open(t, cfg, t.TempDir())
}

// Restartable is the suite's Options.Restartable: New's sandbox, and a
// restart that opens a new host runner on its state directory after
// closing it or, for a crash, abandoning it (kit.Sandbox.Abandon: its
// sessions' processes and directories stay, as after a SIGKILL).
func Restartable(t *testing.T, cfg sandboxtest.Config) (sandbox.Sandbox, func(crash bool) sandbox.Sandbox) {
	t.Helper()
	dir := t.TempDir()
	sb := open(t, cfg, dir)
	return sb, func(crash bool) sandbox.Sandbox {
		if crash {
			sb.Abandon()
		} else if err := sb.Close(context.Background()); err != nil {
			t.Fatalf("closing the sandbox before its restart: %v", err)
		}
		return open(t, cfg, dir)
	}
}

func open(t testing.TB, cfg sandboxtest.Config, dir string) *kit.Sandbox {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, host.Name), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(filepath.Join(dir, host.Name, ledger.FileName))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := host.New(host.Options{Options: kit.Options{Policy: cfg.Policy, ReapInterval: cfg.ReapInterval, Ledger: l, Logger: cfg.Logger}, ProviderOptions: kit.ProviderOptions{StateDir: dir}})
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the host sandbox: %v", err)
		}
	})
	return sb
}
