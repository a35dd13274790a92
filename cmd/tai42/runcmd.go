package main

import (
	"github.com/spf13/cobra"
)

// runCmd is "tai42 run [flags] -- CMD [ARGS...]".
func (c *cli) runCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "Run one command in a new sandbox session",
		Long: `Run creates a sandbox session, runs CMD in it with this terminal's stdin
streamed to it and its stdout and stderr streamed back, exits with CMD's
exit code, and destroys the session (also on error, SIGINT and SIGTERM).

The session's network defaults to "none" (loopback only). The policy allows
all the provider can honour; --policy-egress, --policy-isolation and
--policy-durable tighten it, and a spec beyond the policy is rejected.

State (workspaces, persistent keys) lives in --state-dir, else
$TAI42_STATE_DIR, else $XDG_STATE_HOME/tai42, else ~/.local/state/tai42.

Exit codes: CMD's own; 124 when CMD exceeded --timeout (the partial output's
lengths are printed); 2 for a usage error, a rejected spec or an unknown
provider; 1 for another sandbox error; 128+N when tai42 got signal N
(130 for SIGINT, 143 for SIGTERM).`,
		Example: `  tai42 run -- sh -c 'echo out; echo err >&2; exit 3'
  echo hello | tai42 run -- cat
  tai42 run --env GREETING=hi --env HOME -- sh -c 'echo $GREETING'
  tai42 run --put ./data.csv:in/data.csv --workdir in -- wc -l data.csv
  tai42 run --persistent myproj --ttl 1h --timeout 30m -- make
  tai42 run --network egress -- curl -sI https://example.com
  tai42 run --policy-egress none --network egress -- true   # rejected, exit 2`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f.timeoutSet = cmd.Flags().Changed("timeout")
			p, err := buildPlan(f, args, c.lookupEnv)
			if err != nil {
				return &exitError{code: errorExitCode(err), err: err}
			}
			if code := c.execute(p); code != exitOK {
				return &exitError{code: code}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	// Everything from CMD on is CMD's: "tai42 run sh -c ..." needs no "--".
	fl.SetInterspersed(false)
	fl.StringVar(&f.image, "image", defaultImage, "image the session runs (the host provider honours only \"host\")")
	fl.StringVar(&f.network, "network", defaultNetwork, "network tier: none (loopback only), internal or egress")
	fl.StringVar(&f.isolation, "isolation", "", "isolation tier: none, container or vm (default: the provider's own)")
	fl.DurationVar(&f.ttl, "ttl", defaultTTL, "session life, a Go duration rounded up to whole seconds, at least 1s; a command still running when it ends is killed")
	fl.DurationVar(&f.timeout, "timeout", 0, "kill CMD after this Go duration, > 0 (default: the provider's exec default, 60s)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set K=V in CMD's environment, or K to pass the caller's K (repeatable; values are never printed)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "CMD's working directory, relative to the workspace; it must exist (default: the workspace)")
	fl.StringVar(&f.persistent, "persistent", "", "make the session persistent with workspace key `KEY` (files survive between runs)")
	fl.StringArrayVar(&f.puts, "put", nil, "copy a local file into the workspace before CMD runs: `LOCAL[:REMOTE]`, split at the first ':'; REMOTE defaults to LOCAL's base name (repeatable)")
	fl.Float64Var(&f.cpu, "cpu", 0, "cap the session at N CPUs (0: no cap)")
	fl.IntVar(&f.memoryMB, "memory-mb", 0, "cap the session's memory at N MiB (0: no cap)")
	fl.StringArrayVarP(&f.labels, "label", "l", nil, "tag the session with K=V (repeatable)")
	fl.StringVar(&f.provider, "provider", defaultProvider, "sandbox provider to run on")
	fl.StringVar(&f.stateDir, "state-dir", "", "state directory (default: $"+stateDirEnv+", else $XDG_STATE_HOME/tai42, else ~/.local/state/tai42)")
	fl.BoolVarP(&f.noStdin, "no-stdin", "n", false, "give CMD an empty stdin instead of streaming this one")
	fl.StringVar(&f.policyEgress, "policy-egress", string(defaultPolicy.Egress), "policy: the loosest network a session may have (none, internal, egress)")
	fl.StringVar(&f.policyIsolation, "policy-isolation", string(defaultPolicy.Isolation), "policy: the weakest isolation a session may have (none, container, vm)")
	fl.BoolVar(&f.policyDurable, "policy-durable", defaultPolicy.Durable, "policy: allow persistent sessions (--policy-durable=false forbids them)")
	return cmd
}
