package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/client"
)

// workspaceCmd is "tai42 workspace": the daemon's persistent workspaces.
func (c *cli) workspaceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "workspace",
		Aliases: []string{"workspaces"},
		Short:   "List and remove the daemon's persistent workspaces",
		Long: `Workspace manages the persistent workspaces of the daemon ($TAI42_URL): the
workspace a session made with --persistent KEY keeps its files after the
session ends, for the next session with the same KEY, until it is removed
here. "tai42 workspace ls" lists them with their size and the live session
holding each; "tai42 workspace rm KEY..." deletes them and their files (a
workspace a live session holds is refused: destroy the session first).`,
		Example: `  id=$(tai42 create --persistent notes)
  tai42 exec "$id" -- sh -c 'date >> log.txt'
  tai42 rm "$id"
  tai42 workspace ls
  tai42 workspace rm notes`,
		Args: cobra.NoArgs, // an unknown subcommand is a usage error
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.workspaceLsCmd(), c.workspaceRmCmd())
	return cmd
}

// workspaceLsCmd is "tai42 workspace ls".
func (c *cli) workspaceLsCmd() *cobra.Command {
	var rf remoteFlags
	var asJSON, quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the daemon's persistent workspaces",
		Long: `Ls lists the persistent workspaces of the daemon ($TAI42_URL), sorted by
key, as a table: KEY, SIZE (of its regular files, symlinks not followed),
MODIFIED (the last change to its top directory, RFC 3339) and IN USE BY
(the live session holding it, "-" for none). --json prints a JSON array of
{key, size_bytes, modified_at, in_use_by} instead ([] when there is none);
-q prints the keys alone.`,
		Example: `  tai42 workspace ls
  tai42 workspace ls --json | jq -r '.[] | select(.in_use_by == null) | .key'
  tai42 workspace rm $(tai42 workspace ls -q)   # remove them all; those in use are refused`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				infos, err := cl.ListWorkspaces(ctx)
				if err != nil {
					return c.routeErr(err, "workspace")
				}
				out := cmd.OutOrStdout()
				switch {
				case asJSON:
					return writeJSON(out, infos)
				case quiet:
					keys := make([]string, len(infos))
					for i, in := range infos {
						keys[i] = in.Key
					}
					return writeLines(out, keys...)
				}
				return writeWorkspaceTable(out, infos)
			})
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "print a JSON array of the workspaces")
	fl.BoolVarP(&quiet, "quiet", "q", false, "print only the keys, one per line")
	addRemoteFlags(fl, &rf)
	return cmd
}

// writeWorkspaceTable writes infos as the table of "tai42 workspace ls",
// times in the local zone; a header alone when there is none.
func writeWorkspaceTable(w io.Writer, infos []sandbox.WorkspaceInfo) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	_, _ = io.WriteString(tw, "KEY\tSIZE\tMODIFIED\tIN USE BY\n")
	for _, in := range infos {
		_, _ = io.WriteString(tw, in.Key+"\t"+humanBytes(in.SizeBytes)+"\t"+in.ModifiedAt.Local().Format(time.RFC3339)+"\t"+orDash(in.InUseBy)+"\n")
	}
	return outputErr(tw.Flush())
}

// workspaceRmCmd is "tai42 workspace rm KEY...".
func (c *cli) workspaceRmCmd() *cobra.Command {
	var rf remoteFlags
	cmd := &cobra.Command{
		Use:     "rm KEY...",
		Aliases: []string{"remove"},
		Short:   "Remove persistent workspaces and their files",
		Long: `Rm deletes each persistent workspace named, and every file in it, on the
daemon ($TAI42_URL). A workspace a live session holds is refused, naming
the session (destroy it with "tai42 rm ID" first); a key with no workspace
is an error. Each failure is reported with its cause, and the other
workspaces are still removed. It prints nothing.

Exit codes: 0 all removed; 1 when one was missing, in use or failed; 2 for
a key that cannot name a workspace (1 to 128 letters, digits, '.', '_' and
'-'; not "." or "..").`,
		Example: `  tai42 workspace rm notes
  tai42 workspace rm $(tai42 workspace ls -q)`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("workspace rm: name the workspace keys to remove, e.g. tai42 workspace rm notes")
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				var errs []error
				code := exitOK
				for _, key := range args {
					err := cl.RemoveWorkspace(ctx, key)
					if err == nil {
						continue
					}
					var op *net.OpError
					var te *api.TransportError
					if ctx.Err() != nil || errors.As(err, &op) || errors.As(err, &te) {
						// Interrupted, no daemon to try the others on, or the
						// daemon refused the request itself (a token, a route).
						return c.routeErr(err, "workspace")
					}
					errs = append(errs, fmt.Errorf("%s: %w", key, err))
					if sandbox.ValidWorkspaceKey(key) != nil {
						code = max(code, exitUsage)
					} else {
						code = max(code, exitFailure)
					}
				}
				if len(errs) == 0 {
					return nil
				}
				return &exitError{code: code, err: errors.Join(errs...)}
			})
		},
	}
	addRemoteFlags(cmd.Flags(), &rf)
	return cmd
}

// routeErr explains a daemon that does not know the routes of what (one
// older than them): its not_found names the route only.
func (c *cli) routeErr(err error, what string) error {
	var te *api.TransportError
	if errors.As(err, &te) && te.Kind == api.KindNotFound {
		where := "the daemon"
		if c.remote != nil {
			where += " at " + c.remote.url
		}
		return fmt.Errorf("%w (%s does not serve the %s routes: is it an older tai42?)", err, where, what)
	}
	return err
}
