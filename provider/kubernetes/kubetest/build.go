package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/buildtest"
	"github.com/tai42/sandbox/internal/flock"
)

// The pinned versions the harness builds: the cluster's, the staging
// modules' (k8s.io/api and the like, v0.MINOR.PATCH of it) and the
// NetworkPolicy enforcer's.
const (
	KubernetesVersion = "v1.37.2"
	stagingVersion    = "v0.37.2"
	KubeRouterModule  = "github.com/cloudnativelabs/kube-router/v2"
	KubeRouterVersion = "v2.1.0"
)

// buildLayout is part of the stamp: a change to what Build makes (a new
// binary, other flags) makes an earlier build incomplete.
const buildLayout = "2"

// kubeCommands are the binaries of k8s.io/kubernetes Build makes.
var kubeCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

// Binaries is every file Build leaves in its bin directory.
var Binaries = append(append([]string{}, kubeCommands...), "kube-router", "pause")

// DefaultCacheDir is where Build keeps the binaries between runs:
// $TAI42_TEST_K8S_CACHE, else /var/cache/tai42-test/k8s.
func DefaultCacheDir() string {
	if d := os.Getenv("TAI42_TEST_K8S_CACHE"); d != "" {
		return d
	}
	return "/var/cache/tai42-test/k8s"
}

// Build makes the cluster's binaries (Binaries) under
// cacheDir/k8s-VERSION/bin and returns that directory. A complete
// earlier build (its stamp names the versions, the Go toolchain and the
// layout) is reused; otherwise they are built, under a lock so that test
// processes started together build once:
//   - kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
//     kubectl of k8s.io/kubernetes at KubernetesVersion, through a wrapper
//     module that requires it and replaces each of its ./staging modules
//     by the published k8s.io/* at stagingVersion (k8s.io/kubernetes is
//     not meant to be required: its go.mod points into its own tree);
//   - kube-router at KubeRouterVersion: its NetworkPolicy controller alone
//     (kubeRouterSource), built in the same wrapper module and go build;
//   - pause, the pod sandbox's process (a few lines of Go written here:
//     the usual pause image is on a registry this machine cannot reach).
//
// All are static (CGO_ENABLED=0), built with the default GOMODCACHE and
// GOCACHE so that a machine's builds share them. Cold, it downloads the
// modules and compiles for several minutes; warm, seconds.
func Build(ctx context.Context, cacheDir string) (string, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	dir := filepath.Join(cacheDir, "k8s-"+KubernetesVersion)
	bin := filepath.Join(dir, "bin")
	want := stamp()
	if complete(bin, want) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := flock.LockContext(ctx, lock, unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("waiting for the build lock %s: %w", lock.Name(), err)
	}
	if complete(bin, want) { // built by another process meanwhile
		return bin, nil
	}
	_ = os.Remove(filepath.Join(bin, stampFile))
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	if err := buildKubernetes(ctx, dir, bin); err != nil {
		return "", err
	}
	if err := buildPause(ctx, dir, bin); err != nil {
		return "", err
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return "", fmt.Errorf("the build left no %s: %w", b, err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, stampFile), []byte(want), 0o644); err != nil {
		return "", err
	}
	return bin, nil
}

const stampFile = ".complete"

func stamp() string {
	return fmt.Sprintf("kubernetes %s staging %s kube-router %s %s layout %s\n",
		KubernetesVersion, stagingVersion, KubeRouterVersion, runtime.Version(), buildLayout)
}

func complete(bin, want string) bool {
	b, err := os.ReadFile(filepath.Join(bin, stampFile))
	return err == nil && string(b) == want
}

// goEnv is the environment of the go commands: static binaries, modules
// fetched as the go.mod needs; the caller's GOMODCACHE/GOCACHE/GOPROXY
// kept (the shared caches).
func goEnv(extra ...string) []string {
	env := []string{"CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off"}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "CGO_ENABLED", "GOFLAGS", "GOWORK", "GOOS", "GOARCH", "GOBIN":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

var stagingLine = regexp.MustCompile(`^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/`)

// buildKubernetes writes the wrapper module in dir/kbuild and builds
// kubeCommands into bin, with the version ldflags kube's own build sets
// (a server reports it, the kubelet registers with it).
func buildKubernetes(ctx context.Context, dir, bin string) error {
	mod := filepath.Join(dir, "kbuild")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return err
	}
	env := goEnv()
	// The kubernetes go.mod, from the module cache (downloaded if not there).
	cmd := exec.CommandContext(ctx, buildtest.GoTool(), "mod", "download", "-json", "k8s.io/kubernetes@"+KubernetesVersion)
	cmd.Dir, cmd.Env = mod, env
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go mod download k8s.io/kubernetes@%s: %w (%s)", KubernetesVersion, err, out)
	}
	var dl struct{ GoMod, Error string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.GoMod == "" {
		return fmt.Errorf("go mod download k8s.io/kubernetes@%s: %v %s", KubernetesVersion, err, dl.Error)
	}
	kmod, err := os.ReadFile(dl.GoMod)
	if err != nil {
		return err
	}
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module example.com/tai42-kubetest-k8s\n\ngo 1.24.0\n\nrequire (\n\tk8s.io/kubernetes %s\n\t%s %s\n)\n\nreplace (\n", KubernetesVersion, KubeRouterModule, KubeRouterVersion)
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(kmod))
	for sc.Scan() {
		if m := stagingLine.FindStringSubmatch(sc.Text()); m != nil {
			fmt.Fprintf(&gomod, "\t%s => %s %s\n", m[1], m[1], stagingVersion)
			n++
		}
	}
	gomod.WriteString(")\n")
	if n == 0 {
		return fmt.Errorf("%s replaces no module by ./staging: not the go.mod the wrapper expects", dl.GoMod)
	}
	var tools strings.Builder
	tools.WriteString("//go:build tools\n\npackage tools\n\nimport (\n")
	for _, c := range kubeCommands {
		fmt.Fprintf(&tools, "\t_ \"k8s.io/kubernetes/cmd/%s\"\n", c)
	}
	tools.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod.String()), 0o644); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(mod, "go.sum"))
	if err := os.WriteFile(filepath.Join(mod, "tools.go"), []byte(tools.String()), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(mod, "kube-router"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(mod, "kube-router", "main.go"), []byte(kubeRouterSource), 0o644); err != nil {
		return err
	}
	if err := buildtest.Go(ctx, mod, env, "mod", "tidy"); err != nil {
		return err
	}
	minor := strings.Split(strings.TrimPrefix(KubernetesVersion, "v"), ".")[1]
	ldflags := fmt.Sprintf("-s -w -X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=%s", KubernetesVersion, minor)
	args := []string{"build", "-trimpath", "-ldflags", ldflags, "-o", bin + "/"}
	for _, c := range kubeCommands {
		args = append(args, "k8s.io/kubernetes/cmd/"+c)
	}
	args = append(args, "./kube-router")
	return buildtest.Go(ctx, mod, env, args...)
}

// kubeRouterSource is the harness's kube-router: kube-router's
// NetworkPolicy controller alone, run as kube-router's own main runs it
// with --run-firewall and neither its router nor its service proxy (the
// same flags, refusing the others). It is built in the wrapper module,
// so against the cluster's own client-go, whose packages the Kubernetes
// build has just compiled: kube-router's main would compile its own
// older client-go and its router's GoBGP as well, minutes of a cold
// build. The advisories on v2.1.0 are in the code it leaves out.
const kubeRouterSource = `// Command kube-router is kube-router's NetworkPolicy controller alone.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cloudnativelabs/kube-router/v2/pkg/controllers/netpol"
	"github.com/cloudnativelabs/kube-router/v2/pkg/healthcheck"
	"github.com/cloudnativelabs/kube-router/v2/pkg/options"
	"github.com/spf13/pflag"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kube-router:", err)
		os.Exit(1)
	}
}

func run() error {
	klog.InitFlags(nil)
	config := options.NewKubeRouterConfig()
	config.AddFlags(pflag.CommandLine)
	pflag.Parse()
	if err := flag.Set("logtostderr", "true"); err != nil {
		return err
	}
	if err := flag.Set("v", config.VLevel); err != nil {
		return err
	}
	if !config.RunFirewall || config.RunRouter || config.RunServiceProxy || config.RunLoadBalancer {
		return errors.New("this build runs the firewall alone: --run-firewall=true --run-router=false --run-service-proxy=false")
	}
	rc, err := clientcmd.BuildConfigFromFlags(config.Master, config.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	stopCh := make(chan struct{})
	healthChan := make(chan *healthcheck.ControllerHeartbeat, 10)
	hc, err := healthcheck.NewHealthController(config)
	if err != nil {
		return err
	}
	wg.Add(1)
	go hc.RunServer(stopCh, &wg)

	factory := informers.NewSharedInformerFactory(client, 0)
	pods := factory.Core().V1().Pods().Informer()
	namespaces := factory.Core().V1().Namespaces().Informer()
	policies := factory.Networking().V1().NetworkPolicies().Informer()
	factory.Start(stopCh)
	synced := make(chan struct{})
	go func() { factory.WaitForCacheSync(stopCh); close(synced) }()
	select {
	case <-synced:
	case <-time.After(config.CacheSyncTimeout):
		return fmt.Errorf("the informers' caches did not sync within %s", config.CacheSyncTimeout)
	}
	hc.SetAlive()
	wg.Add(1)
	go hc.RunCheck(healthChan, stopCh, &wg)

	config.MetricsEnabled = false
	var ipsetMutex sync.Mutex
	ipt, ipsets, err := netpol.NewIPTablesHandlers(config)
	if err != nil {
		return err
	}
	npc, err := netpol.NewNetworkPolicyController(client, config, pods, policies, namespaces, &ipsetMutex, ipt, ipsets)
	if err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(npc.PodEventHandler); err != nil {
		return err
	}
	if _, err := namespaces.AddEventHandler(npc.NamespaceEventHandler); err != nil {
		return err
	}
	if _, err := policies.AddEventHandler(npc.NetworkPolicyEventHandler); err != nil {
		return err
	}
	wg.Add(1)
	go npc.Run(healthChan, stopCh, &wg)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	close(stopCh)
	wg.Wait()
	return nil
}
`

// pauseSource is the pod sandbox's process: it holds the pod's
// namespaces, reaps what is reparented to it, and exits on SIGTERM or
// SIGINT (the runtime's stop).
const pauseSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var st syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &st, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
`

func buildPause(ctx context.Context, dir, bin string) error {
	src := filepath.Join(dir, "pause")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module example.com/tai42-kubetest-pause\n\ngo 1.22\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(pauseSource), 0o644); err != nil {
		return err
	}
	return buildtest.Go(ctx, src, goEnv(), "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(bin, "pause"), ".")
}
