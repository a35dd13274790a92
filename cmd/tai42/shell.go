package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"golang.org/x/term"
)

// minShellTimeout is the least "tai42 shell" may last without --timeout:
// the default is the session's remaining life, but at least this.
const minShellTimeout = time.Hour

// probeTimeout bounds the check for script(1) in the session.
const probeTimeout = 30 * time.Second

// shellCmd is "tai42 shell ID".
func (c *cli) shellCmd() *cobra.Command {
	var f execFlags
	var rf remoteFlags
	cmd := &cobra.Command{
		Use:   "shell [flags] ID",
		Short: "Open an interactive shell in a session of the daemon",
		Long: `Shell opens an interactive shell (sh) in the daemon's session ID.

When stdin is a terminal, the shell gets a terminal of its own inside the
session (util-linux script(1) makes one there, sized like this one), and
this terminal is put in raw mode until the shell ends: keys, line editing,
^C and ^D go to the shell; "exit" or ^D leaves. Resizing this terminal
later does not resize the shell's: run "stty rows R cols C" in it. If the
session has no script(1), the shell runs without a terminal, and tai42 says
so.

When stdin is not a terminal, sh reads its commands from stdin, like
"tai42 exec ID -- sh".

The shell ends at --timeout (default: the session's remaining life, at
least 1h), and with the session: keep it alive with "tai42 touch". tai42
exits with the shell's exit code.`,
		Example: `  tai42 shell "$id"
  echo 'echo hi; exit 3' | tai42 shell "$id"; echo $?   # hi, then 3
  tai42 shell --timeout 8h -e TERM=xterm-256color -w src "$id"`,
		Args: exactArgs(1, "shell: name one session id, e.g. tai42 shell ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.timeoutSet = cmd.Flags().Changed("timeout")
			opts, err := f.startOptions(c.lookupEnv, minShellTimeout)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			return c.daemonCall(rf, func(ctx context.Context, in *interruption, cl *client.Client) error {
				sess, err := cl.GetSession(ctx, args[0])
				if err != nil {
					return err
				}
				if !f.timeoutSet {
					info, err := sess.Info(ctx)
					if err != nil {
						return err
					}
					opts.Timeout = max(minShellTimeout, time.Until(info.ExpiresAt).Round(time.Second))
				}
				if code := c.shell(ctx, in, sess, opts); code != exitOK {
					return &exitError{code: code}
				}
				return nil
			})
		},
	}
	addExecFlags(cmd.Flags(), &f, 0, "end the shell after this Go duration, > 0 (default: the session's remaining life, at least 1h)")
	addRemoteFlags(cmd.Flags(), &rf)
	return cmd
}

// shell runs the interactive shell of "tai42 shell" in sess and returns its
// exit code.
func (c *cli) shell(ctx context.Context, in *interruption, sess sandbox.Session, opts sandbox.StartOptions) int {
	fd, tty := terminalFd(c.stdin)
	if !tty {
		return c.interact(ctx, in, sess, []string{"sh"}, opts, false)
	}
	ok, err := hasScript(ctx, sess)
	if err != nil {
		if code, ok := in.code(); ok {
			return code
		}
		return c.fail(err)
	}
	if !ok {
		fmt.Fprintln(c.stderr, "tai42: script(1) is not in the session, so the shell has no terminal: no prompt editing, and ^C ends tai42 and the shell")
		return c.interact(ctx, in, sess, []string{"sh", "-i"}, opts, false)
	}
	if t, ok := c.lookupEnv("TERM"); ok && t != "" {
		if _, set := opts.Env["TERM"]; !set {
			if opts.Env == nil {
				opts.Env = map[string]sandbox.Secret{}
			}
			opts.Env["TERM"] = sandbox.NewSecret(t)
		}
	}
	rows, cols := terminalSize(fd)
	restore, err := rawMode(fd)
	if err != nil {
		return c.fail(fmt.Errorf("putting the terminal in raw mode: %w", err))
	}
	defer restore()
	// Raw mode turns off the terminal's newline translation: tai42's own
	// messages end lines with \r\n until the mode is restored.
	stderr := c.stderr
	c.stderr = crlfWriter{stderr}
	defer func() { c.stderr = stderr }()
	return c.interact(ctx, in, sess, scriptArgv(rows, cols), opts, false)
}

// scriptArgv is the command giving an interactive sh a terminal of rows x
// cols inside the session: script(1) runs it on a new pseudo-terminal
// (-q: no banner; -f: flush at once; -e: its exit code is the shell's), and
// stty sizes that terminal.
func scriptArgv(rows, cols int) []string {
	inner := "stty rows " + strconv.Itoa(rows) + " cols " + strconv.Itoa(cols) + " 2>/dev/null; exec sh -i"
	return []string{"script", "-qfec", inner, "/dev/null"}
}

// hasScript reports whether script(1) is on the session's PATH.
func hasScript(ctx context.Context, sess sandbox.Session) (bool, error) {
	res, err := sess.Exec(ctx, []string{"sh", "-c", "command -v script"}, sandbox.ExecOptions{Timeout: probeTimeout})
	if err != nil {
		return false, err
	}
	return res.ExitCode == 0, nil
}

// terminalFd returns the file descriptor of r and whether it is a terminal.
func terminalFd(r io.Reader) (int, bool) {
	f, ok := r.(*os.File)
	if !ok || f == nil {
		return -1, false
	}
	fd := int(f.Fd())
	return fd, term.IsTerminal(fd)
}

// terminalSize returns the rows and columns of the terminal fd, 24x80 when
// it does not say.
func terminalSize(fd int) (rows, cols int) {
	w, h, err := term.GetSize(fd)
	if err != nil || w <= 0 || h <= 0 {
		return 24, 80
	}
	return h, w
}

// rawMode puts the terminal fd in raw mode and returns the function that
// restores its previous mode (safe to call more than once).
func rawMode(fd int) (restore func(), err error) {
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, err
	}
	done := false
	return func() {
		if !done {
			done = true
			_ = term.Restore(fd, old)
		}
	}, nil
}

// crlfWriter writes to w with each "\n" made "\r\n", for a terminal in raw
// mode.
type crlfWriter struct{ w io.Writer }

func (cw crlfWriter) Write(p []byte) (int, error) {
	if _, err := cw.w.Write(bytes.ReplaceAll(p, []byte("\n"), []byte("\r\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}
