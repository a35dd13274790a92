// Command kubecluster builds and runs the kubetest cluster outside a
// test: for CI's warm-up, the bench script and humans.
//
//	kubecluster build              build the binaries (kubetest.Build) into the cache
//	kubecluster up STATE           start a cluster in STATE; stays in the foreground
//	                               until SIGINT/SIGTERM or "down"; prints the
//	                               KUBECONFIG export line once up (also in STATE/env)
//	kubecluster down STATE         stop the cluster "up STATE" runs (by its PID) and
//	                               wait until it is torn down
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubecluster:", err)
		os.Exit(1)
	}
}

func usage() error {
	return errors.New("usage: kubecluster build | up STATE | down STATE")
}

func run(args []string) error {
	if len(args) == 0 {
		return usage()
	}
	switch args[0] {
	case "build":
		t0 := time.Now()
		bin, err := kubetest.Build(context.Background(), kubetest.DefaultCacheDir())
		if err != nil {
			return err
		}
		fmt.Printf("binaries in %s (%.1fs)\n", bin, time.Since(t0).Seconds())
		return nil
	case "up":
		if len(args) != 2 {
			return usage()
		}
		return up(args[1])
	case "down":
		if len(args) != 2 {
			return usage()
		}
		return down(args[1])
	}
	return usage()
}

// pidFile is beside STATE, not in it: Close empties STATE. It holds
// "up"'s PID and start time (kubetest.StartTime): the two name one
// process, where a stale file's PID alone may be another's by now.
func pidFile(state string) string { return filepath.Clean(state) + ".pid" }

// parsePidFile reads "PID START" from b.
func parsePidFile(b []byte) (pid int, start uint64, err error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, errors.New("not \"PID START\"")
	}
	if pid, err = strconv.Atoi(f[0]); err != nil || pid <= 1 {
		return 0, 0, fmt.Errorf("not a PID: %q", f[0])
	}
	if start, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("not a start time: %q", f[1])
	}
	return pid, start, nil
}

func up(state string) error {
	state, err := filepath.Abs(state)
	if err != nil {
		return err
	}
	start, err := kubetest.StartTime(os.Getpid())
	if err != nil {
		return err
	}
	if err := os.WriteFile(pidFile(state), []byte(fmt.Sprintf("%d %d\n", os.Getpid(), start)), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile(state))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-sig; cancel() }()
	c, err := kubetest.Start(ctx, kubetest.Options{
		StateDir: state,
		Logf:     func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	line := fmt.Sprintf("export KUBECONFIG=%s\n", c.Kubeconfig)
	env := line + fmt.Sprintf("KUBECTL=%s\nREGISTRY=%s\nAGENT_IMAGE=%s\nBUSYBOX_IMAGE=%s\nSTORAGE_CLASS=%s\n",
		c.Kubectl, c.Registry, c.AgentImage, c.Busybox, c.StorageClass)
	if err := os.WriteFile(filepath.Join(state, "env"), []byte(env), 0o644); err != nil {
		return errors.Join(err, c.Close())
	}
	fmt.Fprintf(os.Stderr, "node Ready %.2fs after start; kubectl %s\n", c.NodeReady.Seconds(), c.Kubectl)
	fmt.Print(line)
	<-ctx.Done()
	t0 := time.Now()
	err = c.Close()
	fmt.Fprintf(os.Stderr, "closed in %.2fs\n", time.Since(t0).Seconds())
	return err
}

func down(state string) error {
	state, err := filepath.Abs(state)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(pidFile(state))
	if err != nil {
		return fmt.Errorf("no cluster runs in %s: %w", state, err)
	}
	pid, start, err := parsePidFile(b)
	if err != nil {
		return fmt.Errorf("%s: %w", pidFile(state), err)
	}
	// The PID is "up"'s only while its start time is the one "up"
	// wrote: a stale file's PID may be another process's by now.
	running := func() bool {
		s, err := kubetest.StartTime(pid)
		return err == nil && s == start
	}
	if !running() {
		_ = os.Remove(pidFile(state))
		return fmt.Errorf("pid %d is not the \"kubecluster up %s\" that wrote %s (it exited; the stale file is removed)", pid, state, pidFile(state))
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	for deadline := time.Now().Add(4 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if !running() {
			return nil
		}
	}
	return fmt.Errorf("pid %d did not exit within 4 minutes", pid)
}
