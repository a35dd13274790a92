package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// cli is one invocation's world: its standard streams, its environment and
// the signals that interrupt it. Tests build one with fake streams.
type cli struct {
	stdin     io.Reader // nil reads as empty
	stdout    io.Writer
	stderr    io.Writer
	lookupEnv func(string) (string, bool)
	signals   <-chan os.Signal // nil: never interrupted
	// exe is the executable "tai42 agent-image push" pushes; "" for
	// os.Executable (a test's binary is not tai42).
	exe string

	// remote is the daemon the command talks to, once dialled: errors
	// from it are explained with where its address and token came from.
	remote *remote
}

// run is the CLI without signal handling: args are the arguments after the
// program name, env looks a variable up in the caller's environment. It
// returns the exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) (string, bool)) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, lookupEnv: env}
	return c.main(args)
}

// main parses args, runs the chosen command and maps the outcome to an
// exit code (see exitcode.go).
func (c *cli) main(args []string) int {
	if c.lookupEnv == nil {
		c.lookupEnv = func(string) (string, bool) { return "", false }
	}
	root := c.rootCmd()
	root.SetArgs(args)
	root.SetIn(readerOrEmpty(c.stdin))
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(c.stderr, "tai42: %v\n", ee.err)
		}
		return ee.code
	}
	// Anything else comes from parsing: a usage error.
	fmt.Fprintf(c.stderr, "tai42: %v\n", err)
	if cmd == nil {
		cmd = root
	}
	fmt.Fprintf(c.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	return exitUsage
}

func (c *cli) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "tai42",
		Short: "TAI42 — disposable sandbox sessions for AI tools",
		Long: `tai42 runs commands in disposable sandbox sessions.

"tai42 run" creates a session on the embedded provider (the host runner),
runs one command in it with your terminal's stdin, stdout and stderr
streamed, exits with the command's exit code, and destroys the session.

"tai42 serve" runs the daemon: sessions over an HTTP API, for programs in
any language and for the client commands (create, ls, exec, shell, cp,
touch, rm, reap, workspace, and run), which find it through $TAI42_URL
and $TAI42_TOKEN (or --url and --token). The daemon keeps its sessions in
a ledger in its state directory: killed, it brings them back when it
starts again. With --provider kubernetes its sessions are Pods of a
cluster, whose apiserver is the ledger several daemons share ("tai42
agent-image push" makes the image their agent comes from).

Commands that print data print a table or plain lines for people, and JSON
with --json for programs.`,
		Example: `  # Run a command with no network (the default) and get its exit code
  tai42 run -- sh -c 'echo hello; exit 7'; echo $?

  # Pipe data through a sandboxed command
  printf 'b\na\n' | tai42 run -- sort

  # Copy a script in and run it with a secret in its environment
  tai42 run --put ./job.py:job.py --env API_TOKEN -- python3 job.py

  # Keep files between runs in a persistent workspace
  tai42 run --persistent notes -- sh -c 'date >> log.txt; cat log.txt'

  # Allow outbound network, cap CPU and memory, limit the run to 5 minutes
  tai42 run --network egress --cpu 1 --memory-mb 512 --timeout 5m -- make test

  # A daemon, and a session that outlives one command
  tai42 serve &                          # prints: tai42: listening on 127.0.0.1:4242 ...
  export TAI42_URL=127.0.0.1:4242        # the token is read from the state directory
  id=$(tai42 create --ttl 1h)
  tai42 cp ./src.tgz "$id":src.tgz
  tai42 exec "$id" -- tar xzf src.tgz
  tai42 shell "$id"
  tai42 rm "$id"

  # The daemon's persistent workspaces
  tai42 workspace ls
  tai42 workspace rm notes`,
		Version:       versionLine(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(
		c.runCmd(), c.serveCmd(), c.mcpCmd(),
		c.createCmd(), c.lsCmd(), c.execCmd(), c.shellCmd(), c.cpCmd(),
		c.touchCmd(), c.rmCmd(), c.reapCmd(), c.workspaceCmd(),
		c.imageCmd(), c.agentImageCmd(),
		c.versionCmd(),
		c.agentCmd(),
	)
	return root
}

func readerOrEmpty(r io.Reader) io.Reader {
	if r == nil {
		return eofReader{}
	}
	return r
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
