package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// brokenStdioEnv makes the test binary run as the agent whose stderr
// nobody reads any more (see TestBrokenStderr); its value is the socket.
const brokenStdioEnv = "TAI42_AGENT_TEST_BROKEN_STDIO"

// runBrokenStdioAgent serves on fd 3 as "tai42 agent" does, waits until
// the agent answers, then logs to its stderr, whose reader is gone:
// exit 0 when the write failed and the process is still there to say so.
func runBrokenStdioAgent(sock string) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	served := make(chan error, 1)
	go func() { served <- ServeFD(ctx, 3, logger) }()
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	if err := dialer(sock).Ping(pctx); err != nil {
		return 3
	}
	logger.Warn("agent: a warning after the provider that read stderr is gone")
	_, err := fmt.Fprintln(os.Stderr, "and a line")
	cancel()
	if serr := <-served; serr != nil {
		return 4
	}
	if !errors.Is(err, syscall.EPIPE) {
		return 5
	}
	return 0
}

// TestBrokenStderr: the agent (a session's PID 1) lives on when its
// stdout and stderr, a pipe the container provider drains, lose their
// reader (the provider's process ended; its kept sessions run on): a
// write there fails with EPIPE instead of ending it with SIGPIPE, as Go
// does for file descriptors 1 and 2 by default.
func TestBrokenStderr(t *testing.T) {
	sock, lf := listenerFile(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // the reader is gone before the agent writes
	defer w.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), brokenStdioEnv+"="+sock)
	cmd.ExtraFiles = []*os.File{lf} // fd 3
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	if err != nil {
		t.Fatalf("the agent whose stderr lost its reader: %v (want exit 0: it lived on and its write failed with EPIPE)", err)
	}
}
