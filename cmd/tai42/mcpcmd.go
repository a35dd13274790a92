package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"

	"github.com/spf13/cobra"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/mcpserver"
	"github.com/tai42/sandbox/provider/container"
	"github.com/tai42/sandbox/provider/host"
	"github.com/tai42/sandbox/provider/kubernetes"
)

// mcpFlags are the flags of "tai42 mcp".
type mcpFlags struct {
	image            string
	maxResultBytes   int
	allowUnsandboxed bool
	embeddedFlags
}

// allowUnsandboxedEnv is the variable of --allow-unsandboxed.
const allowUnsandboxedEnv = "TAI42_ALLOW_UNSANDBOXED"

// errUnsandboxed matches every *unsandboxedError.
var errUnsandboxed = errors.New("tai42 mcp: no sandbox for the agent")

// unsandboxedError refuses to serve an agent sessions that run at
// isolation none, which it did not opt into: its commands would run on
// this machine as the user running tai42.
type unsandboxedError struct {
	provider string
	daemon   string // the daemon's address; "" for the embedded provider
}

func (e *unsandboxedError) Error() string {
	where := fmt.Sprintf("the embedded provider %q", e.provider)
	alt := "as root with runc or crun installed (--provider container), or on a daemon that runs the container provider ($" + urlEnv + ")"
	if e.daemon != "" {
		where = fmt.Sprintf("the daemon at %s serves provider %q, which", e.daemon, e.provider)
		alt = "on a daemon that runs the container provider"
	}
	return fmt.Sprintf("refusing to serve the agent sessions with no sandbox: %s runs them at isolation none, on this machine itself as the user running them, "+
		"so a command the agent runs can read and change that user's files, see its processes and reach whatever this machine reaches. "+
		"Run tai42 mcp %s, or accept that with --allow-unsandboxed (or $%s=true)", where, alt, allowUnsandboxedEnv)
}

func (e *unsandboxedError) Is(target error) bool { return target == errUnsandboxed }

// mcpCmd is "tai42 mcp": the MCP server over stdio.
func (c *cli) mcpCmd() *cobra.Command {
	var f mcpFlags
	var rf remoteFlags
	cmd := &cobra.Command{
		Use:   "mcp [flags]",
		Short: "Serve sandbox sessions to an agent as MCP tools over stdio",
		Long: `Mcp is a Model Context Protocol server on stdin and stdout, what a desktop
agent's configuration launches: its tools create sessions, run commands,
move files and run background processes (create_session, run, write_file,
read_file, list_dir, list_sessions, touch, destroy_session, start_process,
read_process_output, write_process_stdin, close_process_stdin,
kill_process, list_processes). The sessions it creates are destroyed when
the agent closes the connection (or tai42 gets SIGINT or SIGTERM), unless
persistent; their TTL applies meanwhile.

It refuses to start (exit 2) where the sessions would have no sandbox,
isolation none: the host provider, which the default becomes for a user
other than root or where no runc or crun is installed, runs the agent's
commands on this machine as the user running tai42 mcp, with its files,
processes and network. --allow-unsandboxed (or $TAI42_ALLOW_UNSANDBOXED=true)
accepts that. The server's instructions and every create_session result
tell the agent the isolation and network its sessions really have.

With $TAI42_URL (or --url) set, the sessions are the daemon's ("tai42
serve"), with $TAI42_TOKEN (or --token) as its token; the policy, provider
and state directory are then the daemon's, and the --policy-*, --provider
and --state-dir flags are refused. Without, it runs the embedded provider
as "tai42 run" does, and a persistent workspace key it uses stays reserved
to it until it exits. A daemon serves the same tools at /mcp.

A tool's output past --max-result-bytes is cut: the result says so, with
the full lengths, and the whole output is saved in the session's
workspace for read_file to page. Logs go to stderr; they never show an
environment value.`,
		Example: `  sudo tai42 mcp                              # as root with runc or crun: containers
  TAI42_URL=http://127.0.0.1:4242 tai42 mcp   # on a daemon
  tai42 mcp --allow-unsandboxed               # on the host runner: no sandbox

  # A desktop agent's configuration (mcpServers), on a daemon:
  #   "tai42": {"command": "tai42", "args": ["mcp"],
  #             "env": {"TAI42_URL": "http://127.0.0.1:4242", "TAI42_TOKEN_FILE": "/path/to/token"}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.maxResultBytes <= 0 {
				return &exitError{code: exitUsage, err: usagef(fmt.Errorf("--max-result-bytes must be > 0, got %d", f.maxResultBytes))}
			}
			if err := c.resolveAllowUnsandboxed(cmd, &f); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			rem, err := c.runRemote(cmd.Flags(), rf)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			var pc providerConfig
			if rem == nil {
				if pc, err = c.mcpProviderConfig(cmd, &f); err != nil {
					return &exitError{code: exitUsage, err: err}
				}
			}
			if err := c.serveMCP(f, rem, pc); err != nil {
				err = c.explain(err)
				return &exitError{code: errorExitCode(err), err: err}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", defaultImage, "the image of a session whose create_session names none")
	fl.IntVar(&f.maxResultBytes, "max-result-bytes", mcpserver.DefaultMaxResultBytes, "the most output one tool result carries, in bytes")
	fl.BoolVar(&f.allowUnsandboxed, "allow-unsandboxed", false, "serve sessions that have no sandbox (isolation none: the host provider runs the agent's commands on this machine as you), which tai42 mcp otherwise refuses (default: $"+allowUnsandboxedEnv+")")
	addEmbeddedFlags(fl, &f.embeddedFlags, c.lookupEnv)
	addRemoteFlags(fl, &rf)
	return cmd
}

// resolveAllowUnsandboxed sets f.allowUnsandboxed from
// $TAI42_ALLOW_UNSANDBOXED when the flag is not given (an empty value is
// unset); a value that is no boolean is a usage error.
func (c *cli) resolveAllowUnsandboxed(cmd *cobra.Command, f *mcpFlags) error {
	v, ok := envValue(c.lookupEnv, allowUnsandboxedEnv)
	if !ok || cmd.Flags().Changed("allow-unsandboxed") {
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return usagef(fmt.Errorf("$%s %q: want true or false", allowUnsandboxedEnv, v))
	}
	f.allowUnsandboxed = b
	return nil
}

// mcpProviderConfig resolves the embedded provider's settings.
func (c *cli) mcpProviderConfig(cmd *cobra.Command, f *mcpFlags) (providerConfig, error) {
	pol, err := f.policy()
	if err != nil {
		return providerConfig{}, err
	}
	stateDir, err := resolveStateDir(f.stateDir, c.lookupEnv)
	if err != nil {
		return providerConfig{}, usagef(err)
	}
	images, err := resolveImageSettings(cmd.Flags(), &f.images, c.lookupEnv)
	if err != nil {
		return providerConfig{}, err
	}
	kube, err := resolveKubeSettings(cmd.Flags(), &f.kube, c.lookupEnv)
	if err != nil {
		return providerConfig{}, err
	}
	if f.provider == kubernetes.Name {
		if err := kube.check(); err != nil {
			return providerConfig{}, err
		}
	}
	return providerConfig{stateDir: stateDir, policy: pol, reapInterval: cliReapInterval, images: images, kube: kube}, nil
}

// serveMCP runs the MCP server on stdin and stdout over the daemon rem,
// or over the embedded provider pc describes, until the client closes
// stdin or a signal comes. Sessions with no sandbox are refused unless
// f.allowUnsandboxed (an *unsandboxedError).
func (c *cli) serveMCP(f mcpFlags, rem *remote, pc providerConfig) error {
	ctx, _, stop := c.interruptible()
	defer stop()
	log := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	m, err := c.openMCPSandbox(ctx, f, rem, pc)
	if err != nil {
		return err
	}
	defer m.close()
	if m.isolation == sandbox.IsolationNone {
		if !f.allowUnsandboxed {
			e := &unsandboxedError{provider: m.provider}
			if rem != nil {
				e.daemon = rem.url
			}
			return usagef(e)
		}
		log.Warn("the agent's sessions have no sandbox (--allow-unsandboxed): isolation none, its commands run on this machine as the user running them", "provider", m.provider, "uid", os.Geteuid())
	}
	log.Info("mcp: serving", "provider", m.provider, "isolation", cmp.Or(string(m.isolation), "unknown"))
	srv := mcpserver.New(m.sb, mcpserver.Options{Version: buildVersion(), DefaultImage: f.image, MaxResultBytes: f.maxResultBytes, Isolation: m.isolation, Logger: log})
	err = srv.ServeIO(ctx, readerOrEmpty(c.stdin), c.stdout)
	if ctx.Err() != nil { // a signal: a normal end
		return nil
	}
	return err
}

// mcpSandbox is the sandbox "tai42 mcp" serves.
type mcpSandbox struct {
	sb        sandbox.Sandbox
	provider  string            // its provider's name
	isolation sandbox.Isolation // its sessions'; "" when not known
	close     func()            // releases it all
}

// openMCPSandbox opens the sandbox of "tai42 mcp": a client of the daemon
// rem (asked which provider it serves), or the embedded provider pc
// describes (its state directory checked first).
func (c *cli) openMCPSandbox(ctx context.Context, f mcpFlags, rem *remote, pc providerConfig) (mcpSandbox, error) {
	if rem != nil {
		cl, err := c.dial(*rem)
		if err != nil {
			return mcpSandbox{}, err
		}
		info, err := cl.Info(ctx)
		if err != nil {
			cl.Close()
			return mcpSandbox{}, fmt.Errorf("asking the daemon which provider it serves: %w", err)
		}
		return mcpSandbox{sb: cl, provider: info.Provider, isolation: providerNameIsolation(info.Provider), close: func() { cl.Close() }}, nil
	}
	if err := ensureStateDir(pc.stateDir); err != nil {
		return mcpSandbox{}, err
	}
	psb, closePSB, err := openProvider(f.provider, pc)
	if err != nil {
		return mcpSandbox{}, err
	}
	keys := &keyLocks{Sandbox: psb, stateDir: pc.stateDir, durable: pc.policy.Durable, held: map[string]io.Closer{}}
	closeAll := func() {
		keys.release()
		cctx, done := cleanupContext(ctx)
		defer done()
		if err := closePSB(cctx); err != nil {
			c.warn(err)
		}
	}
	return mcpSandbox{sb: keys, provider: f.provider, isolation: sandboxIsolation(psb), close: closeAll}, nil
}

// sandboxIsolation is the isolation every session of an embedded
// provider's sandbox runs at (the kit runs them all at the provider's);
// "" for a sandbox that does not say.
func sandboxIsolation(sb sandbox.Sandbox) sandbox.Isolation {
	if k, ok := sb.(interface{ Provider() kit.Provider }); ok {
		return k.Provider().Isolation()
	}
	return ""
}

// providerNameIsolation is the isolation a daemon's provider, known by
// name only, runs its sessions at: the weakest it may (the kubernetes
// provider's is vm with a runtime class, else container); "" for a
// provider this build does not know.
func providerNameIsolation(name string) sandbox.Isolation {
	switch name {
	case host.Name:
		return sandbox.IsolationNone
	case container.Name, kubernetes.Name:
		return sandbox.IsolationContainer
	}
	return ""
}

// keyLocks holds, for the embedded provider, the lock of every persistent
// workspace key a session was created with, as "tai42 run" does for its
// one session: the kit keeps one live session per key within the
// process, the lock across tai42 processes. A key stays locked until the
// process exits (its session may be destroyed before: the lock is kept,
// not retaken).
type keyLocks struct {
	sandbox.Sandbox
	stateDir string
	durable  bool // the policy allows persistent sessions

	mu   sync.Mutex
	held map[string]io.Closer
}

func (k *keyLocks) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.Session, error) {
	// A spec the kit refuses anyway (a bad key, persistence the policy
	// forbids) gets the kit's own error, and no lock file.
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Durability == sandbox.Persistent && k.durable {
		if err := k.lock(spec.WorkspaceKey); err != nil {
			return nil, err
		}
	}
	return k.Sandbox.CreateSession(ctx, spec)
}

func (k *keyLocks) lock(key string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.held[key]; ok {
		return nil
	}
	f, err := lockWorkspaceKey(k.stateDir, key)
	if err != nil {
		return err
	}
	k.held[key] = f
	return nil
}

func (k *keyLocks) release() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, f := range k.held {
		_ = f.Close()
		delete(k.held, key)
	}
}
