package host

import (
	"os"
	"os/signal"
	"syscall"
)

// childSignals are the signals a command must get with their default
// action, whatever this process does with them.
var childSignals = []os.Signal{syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU}

// swallowed receives the signals this process ignored before New; nobody
// reads it (signal.Notify never blocks on a full channel), so they stay
// without effect here.
var swallowed = make(chan os.Signal, 1)

// defaultSignalsForCommands makes the signals this process ignores reach
// the commands it starts with their default action. An ignored signal is
// inherited through exec (a daemon started as a background job of a
// script, or under nohup, ignores SIGINT and SIGHUP, and so would every
// command: ^C in a shell would do nothing), while a caught one is reset to
// its default by exec. So each ignored signal is caught here, into a
// channel nobody reads: this process goes on ignoring it in effect.
func defaultSignalsForCommands() {
	for _, s := range childSignals {
		if signal.Ignored(s) {
			signal.Notify(swallowed, s)
		}
	}
}
