package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox/internal/agent"
)

// agentCmd is the in-sandbox agent: PID 1 of each session's container,
// serving the agent protocol on the listening socket the provider passed
// (see internal/agent), or on a TCP address of its own (--listen: a
// Kubernetes Pod, reached through the apiserver's port-forward). Hidden:
// not for direct use.
func (c *cli) agentCmd() *cobra.Command {
	var fd int
	var listen string
	var workspace string
	cmd := &cobra.Command{
		Use:    "agent",
		Short:  "Run the in-sandbox agent (PID 1 of a sandbox; started by the container provider)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// SIGTERM and SIGINT (and SIGHUP) end the agent: Serve kills
			// every exec and returns.
			ctx, _, stop := c.interruptible()
			defer stop()
			logger := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			err := agent.Run(ctx, agent.RunConfig{ListenFD: fd, ListenFDSet: cmd.Flags().Changed("listen-fd"), Listen: listen, Workspace: workspace}, logger)
			switch {
			case errors.Is(err, agent.ErrUsage):
				return &exitError{code: exitUsage, err: err}
			case err != nil:
				return &exitError{code: exitFailure, err: err}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&fd, "listen-fd", 3, "the inherited listening socket's file descriptor")
	cmd.Flags().StringVar(&listen, "listen", "", "serve on a TCP listener at this host:port instead of the inherited socket")
	cmd.Flags().StringVar(&workspace, "workspace", "/workspace", "the directory the agent runs in; it must exist")
	cmd.AddCommand(c.agentInstallCmd())
	return cmd
}

// agentInstallCmd copies the running executable to DEST: the init
// container of a Kubernetes session Pod runs it from the agent image to put
// the agent into the Pod's emptyDir, where the session's own image runs it.
func (c *cli) agentInstallCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "install DEST",
		Short:  "Copy this executable to DEST (mode 0555), for a Pod's init container",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := installSelf(args[0]); err != nil {
				return &exitError{code: exitFailure, err: err}
			}
			return nil
		},
	}
}

// installSelf copies the running executable to dest with mode 0555,
// durably and atomically: a temporary file beside dest, fsynced, renamed
// over dest, and the directory fsynced; a reader of dest sees the old file
// or the whole new one. The executable is opened first, through
// /proc/self/exe, so the copy is of this very binary even if its path was
// replaced meanwhile.
func installSelf(dest string) (err error) {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		exe, xerr := os.Executable()
		if xerr != nil {
			return fmt.Errorf("agent install: cannot find the running executable: %w", errors.Join(err, xerr))
		}
		if src, err = os.Open(exe); err != nil {
			return fmt.Errorf("agent install: open the running executable: %w", err)
		}
	}
	defer src.Close()
	dir := filepath.Dir(dest)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dest)+".tmp-*")
	if err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = io.Copy(tmp, src); err != nil {
		return fmt.Errorf("agent install: copy to %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(0o555); err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("agent install: fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("agent install: close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), dest); err != nil {
		return fmt.Errorf("agent install: %w", err)
	}
	if d, derr := os.Open(dir); derr == nil {
		serr := d.Sync()
		d.Close()
		if serr != nil {
			return fmt.Errorf("agent install: fsync %s: %w", dir, serr)
		}
	}
	return nil
}
