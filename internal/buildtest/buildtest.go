// Package buildtest builds the tai42 binary for tests and their harnesses
// (the container provider's agent, the kubernetes harness's agent image,
// the CLI's end-to-end tests, the Python suite's daemons), all the same
// way and one build at a time on the machine.
//
// Why one at a time: `go test ./...` runs several test binaries at once,
// and each wants a tai42 at its start. Go's build cache shares finished
// compiles between go commands, not compiles in progress, so on a cold
// cache every concurrent build compiled the whole tree (client-go and all)
// again: minutes of CPU each on a 2-core CI machine. Under the lock the
// first build compiles and the others find its packages in the cache and
// only link. python/test.sh takes the same lock with flock(1) (LockPath).
package buildtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/flock"
)

// Package is what is built: the tai42 command of this module, by import
// path, so that a build runs from any directory of the module.
const Package = "github.com/tai42/sandbox/cmd/tai42"

// AgentPackage is the agent's own binary (tai42-agent), by import path.
const AgentPackage = "github.com/tai42/sandbox/cmd/tai42-agent"

// LockPath is the machine-wide build lock: a file in the temporary
// directory, which every user of the machine can open.
func LockPath() string { return filepath.Join(os.TempDir(), "tai42-build.lock") }

// Tai42 builds Package into out: static (CGO_ENABLED=0) unless cgo, then
// with cgo (CGO_ENABLED=1: dynamically linked where a C compiler is
// installed). No other flag: every caller's build of a kind shares the
// same cache entries. It holds LockPath while it builds (opened read-only,
// as flock(1) opens it, so that every user can lock it); a lock file it
// cannot open only costs the sharing.
// ctx ends the build. The error carries the end of the go command's
// output (Go).
func Tai42(ctx context.Context, out string, cgo bool) error {
	return build(ctx, out, cgo, Package)
}

// Agent builds AgentPackage into out, static, as Tai42 builds tai42.
func Agent(ctx context.Context, out string) error {
	return build(ctx, out, false, AgentPackage)
}

func build(ctx context.Context, out string, cgo bool, pkg string) error {
	if f, err := os.OpenFile(LockPath(), os.O_RDONLY|os.O_CREATE, 0o666); err == nil {
		defer f.Close()
		if err := flock.LockContext(ctx, f, unix.LOCK_EX); err != nil {
			return fmt.Errorf("waiting for another build of tai42: %w", err)
		}
	}
	cgoEnv := "CGO_ENABLED=0"
	if cgo {
		cgoEnv = "CGO_ENABLED=1"
	}
	return Go(ctx, "", append(os.Environ(), cgoEnv), "build", "-o", out, pkg)
}

// Go runs the go command with args in dir ("": this process's) and env,
// and returns its failure with the end of its output: what every test
// harness that builds with Go runs. The compiler runs with GOGC at
// BuildGOGC unless env sets GOGC.
func Go(ctx context.Context, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, GoTool(), args...)
	cmd.Dir, cmd.Env = dir, WithBuildGOGC(env)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		b := out.Bytes()
		if len(b) > 4096 {
			b = b[len(b)-4096:]
		}
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// BuildGOGC is the GOGC the compiler runs with in the builds here. The
// compiler allocates much and lives briefly: at 400 it spends about a
// fifth less CPU than at Go's default of 100, for more memory (a cold
// static build of tai42 on the 2-core CI machine: 184 CPU-seconds against
// 222). GOGC is no build setting: it changes nothing in the build cache's
// keys, so builds with and without it share their packages.
const BuildGOGC = "400"

// WithBuildGOGC is env with GOGC=BuildGOGC added, unless env sets GOGC.
func WithBuildGOGC(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOGC=") {
			return env
		}
	}
	return append(env[:len(env):len(env)], "GOGC="+BuildGOGC)
}

// GoTool is the go command: PATH's (go test puts its own first), else the
// usual install's (CI adds /usr/local/go/bin to PATH; a test's
// environment may not).
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}
