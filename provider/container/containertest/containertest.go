// Package containertest is what tests of the container provider share: a
// static agent binary built once per test binary (and a dynamically linked
// one, built with cgo, when a test asks), one network manager for
// every provider of the process (each sweeps what its prefix names), a
// shared image store holding the busybox test image, and a fresh provider
// per test.
//
// A test binary that uses it calls [Main] from its TestMain.
package containertest

import (
	"context"
	"debug/elf"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/buildtest"
	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
	"github.com/tai42/sandbox/internal/sessnet"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/ledger"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/sandboxtest"
)

// Busybox is the name the busybox test image is imported under.
const Busybox = "busybox:test"

// env is what Main prepares; skip says why the provider cannot run here.
// Its fields but dir are read once ready is closed.
var env struct {
	ready  chan struct{}
	skip   string
	dir    string
	agent  string
	images string
	net    *sessnet.Manager
	egress netip.Prefix // net's egress subnet
}

// Main prepares the shared pieces (the agent binary, the image store,
// the network manager) while the tests run, which wait for them in
// Require; then it removes them. A preparation still under way when the
// tests are done is stopped: a test binary whose tests need no session (a
// benchmark package under go test, a -run that picks none) does not wait
// for an agent build, nor hold one of go test's -p slots meanwhile.
func Main(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "tai42-containertest-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		env.dir = dir
		defer os.RemoveAll(dir)
		defer func() { _ = escapeprobetest.Cleanup() }() // the escape probe, where a test built it
		ctx, cancel := context.WithCancel(context.Background())
		env.ready = make(chan struct{})
		go func() {
			defer close(env.ready)
			if err := prepare(ctx, dir); err != nil {
				env.skip = err.Error()
			}
		}()
		defer func() {
			cancel()
			<-env.ready
			if env.net != nil {
				_ = env.net.Close()
			}
		}()
		return m.Run()
	}()
	os.Exit(code)
}

func prepare(ctx context.Context, dir string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the container provider needs root (namespaces, mounts, cgroups)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return fmt.Errorf("runc is not installed (apt-get install -y runc)")
	}
	// The agent's own binary, which a provider runs where it is installed
	// beside tai42 (tai42 itself, "tai42 agent", is DynamicAgent's).
	env.agent = filepath.Join(dir, "tai42-agent")
	if err := buildtest.Agent(ctx, env.agent); err != nil {
		return fmt.Errorf("building the static agent: %w", err)
	}
	env.images = filepath.Join(dir, "images")
	store, err := imagestore.Open(env.images)
	if err != nil {
		return err
	}
	layout, err := imagestoretest.WriteBusyboxLayout(filepath.Join(dir, "busybox-layout"), Busybox)
	if err != nil {
		return fmt.Errorf("the busybox test image: %w", err)
	}
	if _, err := store.Import(ctx, layout, Busybox); err != nil {
		return fmt.Errorf("importing the busybox test image: %w", err)
	}
	// A prefix and subnets of this process's own: a daemon or another
	// test binary on the machine keeps its bridges, rules and routes.
	k := byte(os.Getpid() % 120)
	env.egress = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 243, 2*k + 1, 0}), 24)
	env.net, err = sessnet.New(sessnet.Config{
		Dir:            filepath.Join(dir, "netns"),
		Prefix:         fmt.Sprintf("t%x", os.Getpid()%0xfff),
		InternalSubnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 243, 2 * k, 0}), 24),
		EgressSubnet:   env.egress,
	})
	if err != nil {
		return fmt.Errorf("the network manager: %w", err)
	}
	return nil
}

// Require skips t when the container provider cannot run here, saying why.
func Require(t testing.TB) {
	t.Helper()
	if env.dir == "" {
		t.Fatal("containertest: the test binary's TestMain must call containertest.Main")
	}
	<-env.ready
	if env.skip != "" {
		t.Skip("container provider: " + env.skip)
	}
}

// Agent is the static agent binary.
func Agent(t testing.TB) string { Require(t); return env.agent }

// dynamic is the agent DynamicAgent built, once.
var dynamic struct {
	once sync.Once
	path string
	skip string // why cgo cannot build one here
	err  error
}

// DynamicAgent is tai42 built as `go build` builds it where a C compiler
// is installed: with cgo, so dynamically linked (it has a PT_INTERP). It
// skips t, saying why, when cgo cannot build here; a build that fails
// otherwise fails t.
func DynamicAgent(t testing.TB) string {
	t.Helper()
	Require(t)
	dynamic.once.Do(func() {
		dynamic.path, dynamic.skip, dynamic.err = buildDynamic(filepath.Join(env.dir, "tai42-cgo"))
	})
	if dynamic.skip != "" {
		t.Skip(dynamic.skip)
	}
	if dynamic.err != nil {
		t.Fatal(dynamic.err)
	}
	return dynamic.path
}

// buildDynamic builds tai42 at out with CGO_ENABLED=1 and checks that it
// is dynamically linked. skip, when not empty, says why cgo cannot build
// here (no C compiler, or a toolchain that links statically anyway).
func buildDynamic(out string) (path, skip string, err error) {
	cc, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		return "", "", fmt.Errorf("go env CC: %w", err)
	}
	compiler := strings.Fields(string(cc)) // a command, with flags maybe
	if len(compiler) == 0 {
		return "", "cgo is unavailable: go env CC names no C compiler", nil
	}
	if _, err := exec.LookPath(compiler[0]); err != nil {
		return "", fmt.Sprintf("cgo is unavailable: no C compiler (%s; apt-get install -y gcc)", err), nil
	}
	if err := buildtest.Tai42(context.Background(), out, true); err != nil {
		return "", "", fmt.Errorf("building tai42 with cgo: %w", err)
	}
	f, err := elf.Open(out)
	if err != nil {
		return "", "", fmt.Errorf("the cgo build of tai42: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return out, "", nil
		}
	}
	return "", "cgo is unavailable: the cgo build of tai42 has no dynamic loader (PT_INTERP)", nil
}

// Network is the process's shared network manager.
func Network(t testing.TB) *sessnet.Manager { Require(t); return env.net }

// EgressSubnet is the shared network manager's egress subnet, for a test
// to route its egress sessions' traffic to test hosts (see
// sessnettest.Upstream).
func EgressSubnet(t testing.TB) netip.Prefix { Require(t); return env.egress }

// Options are a provider's options for a test: a fresh state directory,
// the shared agent, images and network, and runtime rt ("" for runc).
func Options(t testing.TB, rt string, policy sandbox.Policy) container.Options {
	Require(t)
	return container.Options{
		Options:         kit.Options{Policy: policy},
		ProviderOptions: kit.ProviderOptions{StateDir: t.TempDir()},
		Runtime:         rt,
		AgentBinary:     env.agent,
		Images:          env.images,
		Network:         env.net,
		// A test reaches no registry it did not start: an image the
		// store lacks is rejected at once, never looked up on Docker Hub.
		// The pull tests set their own policy.
		Pull: container.PullNever,
	}
}

// New returns a fresh container provider, closed (every session
// destroyed) at cleanup.
func New(t testing.TB, opts container.Options) *kit.Sandbox {
	t.Helper()
	sb, err := container.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("closing the container sandbox: %v", err)
		}
	})
	return sb
}

// restartSeq numbers the network managers of Restartable's sandboxes.
var restartSeq atomic.Uint32

// Restartable is the suite's Options.Restartable for runtime rt: a
// provider as Options and New make, but with a durable ledger and a network
// manager of its own (a prefix and subnets of this process and sandbox),
// since a shared one cannot hand a network back; and a restart that opens
// a new provider on its state directory after closing it or, for a crash,
// abandoning it (kit.Sandbox.Abandon: its containers, mounts, cgroups and
// networks stay, as after a SIGKILL).
func Restartable(rt string) func(t *testing.T, cfg sandboxtest.Config) (sandbox.Sandbox, func(crash bool) sandbox.Sandbox) {
	return RestartableAgent(rt, "")
}

// RestartableAgent is Restartable with agent as the agent binary ("" for
// the static one).
func RestartableAgent(rt, agent string) func(t *testing.T, cfg sandboxtest.Config) (sandbox.Sandbox, func(crash bool) sandbox.Sandbox) {
	return func(t *testing.T, cfg sandboxtest.Config) (sandbox.Sandbox, func(crash bool) sandbox.Sandbox) {
		t.Helper()
		opts := Options(t, rt, cfg.Policy)
		if agent != "" {
			opts.AgentBinary = agent
		}
		opts.ReapInterval = cfg.ReapInterval
		opts.Logger = cfg.Logger
		n := restartSeq.Add(1)
		k := byte(os.Getpid() % 250)
		opts.Network = nil
		opts.NetPrefix = fmt.Sprintf("r%03x%d", os.Getpid()%0xfff, n%10)
		opts.InternalSubnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, k, byte(n%32) * 4}), 30)
		opts.EgressSubnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, k, byte(n%32)*4 + 128}), 30)
		openOne := func() *kit.Sandbox {
			dir := filepath.Join(opts.StateDir, container.Name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			l, err := ledger.Open(filepath.Join(dir, ledger.FileName))
			if err != nil {
				t.Fatal(err)
			}
			o := opts
			o.Ledger = l
			sb, err := container.New(o)
			if err != nil {
				l.Close()
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := sb.Close(context.Background()); err != nil {
					t.Errorf("closing the container sandbox: %v", err)
				}
			})
			return sb
		}
		sb := openOne()
		return sb, func(crash bool) sandbox.Sandbox {
			if crash {
				sb.Abandon()
			} else if err := sb.Close(context.Background()); err != nil {
				t.Fatalf("closing the sandbox before its restart: %v", err)
			}
			return openOne()
		}
	}
}

// SuiteOptions are the conformance suite's options for image. They say
// Logs: the factory must pass Config.Logger to the provider. The user
// execs run as is nobody: the busybox test image's (65534, home
// /nonexistent), the host image's from the host's /etc/passwd (root where
// it has no nobody its user namespace maps).
func SuiteOptions(image string) sandboxtest.Options {
	opts := sandboxtest.Options{
		Image:              image,
		Isolation:          sandbox.IsolationContainer,
		Networks:           []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkInternal, sandbox.NetworkEgress},
		Durable:            true,
		Caps:               true,
		KillStopsLeftovers: true,
		Logs:               true,
		User:               &sandboxtest.UserOptions{Name: "nobody", UID: 65534, GID: 65534, Home: "/nonexistent"},
	}
	if image == sandbox.HostImage {
		opts.User = sandboxtest.HostUser("nobody")
		if opts.User == nil || opts.User.UID >= container.UserNamespaceSize || opts.User.GID >= container.UserNamespaceSize {
			opts.User = sandboxtest.HostUser("root")
		}
	}
	return opts
}

// HasRuntime reports whether runtime name is installed.
func HasRuntime(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil && !strings.Contains(name, "/")
}
