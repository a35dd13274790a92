package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/flock"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/mcpserver"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/provider/kubernetes"
	"github.com/tai42/sandbox/server"
)

// serveCmd is "tai42 serve [flags]".
func (c *cli) serveCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Run the daemon: sandbox sessions over an HTTP API",
		Long: `Serve runs the daemon: the embedded provider (--provider: container
where an OCI runtime is installed and tai42 runs as root, else host) behind the HTTP API that "tai42 create", "exec", "cp", "shell", "ls", "touch",
"rm", "reap" and "run" (with $TAI42_URL set) use, as do programs in any
language (the API's OpenAPI document is at /openapi.json).

On start it prints "tai42: listening on ADDR (provider P)" on stderr, ADDR
being the real address (with --listen 127.0.0.1:0, the port picked), usable
as $TAI42_URL. Every API call needs the token: --token, else $TAI42_TOKEN,
else the file --token-file names, else <state-dir>/token, which the first
start writes (32 random bytes, hex, mode 0600) and says so on stderr. A
token file that group or others may read is refused. Clients on this
machine find <state-dir>/token themselves; others set $TAI42_TOKEN.

Each setting is a flag, an environment variable and a key of the TOML
config file (--config or $TAI42_CONFIG); a flag wins over the variable,
which wins over the file, which wins over the default. Relative paths in
the file are relative to its directory. Unknown keys are an error.

  flag                       variable                       config key
  --listen                   TAI42_LISTEN                   listen
  --state-dir                TAI42_STATE_DIR                state_dir
  --provider                 TAI42_PROVIDER                 provider
  --runtime                  TAI42_RUNTIME                  runtime
  --net-prefix               TAI42_NET_PREFIX               net_prefix
  --token                    TAI42_TOKEN                    (none: use token_file)
  --token-file               TAI42_TOKEN_FILE               token_file
  --exec-timeout             TAI42_EXEC_TIMEOUT             exec_default_timeout
  --reap-interval            TAI42_REAP_INTERVAL            reap_interval
  --log-level, --log-format  TAI42_LOG_LEVEL, _FORMAT       log_level, log_format
  --tls-cert, --tls-key      TAI42_TLS_CERT, _KEY           [tls] cert, key
  --policy-egress            TAI42_POLICY_EGRESS            [policy] egress
  --policy-isolation         TAI42_POLICY_ISOLATION         [policy] isolation
  --policy-durable           TAI42_POLICY_DURABLE           [policy] durable
  --policy-scrub-transcript  TAI42_POLICY_SCRUB_TRANSCRIPT  [policy] scrub_transcript
  --max-body-bytes           TAI42_MAX_BODY_BYTES           [limits] max_body_bytes
  --max-output-bytes         TAI42_MAX_OUTPUT_BYTES         [limits] max_output_bytes
  --mcp-max-result-bytes     TAI42_MCP_MAX_RESULT_BYTES     [limits] mcp_max_result_bytes
  --shutdown-grace           TAI42_SHUTDOWN_GRACE           [limits] shutdown_grace
  --pull                     TAI42_PULL                     [images] pull
  --max-image-size           TAI42_MAX_IMAGE_SIZE           [images] max_size
  --max-image-inodes         TAI42_MAX_IMAGE_INODES         [images] max_inodes
  --registry-mirror          TAI42_REGISTRY_MIRROR          [registry] mirrors
  --insecure-registry        TAI42_INSECURE_REGISTRY        [registry] insecure
  --kubeconfig               TAI42_KUBECONFIG               [kubernetes] kubeconfig
  --namespace                TAI42_NAMESPACE                [kubernetes] namespace
  --agent-image              TAI42_AGENT_IMAGE              [kubernetes] agent_image
  --pod-user                 TAI42_POD_USER                 [kubernetes] pod_user
  --runtime-class            TAI42_RUNTIME_CLASS            [kubernetes] runtime_class
  --image-pull-secret        TAI42_IMAGE_PULL_SECRET        [kubernetes] image_pull_secrets
  --storage-class            TAI42_STORAGE_CLASS            [kubernetes] storage_class
  --create-timeout           TAI42_CREATE_TIMEOUT           [kubernetes] create_timeout
  --network-probe-image      TAI42_NETWORK_PROBE_IMAGE      [kubernetes] network_probe_image
  --trust-network-policy     TAI42_TRUST_NETWORK_POLICY     [kubernetes] trust_network_policy
  --workspace-size           TAI42_WORKSPACE_SIZE           [kubernetes] workspace_size

Images: a create whose image the container provider's store lacks pulls
it first (--pull missing, the default; always pulls on every create, never
rejects it), concurrent creates of one image sharing one pull; a failed
pull rejects the spec, naming the reference and the registry's answer.
Registries are reached over verified HTTPS with the docker config's
credentials ($DOCKER_CONFIG, ~/.docker/config.json); --insecure-registry
allows plain HTTP or unverified TLS for one registry, --registry-mirror is
tried first for Docker Hub's images. The host provider pulls nothing: the
image settings then have no effect (a warning says so). List values
(mirrors, insecure registries, the egress lists) are comma-separated in a
variable.

Kubernetes: --provider kubernetes serves sessions as Pods of a cluster
(--kubeconfig, else $KUBECONFIG, else the in-cluster config of the Pod
tai42 runs in; --namespace). It needs --agent-image, the image every
session Pod's init container copies the agent from: "tai42 agent-image
push REF" pushes this build's. Its ledger is the apiserver, not the state
directory: several daemons may serve one namespace, each serving every
session in it, one of them reaping (a Lease); a daemon killed loses none.
The cluster pulls the sessions' images (--image-pull-secret): the image
settings above have no effect on it.

MCP: the daemon serves its sessions to agents as Model Context Protocol
tools at /mcp (the Streamable HTTP transport), behind the same token; a
connection's sessions end with it. "tai42 mcp" is the same server over
stdio.

Durations are Go durations ("90s", "5m"). An example config file with every
key is cmd/tai42/example/tai42.toml in the source tree.

SIGTERM or SIGINT stops it gracefully: requests in flight get
--shutdown-grace to finish, then every session is destroyed (ephemeral
workspaces are removed, persistent ones kept) and it exits 0. A daemon
that is killed (SIGKILL, a crash) keeps its sessions in a ledger in the
state directory (<state-dir>/<provider>/ledger.db): started again, it
brings back the live ones (execs that were running are gone), reaps the
expired ones and removes whatever a crash left that no session owns. Logs (JSON or
text, on stderr) never show the token or an environment value.

Exit codes: 0 after a signal; 2 for a bad flag, variable or config file or
an unknown provider; 1 for another failure (the address in use, the state
directory used by another daemon, an unreadable token file).`,
		Example: `  # Serve on 127.0.0.1:4242 and use it from this machine
  tai42 serve &
  export TAI42_URL=127.0.0.1:4242
  id=$(tai42 create) && tai42 exec "$id" -- uname -a

  # A unix socket, and a config file
  tai42 serve --listen unix:/run/tai42.sock --config /etc/tai42/tai42.toml

  # HTTPS on every interface, no persistent workspaces, outbound network denied
  TAI42_TOKEN=$(cat /etc/tai42/token) tai42 serve --listen :4242 \
    --tls-cert cert.pem --tls-key key.pem --policy-durable=false --policy-egress none`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			given := givenFlags(cmd.Flags())
			cfg, err := resolveServeConfig(cmd.Flags(), &f, c.lookupEnv)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			cfg.reload = func() (serveConfig, error) { return c.resolveAgain(given) }
			return c.serve(cfg)
		},
	}
	addServeFlags(cmd.Flags(), &f)
	return cmd
}

// serve runs the daemon until a signal, then shuts it down gracefully and
// closes the sandbox (under a bounded context). It returns nil (exit 0)
// after a signal.
func (c *cli) serve(cfg serveConfig) error {
	fail := func(err error) error { return &exitError{code: errorExitCode(err), err: err} }
	log := newLogger(c.stderr, cfg)

	tlsConf, err := loadTLS(cfg)
	if err != nil {
		return fail(err)
	}
	lock, err := lockStateDir(cfg.stateDir)
	if err != nil {
		return fail(err)
	}
	defer lock.Close()
	token, from, generated, err := serveToken(cfg)
	if err != nil {
		return fail(err)
	}
	if generated {
		fmt.Fprintf(c.stderr, "tai42: token written to %s\n", from)
	} else {
		fmt.Fprintf(c.stderr, "tai42: token read from %s\n", from)
	}

	if err := checkEnforceable(cfg); err != nil {
		return fail(usagef(err))
	}

	var onHUP func()
	var srv *server.Server
	var sb sandbox.Sandbox
	var ready atomic.Bool // srv and sb are set
	if cfg.reload != nil {
		onHUP = func() {
			if ready.Load() {
				reloadFences(log, cfg, sb, srv)
			}
		}
	}
	ctx, in, stop := c.interruptibleWith(onHUP)
	defer stop()

	var closeSB func(context.Context) error
	sb, closeSB, err = openProvider(cfg.provider, providerConfig{
		stateDir:       cfg.stateDir,
		policy:         cfg.policy,
		reapInterval:   cfg.reapInterval,
		execTimeout:    cfg.execTimeout,
		maxOutputBytes: cfg.maxOutputBytes,
		runtime:        cfg.runtime,
		netPrefix:      cfg.netPrefix,
		egress:         cfg.egress,
		disk:           cfg.disk,
		pool:           cfg.pool,
		poolRefills:    cfg.poolRefills,
		images:         cfg.images,
		kube:           cfg.kube,
		logger:         log,
		durable:        true,
	})
	if err != nil {
		return fail(err)
	}
	// Close destroys every session: ephemeral workspaces go, persistent
	// ones stay.
	defer func() {
		cctx, done := cleanupContext(ctx)
		defer done()
		if err := closeSB(cctx); err != nil {
			log.Error("closing the sandbox", "err", err)
			c.warn(err)
		} else {
			log.Info("sandbox closed: sessions destroyed, persistent workspaces kept")
		}
	}()

	if err := checkFloor(sb, cfg.policy); err != nil {
		return fail(usagef(err))
	}
	if cfg.provider == host.Name {
		// Said plainly, once at every start: the operator did not ask for
		// fences here, and plain egress use is not refused.
		log.Warn("the host runner does not fence egress: isolation none shares the host's network, so a session with network egress reaches what the host reaches, private networks and a cloud's metadata service included; serve --provider container for fenced egress")
		log.Warn("the host runner does not cap a session's disk: a session may fill the state directory's filesystem; serve --provider container for a cap")
		if len(cfg.images.given) > 0 {
			log.Warn("the host runner pulls no images (its one image is \"host\"): the image settings have no effect", "settings", strings.Join(cfg.images.given, ", "))
		}
	}
	if cfg.provider == kubernetes.Name && len(cfg.images.given) > 0 {
		log.Warn("the kubernetes provider's images are pulled by the cluster (its nodes' registry settings, and --image-pull-secret): the image settings have no effect", "settings", strings.Join(cfg.images.given, ", "))
	}
	if cfg.provider != kubernetes.Name && len(cfg.kube.given) > 0 {
		log.Warn("the kubernetes settings have no effect on provider "+cfg.provider, "settings", strings.Join(cfg.kube.given, ", "))
	}
	if len(token) < minTokenLen {
		log.Warn("the token is short: anyone who can reach the daemon may guess it; use 32 random bytes (the generated token) or more", "length", len(token))
	}

	fences, disk := enforced(sb)
	logFences(log, fences, disk)
	reg := prometheus.NewRegistry()
	if err := registerEgressMetrics(reg, sb); err != nil {
		return fail(err)
	}
	mcpSrv := mcpserver.New(sb, mcpserver.Options{Version: buildVersion(), MaxResultBytes: cfg.mcpResultBytes, Isolation: sandboxIsolation(sb),
		MaxMessageBytes: int(min(cfg.maxBodyBytes, mcpserver.DefaultMaxMessageBytes)), Logger: log})
	// Before the sandbox closes: the MCP connections' sessions are
	// destroyed with them.
	defer func() {
		cctx, done := cleanupContext(ctx)
		defer done()
		if err := mcpSrv.Close(cctx); err != nil {
			log.Error("closing the MCP connections", "err", err)
		}
	}()
	srv, err = server.New(sb, server.Options{
		Token:         token,
		Policy:        cfg.policy,
		EgressFences:  fences,
		Disk:          disk,
		Registry:      reg,
		Provider:      cfg.provider,
		Version:       buildVersion(),
		MaxBodyBytes:  cfg.maxBodyBytes,
		Logger:        log,
		ShutdownGrace: cfg.shutdownGrace,
		MCP:           mcpSrv.HTTPHandler(),
	})
	if err != nil {
		return fail(err)
	}
	ln, err := server.Listen(cfg.listen)
	if err != nil {
		var bad *net.AddrError // a malformed address, not one in use
		if errors.As(err, &bad) {
			return fail(usagef(fmt.Errorf("--listen %q: %w", cfg.listen, err)))
		}
		return fail(err)
	}
	addr := listenAddr(ln)
	if tlsConf != nil && !strings.HasPrefix(addr, "unix:") {
		addr = "https://" + addr // usable as $TAI42_URL as printed
	}
	ready.Store(true)
	fmt.Fprintf(c.stderr, "tai42: listening on %s (provider %s)\n", addr, cfg.provider)
	log.Info("serving", "addr", addr, "provider", cfg.provider, "tls", tlsConf != nil,
		"state_dir", cfg.stateDir, "config", cfg.configFile, "version", buildVersion(),
		"policy_egress", cfg.policy.Egress, "policy_isolation", cfg.policy.Isolation,
		"policy_durable", cfg.policy.Durable, "policy_scrub_transcript", cfg.policy.ScrubTranscript)

	err = srv.Serve(ctx, ln, tlsConf)
	if sig, ok := in.signal(); ok {
		log.Info("stopped on a signal", "signal", sig.String())
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("graceful shutdown incomplete", "err", err)
		}
		return nil
	}
	if err == nil {
		err = errors.New("the server stopped on its own")
	}
	return &exitError{code: exitFailure, err: fmt.Errorf("serving: %w", err)}
}

// listenAddr prints ln's address as --listen takes it: HOST:PORT, or
// unix:PATH for a unix socket.
func listenAddr(ln net.Listener) string {
	a := ln.Addr()
	if a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return a.String()
}

// checkEnforceable refuses settings the chosen provider cannot enforce,
// rather than serve without them: fences or a disk cap the operator asked
// for on the host runner.
func checkEnforceable(cfg serveConfig) error {
	switch cfg.provider {
	case host.Name:
		if cfg.egress.given() {
			return errors.New("the host runner cannot fence egress (isolation none shares the host's network): --egress-allow, --egress-deny, --egress-allow-domain and --egress-dns need --provider container")
		}
		if cfg.disk.explicit && cfg.disk.mb > 0 {
			return errors.New("the host runner cannot cap a session's disk: --disk-mb needs --provider container (--disk-mb 0 says no cap)")
		}
	case kubernetes.Name:
		// Its egress tier is a NetworkPolicy (the internet without private
		// ranges and metadata): the operator's own fences are not in it.
		if cfg.egress.given() {
			return errors.New("the kubernetes provider's egress is a NetworkPolicy of its own (the internet without private ranges and the metadata address), not the container provider's fences: --egress-allow, --egress-deny, --egress-allow-domain and --egress-dns need --provider container")
		}
		if cfg.disk.inodes > 0 {
			return errors.New("the kubernetes provider caps a session's disk by its size alone (a Pod's ephemeral-storage limit, --disk-mb): --disk-inodes needs --provider container")
		}
	}
	return nil
}

// minTokenLen is the token length below which serve warns.
const minTokenLen = 16

// checkFloor refuses a policy whose isolation floor is above what the
// provider gives: every create would be rejected.
func checkFloor(sb sandbox.Sandbox, p sandbox.Policy) error {
	k, ok := sb.(interface{ Provider() kit.Provider })
	if !ok || p.Isolation == "" {
		return nil
	}
	if got := k.Provider().Isolation(); sandbox.IsolationStrength(got) < sandbox.IsolationStrength(p.Isolation) {
		return fmt.Errorf("the policy's isolation floor %q is above what provider %q gives (%q): every session would be rejected; lower --policy-isolation or choose another --provider",
			p.Isolation, k.Provider().Name(), got)
	}
	return nil
}

// newLogger is the daemon's logger: cfg's level and format, on w.
func newLogger(w io.Writer, cfg serveConfig) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// loadTLS loads the certificate and key of cfg; nil (plain HTTP) without.
func loadTLS(cfg serveConfig) (*tls.Config, error) {
	if cfg.tlsCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
	if err != nil {
		return nil, usagef(fmt.Errorf("TLS certificate and key: %w", err))
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// lockStateDir takes the daemon's lock on its state directory (creating it,
// mode 0700): two daemons on one state directory would share workspaces
// and the token file without knowing it.
func lockStateDir(dir string) (io.Closer, error) {
	if err := ensureStateDir(dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "serve.lock")
	f, err := flock.TryExclusive(path)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("state directory %s is in use by another tai42 serve (lock %s held): give this one another --state-dir", dir, path)
	}
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	return f, nil
}
