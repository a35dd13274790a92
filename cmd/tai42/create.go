package main

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox/client"
)

// createCmd is "tai42 create [flags]".
func (c *cli) createCmd() *cobra.Command {
	f := runFlags{}
	var rf remoteFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a session on the daemon and print its id",
		Long: `Create creates a sandbox session on the daemon ($TAI42_URL, "tai42 serve")
and prints its id alone on stdout, for "tai42 exec", "tai42 cp", "tai42 shell",
"tai42 touch" and "tai42 rm". The session lives until --ttl passes without a
"tai42 touch", or until "tai42 rm". With --json it prints the session's
info (id, image, workspace_key, workspace_path, durability, created_at,
expires_at, labels) instead.

The session-shaping flags are those of "tai42 run"; the daemon's policy caps
them, and a spec beyond it is rejected (exit 2).`,
		Example: `  id=$(tai42 create --ttl 30m --label job=etl)
  tai42 exec "$id" -- sh -c 'echo hi > greeting.txt'
  tai42 cp "$id":greeting.txt -
  tai42 rm "$id"

  # A persistent workspace: its files outlive the session
  tai42 create --persistent notes --network egress --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := buildSpec(f, c.lookupEnv)
			if err != nil {
				return &exitError{code: errorExitCode(err), err: err}
			}
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				sess, err := cl.CreateSession(ctx, spec)
				if err != nil {
					return err
				}
				if !asJSON {
					return writeLines(cmd.OutOrStdout(), sess.ID())
				}
				info, err := sess.Info(ctx)
				if err != nil {
					return err
				}
				return writeJSON(cmd.OutOrStdout(), info)
			})
		},
	}
	fl := cmd.Flags()
	addSessionFlags(fl, &f)
	fl.BoolVar(&asJSON, "json", false, "print the session's info as JSON instead of its id")
	addRemoteFlags(fl, &rf)
	return cmd
}
