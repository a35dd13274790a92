// Command tai42 is the TAI42 sandbox CLI: "tai42 run" runs one command in a
// disposable sandbox session of the embedded host provider (or of a daemon),
// streaming the terminal's stdin, stdout and stderr, and exits with the
// command's code; "tai42 serve" is the daemon, serving sessions over HTTP;
// "tai42 create", "ls", "exec", "shell", "cp", "touch", "rm" and "reap" are
// its client.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(realMain())
}

// realMain runs the CLI and returns its exit code once every deferred
// cleanup (the session's destroy, the sandbox's Close) has run; only main
// calls os.Exit.
func realMain() int {
	sigs := make(chan os.Signal, 4)
	// SIGTERM, SIGINT and SIGHUP end a run cleanly (kill, destroy, exit
	// 128+sig). SIGINT and SIGHUP stay ignored when tai42 was started with
	// them ignored (a background job of a script, nohup).
	signal.Notify(sigs, syscall.SIGTERM)
	for _, s := range []os.Signal{syscall.SIGINT, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	defer signal.Stop(sigs)
	// Catching SIGPIPE (rather than dying of it) turns a write to a closed
	// stdout into an EPIPE error, so a run piped into "head" still destroys
	// its session. A handler, unlike SIG_IGN, is not inherited by commands.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)

	c := &cli{
		stdin:     os.Stdin,
		stdout:    os.Stdout,
		stderr:    os.Stderr,
		lookupEnv: os.LookupEnv,
		signals:   sigs,
	}
	return c.main(os.Args[1:])
}
