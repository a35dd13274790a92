package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/spf13/cobra"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/mcpserver"
	"github.com/tai42/sandbox/provider/kubernetes"
)

// mcpFlags are the flags of "tai42 mcp".
type mcpFlags struct {
	image          string
	maxResultBytes int
	embeddedFlags
}

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
		Example: `  tai42 mcp                                   # on the embedded provider
  TAI42_URL=http://127.0.0.1:4242 tai42 mcp   # on a daemon

  # A desktop agent's configuration (mcpServers):
  #   "tai42": {"command": "tai42", "args": ["mcp"]}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.maxResultBytes <= 0 {
				return &exitError{code: exitUsage, err: usagef(fmt.Errorf("--max-result-bytes must be > 0, got %d", f.maxResultBytes))}
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
				return &exitError{code: errorExitCode(err), err: err}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", defaultImage, "the image of a session whose create_session names none")
	fl.IntVar(&f.maxResultBytes, "max-result-bytes", mcpserver.DefaultMaxResultBytes, "the most output one tool result carries, in bytes")
	addEmbeddedFlags(fl, &f.embeddedFlags, c.lookupEnv)
	addRemoteFlags(fl, &rf)
	return cmd
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
// stdin or a signal comes.
func (c *cli) serveMCP(f mcpFlags, rem *remote, pc providerConfig) error {
	ctx, _, stop := c.interruptible()
	defer stop()
	log := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	var sb sandbox.Sandbox
	if rem != nil {
		cl, err := c.dial(*rem)
		if err != nil {
			return err
		}
		defer cl.Close()
		sb = cl
	} else {
		psb, closeSB, err := openProvider(f.provider, pc)
		if err != nil {
			return err
		}
		defer func() {
			cctx, done := cleanupContext(ctx)
			defer done()
			if err := closeSB(cctx); err != nil {
				c.warn(err)
			}
		}()
		keys := &keyLocks{Sandbox: psb, stateDir: pc.stateDir, durable: pc.policy.Durable, held: map[string]io.Closer{}}
		defer keys.release()
		sb = keys
	}
	srv := mcpserver.New(sb, mcpserver.Options{Version: buildVersion(), DefaultImage: f.image, MaxResultBytes: f.maxResultBytes, Logger: log})
	err := srv.ServeIO(ctx, readerOrEmpty(c.stdin), c.stdout)
	if ctx.Err() != nil { // a signal: a normal end
		return nil
	}
	return err
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
