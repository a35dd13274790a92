package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/client"
)

// execFlags are the flags of "tai42 exec" (and, but --no-stdin, of
// "tai42 shell").
type execFlags struct {
	timeout    time.Duration
	timeoutSet bool
	env        []string
	workdir    string
	user       string
	noStdin    bool
}

// userHelp is the help of --user.
const userHelp = "run the command as `USER` of the session: a name, a uid or uid:gid, resolved in the session's /etc/passwd and /etc/group; HOME becomes its home (default: the session's default user, root)"

// addExecFlags registers --timeout, --env, --workdir and --user.
func addExecFlags(fl *pflag.FlagSet, f *execFlags, timeout time.Duration, timeoutHelp string) {
	fl.DurationVar(&f.timeout, "timeout", timeout, timeoutHelp)
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set K=V in the command's environment, or K to pass the caller's K (repeatable; values are never printed)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "the command's working directory, relative to the workspace; it must exist (default: the workspace)")
	fl.StringVarP(&f.user, "user", "u", "", userHelp)
}

// startOptions validates f into the options of an exec; the timeout is
// def when --timeout was not given.
func (f execFlags) startOptions(lookupEnv func(string) (string, bool), def time.Duration) (sandbox.StartOptions, error) {
	if f.timeoutSet && f.timeout <= 0 {
		return sandbox.StartOptions{}, usagef(fmt.Errorf("--timeout must be > 0, got %v", f.timeout))
	}
	env, err := parseEnv(f.env, lookupEnv)
	if err != nil {
		return sandbox.StartOptions{}, usagef(err)
	}
	if err := sandbox.ValidUser(f.user); err != nil {
		return sandbox.StartOptions{}, usagef(fmt.Errorf("--%v", err))
	}
	timeout := def
	if f.timeoutSet {
		timeout = f.timeout
	}
	return sandbox.StartOptions{Cwd: f.workdir, Env: env, Timeout: timeout, User: f.user}, nil
}

// execCmd is "tai42 exec ID [flags] -- CMD [ARGS...]".
func (c *cli) execCmd() *cobra.Command {
	var f execFlags
	var rf remoteFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] ID [flags] -- CMD [ARGS...]",
		Short: "Run a command in a session of the daemon",
		Long: `Exec runs CMD in the daemon's session ID with this terminal's stdin
streamed to it and its stdout and stderr streamed back, and exits with
CMD's exit code. The session stays: "tai42 rm" destroys it.

Flags go before ID, or after it followed by "--". Without flags after ID,
"--" may be left out as long as CMD does not start with "-".

With --user, CMD runs as that user of the session (a name, a uid, or
uid:gid, looked up in the session's own /etc/passwd and /etc/group), with
HOME its home unless -e sets HOME, starting in the workdir even where the
user may not enter it; a name the session does not know is an error
naming it, and nothing runs.

Exit codes: CMD's own; 124 when CMD exceeded --timeout (the partial output's
lengths are printed); 2 for a usage error (a malformed --user among them);
1 for another error (an unknown session or user, a refused token, a daemon
that cannot be reached); 128+N when tai42 got signal N (the command is
killed).`,
		Example: `  tai42 exec "$id" -- sh -c 'echo out; echo err >&2; exit 3'; echo $?
  tai42 exec "$id" ls -la
  printf 'b\na\n' | tai42 exec "$id" sort
  tai42 exec "$id" --timeout 10m -e API_KEY -w src -- make test
  tai42 exec -u nobody "$id" -- id -u   # as the session's nobody
  tai42 exec -n "$id" -- ./server.sh   # no stdin`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, argv, err := splitExecArgs(cmd.Flags(), args)
			if errors.Is(err, pflag.ErrHelp) {
				return cmd.Help()
			}
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			f.timeoutSet = cmd.Flags().Changed("timeout")
			// Validate before asking the daemon (the default is its own).
			if _, err := f.startOptions(c.lookupEnv, time.Second); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			return c.daemonCall(rf, func(ctx context.Context, in *interruption, cl *client.Client) error {
				sess, err := cl.GetSession(ctx, id)
				if err != nil {
					return err
				}
				def, err := execDefault(ctx, cl)
				if err != nil {
					return err
				}
				opts, err := f.startOptions(c.lookupEnv, def)
				if err != nil {
					return err
				}
				if code := c.interact(ctx, in, sess, argv, opts, f.noStdin); code != exitOK {
					return &exitError{code: code}
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	// Parsing stops at ID; splitExecArgs parses the flags after it.
	fl.SetInterspersed(false)
	addExecFlags(fl, &f, 0, "kill CMD after this Go duration, > 0 (default: the daemon's exec default)")
	fl.BoolVarP(&f.noStdin, "no-stdin", "n", false, "give CMD an empty stdin instead of streaming this one")
	addRemoteFlags(fl, &rf)
	return cmd
}

// execDefault is the daemon's default exec timeout. The client caches it
// from its first answer; when it has none, the daemon is asked here, so
// that its error (a refused token, say) is the one reported.
func execDefault(ctx context.Context, cl *client.Client) (time.Duration, error) {
	if d := cl.ExecDefaultTimeout(); d > 0 {
		return d, nil
	}
	info, err := cl.Info(ctx)
	if err != nil {
		return 0, err
	}
	if d := api.Seconds(info.ExecDefaultTimeoutSeconds); d > 0 {
		return d, nil
	}
	return 0, fmt.Errorf("the daemon reports no default exec timeout (%vs): pass --timeout", info.ExecDefaultTimeoutSeconds)
}

// splitExecArgs splits "ID [FLAGS --] CMD..." (what is left after the
// flags before ID) into the session id and the command, parsing into fl
// the flags between ID and "--". Everything after ID is CMD when it does
// not start with "-"; a leading "--" is dropped. It returns pflag.ErrHelp
// for a -h/--help among the flags after ID.
func splitExecArgs(fl *pflag.FlagSet, args []string) (id string, argv []string, err error) {
	if len(args) == 0 || args[0] == "" {
		return "", nil, errors.New("exec: name a session id and a command, e.g. tai42 exec ID -- echo hello")
	}
	id, rest := args[0], args[1:]
	switch {
	case len(rest) > 0 && rest[0] == "--":
		argv = rest[1:]
	case len(rest) > 0 && strings.HasPrefix(rest[0], "-"):
		i := slices.Index(rest, "--")
		if i < 0 {
			return "", nil, fmt.Errorf("exec: flags after the session id need \"--\" before the command, e.g. tai42 exec ID %s -- CMD", rest[0])
		}
		if err := fl.Parse(rest[:i]); err != nil {
			return "", nil, fmt.Errorf("exec: %w", err)
		}
		if help, _ := fl.GetBool("help"); help {
			return "", nil, pflag.ErrHelp
		}
		if left := fl.Args(); len(left) > 0 {
			return "", nil, fmt.Errorf("exec: unexpected %q between the session id and \"--\"", left[0])
		}
		argv = rest[i+1:]
	default:
		argv = rest
	}
	if len(argv) == 0 || argv[0] == "" {
		return "", nil, errors.New("exec: name a command to run, e.g. tai42 exec ID -- echo hello")
	}
	return id, argv, nil
}
