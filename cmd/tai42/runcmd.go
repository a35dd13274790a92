package main

import (
	"fmt"

	"github.com/tai42/sandbox/provider/kubernetes"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// runCmd is "tai42 run [flags] -- CMD [ARGS...]".
func (c *cli) runCmd() *cobra.Command {
	var f runFlags
	var rf remoteFlags
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

With $TAI42_URL (or --url) set, the session is created on that daemon
("tai42 serve") instead, with $TAI42_TOKEN (or --token) as the token; the
policy, provider and state directory are then the daemon's, and the
--policy-*, --provider and --state-dir flags are refused.

With --user, CMD runs as that user of the session, as "tai42 exec --user"
runs it.

On the container provider, an --image the store lacks is pulled from its
registry first (--pull missing, the default; see "tai42 image pull"); a
failed pull is a rejected spec naming the reference and what the registry
said. --pull, --registry-mirror, --insecure-registry, --max-image-size and
--max-image-inodes are also $TAI42_PULL, $TAI42_REGISTRY_MIRROR,
$TAI42_INSECURE_REGISTRY, $TAI42_MAX_IMAGE_SIZE and $TAI42_MAX_IMAGE_INODES,
and keys of the config file $TAI42_CONFIG names, as for "tai42 serve";
the host provider pulls nothing (they have no effect).

On the kubernetes provider (--provider kubernetes) the session is a Pod
of the cluster --kubeconfig (else $KUBECONFIG, else the in-cluster
config) reaches, in --namespace, its agent copied from --agent-image
(required; "tai42 agent-image push REF" pushes this build's); the
kubernetes flags are also variables and config keys, as for "tai42 serve".

Exit codes: CMD's own; 124 when CMD exceeded --timeout (the partial output's
lengths are printed); 2 for a usage error (a malformed --user among them),
a rejected spec or an unknown provider; 1 for another sandbox error (an
unknown user among them); 128+N when tai42 got signal N (130 for SIGINT,
143 for SIGTERM).`,
		Example: `  tai42 run -- sh -c 'echo out; echo err >&2; exit 3'
  echo hello | tai42 run -- cat
  tai42 run --env GREETING=hi --env HOME -- sh -c 'echo $GREETING'
  tai42 run --put ./data.csv:in/data.csv --workdir in -- wc -l data.csv
  tai42 run --persistent myproj --ttl 1h --timeout 30m -- make
  tai42 run --network egress -- curl -sI https://example.com
  tai42 run --user nobody -- id -un                # as the session's nobody
  tai42 run --provider container --image python:3.12-slim -- python3 -V
  tai42 run --provider container --insecure-registry localhost:5000 \
    --image localhost:5000/python:3.12-slim -- python3 -V
  tai42 run --policy-egress none --network egress -- true   # rejected, exit 2
  TAI42_URL=http://127.0.0.1:4242 tai42 run -- uname -a    # on a daemon`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f.timeoutSet = cmd.Flags().Changed("timeout")
			p, err := buildPlan(f, args, c.lookupEnv)
			if err != nil {
				return &exitError{code: errorExitCode(err), err: err}
			}
			rem, err := c.runRemote(cmd.Flags(), rf)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			if rem == nil {
				// Before resolving, which marks what it sets as changed.
				for _, s := range imageSettings {
					if cmd.Flags().Changed(s.flag) {
						p.imageFlags = append(p.imageFlags, "--"+s.flag)
					}
				}
				if p.images, err = resolveImageSettings(cmd.Flags(), &f.images, c.lookupEnv); err != nil {
					return &exitError{code: exitUsage, err: err}
				}
				if p.kube, err = resolveKubeSettings(cmd.Flags(), &f.kube, c.lookupEnv); err != nil {
					return &exitError{code: exitUsage, err: err}
				}
				if p.provider == kubernetes.Name {
					if err := p.kube.check(); err != nil {
						return &exitError{code: exitUsage, err: err}
					}
				}
			}
			if code := c.runPlan(p, rem); code != exitOK {
				return &exitError{code: code}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	// Everything from CMD on is CMD's: "tai42 run sh -c ..." needs no "--".
	fl.SetInterspersed(false)
	addSessionFlags(fl, &f)
	fl.DurationVar(&f.timeout, "timeout", 0, "kill CMD after this Go duration, > 0 (default: the provider's exec default, 60s)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "CMD's working directory, relative to the workspace; it must exist (default: the workspace)")
	fl.StringVarP(&f.user, "user", "u", "", userHelp)
	fl.StringArrayVar(&f.puts, "put", nil, "copy a local file into the workspace before CMD runs: `LOCAL[:REMOTE]`, split at the first ':'; REMOTE defaults to LOCAL's base name (repeatable)")
	fl.BoolVarP(&f.noStdin, "no-stdin", "n", false, "give CMD an empty stdin instead of streaming this one")
	addEmbeddedFlags(fl, &f.embeddedFlags, c.lookupEnv)
	addRemoteFlags(fl, &rf)
	return cmd
}

// addSessionFlags registers the flags that shape a session, shared by
// "tai42 run" and "tai42 create".
func addSessionFlags(fl *pflag.FlagSet, f *runFlags) {
	fl.StringVar(&f.image, "image", defaultImage, "image the session runs (the host provider honours only \"host\")")
	fl.StringVar(&f.network, "network", defaultNetwork, "network tier: none (loopback only), internal or egress")
	fl.StringVar(&f.isolation, "isolation", "", "isolation tier: none, container or vm (default: the provider's own)")
	fl.DurationVar(&f.ttl, "ttl", defaultTTL, "session life, a Go duration rounded up to whole seconds, at least 1s; when it ends the session is gone, and the next reap (every second for run, the daemon's --reap-interval otherwise) destroys it and kills what runs in it")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set K=V in the session's environment, or K to pass the caller's K (repeatable; values are never printed)")
	fl.StringVar(&f.persistent, "persistent", "", "make the session persistent with workspace key `KEY` (its files outlive it)")
	fl.Float64Var(&f.cpu, "cpu", 0, "cap the session at N CPUs (0: no cap)")
	fl.IntVar(&f.memoryMB, "memory-mb", 0, "cap the session's memory at N MiB (0: no cap)")
	fl.StringArrayVarP(&f.labels, "label", "l", nil, "tag the session with K=V (repeatable)")
}

// embeddedOnlyFlags are the flags of "tai42 run" that shape the embedded
// provider, not a session: a daemon has its own.
var embeddedOnlyFlags = append([]string{"policy-egress", "policy-isolation", "policy-durable", "provider", "state-dir",
	"pull", "registry-mirror", "insecure-registry", "max-image-size", "max-image-inodes"}, kubeFlagNames()...)

// runRemote returns the daemon "tai42 run" uses, or nil for the embedded
// provider. Given a daemon, a flag of embeddedOnlyFlags is a usage error:
// the policy, the provider and the state directory are the daemon's.
func (c *cli) runRemote(fl *pflag.FlagSet, rf remoteFlags) (*remote, error) {
	r, ok, err := c.resolveRemote(rf)
	if err != nil || !ok {
		return nil, err
	}
	for _, name := range embeddedOnlyFlags {
		if fl.Changed(name) {
			return nil, fmt.Errorf("--%s does not apply to a daemon (%s names one): the policy, the provider, the state directory and how images are pulled are the daemon's, set by `tai42 serve`; to run on the embedded provider, leave --url out and set %s empty", name, r.urlFrom, urlEnv)
		}
	}
	return &r, nil
}
