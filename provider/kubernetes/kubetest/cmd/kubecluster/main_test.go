package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

// TestDown: "down" signals the PID of the pid file only while its start
// time is the one written: a stale file's PID (here a live process
// started at another time) is left alone and the file removed.
func TestDown(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	pid := cmd.Process.Pid
	start, err := kubetest.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(pidFile(state), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	write(fmt.Sprintf("%d %d\n", pid, start+1))
	if err := down(state); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("down with a stale start time: %v", err)
	}
	if _, err := os.Stat(pidFile(state)); !os.IsNotExist(err) {
		t.Errorf("the stale pid file is kept: %v", err)
	}
	select {
	case <-exited:
		t.Fatal("down signalled a process that is not the one the file names")
	case <-time.After(200 * time.Millisecond):
	}

	write(fmt.Sprintf("%d\n", pid)) // the older format: no start time
	if err := down(state); err == nil {
		t.Error("down trusted a pid file without a start time")
	}

	write(fmt.Sprintf("%d %d\n", pid, start))
	if err := down(state); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("down did not stop the process the file names")
	}
}
