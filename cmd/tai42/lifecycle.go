package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox/client"
)

// touchCmd is "tai42 touch ID".
func (c *cli) touchCmd() *cobra.Command {
	var rf remoteFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "touch ID",
		Short: "Keep a session alive: extend its life by its ttl",
		Long: `Touch extends the session's expiry to at least now + its ttl (it never
shortens it) and prints the new expiry (RFC 3339); with --json, the
session's info. An unknown or expired session is an error (exit 1).`,
		Example: `  tai42 touch sb-0123456789abcdef01234567
  while sleep 300; do tai42 touch "$id" >/dev/null || break; done &   # keep-alive loop`,
		Args: exactArgs(1, "touch: name one session id, e.g. tai42 touch ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				sess, err := cl.GetSession(ctx, args[0])
				if err != nil {
					return err
				}
				if err := sess.Touch(ctx); err != nil {
					return err
				}
				info, err := sess.Info(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), info)
				}
				return writeLines(cmd.OutOrStdout(), info.ExpiresAt.Local().Format(time.RFC3339))
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the session's info as JSON")
	addRemoteFlags(cmd.Flags(), &rf)
	return cmd
}

// rmCmd is "tai42 rm ID...".
func (c *cli) rmCmd() *cobra.Command {
	var rf remoteFlags
	cmd := &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"destroy"},
		Short:   "Destroy sessions",
		Long: `Rm destroys each session named: its commands are killed, an ephemeral
workspace is removed, a persistent one is kept for the next session with
its key. It is idempotent: an id that is unknown or already gone is not an
error. It prints nothing; a failure is reported per id and the others are
still destroyed.`,
		Example: `  tai42 rm "$id"
  tai42 rm $(tai42 ls -q)   # destroy every session`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("rm: name the session ids to destroy, e.g. tai42 rm ID")
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				var errs []error
				for _, id := range args {
					if err := cl.DestroySession(ctx, id); err != nil {
						var op *net.OpError
						if ctx.Err() != nil || errors.As(err, &op) {
							return err // interrupted, or no daemon to try the others on
						}
						errs = append(errs, fmt.Errorf("%s: %w", id, err))
					}
				}
				return errors.Join(errs...)
			})
		},
	}
	addRemoteFlags(cmd.Flags(), &rf)
	return cmd
}

// reapCmd is "tai42 reap".
func (c *cli) reapCmd() *cobra.Command {
	var rf remoteFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "reap",
		Short: "Destroy the daemon's expired sessions now",
		Long: `Reap destroys every session past its expiry now, rather than at the
daemon's next sweep, and prints the ids it destroyed, one per line (with
--json, a JSON array, [] when none).`,
		Example: `  tai42 reap
  tai42 reap --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				ids, err := cl.Reap(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					if ids == nil {
						ids = []string{}
					}
					return writeJSON(cmd.OutOrStdout(), ids)
				}
				return writeLines(cmd.OutOrStdout(), ids...)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the reaped ids as a JSON array")
	addRemoteFlags(cmd.Flags(), &rf)
	return cmd
}

// exactArgs is cobra.ExactArgs with a message saying what to pass.
func exactArgs(n int, msg string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return errors.New(msg)
		}
		return nil
	}
}
