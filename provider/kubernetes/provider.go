package kubernetes

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// Defaults for [Options].
const (
	DefaultPodUser       = "65532:65532"
	DefaultCreateTimeout = 2 * time.Minute
	DefaultDiskMB        = 10240
	// setupTimeout bounds each of New's checks of the cluster.
	setupTimeout = 10 * time.Second
)

// Options configure the kubernetes provider.
type Options struct {
	kit.Options
	// ProviderOptions bound an exec's output; StateDir is not used (the
	// provider's state is the cluster's).
	kit.ProviderOptions
	// Kubeconfig is the kubeconfig file; "": in-cluster when the process
	// runs in a Pod, else the default loading rules ($KUBECONFIG,
	// ~/.kube/config).
	Kubeconfig string
	// Namespace holds the sessions; "": the kubeconfig context's
	// namespace (in-cluster: the Pod's own), else "default".
	Namespace string
	// AgentImage is the image whose /tai42 the init container copies into
	// each session Pod. Required.
	AgentImage string
	// PodUser is "uid:gid" every session Pod runs as; "" is
	// [DefaultPodUser]. uid 0 is refused (the restricted Pod Security
	// standard runs as non-root).
	PodUser string
	// RuntimeClass names the RuntimeClass of isolation "vm" (gVisor,
	// Kata, ...): the provider's level is then vm. "": container.
	RuntimeClass string
	// ImagePullSecrets are Secrets of the namespace every session Pod
	// pulls its images with.
	ImagePullSecrets []string
	// StorageClass of the persistent workspaces' PVCs; "": the cluster's
	// default StorageClass.
	StorageClass string
	// CreateTimeout bounds a create (the Pod scheduled, pulled, started,
	// its agent answering); 0 is [DefaultCreateTimeout].
	CreateTimeout time.Duration
	// NetworkProbeImage is the image (with a busybox-style nc) of the
	// Pods that prove at start that the cluster enforces NetworkPolicy;
	// "" rejects every network tier unless TrustNetworkPolicy is set.
	NetworkProbeImage string
	// TrustNetworkPolicy skips that probe: the operator says the cluster
	// enforces NetworkPolicy (logged at start).
	TrustNetworkPolicy bool
	// WorkspaceSize is each persistent workspace's PVC request; "" is
	// DefaultWorkspaceSize.
	WorkspaceSize string
	// DiskMB caps what a session may write to its node's disk, in MiB:
	// the ephemeral-storage limit of the session's container, which its
	// writable layer, its logs and its emptyDir workspace count against
	// (a persistent workspace is a PVC of WorkspaceSize, not counted). The
	// kubelet evicts a session past it: its Pod fails, and the session
	// with it. Nothing is requested: the scheduler reserves no disk for a
	// session. 0 means [DefaultDiskMB] (10 GiB, the container provider's
	// default cap); a negative value is an error of New. Turning the cap
	// off is DiskOff's, never a silent default.
	DiskMB int
	// DiskOff gives session Pods no ephemeral-storage limit: a session
	// may fill its node's disk, and the kubelet then evicts Pods of the
	// node, other sessions' among them.
	DiskOff bool
	// RESTConfig, when set, is used instead of loading Kubeconfig (tests).
	RESTConfig *rest.Config
}

// SetupCheck names what New found wrong with the cluster or its options.
type SetupCheck string

const (
	CheckOptions      SetupCheck = "options"
	CheckKubeconfig   SetupCheck = "kubeconfig"
	CheckAPIServer    SetupCheck = "apiserver"
	CheckNamespace    SetupCheck = "namespace"
	CheckRBAC         SetupCheck = "rbac"
	CheckRuntimeClass SetupCheck = "runtimeclass"
)

// SetupError reports why [New] cannot serve the cluster it was given: a
// kubeconfig that does not load, an apiserver that does not answer, a
// namespace that does not exist, RBAC that forbids a verb the provider
// needs (Verb and Resource name it), a RuntimeClass that does not exist.
type SetupError struct {
	Check    SetupCheck
	Verb     string // CheckRBAC: the forbidden verb
	Resource string // CheckRBAC: on this resource (group/resource/subresource)
	Message  string
	Err      error
}

func (e *SetupError) Error() string {
	s := "kubernetes provider: " + string(e.Check) + ": " + e.Message
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}
func (e *SetupError) Unwrap() error        { return e.Err }
func (e *SetupError) Is(target error) bool { return target == sandbox.ErrSandbox }

// As fills a *sandbox.SandboxError, as the sandbox's own error kinds do:
// a caller that handles the family's base type gets New's failure too.
func (e *SetupError) As(target any) bool {
	p, ok := target.(**sandbox.SandboxError)
	if ok {
		*p = &sandbox.SandboxError{Message: e.Error(), Err: e}
	}
	return ok
}

// New returns the kubernetes provider wrapped by the kit, once it has
// checked, each within a bounded time, that the kubeconfig loads and the
// apiserver answers, the namespace exists, RBAC allows every verb the
// provider uses, and the RuntimeClass exists when one is named. Each
// failure is a *SetupError naming its cause. New owns opts.Ledger, as
// kit.New does.
//
// The ledger is the apiserver: opts.Ledger must be nil, and the sandbox
// serves every session of the namespace, whichever daemon made it.
func New(opts Options) (*kit.Sandbox, error) {
	if opts.Ledger != nil {
		return kit.Wrap(nil, &SetupError{Check: CheckOptions, Message: "Options.Ledger must be nil: the apiserver is the kubernetes provider's ledger"}, opts.Options)
	}
	p, err := newProvider(opts)
	if err != nil {
		return nil, err
	}
	opts.Options.Ledger = p.ledger
	return kit.New(p, opts.Options)
}

type provider struct {
	opts       Options
	log        *slog.Logger
	cfg        *rest.Config
	cs         kubernetes.Interface
	ns         string
	uid, gid   int64
	network    *network    // network.go: the tier NetworkPolicies and the enforcement probe
	workspaces *workspaces // workspaces.go: the persistent workspaces' PVCs
	ledger     *ledger     // ledger.go: the sessions' records, on their Pods
	sweeper    *sweeper    // sweep.go: what crashed creates and teardowns left
	stopSweep  context.CancelFunc
	sweepDone  chan struct{}

	closeOnce sync.Once
}

var (
	_ kit.Provider  = (*provider)(nil)
	_ kit.Abandoner = (*provider)(nil)
	// No kit.Recoverer: the ledger is always the apiserver's, a
	// kit.SharedLedger, over which the kit never calls Recover; a session
	// another daemon (or this one before a restart) made is adopted.
)

func (p *provider) Name() string { return Name }

func (p *provider) Isolation() sandbox.Isolation {
	if p.opts.RuntimeClass != "" {
		return sandbox.IsolationVM
	}
	return sandbox.IsolationContainer
}

func (p *provider) SharedFilesystem() bool { return false }

// Close lets go of the provider's clients; sessions are the kit's.
func (p *provider) Close() error {
	p.closeOnce.Do(func() {
		if p.stopSweep != nil {
			p.stopSweep()
			<-p.sweepDone
		}
		if p.network != nil {
			p.network.close()
		}
	})
	return nil
}

// Abandon (kit.Abandoner) stops what runs in this process, the sweep and
// the network probe, as Close does: it touches no session (a probe cut
// short removes its own Pods), so it leaves what the process's death would.
func (p *provider) Abandon() { _ = p.Close() }

// Workspaces implements kit.WorkspaceStore through the PVCs.
func (p *provider) Workspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error) {
	return p.workspaces.Workspaces(ctx)
}

// RemoveWorkspace implements kit.WorkspaceStore through the PVCs.
func (p *provider) RemoveWorkspace(ctx context.Context, key string) error {
	return p.workspaces.RemoveWorkspace(ctx, key)
}

// sweepLoop runs the sweeper on the reaper's cadence while this daemon
// holds the reaper's Lease: one daemon per namespace sweeps.
func (p *provider) sweepLoop(ctx context.Context, every time.Duration) {
	defer close(p.sweepDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !p.ledger.Reaping() {
			continue
		}
		removed, err := p.sweeper.sweep(ctx)
		if len(removed) > 0 {
			p.log.Info("swept what no live session owns", "removed", removed)
		}
		if err != nil && ctx.Err() == nil {
			p.log.Warn("sweep failed", "err", err)
		}
	}
}

// parsePodUser reads "uid:gid" (or "uid", gid = uid).
func parsePodUser(s string) (uid, gid int64, err error) {
	us, gs, ok := strings.Cut(s, ":")
	if !ok {
		gs = us
	}
	uid, err1 := strconv.ParseInt(us, 10, 64)
	gid, err2 := strconv.ParseInt(gs, 10, 64)
	switch {
	case err1 != nil || err2 != nil || uid < 0 || gid < 0:
		return 0, 0, fmt.Errorf("PodUser %q is not uid:gid", s)
	case uid == 0:
		return 0, 0, fmt.Errorf("PodUser %q is root: the restricted Pod Security standard runs Pods as non-root", s)
	}
	return uid, gid, nil
}

// restConfig loads the cluster's config and the namespace it names.
func restConfig(opts Options) (*rest.Config, string, error) {
	if opts.RESTConfig != nil {
		ns := opts.Namespace
		if ns == "" {
			ns = "default"
		}
		return rest.CopyConfig(opts.RESTConfig), ns, nil
	}
	if opts.Kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, "", &SetupError{Check: CheckKubeconfig, Message: "the in-cluster config does not load", Err: err}
		}
		ns := opts.Namespace
		if ns == "" {
			if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
				ns = strings.TrimSpace(string(b))
			}
		}
		if ns == "" {
			ns = "default"
		}
		return cfg, ns, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if opts.Kubeconfig != "" {
		rules.ExplicitPath = opts.Kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		what := "the kubeconfig does not load"
		if opts.Kubeconfig != "" {
			what = fmt.Sprintf("the kubeconfig %s does not load", opts.Kubeconfig)
		}
		return nil, "", &SetupError{Check: CheckKubeconfig, Message: what, Err: err}
	}
	ns := opts.Namespace
	if ns == "" {
		if n, _, err := cc.Namespace(); err == nil && n != "" {
			ns = n
		} else {
			ns = "default"
		}
	}
	return cfg, ns, nil
}

// permissions are every verb the provider (and its ledger, sweeper,
// workspaces and network policies) uses, checked at New so that a
// forbidden one is named then, not at some later create. The README's Role
// grants exactly these and nothing more (TestReadmeRBACIsWhatTheProviderUses),
// and the provider's requests stay within them (TestRBACSuffices): a
// daemon's credential reaches no further than the daemon needs. Secrets
// are listed only by the sweep (an env Secret the garbage collector has
// not yet taken with its Pod), and never watched.
var permissions = []authv1.ResourceAttributes{
	{Verb: "create", Resource: "pods"},
	{Verb: "get", Resource: "pods"},
	{Verb: "list", Resource: "pods"},
	{Verb: "watch", Resource: "pods"},
	{Verb: "delete", Resource: "pods"},
	{Verb: "patch", Resource: "pods"},
	{Verb: "create", Resource: "pods", Subresource: "portforward"},
	{Verb: "create", Resource: "secrets"},
	{Verb: "get", Resource: "secrets"},
	{Verb: "list", Resource: "secrets"},
	{Verb: "delete", Resource: "secrets"},
	{Verb: "create", Resource: "persistentvolumeclaims"},
	{Verb: "get", Resource: "persistentvolumeclaims"},
	{Verb: "list", Resource: "persistentvolumeclaims"},
	{Verb: "update", Resource: "persistentvolumeclaims"},
	{Verb: "delete", Resource: "persistentvolumeclaims"},
	{Verb: "create", Group: "networking.k8s.io", Resource: "networkpolicies"},
	{Verb: "get", Group: "networking.k8s.io", Resource: "networkpolicies"},
	{Verb: "update", Group: "networking.k8s.io", Resource: "networkpolicies"},
	{Verb: "create", Group: "coordination.k8s.io", Resource: "leases"},
	{Verb: "get", Group: "coordination.k8s.io", Resource: "leases"},
	{Verb: "update", Group: "coordination.k8s.io", Resource: "leases"},
	{Verb: "list", Resource: "events"},
}

// clusterPermissions are the cluster-scoped verbs: the StorageClasses the
// workspaces' check reads (workspaces.probeClass).
var clusterPermissions = []authv1.ResourceAttributes{
	{Verb: "get", Group: "storage.k8s.io", Resource: "storageclasses"},
	{Verb: "list", Group: "storage.k8s.io", Resource: "storageclasses"},
}

func resourceName(a authv1.ResourceAttributes) string {
	s := a.Resource
	if a.Group != "" {
		s = a.Group + "/" + s
	}
	if a.Subresource != "" {
		s += "/" + a.Subresource
	}
	return s
}

// newProvider checks opts and the cluster (see [New]).
func newProvider(opts Options) (*provider, error) {
	opts.ProviderOptions = opts.ProviderOptions.WithDefaults()
	if opts.AgentImage == "" {
		return nil, &SetupError{Check: CheckOptions, Message: "AgentImage (--agent-image) is required: the image whose /tai42 each session Pod runs as its agent"}
	}
	if opts.PodUser == "" {
		opts.PodUser = DefaultPodUser
	}
	uid, gid, err := parsePodUser(opts.PodUser)
	if err != nil {
		return nil, &SetupError{Check: CheckOptions, Message: err.Error()}
	}
	if opts.DiskMB < 0 {
		return nil, &SetupError{Check: CheckOptions, Message: fmt.Sprintf("DiskMB %d must not be negative: 0 means the default cap on a session's disk (%d MiB), DiskOff turns the cap off", opts.DiskMB, DefaultDiskMB)}
	}
	if opts.CreateTimeout <= 0 {
		opts.CreateTimeout = DefaultCreateTimeout
	}
	cfg, ns, err := restConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, &SetupError{Check: CheckKubeconfig, Message: "cannot make a client of the kubeconfig", Err: err}
	}
	p := &provider{opts: opts, log: opts.Logger, cfg: cfg, cs: cs, ns: ns, uid: uid, gid: gid}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if err := p.checkCluster(); err != nil {
		return nil, err
	}
	if p.workspaces, err = newWorkspaces(cs, ns, wsOptions{StorageClass: opts.StorageClass, Size: opts.WorkspaceSize, CreateTimeout: opts.CreateTimeout}); err != nil {
		return nil, &SetupError{Check: CheckOptions, Message: err.Error()}
	}
	lease, err := newReaperLease(cs, ns, leaseOptions{Log: p.log.With("component", "reaper-lease")})
	if err != nil {
		return nil, err
	}
	// client-go's lines (the informer's, the election's) go to the
	// provider's logger through klog's contextual logger.
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logr.FromSlogHandler(p.log.Handler())), 30*time.Second)
	defer cancel()
	if p.ledger, err = newLedger(ctx, cs, ns, Name); err != nil {
		_ = lease.Close()
		return nil, err
	}
	p.ledger.attachLease(lease) // the ledger closes it
	p.sweeper = newSweeper(cs, ns, sweepOptions{CreateTimeout: opts.CreateTimeout})
	p.network = newNetwork(cs, ns, networkOptions{
		ProbeImage: opts.NetworkProbeImage, Trust: opts.TrustNetworkPolicy,
		PodUser: uid, PullSecrets: opts.ImagePullSecrets, Log: p.log})
	p.network.start(context.Background())
	if every, on := sweepEvery(opts.ReapInterval); on {
		sctx, stop := context.WithCancel(context.Background())
		p.stopSweep, p.sweepDone = stop, make(chan struct{})
		go p.sweepLoop(sctx, every)
	}
	return p, nil
}

// sweepEvery is the sweep's cadence, the reaper's (kit.Options.ReapInterval:
// 0 is the kit's default), and whether it runs at all: not when the
// operator turned the reaper off (negative).
func sweepEvery(reap time.Duration) (time.Duration, bool) {
	switch {
	case reap < 0:
		return 0, false
	case reap == 0:
		return kit.DefaultReapInterval, true
	}
	return reap, true
}

// checkCluster runs New's checks of the cluster, each bounded.
func (p *provider) checkCluster() error {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	host := apiserverHost(p.cfg.Host)
	if _, err := p.cs.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
		switch {
		case apierrors.IsUnauthorized(err):
			return &SetupError{Check: CheckKubeconfig, Message: fmt.Sprintf("the apiserver %s rejected the kubeconfig's credentials (401 Unauthorized): renew or fix them", host), Err: err}
		case apierrors.IsForbidden(err):
			return &SetupError{Check: CheckRBAC, Verb: "get", Resource: "/version",
				Message: fmt.Sprintf("the apiserver %s forbids the kubeconfig's user reading /version (403 Forbidden): RBAC grants it to every authenticated user by default (system:public-info-viewer)", host), Err: err}
		case ctx.Err() != nil:
			return &SetupError{Check: CheckAPIServer, Message: fmt.Sprintf("the apiserver %s did not answer within %s", host, setupTimeout), Err: err}
		}
		return &SetupError{Check: CheckAPIServer, Message: fmt.Sprintf("the apiserver %s does not answer", host), Err: err}
	}
	if _, err := p.cs.CoreV1().Namespaces().Get(ctx, p.ns, metav1.GetOptions{}); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return &SetupError{Check: CheckNamespace, Message: fmt.Sprintf("the namespace %q does not exist", p.ns), Err: err}
		case apierrors.IsForbidden(err):
			// Reading namespaces is not among the verbs the provider
			// needs: a forbidden get says nothing of the namespace.
		default:
			return &SetupError{Check: CheckNamespace, Message: fmt.Sprintf("cannot read the namespace %q", p.ns), Err: err}
		}
	}
	var forbidden []string
	var first *SetupError
	checks := make([]authv1.ResourceAttributes, 0, len(permissions)+len(clusterPermissions)+1)
	for _, a := range permissions {
		a.Namespace = p.ns
		checks = append(checks, a)
	}
	checks = append(checks, clusterPermissions...)
	if rc := p.opts.RuntimeClass; rc != "" {
		// Read below, and by nothing else: the RuntimeClass of isolation vm.
		checks = append(checks, authv1.ResourceAttributes{Verb: "get", Group: "node.k8s.io", Resource: "runtimeclasses", Name: rc})
	}
	for _, a := range checks {
		rev, err := p.cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
			&authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}, metav1.CreateOptions{})
		if err != nil {
			return &SetupError{Check: CheckRBAC, Verb: a.Verb, Resource: resourceName(a),
				Message: fmt.Sprintf("cannot ask the apiserver whether %s %s is allowed", a.Verb, resourceName(a)), Err: err}
		}
		if !rev.Status.Allowed {
			what := a.Verb + " " + resourceName(a)
			if a.Namespace == "" {
				what += " (cluster-wide)"
			}
			forbidden = append(forbidden, what)
			if first == nil {
				first = &SetupError{Check: CheckRBAC, Verb: a.Verb, Resource: resourceName(a)}
			}
		}
	}
	if first != nil {
		first.Message = fmt.Sprintf("RBAC forbids %s in namespace %q", strings.Join(forbidden, ", "), p.ns)
		return first
	}
	if rc := p.opts.RuntimeClass; rc != "" {
		if _, err := p.cs.NodeV1().RuntimeClasses().Get(ctx, rc, metav1.GetOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return &SetupError{Check: CheckRuntimeClass, Message: fmt.Sprintf("the RuntimeClass %q (isolation vm) does not exist", rc), Err: err}
			}
			return &SetupError{Check: CheckRuntimeClass, Message: fmt.Sprintf("cannot read the RuntimeClass %q", rc), Err: err}
		}
	}
	return nil
}

// Check rejects what a Pod cannot express. cpu and memory_mb become
// requests = limits; network tiers and persistence are the network
// policies' and the workspaces' to honour.
func (p *provider) Check(spec sandbox.SessionSpec) error {
	if spec.CPU < 0 || spec.CPU > 0 && spec.CPU < 0.001 {
		return &sandbox.SpecRejectedError{Field: "cpu", Reason: sandbox.ReasonUnenforceable,
			Message: fmt.Sprintf("cpu %g is below a Pod's resolution (0.001 CPU)", spec.CPU)}
	}
	if spec.MemoryMB < 0 {
		return &sandbox.SpecRejectedError{Field: "memory_mb", Reason: sandbox.ReasonUnenforceable, Message: "a negative memory limit"}
	}
	if err := p.network.check(spec); err != nil {
		return err
	}
	if spec.Durability == sandbox.Persistent {
		if err := p.workspaces.check(spec); err != nil {
			return err
		}
	}
	return nil
}
