package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tai42/sandbox"
)

// runFlags are the flags of "tai42 run" as parsed.
type runFlags struct {
	image      string
	network    string
	isolation  string
	ttl        time.Duration
	timeout    time.Duration
	timeoutSet bool // --timeout was given (0 then is an error, not "default")
	env        []string
	labels     []string
	puts       []string
	workdir    string
	user       string
	persistent string
	cpu        float64
	memoryMB   int
	noStdin    bool

	embeddedFlags
}

// embeddedFlags are the flags of a command that runs a provider of its
// own when no daemon is named ("tai42 run", "tai42 mcp").
type embeddedFlags struct {
	provider string
	stateDir string

	policyEgress    string
	policyIsolation string
	policyDurable   bool

	images imageFlags // the embedded container provider's pulls
	kube   kubeFlags  // the embedded kubernetes provider's settings
}

func addEmbeddedFlags(fl *pflag.FlagSet, f *embeddedFlags, lookupEnv func(string) (string, bool)) {
	provider := defaultProvider
	if v, ok := lookupEnv(providerEnv); ok && v != "" {
		provider = v
	}
	fl.StringVar(&f.provider, "provider", provider, "sandbox provider to run on: container, host or kubernetes (embedded only; default: $"+providerEnv+", else container where runc or crun is installed and tai42 runs as root, else host)")
	fl.StringVar(&f.stateDir, "state-dir", "", "state directory (embedded only; default: $"+stateDirEnv+", else $XDG_STATE_HOME/tai42, else ~/.local/state/tai42)")
	fl.StringVar(&f.policyEgress, "policy-egress", string(defaultPolicy.Egress), "policy: the loosest network a session may have (none, internal, egress; embedded only)")
	fl.StringVar(&f.policyIsolation, "policy-isolation", string(defaultPolicy.Isolation), "policy: the weakest isolation a session may have (none, container, vm; embedded only)")
	fl.BoolVar(&f.policyDurable, "policy-durable", defaultPolicy.Durable, "policy: allow persistent sessions (--policy-durable=false forbids them; embedded only)")
	addImageFlags(fl, &f.images)
	addKubeFlags(fl, &f.kube)
}

// policy is the policy the flags name; an error is a *usageError naming
// the flag.
func (f embeddedFlags) policy() (sandbox.Policy, error) {
	pol := sandbox.Policy{
		Egress:    sandbox.Network(f.policyEgress),
		Isolation: sandbox.Isolation(f.policyIsolation),
		Durable:   f.policyDurable,
	}
	if err := pol.Validate(); err != nil {
		return sandbox.Policy{}, usagef(fmt.Errorf("--policy-%s", strings.TrimPrefix(err.Error(), "policy: ")))
	}
	return pol, nil
}

// Defaults of "tai42 run".
const (
	defaultImage   = sandbox.HostImage
	defaultNetwork = string(sandbox.NetworkNone)
	defaultTTL     = 10 * time.Minute
)

// providerEnv names the embedded provider when --provider is not given.
const providerEnv = "TAI42_PROVIDER"

// defaultProvider is the container provider where an OCI runtime is
// installed and we are root, else the host runner.
var defaultProvider = defaultProviderName()

// defaultPolicy allows all the host provider can honour; the --policy-*
// flags tighten it.
var defaultPolicy = sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}

// putSpec is one --put: a local file to copy to a workspace path.
type putSpec struct {
	local, remote string
}

// plan is a validated "tai42 run": everything but the local files' content.
type plan struct {
	spec     sandbox.SessionSpec
	policy   sandbox.Policy
	argv     []string
	cwd      string
	user     string
	timeout  time.Duration // 0: the sandbox's ExecDefaultTimeout
	puts     []putSpec
	provider string
	stateDir string
	noStdin  bool
	images   imageConfig // the embedded provider's; unused on a daemon
	kube     kubeConfig  // the embedded kubernetes provider's; unused on a daemon
	// imageFlags are the image flags the command line gave (for the host
	// runner's warning: settings from the environment or the config file,
	// meant for the container provider, are ignored quietly).
	imageFlags []string
}

// buildPlan validates the flags and the command and builds the session spec
// and policy. Every error is a *usageError, or the spec's own
// *sandbox.SpecRejectedError; none shows an env value.
func buildPlan(f runFlags, argv []string, lookupEnv func(string) (string, bool)) (plan, error) {
	if len(argv) == 0 || argv[0] == "" {
		return plan{}, usagef(errors.New("run: name a command to run after --, e.g. tai42 run -- echo hello"))
	}
	if f.timeoutSet && f.timeout <= 0 {
		return plan{}, usagef(fmt.Errorf("--timeout must be > 0, got %v", f.timeout))
	}
	puts, err := parsePuts(f.puts)
	if err != nil {
		return plan{}, usagef(err)
	}
	if err := sandbox.ValidUser(f.user); err != nil {
		return plan{}, usagef(fmt.Errorf("--%v", err))
	}
	pol, err := f.policy()
	if err != nil {
		return plan{}, err
	}
	spec, err := buildSpec(f, lookupEnv)
	if err != nil {
		return plan{}, err
	}
	timeout := time.Duration(0)
	if f.timeoutSet {
		timeout = f.timeout
	}
	return plan{
		spec:     spec,
		policy:   pol,
		argv:     argv,
		cwd:      f.workdir,
		user:     f.user,
		timeout:  timeout,
		puts:     puts,
		provider: f.provider,
		stateDir: f.stateDir,
		noStdin:  f.noStdin,
	}, nil
}

// buildSpec validates the session-shaping flags (those "tai42 run" and
// "tai42 create" share) and builds the session spec. Every error is a
// *usageError, or the spec's own *sandbox.SpecRejectedError; none shows an
// env value.
func buildSpec(f runFlags, lookupEnv func(string) (string, bool)) (sandbox.SessionSpec, error) {
	ttl, err := ttlSeconds(f.ttl)
	if err != nil {
		return sandbox.SessionSpec{}, usagef(err)
	}
	env, err := parseEnv(f.env, lookupEnv)
	if err != nil {
		return sandbox.SessionSpec{}, usagef(err)
	}
	labels, err := parseLabels(f.labels)
	if err != nil {
		return sandbox.SessionSpec{}, usagef(err)
	}
	spec := sandbox.SessionSpec{
		Image:      f.image,
		Durability: sandbox.Ephemeral,
		Env:        env,
		Network:    sandbox.Network(f.network),
		Isolation:  sandbox.Isolation(f.isolation),
		CPU:        f.cpu,
		MemoryMB:   f.memoryMB,
		TTLSeconds: ttl,
		Labels:     labels,
	}
	if f.persistent != "" {
		spec.Durability = sandbox.Persistent
		spec.WorkspaceKey = f.persistent
	}
	if err := spec.Validate(); err != nil {
		return sandbox.SessionSpec{}, err
	}
	return spec, nil
}

// ttlSeconds rounds d up to whole seconds; d must be at least 1s.
func ttlSeconds(d time.Duration) (int, error) {
	if d < time.Second {
		return 0, fmt.Errorf("--ttl must be at least 1s, got %v", d)
	}
	s := d / time.Second
	if d%time.Second != 0 {
		s++
	}
	return int(s), nil
}

// parseEnv reads --env items: K=V sets K to V; a bare K takes K's value
// from the caller's environment and is skipped when K is unset there (as
// docker run -e does). The last item for a key wins. Errors name the key,
// never a value.
func parseEnv(items []string, lookupEnv func(string) (string, bool)) (map[string]sandbox.Secret, error) {
	if len(items) == 0 {
		return nil, nil
	}
	out := make(map[string]sandbox.Secret, len(items))
	for _, it := range items {
		k, v, hasValue := strings.Cut(it, "=")
		if k == "" {
			return nil, errors.New("--env: a variable name is empty (want K=V or K)")
		}
		if err := sandbox.ValidEnvKey(k); err != nil {
			return nil, fmt.Errorf("--%w", err)
		}
		if !hasValue {
			var ok bool
			if v, ok = lookupEnv(k); !ok {
				continue
			}
		}
		out[k] = sandbox.NewSecret(v)
	}
	return out, nil
}

// parseLabels reads --label K=V items; the last item for a key wins.
func parseLabels(items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(items))
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want KEY=VALUE", it)
		}
		out[k] = v
	}
	return out, nil
}

// parsePuts reads --put LOCAL:REMOTE items. The item is split at its FIRST
// ':', so a LOCAL path cannot hold a ':' (REMOTE may); without ':REMOTE'
// the file goes to the base name of LOCAL in the workspace root.
func parsePuts(items []string) ([]putSpec, error) {
	var out []putSpec
	for _, it := range items {
		local, remote, ok := strings.Cut(it, ":")
		if local == "" {
			return nil, fmt.Errorf("--put %q: the local path is empty (want LOCAL[:REMOTE])", it)
		}
		if !ok {
			remote = filepath.Base(local)
		} else if remote == "" {
			return nil, fmt.Errorf("--put %q: the workspace path after ':' is empty (want LOCAL[:REMOTE])", it)
		}
		out = append(out, putSpec{local: local, remote: remote})
	}
	return out, nil
}
