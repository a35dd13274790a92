package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox/internal/agent"
)

// agentCmd is the in-sandbox agent: PID 1 of each session's container,
// serving the agent protocol on the listening socket the provider passed
// (see internal/agent). Hidden: not for direct use.
func (c *cli) agentCmd() *cobra.Command {
	var fd int
	var workspace string
	cmd := &cobra.Command{
		Use:    "agent",
		Short:  "Run the in-sandbox agent (PID 1 of a sandbox; started by the container provider)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			if workspace != "" {
				if err := os.Chdir(workspace); err != nil {
					return &exitError{code: exitFailure, err: fmt.Errorf("agent: the workspace: %w", err)}
				}
			}
			// SIGTERM and SIGINT (and SIGHUP) end the agent: Serve kills
			// every exec and returns.
			ctx, _, stop := c.interruptible()
			defer stop()
			logger := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			if err := agent.ServeFD(ctx, fd, logger); err != nil {
				return &exitError{code: exitFailure, err: err}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&fd, "listen-fd", 3, "the inherited listening socket's file descriptor")
	cmd.Flags().StringVar(&workspace, "workspace", "/workspace", "the directory the agent runs in; it must exist")
	return cmd
}
