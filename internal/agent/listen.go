package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
)

// ServeTCP serves on a TCP listener it opens at addr (host:port) until ctx
// is done: [ServeFD] for a sandbox whose runtime passes no socket (a
// Kubernetes Pod, where the daemon reaches the agent through the
// apiserver's port-forward to the Pod's loopback). The same PID 1 duties
// as ServeFD: ReapAll when this process is PID 1, the ignored signals
// reset for the commands, threads reserved. Errors: addr cannot be
// listened on, or Serve's.
func ServeTCP(ctx context.Context, addr string, logger *slog.Logger) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("agent: listen on %s: %w", addr, err)
	}
	defaultSignalsForCommands()
	reserveThreads(reservedThreads)
	return Serve(ctx, ln, Options{ReapAll: os.Getpid() == 1, Logger: logger})
}
