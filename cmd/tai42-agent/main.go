// Command tai42-agent is the in-sandbox agent alone: what "tai42 agent"
// runs, in a binary that links nothing else (no daemon, no client, no
// Kubernetes), so that it starts in a couple of milliseconds and its pages
// are few. It is PID 1 of every container session: the container provider
// runs it in place of tai42 itself when it is installed beside tai42 (see
// the README's "Set-up"). It takes the same command line as "tai42 agent"
// (the word "agent" first is optional), and "version".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/internal/buildversion"
)

// version is set at link time, as tai42's: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "version" {
		fmt.Fprintf(stdout, "tai42-agent %s %s %s/%s\n", buildversion.Of(version), runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	}
	if len(args) > 0 && args[0] == "agent" {
		args = args[1:]
	}
	fl := flag.NewFlagSet("tai42-agent", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var cfg agent.RunConfig
	fl.IntVar(&cfg.ListenFD, "listen-fd", 3, "the inherited listening socket's file descriptor")
	fl.StringVar(&cfg.Listen, "listen", "", "serve on a TCP listener at this host:port instead of the inherited socket")
	fl.StringVar(&cfg.Workspace, "workspace", "/workspace", "the directory the agent runs in; it must exist")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "tai42-agent: unexpected arguments %q\n", fl.Args())
		return 2
	}
	fl.Visit(func(f *flag.Flag) { cfg.ListenFDSet = cfg.ListenFDSet || f.Name == "listen-fd" })
	// SIGTERM, SIGINT and SIGHUP end the agent: Run kills every exec and
	// returns.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := agent.Run(ctx, cfg, logger); err != nil {
		fmt.Fprintf(stderr, "tai42-agent: %v\n", err)
		if errors.Is(err, agent.ErrUsage) {
			return 2
		}
		return 1
	}
	return 0
}
