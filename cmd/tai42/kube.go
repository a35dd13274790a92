package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/pflag"
	"github.com/tai42/sandbox/provider/kubernetes"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// kubeFlags are the kubernetes provider's settings of "tai42 serve" and
// "tai42 run" as their flags hold them.
type kubeFlags struct {
	kubeconfig    string
	namespace     string
	agentImage    string
	podUser       string
	runtimeClass  string
	pullSecrets   []string
	storageClass  string
	createTimeout time.Duration
	probeImage    string
	trustNetwork  bool
	workspaceSize string
}

// kubeSettings tie the kubernetes flags to their variables and config
// keys (the [kubernetes] table).
var kubeSettings = []setting{
	{"kubeconfig", "TAI42_KUBECONFIG", "kubernetes.kubeconfig"},
	{"namespace", "TAI42_NAMESPACE", "kubernetes.namespace"},
	{"agent-image", "TAI42_AGENT_IMAGE", "kubernetes.agent_image"},
	{"pod-user", "TAI42_POD_USER", "kubernetes.pod_user"},
	{"runtime-class", "TAI42_RUNTIME_CLASS", "kubernetes.runtime_class"},
	{"image-pull-secret", "TAI42_IMAGE_PULL_SECRET", "kubernetes.image_pull_secrets"},
	{"storage-class", "TAI42_STORAGE_CLASS", "kubernetes.storage_class"},
	{"create-timeout", "TAI42_CREATE_TIMEOUT", "kubernetes.create_timeout"},
	{"network-probe-image", "TAI42_NETWORK_PROBE_IMAGE", "kubernetes.network_probe_image"},
	{"trust-network-policy", "TAI42_TRUST_NETWORK_POLICY", "kubernetes.trust_network_policy"},
	{"workspace-size", "TAI42_WORKSPACE_SIZE", "kubernetes.workspace_size"},
}

// kubeFlagNames are the kubernetes flags' names, for embeddedOnlyFlags.
func kubeFlagNames() []string {
	names := make([]string, len(kubeSettings))
	for i, s := range kubeSettings {
		names[i] = s.flag
	}
	return names
}

// addKubeFlags registers the kubernetes provider's flags on fl.
func addKubeFlags(fl *pflag.FlagSet, f *kubeFlags) {
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "the kubernetes provider's kubeconfig `FILE` (default: the in-cluster config when tai42 runs in a Pod, else $KUBECONFIG, else ~/.kube/config)")
	fl.StringVar(&f.namespace, "namespace", "", "the kubernetes provider's `NAMESPACE`: its session Pods, PVCs, NetworkPolicies and Lease live there (default: the kubeconfig context's; in-cluster, the Pod's own; else \"default\")")
	fl.StringVar(&f.agentImage, "agent-image", "", "the kubernetes provider's agent image `REF`, which every session Pod's init container copies the agent from (required with --provider kubernetes; push this build's with `tai42 agent-image push REF`)")
	fl.StringVar(&f.podUser, "pod-user", "", "the kubernetes provider's `UID:GID` session Pods run as (runAsUser, runAsGroup, fsGroup; not root) (default: 65532:65532)")
	fl.StringVar(&f.runtimeClass, "runtime-class", "", "the kubernetes provider's RuntimeClass `NAME` for isolation vm sessions (a Kata or gVisor class); without it, isolation vm is rejected")
	fl.StringSliceVar(&f.pullSecrets, "image-pull-secret", nil, "the kubernetes provider's imagePullSecrets: a Secret `NAME` in --namespace that session Pods pull their images with; repeatable, or comma-separated")
	fl.StringVar(&f.storageClass, "storage-class", "", "the kubernetes provider's StorageClass `NAME` for persistent workspaces' PVCs (default: the cluster's default class; with none, persistent sessions are rejected)")
	fl.DurationVar(&f.createTimeout, "create-timeout", 0, "the kubernetes provider's bound on one create (a Pod that has not started by then fails the create with its events, and is deleted) (0: the provider's default, 2m)")
	fl.StringVar(&f.probeImage, "network-probe-image", "", "the kubernetes provider's probe image `REF` (with a busybox nc): at start, Pods of it prove that the cluster enforces NetworkPolicy; without it (or --trust-network-policy) every network tier is rejected")
	fl.BoolVar(&f.trustNetwork, "trust-network-policy", false, "the kubernetes provider skips the enforcement probe: the operator vouches that the cluster enforces NetworkPolicy (logged at start)")
	fl.StringVar(&f.workspaceSize, "workspace-size", "", "the kubernetes provider's storage request of each persistent workspace's PVC, a `QUANTITY` such as 10Gi (default: 1Gi)")
}

// kubeConfig is the resolved, validated kubernetes settings.
type kubeConfig struct {
	// kubeconfig is "" for the provider's default: the in-cluster config
	// in a Pod, else $KUBECONFIG, else ~/.kube/config (client-go's
	// loading rules, which take a list of files in $KUBECONFIG too).
	kubeconfig    string
	namespace     string
	agentImage    string
	podUser       string
	runtimeClass  string
	pullSecrets   []string
	storageClass  string
	createTimeout time.Duration
	probeImage    string
	trustNetwork  bool
	workspaceSize string
	// given lists the settings given (flag, variable or file) rather than
	// defaulted, as their flags' names, for the warning of another
	// provider.
	given []string
}

// validate checks the resolved flags; an error names the flag and value
// at fault.
func (f *kubeFlags) validate() (kubeConfig, error) {
	k := kubeConfig{
		kubeconfig:    f.kubeconfig,
		namespace:     f.namespace,
		agentImage:    strings.TrimSpace(f.agentImage),
		podUser:       f.podUser,
		runtimeClass:  f.runtimeClass,
		storageClass:  f.storageClass,
		createTimeout: f.createTimeout,
		probeImage:    strings.TrimSpace(f.probeImage),
		trustNetwork:  f.trustNetwork,
		workspaceSize: strings.TrimSpace(f.workspaceSize),
	}
	if k.namespace != "" {
		if errs := validation.IsDNS1123Label(k.namespace); len(errs) > 0 {
			return kubeConfig{}, fmt.Errorf("--namespace %q is not a namespace name: %s", k.namespace, strings.Join(errs, "; "))
		}
	}
	for flag, v := range map[string]string{"--agent-image": k.agentImage, "--network-probe-image": k.probeImage} {
		if v == "" {
			continue
		}
		if _, err := name.ParseReference(v); err != nil {
			return kubeConfig{}, fmt.Errorf("%s %q is not an image reference: %w", flag, v, err)
		}
	}
	if k.workspaceSize != "" {
		q, err := resource.ParseQuantity(k.workspaceSize)
		if err != nil || q.Sign() <= 0 {
			return kubeConfig{}, fmt.Errorf("--workspace-size %q is not a positive quantity (e.g. 10Gi)", k.workspaceSize)
		}
	}
	if k.podUser != "" {
		if err := validPodUser(k.podUser); err != nil {
			return kubeConfig{}, fmt.Errorf("--pod-user %q: %w", k.podUser, err)
		}
	}
	for flag, v := range map[string]string{"--runtime-class": k.runtimeClass, "--storage-class": k.storageClass} {
		if v == "" {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			return kubeConfig{}, fmt.Errorf("%s %q is not an object name: %s", flag, v, strings.Join(errs, "; "))
		}
	}
	for _, s := range f.pullSecrets {
		s = strings.TrimSpace(s)
		if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
			return kubeConfig{}, fmt.Errorf("--image-pull-secret %q is not a Secret name: %s", s, strings.Join(errs, "; "))
		}
		k.pullSecrets = append(k.pullSecrets, s)
	}
	if k.createTimeout < 0 {
		return kubeConfig{}, fmt.Errorf("--create-timeout must be >= 0 (0: the provider's default), got %v", k.createTimeout)
	}
	return k, nil
}

// validPodUser checks UID:GID: two numbers, the UID not root (the
// restricted Pod Security standard runs as non-root).
func validPodUser(s string) error {
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		return errors.New("want UID:GID, e.g. 65532:65532")
	}
	uid, err := strconv.ParseUint(u, 10, 31)
	if err != nil {
		return errors.New("the UID is not a number below 2^31 (want UID:GID, e.g. 65532:65532)")
	}
	if _, err := strconv.ParseUint(g, 10, 31); err != nil {
		return errors.New("the GID is not a number below 2^31 (want UID:GID, e.g. 65532:65532)")
	}
	if uid == 0 {
		return errors.New("UID 0 is root: session Pods run as non-root (the restricted Pod Security standard)")
	}
	return nil
}

// errNoAgentImage is the kubernetes provider without --agent-image.
var errNoAgentImage = errors.New("--provider kubernetes needs the agent image its session Pods copy the agent from: give --agent-image REF (or $TAI42_AGENT_IMAGE, or agent_image in the config file's [kubernetes]); push this build's to a registry the cluster pulls from with `tai42 agent-image push REF`")

// check refuses what the kubernetes provider cannot start without.
func (k kubeConfig) check() error {
	if k.agentImage == "" {
		return errNoAgentImage
	}
	return nil
}

// options are the kubernetes provider's options but the kit's.
func (k kubeConfig) options() kubernetes.Options {
	return kubernetes.Options{
		Kubeconfig:         k.kubeconfig,
		Namespace:          k.namespace,
		AgentImage:         k.agentImage,
		PodUser:            k.podUser,
		RuntimeClass:       k.runtimeClass,
		ImagePullSecrets:   k.pullSecrets,
		StorageClass:       k.storageClass,
		CreateTimeout:      k.createTimeout,
		NetworkProbeImage:  k.probeImage,
		TrustNetworkPolicy: k.trustNetwork,
		WorkspaceSize:      k.workspaceSize,
	}
}

// resolveKubeSettings resolves the kubernetes flags of "tai42 run" as
// serve resolves its own: the flag, else the variable, else the config
// file $TAI42_CONFIG names (the daemon's), else the default.
func resolveKubeSettings(fl *pflag.FlagSet, f *kubeFlags, lookupEnv func(string) (string, bool)) (kubeConfig, error) {
	level, err := applyClientSettings(fl, kubeSettings, lookupEnv)
	if err != nil {
		return kubeConfig{}, err
	}
	k, err := f.validate()
	k.given = givenSettings(level, kubeSettings)
	return k, err
}
