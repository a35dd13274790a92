package main

import (
	"cmp"
	"context"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
)

// lsCmd is "tai42 ls".
func (c *cli) lsCmd() *cobra.Command {
	var rf remoteFlags
	var asJSON, quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the daemon's live sessions",
		Long: `Ls lists the live sessions of the daemon ($TAI42_URL), oldest first, as a
table: ID, IMAGE, DURABILITY, KEY (a persistent session's workspace key),
EXPIRES (relative to now) and LABELS. --json prints a JSON array of the
sessions' info instead ([] when there is none); -q prints the ids alone.`,
		Example: `  tai42 ls
  tai42 ls --json | jq -r '.[] | select(.labels.job == "etl") | .id'
  tai42 rm $(tai42 ls -q)   # destroy every session`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				infos, err := cl.ListSessions(ctx)
				if err != nil {
					return err
				}
				slices.SortFunc(infos, func(a, b sandbox.SessionInfo) int {
					return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
				})
				out := cmd.OutOrStdout()
				switch {
				case asJSON:
					if infos == nil {
						infos = []sandbox.SessionInfo{}
					}
					return writeJSON(out, infos)
				case quiet:
					ids := make([]string, len(infos))
					for i, in := range infos {
						ids[i] = in.ID
					}
					return writeLines(out, ids...)
				}
				return writeSessionTable(out, infos, time.Now())
			})
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "print a JSON array of the sessions' info")
	fl.BoolVarP(&quiet, "quiet", "q", false, "print only the ids, one per line")
	addRemoteFlags(fl, &rf)
	return cmd
}

// writeSessionTable writes infos as the table of "tai42 ls", expiry
// relative to now; a header alone when there is none.
func writeSessionTable(w io.Writer, infos []sandbox.SessionInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	_, _ = io.WriteString(tw, "ID\tIMAGE\tDURABILITY\tKEY\tEXPIRES\tLABELS\n")
	for _, in := range infos {
		_, _ = io.WriteString(tw, in.ID+"\t"+in.Image+"\t"+string(in.Durability)+"\t"+orDash(in.WorkspaceKey)+"\t"+
			relativeTime(in.ExpiresAt, now)+"\t"+formatLabels(in.Labels)+"\n")
	}
	return outputErr(tw.Flush())
}
