// Package kubetest runs a real single-node Kubernetes cluster on
// loopback for tests, as httptest runs an HTTP server: etcd, containerd,
// runc and the CNI plugins from Debian; kube-apiserver,
// kube-controller-manager, kube-scheduler and kubelet of
// k8s.io/kubernetes built from the Go module proxy at a pinned version
// (Build); kube-router as the NetworkPolicy enforcer; a local-path
// provisioner of its own (StorageClass tai42-local); and a loopback
// registry (registrytest) holding the agent image (tai42 built from this
// repository), a busybox image and the pod sandbox's pause image.
//
// Start brings one up (node Ready in about five seconds once built) and
// Close tears it down by the PIDs it started, leaving no process, mount,
// bridge, cgroup, iptables chain or file behind. One harness cluster runs
// on a machine at a time (kube-router's iptables chains are the
// machine's): Start waits for a machine-wide lock that Close releases.
// It runs beside the lab's dev cluster (other ports, bridge, subnet and
// cgroup root).
//
// A test package shares one cluster: its TestMain calls Main, and each
// test Require, which skips, saying why, on a machine that cannot run
// one (not root, a Debian package missing).
package kubetest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tai42/sandbox/internal/buildtest"
	"github.com/tai42/sandbox/internal/flock"
	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
	"github.com/tai42/sandbox/internal/imagestore/registrytest"
	"github.com/tai42/sandbox/internal/undo"
)

// StorageClass is the class of the harness's provisioner.
const StorageClass = "tai42-local"

// Provisioner is the provisioner name the StorageClass names.
const Provisioner = "tai42.dev/kubetest-local-path"

// LabelManaged is the label on every object the provider makes (the
// provider's own constant, the same name and value).
const LabelManaged = "app.kubernetes.io/managed-by"

// MachineLock is the lock one harness cluster holds on the machine.
const MachineLock = "/run/tai42-kubetest.lock"

// Debian's binaries the cluster runs.
var debianBinaries = []string{"/usr/bin/etcd", "/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc",
	"/usr/bin/ctr", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/sbin/iptables",
	"/usr/sbin/iptables-save", "/usr/sbin/iptables-restore", "/usr/sbin/ipset", imagestoretest.Busybox, registrytest.Binary}

// Options choose how the cluster is laid out; the zero value is a
// cluster on free loopback ports, beside the dev cluster.
type Options struct {
	// StateDir holds everything the cluster writes; "" makes a new
	// directory under os.TempDir(), removed by Close (a given one is
	// emptied and kept, by Close and by the sweep of a dead run alike:
	// the state record says which it was, not the directory's name).
	StateDir string
	// BinDir holds Binaries; "" runs Build(ctx, DefaultCacheDir()).
	BinDir string
	// AgentBinary is the static tai42 the agent image holds; "" builds
	// ./cmd/tai42 of this repository (CGO_ENABLED=0).
	AgentBinary string
	// Ports; 0 picks a free one on 127.0.0.1.
	EtcdClientPort, EtcdPeerPort, APIServerPort, KubeletPort, KubeletHealthzPort,
	ControllerManagerPort, SchedulerPort, StreamPort, EnforcerHealthPort int
	// Bridge is the CNI bridge's name (default tai42kt0); PodSubnet its
	// pods' (default 10.246.0.0/24); ServiceSubnet the service IP range
	// (default 10.97.0.0/24); CgroupRoot the kubelet's cgroup root
	// (default /tai42-kubetest).
	Bridge, PodSubnet, ServiceSubnet, CgroupRoot string
	// NoEnforcer runs no NetworkPolicy enforcer.
	NoEnforcer bool
	// Logf, when set, gets a line per step with its time since Start.
	Logf func(format string, args ...any)

	// fault fails a step of Start (undo.Stack.Fault), for the test that a
	// failed Start leaves nothing.
	fault func(step string) error
	// beforeUnlock runs at the end of the teardown (Close, or a failed
	// Start's), just before the machine lock is let go: the tests' check
	// that nothing is left must run before another cluster of the
	// machine can make the same names again.
	beforeUnlock func()
}

// Cluster is a running cluster.
type Cluster struct {
	// Kubeconfig is the admin kubeconfig file (system:masters, a token).
	Kubeconfig string
	// Registry is the loopback registry's host (127.0.0.1:PORT); the
	// cluster pulls from it over plain HTTP.
	Registry string
	// AgentImage, Busybox and Pause are images in Registry.
	AgentImage, Busybox, Pause string
	// StorageClass is the provisioner's class (StorageClass).
	StorageClass string
	// Kubectl is the kubectl binary; BinDir the built binaries'
	// directory; StateDir the cluster's files.
	Kubectl, BinDir, StateDir string
	// Client is an admin clientset.
	Client kubernetes.Interface
	// Enforcer says whether a NetworkPolicy enforcer runs.
	Enforcer bool
	// Timings of Start: the wait for the machine lock (another harness
	// cluster ran), then from the lock to the apiserver ready and to the
	// node Ready.
	LockWait, APIReady, NodeReady time.Duration

	opts     Options
	reg      *registrytest.Registry
	api      *proc    // the apiserver running now
	router   *proc    // the enforcer running now (nil: none)
	apiArgs  []string // its flags
	pki      *pki
	ports    map[string]int
	stack    undo.Stack
	procs    []*proc
	ownState bool
	recMu    sync.Mutex
	rec      record // what stateRecord holds
	// undoFailed says an undo failed: the lock's undo, the last, then
	// keeps stateRecord for the next Start to sweep.
	undoFailed bool
	closeOnce  sync.Once
	closeErr   error
	started    time.Time
}

// proc is a process the harness started.
type proc struct {
	name   string
	cmd    *exec.Cmd
	start  uint64 // StartTime
	exited chan struct{}
	log    string
}

// CanRun says why this machine cannot run a cluster ("" when it can):
// root, cgroups, and Debian's packages.
func CanRun() string {
	if runtime.GOOS != "linux" {
		return "kubetest: a cluster runs on Linux only"
	}
	if os.Geteuid() != 0 {
		return "kubetest: a cluster needs root (containerd, mounts, cgroups, iptables)"
	}
	var missing []string
	for _, b := range debianBinaries {
		if _, err := os.Stat(b); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return "kubetest: missing " + strings.Join(missing, " ") +
			" (apt-get install etcd-server containerd runc containernetworking-plugins iptables ipset busybox-static docker-registry)"
	}
	if _, err := exec.LookPath("go"); err != nil {
		if _, err := os.Stat(buildtest.GoTool()); err != nil {
			return "kubetest: no go command to build the cluster's binaries"
		}
	}
	return ""
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf("[kubetest %6.2fs] "+format, append([]any{time.Since(c.started).Seconds()}, args...)...)
	}
}

// Start brings a cluster up. On an error, what it had started is torn
// down before it returns.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if why := CanRun(); why != "" {
		return nil, errors.New(why)
	}
	c := &Cluster{opts: opts, started: time.Now(), StorageClass: StorageClass}
	if c.opts.Bridge == "" {
		c.opts.Bridge = "tai42kt0"
	}
	if c.opts.PodSubnet == "" {
		c.opts.PodSubnet = "10.246.0.0/24"
	}
	if c.opts.ServiceSubnet == "" {
		c.opts.ServiceSubnet = "10.97.0.0/24"
	}
	if c.opts.CgroupRoot == "" {
		c.opts.CgroupRoot = "/tai42-kubetest"
	}
	c.opts.CgroupRoot = "/" + strings.Trim(c.opts.CgroupRoot, "/")
	c.stack.Fault = opts.fault
	defer func() {
		if err != nil {
			// Bounded as Close's: ctx may be what failed Start.
			uctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			_ = c.stack.Unwind(uctx)
		}
	}()
	steps := []undo.Step{
		{Name: "machine lock", Do: func() (undo.Func, error) { return c.lockMachine(ctx) }},
		{Name: "state directory", Do: c.stateDir},
		{Name: "binaries", Do: func() (undo.Func, error) { return nil, c.binaries(ctx) }},
		{Name: "ports", Do: func() (undo.Func, error) { return nil, c.pickPorts() }},
		{Name: "pki", Do: c.makePKI},
		{Name: "registry", Do: func() (undo.Func, error) { return c.registry(ctx) }},
		{Name: "etcd", Do: func() (undo.Func, error) { return c.etcd(ctx) }},
		{Name: "pod routes", Do: c.podRoutes},
		{Name: "containerd", Do: func() (undo.Func, error) { return c.containerd(ctx) }},
		{Name: "kube-apiserver", Do: func() (undo.Func, error) { return c.apiserver(ctx) }},
		{Name: "kube-controller-manager", Do: c.controllerManager},
		{Name: "kube-scheduler", Do: c.scheduler},
		{Name: "kubelet", Do: func() (undo.Func, error) { return c.kubelet(ctx) }},
		{Name: "pods deleted at close", Do: func() (undo.Func, error) { return c.deletePodsUndo, nil }},
		{Name: "node ready", Do: func() (undo.Func, error) { return nil, c.waitNode(ctx) }},
		{Name: "networkpolicy enforcer", Do: func() (undo.Func, error) { return c.enforcer(ctx) }},
		{Name: "provisioner", Do: func() (undo.Func, error) { return c.provisioner(ctx) }},
	}
	for i := range steps {
		do := steps[i].Do
		steps[i].Do = func() (undo.Func, error) {
			u, err := do()
			if u == nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				uerr := u(ctx)
				if uerr != nil {
					c.undoFailed = true
				}
				return uerr
			}, err
		}
	}
	if err := c.stack.Run(steps...); err != nil {
		return nil, fmt.Errorf("kubetest: starting the cluster (%s): %w", undo.FailedStep(err), err)
	}
	c.logf("cluster up: kubeconfig %s", c.Kubeconfig)
	return c, nil
}

// Close tears the cluster down: the pods first (so the kubelet stops
// their sandboxes), then the processes by PID, containerd's remaining
// tasks, the mounts under the state directory, the bridge, the kubelet's
// cgroups, the enforcer's chains and sets, the state directory, the
// lock. It goes on past errors and reports them all.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c.closeErr = c.stack.Unwind(ctx)
		if c.opts.Logf != nil {
			c.opts.Logf("[kubetest] closed in %.2fs", time.Since(t0).Seconds())
		}
	})
	return c.closeErr
}

// RESTConfig is an admin rest.Config for the cluster (a copy).
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", c.ports["apiserver"]),
		BearerToken:     c.pki.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.pki.caPEM...)},
		QPS:             100,
		Burst:           200,
	}
}

// Push writes img to the cluster's registry as repo:tag and returns its
// reference (Registry/repo:tag), which the cluster pulls.
func (c *Cluster) Push(repo, tag string, img v1.Image) (string, error) {
	ref := c.reg.Ref(repo, tag)
	return ref, c.reg.PushImage(ref, img)
}

// KubectlCmd is a kubectl command against the cluster (KUBECONFIG set).
func (c *Cluster) KubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.Kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	return cmd
}

// Port is the port the cluster gave a component: etcd, etcd-peer,
// apiserver, kubelet, kubelet-healthz, kcm, scheduler, stream,
// enforcer-health.
func (c *Cluster) Port(name string) int { return c.ports[name] }

// lockMachine takes MachineLock, waiting while another cluster holds it.
func (c *Cluster) lockMachine(ctx context.Context) (undo.Func, error) {
	f, err := os.OpenFile(MachineLock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flock.Lock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		c.logf("waiting for %s: another harness cluster runs", MachineLock)
		if err := flock.LockContext(ctx, f, unix.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("waiting for %s (another harness cluster runs): %w", MachineLock, err)
		}
	}
	c.LockWait = time.Since(c.started)
	c.started = time.Now()
	c.logf("machine lock held (waited %.2fs)", c.LockWait.Seconds())
	// A run that died without its Close (SIGKILL, a crash), or whose
	// Close failed part of the way, left its record: swept now, under the
	// lock it held.
	if b, err := os.ReadFile(stateRecord); err == nil {
		if old, ok := parseRecord(b); ok {
			if old.Bridge == "" { // an older harness's record: its names were these
				old.Bridge, old.CgroupRoot = c.opts.Bridge, c.opts.CgroupRoot
			}
			c.logf("sweeping the state a previous run left in %s", old.State)
			if err := sweepStale(old); err != nil {
				c.logf("sweeping %s: %v", old.State, err)
			}
		}
		_ = os.Remove(stateRecord)
	}
	return func(context.Context) error {
		if c.undoFailed {
			c.logf("a teardown step failed: %s is kept for the next Start to sweep", stateRecord)
		} else {
			_ = os.Remove(stateRecord)
		}
		if c.opts.beforeUnlock != nil {
			c.opts.beforeUnlock()
		}
		return f.Close()
	}, nil
}

func (c *Cluster) stateDir() (undo.Func, error) {
	dir := c.opts.StateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "kubetest-")
		if err != nil {
			return nil, err
		}
		dir, c.ownState = d, true
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	// The kubelet and containerd resolve symlinks; the mounts are swept
	// by the real path.
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	c.StateDir = dir
	c.rec = record{State: dir, OwnState: c.ownState, Bridge: c.opts.Bridge, CgroupRoot: c.opts.CgroupRoot}
	if err := c.saveRecord(); err != nil {
		return nil, err
	}
	// Pods run as any user: the provisioner's volumes live under it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "etcd", "containerd", "kubelet", "kubelet-pki", "pod-logs", "cni/net.d", "cni/ipam", "registry", "pv", "kcm", "scheduler", "runc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	return func(context.Context) error {
		// Last of all: nothing may be mounted under it by now.
		if err := c.unmountAll(); err != nil {
			return err
		}
		if c.ownState {
			return os.RemoveAll(dir)
		}
		entries, _ := os.ReadDir(dir)
		var errs []error
		for _, e := range entries {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
		return errors.Join(errs...)
	}, nil
}

func (c *Cluster) binaries(ctx context.Context) error {
	if c.opts.BinDir == "" {
		bin, err := Build(ctx, DefaultCacheDir())
		if err != nil {
			return err
		}
		c.opts.BinDir = bin
	}
	c.BinDir = c.opts.BinDir
	for _, b := range Binaries {
		if _, err := os.Stat(c.bin(b)); err != nil {
			return fmt.Errorf("%s has no %s (kubetest.Build makes it): %w", c.BinDir, b, err)
		}
	}
	c.Kubectl = c.bin("kubectl")
	c.logf("binaries in %s", c.BinDir)
	return nil
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.BinDir, name) }

func (c *Cluster) pickPorts() error {
	want := []struct {
		name string
		port int
	}{
		{"etcd", c.opts.EtcdClientPort}, {"etcd-peer", c.opts.EtcdPeerPort}, {"apiserver", c.opts.APIServerPort},
		{"kubelet", c.opts.KubeletPort}, {"kubelet-healthz", c.opts.KubeletHealthzPort}, {"kcm", c.opts.ControllerManagerPort},
		{"scheduler", c.opts.SchedulerPort}, {"stream", c.opts.StreamPort}, {"enforcer-health", c.opts.EnforcerHealthPort},
	}
	c.ports = map[string]int{}
	// All listeners are held until every port is picked, so no two are
	// the same; another process may still take one before its component
	// binds it (then that component fails to start, named).
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, w := range want {
		if w.port != 0 {
			c.ports[w.name] = w.port
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		ls = append(ls, l)
		c.ports[w.name] = l.Addr().(*net.TCPAddr).Port
	}
	return nil
}

func (c *Cluster) makePKI() (undo.Func, error) {
	_, svc, err := net.ParseCIDR(c.opts.ServiceSubnet)
	if err != nil {
		return nil, fmt.Errorf("service subnet %q: %w", c.opts.ServiceSubnet, err)
	}
	first := append(net.IP(nil), svc.IP.To4()...)
	first[3]++
	p, err := newPKI(filepath.Join(c.StateDir, "pki"), first)
	if err != nil {
		return nil, err
	}
	c.pki = p
	c.Kubeconfig = filepath.Join(c.StateDir, "admin.kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, p.adminToken); err != nil {
		return nil, err
	}
	if err := c.writeKubeconfig(c.path("kubelet.kubeconfig"), p.kubeletToken); err != nil {
		return nil, err
	}
	c.Client, err = kubernetes.NewForConfig(c.RESTConfig())
	return nil, err
}

func (c *Cluster) path(rel string) string { return filepath.Join(c.StateDir, rel) }

func (c *Cluster) writeKubeconfig(file, token string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: user
  user:
    token: %s
contexts:
- name: kubetest
  context:
    cluster: kubetest
    user: user
current-context: kubetest
`, c.ports["apiserver"], c.pki.caCert, token)
	return os.WriteFile(file, []byte(kc), 0o600)
}

// registry runs the loopback registry and pushes the images into it.
func (c *Cluster) registry(ctx context.Context) (undo.Func, error) {
	reg, err := registrytest.Run(c.path("registry"), registrytest.Options{})
	if err != nil {
		return nil, err
	}
	stop := func(context.Context) error { return reg.Close() }
	c.reg, c.Registry = reg, reg.Host()
	// It outlives a run killed (no parent-death signal): the sweep ends
	// it by its PID.
	pid, start, err := registryPID(c.path("registry"))
	if err == nil {
		err = c.recordProc("registry", pid, start)
	}
	if err != nil {
		return stop, err
	}
	agent := c.opts.AgentBinary
	if agent == "" {
		tmp, err := os.MkdirTemp("", "kubetest-agent-")
		if err != nil {
			return stop, err
		}
		defer os.RemoveAll(tmp)
		if agent, err = BuildAgent(ctx, tmp); err != nil {
			return stop, err
		}
	}
	agentImg, err := singleFileImage("/tai42", agent)
	if err != nil {
		return stop, err
	}
	pauseImg, err := singleFileImage("/pause", c.bin("pause"))
	if err != nil {
		return stop, err
	}
	bb, err := imagestoretest.BusyboxImage()
	if err != nil {
		return stop, err
	}
	c.AgentImage = reg.Ref("tai42/agent", "kubetest")
	c.Busybox = reg.Ref("tai42/busybox", "1")
	c.Pause = reg.Ref("tai42/pause", "1")
	for ref, img := range map[string]v1.Image{c.AgentImage: agentImg, c.Busybox: bb, c.Pause: pauseImg} {
		if err := reg.PushImage(ref, img); err != nil {
			return stop, err
		}
	}
	c.logf("registry %s: images pushed", c.Registry)
	return stop, nil
}

// ModuleRoot is this repository's root (the directory of its go.mod).
func ModuleRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Join(filepath.Dir(file), "..", "..", "..")
		if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/tai42/sandbox\n")) {
			return filepath.Clean(root), nil
		}
	}
	// Built with -trimpath: ask go for the module of the working directory.
	out, err := exec.Command(buildtest.GoTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("finding the module root: not inside the github.com/tai42/sandbox module")
	}
	return filepath.Dir(gomod), nil
}

// BuildAgent builds ./cmd/tai42 of this repository, static, into dir and
// returns the binary's path (as every test's tai42 is built: package
// buildtest).
func BuildAgent(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "tai42")
	if err := buildtest.Tai42(ctx, out, false); err != nil {
		return "", fmt.Errorf("building the agent: %w", err)
	}
	return out, nil
}

var imageEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// singleFileImage is an image of one layer holding the file binary at
// path (0755, root), its entrypoint.
func singleFileImage(path, binary string) (v1.Image, error) {
	b, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(path, "/"), Mode: 0o755, Size: int64(len(b)), ModTime: imageEpoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(b); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: imageEpoch}
	cf.Config.Entrypoint = []string{path}
	return mutate.ConfigFile(img, cf)
}

// start runs a component, its output in logs/NAME.log. It dies with the
// harness's process (SIGKILL as its parent exits), so a test binary that
// crashes leaves no control plane running.
func (c *Cluster) start(name, bin string, args []string, env []string) (*proc, undo.Func, error) {
	logFile := c.path("logs/" + name + ".log")
	f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = c.StateDir
	cmd.Stdout, cmd.Stderr = f, f
	if env == nil {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + c.StateDir}
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Pdeathsig fires when the thread that forked dies, not the process:
	// the forks are made on one locked thread that never exits.
	if err := spawn(cmd); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), log: logFile}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	c.procs = append(c.procs, p)
	stop := func(context.Context) error { return p.stop(10 * time.Second) }
	// Read before the process can exit and be reaped: the PID is still
	// its own (a zombie's at worst) until the Wait above returns.
	p.start, err = StartTime(cmd.Process.Pid)
	if err == nil {
		err = c.recordProc(name, cmd.Process.Pid, p.start)
	}
	if err != nil {
		return p, stop, fmt.Errorf("recording %s (pid %d): %w", name, cmd.Process.Pid, err)
	}
	c.logf("%s started (pid %d)", name, cmd.Process.Pid)
	return p, stop, nil
}

var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// spawn starts cmd from the spawner thread.
func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, done: make(chan error, 1)}
	spawner.reqs <- r
	return <-r.done
}

// stop ends p by its PID: SIGTERM, SIGKILL after grace.
func (p *proc) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	return p.kill()
}

// kill ends p by its PID with SIGKILL, at once.
func (p *proc) kill() error {
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// tail is the end of p's log, for an error.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// waitFor polls ready until it is true, p exits, or timeout.
func (c *Cluster) waitFor(ctx context.Context, p *proc, what string, timeout time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if ready() {
			return nil
		}
		if p != nil && !p.alive() {
			return fmt.Errorf("%s exited (%s) before %s; its log ends:\n%s", p.name, p.cmd.ProcessState, what, p.tail())
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("%s not within %s", what, timeout)
			if p != nil {
				msg += "; " + p.name + "'s log ends:\n" + p.tail()
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) etcd(ctx context.Context) (undo.Func, error) {
	client := fmt.Sprintf("http://127.0.0.1:%d", c.ports["etcd"])
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.ports["etcd-peer"])
	p, stop, err := c.start("etcd", "/usr/bin/etcd", []string{
		"--name=kubetest", "--data-dir=" + c.path("etcd/data"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=kubetest=" + peer, "--initial-cluster-state=new",
		// A test cluster: no fsync per write is worth its latency.
		"--unsafe-no-fsync",
	}, nil)
	if err != nil {
		return stop, err
	}
	hc := &http.Client{Timeout: time.Second}
	return stop, c.waitFor(ctx, p, "etcd healthy", 30*time.Second, func() bool {
		resp, err := hc.Get(client + "/health")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return bytes.Contains(b, []byte(`"true"`))
	})
}

func (c *Cluster) containerdSocket() string { return c.path("containerd/containerd.sock") }

func (c *Cluster) containerd(ctx context.Context) (undo.Func, error) {
	s := c.StateDir
	cfg := fmt.Sprintf(`version = 2
root = "%[1]s/containerd/root"
state = "%[1]s/containerd/state"
[grpc]
  address = "%[1]s/containerd/containerd.sock"
[ttrpc]
  address = "%[1]s/containerd/containerd.sock.ttrpc"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "%[2]s"
    stream_server_address = "127.0.0.1"
    stream_server_port = "%[3]d"
    disable_apparmor = true
    # The pods' network namespaces are bind-mounted under the state
    # directory (containerd/state/io.containerd.grpc.v1.cri/netns), not
    # /var/run/netns: the unmount of everything under it, at Close or at
    # the sweep of a dead run, frees them, and their veths with them.
    netns_mounts_under_state_dir = true
    # This machine's root lacks CAP_SYS_RESOURCE: the sandbox's
    # oom_score_adj of -998 would make runc fail.
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "%[1]s/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "%[1]s/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "%[1]s/containerd/certs.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "%[1]s/containerd/opt"
`, s, c.Pause, c.ports["stream"])
	if err := os.WriteFile(c.path("containerd.toml"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	// The loopback registry over plain HTTP (containerd tries HTTPS for
	// a host it has no hosts.toml for).
	if err := c.plainHTTP(c.Registry); err != nil {
		return nil, err
	}
	// The pods' network: a bridge that is their gateway (the node's
	// address on it, a default route), no masquerade. What leaves the
	// subnet is routed by podRoutes: to a test's own test hosts, or
	// nowhere.
	cni := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "tai42-kubetest", "plugins": [
 {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
 {"type": "loopback"}]}
`, c.opts.Bridge, c.opts.PodSubnet, c.path("cni/ipam"))
	if err := os.WriteFile(c.path("cni/net.d/10-tai42-kubetest.conflist"), []byte(cni), 0o644); err != nil {
		return nil, err
	}
	p, stop, err := c.start("containerd", "/usr/bin/containerd", []string{"--config", c.path("containerd.toml")}, nil)
	if err != nil {
		return stop, err
	}
	undoAll := func(ctx context.Context) error {
		// The shims, found while their containers run, are killed if
		// they outlive containerd (a shim is not killed with it).
		shims, socks := shimPIDs(c.StateDir, p.start), shimSockets(c.StateDir)
		// Tasks the kubelet left (it is stopped by now): killed through
		// containerd, so their shims exit.
		errs := []error{c.killTasks(ctx)}
		errs = append(errs, stop(ctx))
		errs = append(errs, killRecorded(shims), removeSockets(socks))
		errs = append(errs, c.unmountAll())
		errs = append(errs, deleteBridge(c.opts.Bridge))
		return errors.Join(errs...)
	}
	err = c.waitFor(ctx, p, "containerd serving", 30*time.Second, func() bool {
		conn, err := net.DialTimeout("unix", c.containerdSocket(), time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		vctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return exec.CommandContext(vctx, "/usr/bin/ctr", "-a", c.containerdSocket(), "version").Run() == nil
	})
	return undoAll, err
}

// plainHTTP makes containerd pull from host (a loopback registry) over
// plain HTTP: a hosts.toml in its config_path, read at each pull.
func (c *Cluster) plainHTTP(host string) error {
	hostDir := c.path("containerd/certs.d/" + host)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return err
	}
	hosts := fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", host)
	return os.WriteFile(filepath.Join(hostDir, "hosts.toml"), []byte(hosts), 0o644)
}

// AuthRegistry starts, for t, a second loopback registry that takes
// only users' basic-auth credentials (htpasswd), which the cluster
// pulls from over plain HTTP: for the tests of imagePullSecrets. It
// is stopped, and forgotten by containerd, when t ends.
func (c *Cluster) AuthRegistry(t testing.TB, users map[string]string) *registrytest.Registry {
	t.Helper()
	r := registrytest.Start(t, registrytest.Options{Users: users})
	if err := c.plainHTTP(r.Host()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(c.path("containerd/certs.d/" + r.Host())) })
	return r
}

// ctr runs containerd's CLI against this cluster's containerd.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "/usr/bin/ctr", append([]string{"-a", c.containerdSocket(), "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// killTasks kills and deletes every task of this containerd.
func (c *Cluster) killTasks(ctx context.Context) error {
	out, err := c.ctr(ctx, "tasks", "ls", "-q")
	if err != nil {
		return nil // containerd is gone: its undo kills the shims it found
	}
	ids := strings.Fields(out)
	for _, id := range ids {
		_, _ = c.ctr(ctx, "tasks", "kill", "-s", "KILL", id)
	}
	var errs []error
	for _, id := range ids {
		for i := 0; i < 50; i++ {
			if _, err := c.ctr(ctx, "tasks", "delete", "-f", id); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if out, _ := c.ctr(ctx, "tasks", "ls", "-q"); strings.TrimSpace(out) != "" {
		errs = append(errs, fmt.Errorf("containerd tasks left: %s", strings.Fields(out)))
	}
	return errors.Join(errs...)
}

// unmountAll unmounts everything mounted under the state directory,
// deepest first.
func (c *Cluster) unmountAll() error {
	if c.StateDir == "" {
		return nil
	}
	var errs []error
	for range 3 {
		mounts := mountsUnder(c.StateDir)
		if len(mounts) == 0 {
			return nil
		}
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	if left := mountsUnder(c.StateDir); len(left) > 0 {
		return errors.Join(append(errs, fmt.Errorf("still mounted under %s: %v", c.StateDir, left))...)
	}
	return nil
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// MountsUnder is mountsUnder for the harness's tests.
func MountsUnder(dir string) []string { return mountsUnder(dir) }

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (c *Cluster) apiserver(ctx context.Context) (undo.Func, error) {
	p := c.pki
	args := []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.ports["etcd"]),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports["apiserver"]),
		"--cert-dir=" + c.path("pki"),
		"--tls-cert-file=" + p.serverCert, "--tls-private-key-file=" + p.serverKey,
		"--client-ca-file=" + p.caCert, "--token-auth-file=" + p.tokens,
		"--authorization-mode=Node,RBAC",
		// The defaults (PodSecurity, ServiceAccount, NamespaceLifecycle,
		// DefaultStorageClass, ...) and the kubelet's NodeRestriction.
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.saPub, "--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=" + c.opts.ServiceSubnet,
		// The kubelet serves on 127.0.0.1 as "localhost".
		"--kubelet-preferred-address-types=Hostname",
		"--kubelet-client-certificate=" + p.kubeletClientCert, "--kubelet-client-key=" + p.kcKey,
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	c.apiArgs = args
	// The undo stops the apiserver running then: StopAPIServer and
	// StartAPIServer may have replaced the first.
	stop := func(context.Context) error {
		if c.api == nil {
			return nil
		}
		return c.api.stop(10 * time.Second)
	}
	err := c.runAPIServer(ctx)
	c.APIReady = time.Since(c.started)
	return stop, err
}

// runAPIServer starts the apiserver and waits until it is ready.
func (c *Cluster) runAPIServer(ctx context.Context) error {
	proc, _, err := c.start("kube-apiserver", c.bin("kube-apiserver"), c.apiArgs, nil)
	if err != nil {
		return err
	}
	c.api = proc
	rc := c.Client.CoreV1().RESTClient()
	return c.waitFor(ctx, proc, "the apiserver ready (/readyz)", 60*time.Second, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		b, err := rc.Get().AbsPath("/readyz").DoRaw(rctx)
		return err == nil && string(b) == "ok"
	})
}

// StopAPIServer kills the apiserver (by its PID, SIGKILL: it goes away
// mid-stream, as a crashed or partitioned one does, with no graceful
// close of its watches); the rest of the cluster keeps running. The
// package's other tests share the cluster: a test that calls it must
// StartAPIServer again before it ends.
func (c *Cluster) StopAPIServer() error {
	if c.api == nil || !c.api.alive() {
		return errors.New("kubetest: the apiserver is not running")
	}
	return c.api.kill()
}

// StartAPIServer starts the apiserver StopAPIServer stopped, with the
// same flags and port, and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if c.api != nil && c.api.alive() {
		return errors.New("kubetest: the apiserver is running")
	}
	return c.runAPIServer(ctx)
}

func (c *Cluster) controllerManager() (undo.Func, error) {
	kc := c.Kubeconfig
	_, stop, err := c.start("kube-controller-manager", c.bin("kube-controller-manager"), []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", c.ports["kcm"]), "--cert-dir=" + c.path("kcm"),
		"--root-ca-file=" + c.pki.caCert, "--service-account-private-key-file=" + c.pki.saKey,
		"--service-cluster-ip-range=" + c.opts.ServiceSubnet,
		"--leader-elect=false", "--use-service-account-credentials=false",
		// The garbage collector, namespace, serviceaccount, PV binder and
		// the rest of the defaults; no cloud.
		"--controllers=*",
	}, nil)
	return stop, err
}

func (c *Cluster) scheduler() (undo.Func, error) {
	kc := c.Kubeconfig
	_, stop, err := c.start("kube-scheduler", c.bin("kube-scheduler"), []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", c.ports["scheduler"]), "--cert-dir=" + c.path("scheduler"),
		"--leader-elect=false",
	}, nil)
	return stop, err
}

func (c *Cluster) kubelet(ctx context.Context) (undo.Func, error) {
	err := makeCgroupRoot(c.opts.CgroupRoot)
	undoCg := func(context.Context) error { return removeCgroupRoot(c.opts.CgroupRoot) }
	if err != nil {
		return undoCg, err
	}
	undoVarLib, err := c.varLibKubelet()
	undoBase := func(ctx context.Context) error { return errors.Join(undoCg(ctx), undoVarLib()) }
	if err != nil {
		return undoBase, err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: %q
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%s
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {"memory.available": "1Mi", "nodefs.available": "1%%", "imagefs.available": "1%%"}
localStorageCapacityIsolation: false
podLogsDir: %q
serializeImagePulls: false
maxPods: 250
syncFrequency: 10s
fileCheckFrequency: 10s
`, c.ports["kubelet"], c.ports["kubelet-healthz"], c.pki.caCert, c.opts.CgroupRoot, c.containerdSocket(), c.path("pod-logs"))
	if err := os.WriteFile(c.path("kubelet-config.yaml"), []byte(cfg), 0o644); err != nil {
		return undoBase, err
	}
	p, stop, err := c.start("kubelet", c.bin("kubelet"), []string{
		"--config=" + c.path("kubelet-config.yaml"), "--kubeconfig=" + c.path("kubelet.kubeconfig"),
		"--root-dir=" + c.path("kubelet"), "--cert-dir=" + c.path("kubelet-pki"),
		// No --node-ip: the kubelet refuses a loopback one, and kube-router
		// needs the node to have an InternalIP (the host's own, unused:
		// the apiserver reaches the kubelet as "localhost").
		"--hostname-override=localhost",
	}, nil)
	undoAll := func(ctx context.Context) error {
		errs := []error{}
		if stop != nil {
			errs = append(errs, stop(ctx))
		}
		// The pods' processes the kubelet left: killed by containerd.
		errs = append(errs, c.killTasks(ctx))
		errs = append(errs, undoBase(ctx))
		c.removeLogLinks()
		return errors.Join(errs...)
	}
	if err != nil {
		return undoAll, err
	}
	hc := &http.Client{Timeout: time.Second}
	err = c.waitFor(ctx, p, "the kubelet healthy", 60*time.Second, func() bool {
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", c.ports["kubelet-healthz"]))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return undoAll, err
}

// removeLogLinks removes the links the kubelet made in
// /var/log/containers (a path compiled in) to this cluster's pod logs:
// those of containers it had not removed when it stopped.
func (c *Cluster) removeLogLinks() {
	const dir = "/var/log/containers"
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, c.StateDir+"/") {
			_ = os.Remove(p)
		}
	}
}

// varLibKubelet notes whether /var/lib/kubelet is there: the kubelet
// makes /var/lib/kubelet/device-plugins whatever its root directory (a
// path compiled in; a kubelet beside, the dev cluster's, shares it: the
// last started owns the kubelet.sock there, which neither uses, as
// neither runs a device plugin); the undo removes it only if this
// cluster made it.
func (c *Cluster) varLibKubelet() (func() error, error) {
	if _, err := os.Stat("/var/lib/kubelet"); err == nil {
		return func() error { return nil }, nil
	}
	return func() error {
		_ = os.RemoveAll("/var/lib/kubelet/device-plugins")
		_ = os.Remove("/var/lib/kubelet")
		return nil
	}, nil
}

// netnsDir is where containerd mounts the pods' network namespaces
// (netns_mounts_under_state_dir): its CRI plugin's state directory.
func netnsDir(state string) string {
	return filepath.Join(state, "containerd/state/io.containerd.grpc.v1.cri/netns")
}

// netnsLeft lists the pods' network namespaces containerd still has
// mounted under state.
func netnsLeft(state string) []string {
	var left []string
	for _, m := range mountsUnder(state) {
		if strings.HasPrefix(m, netnsDir(state)+"/") {
			left = append(left, m)
		}
	}
	return left
}

// deletePodsUndo deletes every pod and waits until containerd runs no
// task and has no pod network namespace mounted: StopPodSandbox removes
// the namespace after the CNI DEL, so "no pods, no tasks" alone can hold
// while a DEL is still under way, and a kubelet stopped then leaves the
// namespace and its veth. Past the wait, what is left is killed through
// containerd and unmounted by its undo.
func (c *Cluster) deletePodsUndo(ctx context.Context) error {
	zero := int64(0)
	nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, ns := range nss.Items {
			_ = c.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		out, cerr := c.ctr(ctx, "tasks", "ls", "-q")
		if (err != nil || len(pods.Items) == 0) && (cerr != nil || strings.TrimSpace(out) == "") && len(netnsLeft(c.StateDir)) == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.logf("pods, tasks or network namespaces left after 60s: killed and unmounted by containerd's undo")
	return nil
}

func (c *Cluster) waitNode(ctx context.Context) error {
	var kubelet *proc
	for _, p := range c.procs {
		if p.name == "kubelet" {
			kubelet = p
		}
	}
	err := c.waitFor(ctx, kubelet, "node localhost Ready", 120*time.Second, func() bool {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "localhost", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	c.NodeReady = time.Since(c.started)
	c.logf("node Ready")
	return c.waitFor(ctx, nil, "the default service account", 60*time.Second, func() bool {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
}

// storageClass creates the provisioner's StorageClass (the default).
func (c *Cluster) storageClass(ctx context.Context) error {
	del := corev1.PersistentVolumeReclaimDelete
	mode := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        StorageClass,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       Provisioner,
		ReclaimPolicy:     &del,
		VolumeBindingMode: &mode,
	}
	_, err := c.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil
	}
	return err
}
