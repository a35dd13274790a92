package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
)

// ServeFD serves on the listening socket inherited as file descriptor fd
// (the runtime passes it as fd 3) until ctx is done: [Serve] with ReapAll
// set when this process is PID 1. It first makes the signals this process
// ignores reach the commands with their default action. Errors: fd is not
// a listening socket, or Serve's.
func ServeFD(ctx context.Context, fd int, logger *slog.Logger) error {
	if fd < 0 {
		return fmt.Errorf("agent: listen fd %d is not a file descriptor", fd)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("listen-fd-%d", fd))
	ln, err := net.FileListener(f) // a dup of fd
	f.Close()
	if err != nil {
		return fmt.Errorf("agent: fd %d is not a listening socket: %w", fd, err)
	}
	defaultSignalsForCommands()
	survivePipeErrors()
	reserveThreads(reservedThreads)
	return Serve(ctx, ln, Options{ReapAll: os.Getpid() == 1, Logger: logger})
}

// survivePipeErrors makes a write to a pipe without a reader fail with
// EPIPE here, on every descriptor: by default Go ends the process with
// SIGPIPE when it is stdout or stderr. The container provider gives its
// sessions' PID 1 a pipe it drains as stdout and stderr, whose reader is
// gone once its process ends while kept sessions run on: a warning logged
// then must not end the session. A caught signal is reset to its default
// in the commands this process starts.
func survivePipeErrors() {
	signal.Notify(swallowed, syscall.SIGPIPE)
}

// reservedThreads is how many OS threads the agent makes at its start.
const reservedThreads = 4

// reserveThreads makes n OS threads now, while the sandbox can still make
// them, and leaves them idle for the Go runtime to reuse: a command that
// exhausts the sandbox's pids limit (a fork bomb) must not leave the agent
// unable to get the thread a blocking system call hands its work to (the
// runtime dies when it cannot make one).
func reserveThreads(n int) {
	var held sync.WaitGroup
	release := make(chan struct{})
	for range n {
		held.Add(1)
		go func() {
			runtime.LockOSThread() // a thread of its own while all n are held
			held.Done()
			<-release
			runtime.UnlockOSThread() // the thread goes back to the runtime's idle list
		}()
	}
	held.Wait()
	close(release)
}

// childSignals are the signals a command must get with their default
// action, whatever this process does with them.
var childSignals = []os.Signal{syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU}

// swallowed receives the signals this process ignored at the start, and
// SIGPIPE (see survivePipeErrors); nobody reads it (signal.Notify never blocks on a full channel), so they stay
// without effect here.
var swallowed = make(chan os.Signal, 1)

// defaultSignalsForCommands makes the signals this process ignores reach
// the commands it starts with their default action: an ignored signal is
// inherited through exec, while a caught one is reset to its default. So
// each ignored signal is caught, into a channel nobody reads: this
// process goes on ignoring it in effect.
func defaultSignalsForCommands() {
	for _, s := range childSignals {
		if signal.Ignored(s) {
			signal.Notify(swallowed, s)
		}
	}
}
