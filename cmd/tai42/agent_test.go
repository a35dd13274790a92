package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/agent"
)

// TestAgentInstall: "tai42 agent install DEST" puts a copy of the binary at
// DEST, mode 0555, that runs; no temporary file stays beside it; a second
// install replaces the first.
func TestAgentInstall(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	dest := filepath.Join(dir, "tai42")
	for range 2 {
		if out, err := exec.Command(bin, "agent", "install", dest).CombinedOutput(); err != nil {
			t.Fatalf("agent install: %v\n%s", err, out)
		}
	}
	fi, err := os.Stat(dest)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o555 {
		t.Errorf("mode %v, want -r-xr-xr-x", fi.Mode())
	}
	want, _ := os.ReadFile(bin)
	got, _ := os.ReadFile(dest)
	if !bytes.Equal(got, want) {
		t.Errorf("the copy (%d bytes) differs from the binary (%d bytes)", len(got), len(want))
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("the directory holds %d entries, want only tai42", len(ents))
	}
	out, err := exec.Command(dest, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tai42") {
		t.Errorf("the copy's --version: %v %q", err, out)
	}
	// A destination in a missing directory fails, and says where.
	out, err = exec.Command(bin, "agent", "install", filepath.Join(dir, "nope", "tai42")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "nope") {
		t.Errorf("install into a missing directory: %v %q", err, out)
	}
}

// TestAgentListen: "tai42 agent --listen ADDR" serves the protocol on TCP:
// a ping and an exec through agent.Client; SIGTERM ends it with status 0.
func TestAgentListen(t *testing.T) {
	bin := buildBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "agent", "--listen", addr, "--workspace", t.TempDir())
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	c := &agent.Client{Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if err = c.Ping(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("ping: %v (stderr %q)", err, stderr.String())
	}
	var out bytes.Buffer
	p, err := c.Start(ctx, agent.ExecSpec{Argv: []string{"echo", "over", "tcp"}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/"},
		func(_ int, b []byte) bool { out.Write(b); return true })
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	res := p.Result()
	p.Close()
	if res.Err != nil || res.ExitCode != 0 || out.String() != "over tcp\n" {
		t.Errorf("echo: %+v %q", res, out.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the agent's exit on SIGTERM: %v (stderr %q)", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not end on SIGTERM")
	}
	// Both listening flags at once is a usage error.
	err = exec.Command(bin, "agent", "--listen", addr, "--listen-fd", "3").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Errorf("--listen with --listen-fd: %v, want exit %d", err, exitUsage)
	}
}
