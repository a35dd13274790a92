package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
)

// RunConfig is how an agent process serves: the flags of "tai42 agent"
// and of the tai42-agent binary, which both call [Run].
type RunConfig struct {
	// ListenFD is the inherited listening socket (the container
	// provider's); used unless Listen is set.
	ListenFD int
	// ListenFDSet says ListenFD was given explicitly.
	ListenFDSet bool
	// Listen is a TCP host:port to serve on instead (a Kubernetes Pod).
	Listen string
	// Workspace is the directory the agent runs in; "" leaves it.
	Workspace string
}

// ErrUsage is matched by Run's error when the configuration is wrong.
var ErrUsage = errors.New("agent: usage")

// Run serves the agent protocol as cfg says until ctx ends (every exec is
// then killed).
func Run(ctx context.Context, cfg RunConfig, logger *slog.Logger) error {
	if cfg.Listen != "" && cfg.ListenFDSet {
		return fmt.Errorf("%w: --listen and --listen-fd exclude each other", ErrUsage)
	}
	if cfg.Workspace != "" {
		if err := os.Chdir(cfg.Workspace); err != nil {
			return fmt.Errorf("agent: the workspace: %w", err)
		}
	}
	if cfg.Listen != "" {
		return ServeTCP(ctx, cfg.Listen, logger)
	}
	return ServeFD(ctx, cfg.ListenFD, logger)
}
