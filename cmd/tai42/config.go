package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/internal/egressdns"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/mcpserver"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/kubernetes"
)

// configEnv names the variable that names the config file of "tai42 serve".
const configEnv = "TAI42_CONFIG"

// Defaults of "tai42 serve" beyond the kit's and the provider's.
const (
	defaultListen         = "127.0.0.1:4242"
	defaultMaxBodyBytes   = 1 << 30
	defaultShutdownGrace  = 10 * time.Second
	defaultLogLevel       = "info"
	defaultLogFormat      = "json"
	defaultMaxOutputBytes = kit.DefaultMaxOutputBytes
	defaultMCPResultBytes = mcpserver.DefaultMaxResultBytes
	defaultDiskMB         = 10240
	defaultDiskReserveMB  = 1024
)

// serveFlags are the settings of "tai42 serve" as its flags hold them;
// resolveServeConfig fills those not given as flags from the environment
// and the config file.
type serveFlags struct {
	config          string
	listen          string
	stateDir        string
	provider        string
	runtime         string
	netPrefix       string
	token           string
	tokenFile       string
	tlsCert         string
	tlsKey          string
	execTimeout     time.Duration
	reapInterval    time.Duration
	shutdownGrace   time.Duration
	maxBodyBytes    int64
	maxOutputBytes  int64
	mcpResultBytes  int
	policyEgress    string
	policyIsolation string
	policyDurable   bool
	policyScrub     bool
	logLevel        string
	logFormat       string
	egressAllow     []string
	egressDeny      []string
	egressDomains   []string
	egressDNS       []string
	diskMB          int
	diskInodes      int64
	diskReserveMB   int
	pool            []string
	poolRefills     int
	images          imageFlags
	kube            kubeFlags
}

// addServeFlags registers the flags of "tai42 serve" on fl.
func addServeFlags(fl *pflag.FlagSet, f *serveFlags) {
	fl.StringVar(&f.config, "config", "", "TOML config `FILE` (default: $"+configEnv+"; none when unset)")
	fl.StringVar(&f.listen, "listen", defaultListen, "address to serve on: `HOST:PORT` (port 0 picks a free one) or unix:/PATH")
	fl.StringVar(&f.stateDir, "state-dir", "", "state directory: workspaces, the token file (default: $"+stateDirEnv+", else $XDG_STATE_HOME/tai42, else ~/.local/state/tai42)")
	fl.StringVar(&f.provider, "provider", defaultProvider, "sandbox provider to serve: container, host or kubernetes (default: container where runc or crun is installed and tai42 runs as root, else host)")
	fl.StringVar(&f.runtime, "runtime", "runc", "the container provider's OCI runtime: runc or crun (a name in PATH or a path)")
	fl.StringVar(&f.netPrefix, "net-prefix", "", "the container provider's prefix for its bridges, veths and nftables table, at most 6 characters (default tai42); two daemons on one host need different ones")
	fl.StringVar(&f.token, "token", "", "the token clients must send (default: the token file); a flag's value is visible to every user of this machine in ps: prefer --token-file or $TAI42_TOKEN")
	fl.StringVar(&f.tokenFile, "token-file", "", "read the token from this `FILE`, owned by the user tai42 runs as, mode 0600, not a symbolic link (default: <state-dir>/token, written at first start)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "serve HTTPS with this PEM certificate `FILE` (with --tls-key)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "the PEM private key `FILE` of --tls-cert")
	fl.DurationVar(&f.execTimeout, "exec-timeout", kit.DefaultExecTimeout, "the default exec timeout clients get")
	fl.DurationVar(&f.reapInterval, "reap-interval", kit.DefaultReapInterval, "how often expired sessions are reaped")
	fl.DurationVar(&f.shutdownGrace, "shutdown-grace", defaultShutdownGrace, "on SIGTERM/SIGINT, how long requests in flight may finish")
	fl.Int64Var(&f.maxBodyBytes, "max-body-bytes", defaultMaxBodyBytes, "the largest request body (a file put) accepted, in bytes")
	fl.Int64Var(&f.maxOutputBytes, "max-output-bytes", defaultMaxOutputBytes, "the most output per stream a non-interactive exec holds in memory, in bytes")
	fl.IntVar(&f.mcpResultBytes, "mcp-max-result-bytes", defaultMCPResultBytes, "the most output one MCP tool result (at /mcp) carries, in bytes; past it the result says so and where the rest is")
	fl.StringVar(&f.policyEgress, "policy-egress", string(defaultPolicy.Egress), "policy: the loosest network a session may have (none, internal, egress)")
	fl.StringVar(&f.policyIsolation, "policy-isolation", string(defaultPolicy.Isolation), "policy: the weakest isolation a session may have (none, container, vm)")
	fl.BoolVar(&f.policyDurable, "policy-durable", defaultPolicy.Durable, "policy: allow persistent sessions")
	fl.BoolVar(&f.policyScrub, "policy-scrub-transcript", defaultPolicy.ScrubTranscript, "policy: tell consumers to scrub transcripts (carried, not enforced here)")
	fl.StringVar(&f.logLevel, "log-level", defaultLogLevel, "log level: debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", defaultLogFormat, "log format on stderr: json or text")
	fl.StringSliceVar(&f.egressAllow, "egress-allow", nil, "egress fences: a `CIDR` egress sessions may reach although the fences refuse it (a private range, say); repeatable")
	fl.StringSliceVar(&f.egressDeny, "egress-deny", nil, "egress fences: a `CIDR` egress sessions may not reach, on top of the private, link-local and host ranges always refused; repeatable")
	fl.StringSliceVar(&f.egressDomains, "egress-allow-domain", nil, "egress fences: a `NAME` (or *.NAME for the names below it) egress sessions may resolve and reach; once set, they reach nothing else; repeatable")
	fl.StringSliceVar(&f.egressDNS, "egress-dns", nil, "the upstream resolver (`IP` or IP:PORT) of the resolver egress sessions use (default: the host's, from /etc/resolv.conf); repeatable")
	fl.IntVar(&f.diskMB, "disk-mb", defaultDiskMB, "the container provider's disk cap per session, in MiB: its root's writes, /tmp and workspace together (a persistent workspace has a cap of this size of its own); 0 turns the cap off")
	fl.Int64Var(&f.diskInodes, "disk-inodes", 0, "the files a session's disk holds at most (default: one per 16 KiB of --disk-mb)")
	fl.IntVar(&f.diskReserveMB, "disk-reserve-mb", defaultDiskReserveMB, "refuse creates while the state directory's filesystem has less than this free, in MiB")
	fl.StringSliceVar(&f.pool, "pool", nil, "keep `IMAGE:NETWORK=N` sessions ready ahead of the creates (a warm pool; e.g. host:none=8): an ephemeral create of that image and network takes one; repeatable")
	fl.IntVar(&f.poolRefills, "pool-refills", kit.DefaultPoolRefills, "how many pool sessions are made at once (the refill runs at the lowest CPU priority, after the creates)")
	addImageFlags(fl, &f.images)
	addKubeFlags(fl, &f.kube)
}

// setting ties a flag of "tai42 serve" to its environment variable and
// its config file key.
type setting struct {
	flag string // the flag's name
	env  string // the environment variable, "" for none
	key  string // the config file key, dotted; "" for none
}

// serveSettings lists every setting of "tai42 serve" but --config. The token
// has no config file key: a config file is no place for a secret (use
// token_file).
var serveSettings = append([]setting{
	{"listen", "TAI42_LISTEN", "listen"},
	{"state-dir", stateDirEnv, "state_dir"},
	{"provider", providerEnv, "provider"},
	{"runtime", "TAI42_RUNTIME", "runtime"},
	{"net-prefix", "TAI42_NET_PREFIX", "net_prefix"},
	{"token", tokenEnv, ""},
	{"token-file", "TAI42_TOKEN_FILE", "token_file"},
	{"exec-timeout", "TAI42_EXEC_TIMEOUT", "exec_default_timeout"},
	{"reap-interval", "TAI42_REAP_INTERVAL", "reap_interval"},
	{"log-level", "TAI42_LOG_LEVEL", "log_level"},
	{"log-format", "TAI42_LOG_FORMAT", "log_format"},
	{"tls-cert", "TAI42_TLS_CERT", "tls.cert"},
	{"tls-key", "TAI42_TLS_KEY", "tls.key"},
	{"policy-egress", "TAI42_POLICY_EGRESS", "policy.egress"},
	{"policy-isolation", "TAI42_POLICY_ISOLATION", "policy.isolation"},
	{"policy-durable", "TAI42_POLICY_DURABLE", "policy.durable"},
	{"policy-scrub-transcript", "TAI42_POLICY_SCRUB_TRANSCRIPT", "policy.scrub_transcript"},
	{"max-body-bytes", "TAI42_MAX_BODY_BYTES", "limits.max_body_bytes"},
	{"max-output-bytes", "TAI42_MAX_OUTPUT_BYTES", "limits.max_output_bytes"},
	{"mcp-max-result-bytes", "TAI42_MCP_MAX_RESULT_BYTES", "limits.mcp_max_result_bytes"},
	{"shutdown-grace", "TAI42_SHUTDOWN_GRACE", "limits.shutdown_grace"},
	{"egress-allow", "TAI42_EGRESS_ALLOW", "egress.allow"},
	{"egress-deny", "TAI42_EGRESS_DENY", "egress.deny"},
	{"egress-allow-domain", "TAI42_EGRESS_ALLOW_DOMAIN", "egress.allow_domains"},
	{"egress-dns", "TAI42_EGRESS_DNS", "egress.dns"},
	{"disk-mb", "TAI42_DISK_MB", "disk.mb"},
	{"disk-inodes", "TAI42_DISK_INODES", "disk.inodes"},
	{"disk-reserve-mb", "TAI42_DISK_RESERVE_MB", "disk.reserve_mb"},
	{"pool", "TAI42_POOL", "pool.shapes"},
	{"pool-refills", "TAI42_POOL_REFILLS", "pool.refills"},
}, append(imageSettings, kubeSettings...)...)

// fileConfig is the layout of the config file. A nil field, or an empty
// string, is a key the file leaves unset.
type fileConfig struct {
	Listen             *string `toml:"listen"`
	StateDir           *string `toml:"state_dir"`
	Provider           *string `toml:"provider"`
	Runtime            *string `toml:"runtime"`
	NetPrefix          *string `toml:"net_prefix"`
	TokenFile          *string `toml:"token_file"`
	ExecDefaultTimeout *string `toml:"exec_default_timeout"`
	ReapInterval       *string `toml:"reap_interval"`
	LogLevel           *string `toml:"log_level"`
	LogFormat          *string `toml:"log_format"`
	TLS                struct {
		Cert *string `toml:"cert"`
		Key  *string `toml:"key"`
	} `toml:"tls"`
	Policy struct {
		Egress          *string `toml:"egress"`
		Isolation       *string `toml:"isolation"`
		Durable         *bool   `toml:"durable"`
		ScrubTranscript *bool   `toml:"scrub_transcript"`
	} `toml:"policy"`
	Limits struct {
		MaxBodyBytes      *int64  `toml:"max_body_bytes"`
		MaxOutputBytes    *int64  `toml:"max_output_bytes"`
		MCPMaxResultBytes *int64  `toml:"mcp_max_result_bytes"`
		ShutdownGrace     *string `toml:"shutdown_grace"`
	} `toml:"limits"`
	Egress struct {
		Allow        []string `toml:"allow"`
		Deny         []string `toml:"deny"`
		AllowDomains []string `toml:"allow_domains"`
		DNS          []string `toml:"dns"`
	} `toml:"egress"`
	Disk struct {
		MB        *int64 `toml:"mb"`
		Inodes    *int64 `toml:"inodes"`
		ReserveMB *int64 `toml:"reserve_mb"`
	} `toml:"disk"`
	Images struct {
		Pull      *string    `toml:"pull"`
		MaxSize   *sizeValue `toml:"max_size"`
		MaxInodes *int64     `toml:"max_inodes"`
	} `toml:"images"`
	Registry struct {
		Mirrors  []string `toml:"mirrors"`
		Insecure []string `toml:"insecure"`
		Allowed  []string `toml:"allowed"`
	} `toml:"registry"`
	Pool struct {
		Shapes  []string `toml:"shapes"`
		Refills *int64   `toml:"refills"`
	} `toml:"pool"`
	Kubernetes struct {
		Kubeconfig       *string  `toml:"kubeconfig"`
		Namespace        *string  `toml:"namespace"`
		AgentImage       *string  `toml:"agent_image"`
		PodUser          *string  `toml:"pod_user"`
		RuntimeClass     *string  `toml:"runtime_class"`
		ImagePullSecrets []string `toml:"image_pull_secrets"`
		StorageClass     *string  `toml:"storage_class"`
		CreateTimeout    *string  `toml:"create_timeout"`
		ProbeImage       *string  `toml:"network_probe_image"`
		TrustNetwork     *bool    `toml:"trust_network_policy"`
		WorkspaceSize    *string  `toml:"workspace_size"`
	} `toml:"kubernetes"`
}

// sizeValue is a size in the config file: a string ("20GiB") or a number
// of bytes, as the flag's text.
type sizeValue string

func (v *sizeValue) UnmarshalTOML(data any) error {
	switch d := data.(type) {
	case string:
		*v = sizeValue(d)
	case int64:
		*v = sizeValue(strconv.FormatInt(d, 10))
	default:
		return fmt.Errorf("want a size such as \"20GiB\" or a number of bytes, got %v", data)
	}
	return nil
}

// pathKeys are the config keys holding a path: a relative one is relative
// to the config file's directory.
var pathKeys = map[string]bool{"state_dir": true, "token_file": true, "tls.cert": true, "tls.key": true, "kubernetes.kubeconfig": true}

// loadConfigFile reads the config file at path strictly (an unknown key is
// an error naming it) and returns the values it sets, by key, as flag
// text.
func loadConfigFile(path string) (map[string]string, error) {
	var fc fileConfig
	md, err := toml.DecodeFile(path, &fc)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("config file %s: unknown key(s) %s (known: listen, state_dir, provider, runtime, net_prefix, token_file, exec_default_timeout, reap_interval, log_level, log_format, [tls] cert and key, [policy] egress, isolation, durable and scrub_transcript, [limits] max_body_bytes, max_output_bytes, mcp_max_result_bytes and shutdown_grace, [egress] allow, deny, allow_domains and dns, [disk] mb, inodes and reserve_mb, [pool] shapes and refills, [images] pull, max_size and max_inodes, [registry] mirrors and insecure, [kubernetes] kubeconfig, namespace, agent_image, pod_user, runtime_class, image_pull_secrets, storage_class, create_timeout, network_probe_image, trust_network_policy and workspace_size)",
			path, strings.Join(keys, ", "))
	}
	out := map[string]string{}
	str := func(key string, v *string) {
		if v != nil && *v != "" {
			out[key] = *v
		}
	}
	str("listen", fc.Listen)
	str("state_dir", fc.StateDir)
	str("provider", fc.Provider)
	str("runtime", fc.Runtime)
	str("net_prefix", fc.NetPrefix)
	str("token_file", fc.TokenFile)
	str("exec_default_timeout", fc.ExecDefaultTimeout)
	str("reap_interval", fc.ReapInterval)
	str("log_level", fc.LogLevel)
	str("log_format", fc.LogFormat)
	str("tls.cert", fc.TLS.Cert)
	str("tls.key", fc.TLS.Key)
	str("policy.egress", fc.Policy.Egress)
	str("policy.isolation", fc.Policy.Isolation)
	str("limits.shutdown_grace", fc.Limits.ShutdownGrace)
	str("images.pull", fc.Images.Pull)
	str("kubernetes.kubeconfig", fc.Kubernetes.Kubeconfig)
	str("kubernetes.namespace", fc.Kubernetes.Namespace)
	str("kubernetes.agent_image", fc.Kubernetes.AgentImage)
	str("kubernetes.pod_user", fc.Kubernetes.PodUser)
	str("kubernetes.runtime_class", fc.Kubernetes.RuntimeClass)
	str("kubernetes.storage_class", fc.Kubernetes.StorageClass)
	str("kubernetes.create_timeout", fc.Kubernetes.CreateTimeout)
	str("kubernetes.network_probe_image", fc.Kubernetes.ProbeImage)
	str("kubernetes.workspace_size", fc.Kubernetes.WorkspaceSize)
	if fc.Images.MaxSize != nil {
		str("images.max_size", (*string)(fc.Images.MaxSize))
	}
	for key, v := range map[string]*bool{"policy.durable": fc.Policy.Durable, "policy.scrub_transcript": fc.Policy.ScrubTranscript,
		"kubernetes.trust_network_policy": fc.Kubernetes.TrustNetwork} {
		if v != nil {
			out[key] = strconv.FormatBool(*v)
		}
	}
	for key, v := range map[string][]string{"egress.allow": fc.Egress.Allow, "egress.deny": fc.Egress.Deny, "egress.allow_domains": fc.Egress.AllowDomains, "egress.dns": fc.Egress.DNS,
		"registry.mirrors": fc.Registry.Mirrors, "registry.insecure": fc.Registry.Insecure, "registry.allowed": fc.Registry.Allowed, "kubernetes.image_pull_secrets": fc.Kubernetes.ImagePullSecrets,
		"pool.shapes": fc.Pool.Shapes} {
		if len(v) > 0 {
			for _, e := range v {
				if strings.Contains(e, ",") {
					return nil, fmt.Errorf("config file %s: %s: %q holds a comma, which no CIDR, address, domain name, registry, Secret name or pool shape does", path, key, e)
				}
			}
			out[key] = strings.Join(v, ",")
		}
	}
	for key, v := range map[string]*int64{
		"limits.max_body_bytes":       fc.Limits.MaxBodyBytes,
		"limits.max_output_bytes":     fc.Limits.MaxOutputBytes,
		"limits.mcp_max_result_bytes": fc.Limits.MCPMaxResultBytes,
		"disk.mb":                     fc.Disk.MB,
		"disk.inodes":                 fc.Disk.Inodes,
		"images.max_inodes":           fc.Images.MaxInodes,
		"disk.reserve_mb":             fc.Disk.ReserveMB,
		"pool.refills":                fc.Pool.Refills,
	} {
		if v != nil {
			out[key] = strconv.FormatInt(*v, 10)
		}
	}
	dir := filepath.Dir(path)
	for key := range pathKeys {
		if v, ok := out[key]; ok && !filepath.IsAbs(v) {
			out[key] = filepath.Join(dir, v)
		}
	}
	return out, nil
}

// serveConfig is the resolved, validated configuration of "tai42 serve".
type serveConfig struct {
	configFile     string // "" when none
	listen         string
	stateDir       string
	provider       string
	runtime        string // the container provider's OCI runtime
	netPrefix      string // the container provider's network name prefix; "" for its default
	token          string // from --token or $TAI42_TOKEN; "" for a token file
	tokenFile      string
	tlsCert        string
	tlsKey         string
	execTimeout    time.Duration
	reapInterval   time.Duration
	shutdownGrace  time.Duration
	maxBodyBytes   int64
	maxOutputBytes int64
	mcpResultBytes int
	policy         sandbox.Policy
	logLevel       slog.Level
	logFormat      string
	egress         egressConfig
	disk           diskConfig
	pool           []kit.PoolShape
	poolRefills    int
	images         imageConfig
	kube           kubeConfig
	// reload resolves the configuration again as at start (the same
	// command line, the environment, the config file as it is now), for a
	// SIGHUP; nil where nothing reloads.
	reload func() (serveConfig, error)
}

// egressConfig is the operator's egress fences: exceptions, denials, the
// domain allowlist and the sessions' resolver's upstreams.
type egressConfig struct {
	allow, deny []netip.Prefix
	domains     []string
	dns         []netip.AddrPort
}

// given reports whether the operator asked for any fence of their own.
func (e egressConfig) given() bool {
	return len(e.allow)+len(e.deny)+len(e.domains)+len(e.dns) > 0
}

// diskConfig is the container provider's disk cap per session. Its zero
// value, which "tai42 run" uses, is the provider's defaults.
type diskConfig struct {
	mb        int   // 0: no cap (serve), the default cap (the zero value)
	inodes    int64 // 0: the provider's default for mb
	reserveMB int   // 0: no reserve (serve)
	explicit  bool  // the cap was given (flag, variable or file), not defaulted
	resolved  bool  // a resolved setting of serve's, not the zero value
}

// off reports whether the operator turned the cap off (--disk-mb 0).
func (d diskConfig) off() bool { return d.resolved && d.mb == 0 }

// reserve is the provider's DiskReserveMB: --disk-reserve-mb 0 is none.
func (d diskConfig) reserve() int {
	if d.resolved && d.reserveMB == 0 {
		return -1
	}
	return d.reserveMB
}

// pool is the provider's DiskPool: a daemon keeps the provider's default
// number of disks made ahead; a one-shot run, which makes one session,
// none (it would make them only to remove them).
func (d diskConfig) pool(daemon bool) int {
	if daemon {
		return 0
	}
	return -1
}

// resolveServeConfig resolves every setting of "tai42 serve": a flag given
// on the command line wins, then its environment variable (an empty value
// is unset), then the config file (--config, else $TAI42_CONFIG), then the
// flag's default. The state directory falls back to resolveStateDir's
// defaults last. The token and the token file are one setting: the one
// from the higher source wins (both from one source is an error). Errors
// name the flag, variable or key at fault, and never show the token.
func resolveServeConfig(fl *pflag.FlagSet, f *serveFlags, lookupEnv func(string) (string, bool)) (serveConfig, error) {
	if !fl.Changed("config") {
		f.config, _ = lookupEnv(configEnv)
	}
	var file map[string]string
	if f.config != "" {
		var err error
		if file, err = loadConfigFile(f.config); err != nil {
			return serveConfig{}, err
		}
	}
	level, err := applySettings(fl, serveSettings, lookupEnv, f.config, file)
	if err != nil {
		return serveConfig{}, err
	}
	explicitDisk := level["disk-mb"] > fromDefault || level["disk-inodes"] > fromDefault
	if f.token != "" && f.tokenFile != "" {
		switch t, tf := level["token"], level["token-file"]; {
		case t > tf:
			f.tokenFile = ""
		case t < tf:
			f.token = ""
		default:
			return serveConfig{}, errors.New("both a token and a token file are given (--token and --token-file, or $TAI42_TOKEN and $TAI42_TOKEN_FILE): give one")
		}
	}
	cfg, err := f.validate(lookupEnv)
	cfg.disk.explicit = explicitDisk
	cfg.images.given = givenSettings(level, imageSettings)
	cfg.kube.given = givenSettings(level, kubeSettings)
	return cfg, err
}

// Where a setting's value came from, lowest first.
const (
	fromDefault = iota
	fromFile
	fromEnv
	fromFlag
)

// applySettings sets each flag of settings that the command line did not
// give from its environment variable (an empty value is unset), else from
// file, the values of the config file at configPath by key. It returns
// where each came from, by flag name (a default is not in it).
func applySettings(fl *pflag.FlagSet, settings []setting, lookupEnv func(string) (string, bool), configPath string, file map[string]string) (map[string]int, error) {
	level := map[string]int{}
	for _, s := range settings {
		if fl.Changed(s.flag) {
			level[s.flag] = fromFlag
			continue
		}
		if v, ok := envValue(lookupEnv, s.env); ok {
			if err := fl.Set(s.flag, v); err != nil {
				return nil, fmt.Errorf("$%s: %w", s.env, err)
			}
			level[s.flag] = fromEnv
			continue
		}
		if v, ok := file[s.key]; ok {
			if err := fl.Set(s.flag, v); err != nil {
				return nil, fmt.Errorf("config file %s: %s: %w", configPath, s.key, err)
			}
			level[s.flag] = fromFile
		}
	}
	return level, nil
}

// givenSettings lists the flags of settings that level says were given.
func givenSettings(level map[string]int, settings []setting) []string {
	var given []string
	for _, s := range settings {
		if level[s.flag] > fromDefault {
			given = append(given, "--"+s.flag)
		}
	}
	return given
}

// resolveImageSettings resolves the image flags of "tai42 run" and "tai42
// image pull" (those of imageSettings fl has) as serve resolves its own:
// the flag, else the variable, else the config file $TAI42_CONFIG names
// (the daemon's), else the default.
func resolveImageSettings(fl *pflag.FlagSet, f *imageFlags, lookupEnv func(string) (string, bool)) (imageConfig, error) {
	level, err := applyClientSettings(fl, imageSettings, lookupEnv)
	if err != nil {
		return imageConfig{}, err
	}
	// The commands without these flags (image pull, agent-image push)
	// take their defaults, which validate would refuse as zero.
	if fl.Lookup("pull") == nil {
		f.pull = string(container.PullMissing)
	}
	if fl.Lookup("max-image-inodes") == nil {
		f.maxInodes = imagestore.DefaultMaxImageInodes
	}
	cfg, err := f.validate()
	cfg.given = givenSettings(level, imageSettings)
	return cfg, err
}

// applyClientSettings applies those of settings that fl has as
// applySettings does, the config file being the one $TAI42_CONFIG names
// (the daemon's): the settings of a command other than serve.
func applyClientSettings(fl *pflag.FlagSet, settings []setting, lookupEnv func(string) (string, bool)) (map[string]int, error) {
	var have []setting
	for _, s := range settings {
		if fl.Lookup(s.flag) != nil {
			have = append(have, s)
		}
	}
	path, _ := envValue(lookupEnv, configEnv)
	var file map[string]string
	if path != "" {
		var err error
		if file, err = loadConfigFile(path); err != nil {
			return nil, fmt.Errorf("%w (from $%s)", err, configEnv)
		}
	}
	return applySettings(fl, have, lookupEnv, path, file)
}

// envValue looks name up; an empty value, or no name, is unset.
func envValue(lookupEnv func(string) (string, bool), name string) (string, bool) {
	if name == "" {
		return "", false
	}
	v, ok := lookupEnv(name)
	return v, ok && v != ""
}

// validate checks the resolved flags and builds the configuration.
func (f *serveFlags) validate(lookupEnv func(string) (string, bool)) (serveConfig, error) {
	cfg := serveConfig{
		configFile:     f.config,
		listen:         f.listen,
		provider:       f.provider,
		runtime:        f.runtime,
		netPrefix:      f.netPrefix,
		token:          f.token,
		tokenFile:      f.tokenFile,
		tlsCert:        f.tlsCert,
		tlsKey:         f.tlsKey,
		execTimeout:    f.execTimeout,
		reapInterval:   f.reapInterval,
		shutdownGrace:  f.shutdownGrace,
		maxBodyBytes:   f.maxBodyBytes,
		maxOutputBytes: f.maxOutputBytes,
		mcpResultBytes: f.mcpResultBytes,
		policy: sandbox.Policy{
			Egress:          sandbox.Network(f.policyEgress),
			Isolation:       sandbox.Isolation(f.policyIsolation),
			Durable:         f.policyDurable,
			ScrubTranscript: f.policyScrub,
		},
		logFormat: f.logFormat,
	}
	var err error
	if cfg.stateDir, err = resolveStateDir(f.stateDir, lookupEnv); err != nil {
		return serveConfig{}, err
	}
	switch {
	case f.listen == "" || f.listen == "unix:":
		return serveConfig{}, fmt.Errorf("listen: %q is no address (want HOST:PORT or unix:/PATH, e.g. 127.0.0.1:%d)", f.listen, api.DefaultPort)
	case f.provider == "":
		return serveConfig{}, errors.New("provider: empty (want a provider name, e.g. " + defaultProvider + ")")
	case f.execTimeout <= 0:
		return serveConfig{}, fmt.Errorf("exec timeout must be > 0, got %v", f.execTimeout)
	case f.reapInterval <= 0:
		return serveConfig{}, fmt.Errorf("reap interval must be > 0, got %v", f.reapInterval)
	case f.shutdownGrace <= 0:
		return serveConfig{}, fmt.Errorf("shutdown grace must be > 0, got %v", f.shutdownGrace)
	case f.maxBodyBytes <= 0:
		return serveConfig{}, fmt.Errorf("max body bytes must be > 0, got %d", f.maxBodyBytes)
	case f.maxOutputBytes <= 0:
		return serveConfig{}, fmt.Errorf("max output bytes must be > 0, got %d", f.maxOutputBytes)
	case f.mcpResultBytes <= 0:
		return serveConfig{}, fmt.Errorf("MCP max result bytes must be > 0, got %d", f.mcpResultBytes)
	case (f.tlsCert == "") != (f.tlsKey == ""):
		return serveConfig{}, errors.New("TLS needs both a certificate and a key (--tls-cert and --tls-key), or neither")
	case f.logFormat != "json" && f.logFormat != "text":
		return serveConfig{}, fmt.Errorf("log format %q is not one of json, text", f.logFormat)
	}
	if err := cfg.logLevel.UnmarshalText([]byte(f.logLevel)); err != nil || !validLevel(f.logLevel) {
		return serveConfig{}, fmt.Errorf("log level %q is not one of debug, info, warn, error", f.logLevel)
	}
	if err := cfg.policy.Validate(); err != nil {
		return serveConfig{}, err
	}
	if cfg.egress, err = f.egressConfig(); err != nil {
		return serveConfig{}, err
	}
	switch {
	case f.diskMB < 0:
		return serveConfig{}, fmt.Errorf("disk cap --disk-mb must be >= 0 (0 turns it off), got %d", f.diskMB)
	case f.diskInodes < 0:
		return serveConfig{}, fmt.Errorf("--disk-inodes must be >= 0 (0: one per 16 KiB of the cap), got %d", f.diskInodes)
	case f.diskInodes > 0 && f.diskMB == 0:
		return serveConfig{}, errors.New("--disk-inodes caps a session's disk, which --disk-mb 0 turns off: give a --disk-mb")
	case f.diskReserveMB < 0:
		return serveConfig{}, fmt.Errorf("--disk-reserve-mb must be >= 0, got %d", f.diskReserveMB)
	}
	cfg.disk = diskConfig{mb: f.diskMB, inodes: f.diskInodes, reserveMB: f.diskReserveMB, resolved: true}
	for _, v := range f.pool {
		shape, err := kit.ParsePoolShape(v)
		if err != nil {
			return serveConfig{}, fmt.Errorf("--pool: %w", err)
		}
		cfg.pool = append(cfg.pool, shape)
	}
	if f.poolRefills < 1 {
		return serveConfig{}, fmt.Errorf("--pool-refills must be at least 1, got %d", f.poolRefills)
	}
	cfg.poolRefills = f.poolRefills
	if cfg.images, err = f.images.validate(); err != nil {
		return serveConfig{}, err
	}
	if cfg.kube, err = f.kube.validate(); err != nil {
		return serveConfig{}, err
	}
	if cfg.provider == kubernetes.Name {
		if err := cfg.kube.check(); err != nil {
			return serveConfig{}, err
		}
	}
	if cfg.token != "" {
		if err := validToken(cfg.token); err != nil {
			return serveConfig{}, fmt.Errorf("the token from --token or $%s: %w", tokenEnv, err)
		}
	}
	return cfg, nil
}

// egressConfig parses the egress fence settings; an error names the bad
// value and its setting.
func (f *serveFlags) egressConfig() (egressConfig, error) {
	var e egressConfig
	var err error
	if e.allow, err = parsePrefixes("--egress-allow", f.egressAllow); err != nil {
		return e, err
	}
	if e.deny, err = parsePrefixes("--egress-deny", f.egressDeny); err != nil {
		return e, err
	}
	for _, d := range f.egressDomains {
		if err := egressdns.ValidPattern(d); err != nil {
			return e, fmt.Errorf("--egress-allow-domain %q: %w", d, err)
		}
		e.domains = append(e.domains, d)
	}
	for _, s := range f.egressDNS {
		ap, err := parseResolver(s)
		if err != nil {
			return e, fmt.Errorf("--egress-dns %q: %w", s, err)
		}
		e.dns = append(e.dns, ap)
	}
	return e, nil
}

// parsePrefixes parses CIDRs (a bare address is its own /32 or /128).
// Host bits set are refused, since "10.1.2.3/8" more likely means a typo
// than 10.0.0.0/8.
func parsePrefixes(setting string, vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		v = strings.TrimSpace(v)
		var p netip.Prefix
		if a, err := netip.ParseAddr(v); err == nil {
			p = netip.PrefixFrom(a, a.BitLen())
		} else if p, err = netip.ParsePrefix(v); err != nil {
			return nil, fmt.Errorf("%s %q: not a CIDR (want e.g. 10.1.0.0/16 or 2001:db8::/32)", setting, v)
		}
		switch {
		case p.Addr().Zone() != "":
			return nil, fmt.Errorf("%s %q: a zone has no place in a CIDR", setting, v)
		case p.Addr().Is4In6():
			return nil, fmt.Errorf("%s %q: an IPv4-mapped IPv6 prefix; write the IPv4 CIDR", setting, v)
		case p != p.Masked():
			return nil, fmt.Errorf("%s %q: host bits are set (did you mean %s?)", setting, v, p.Masked())
		}
		out = append(out, p)
	}
	return out, nil
}

// parseResolver parses IP or IP:PORT (an IPv6 address with a port in
// brackets); the port defaults to 53.
func parseResolver(s string) (netip.AddrPort, error) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.AddrPort{}, errors.New("a zone is not supported")
		}
		return netip.AddrPortFrom(a.Unmap(), 53), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, errors.New("not an address (want IP or IP:PORT, e.g. 10.0.0.2 or [2001:db8::53]:53)")
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// validLevel reports whether s is one of the four level names (slog also
// takes offsets such as "info+2", which the flag does not).
func validLevel(s string) bool {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}
