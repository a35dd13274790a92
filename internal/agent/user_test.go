package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// needRoot skips a test that switches users: only root may.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running a command as another user needs root")
	}
}

// nobody is the host's nobody, the user the tests run commands as.
func nobody(t *testing.T) *user.User {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("this host has no user nobody: %v", err)
	}
	return u
}

// ids is what a shell run as a user reports of itself.
const ids = `printf '%s %s %s|%s|%s' "$(id -u)" "$(id -g)" "$(id -G)" "$HOME" "$(pwd)"`

// An exec with a user runs with the ids it resolves to in the agent's
// /etc/passwd and /etc/group, gets its home as HOME unless the env sets
// one, and starts in its cwd even where that user may not enter it.
func TestExecUser(t *testing.T) {
	needRoot(t)
	nb := nobody(t)
	a := startAgent(t)
	if err := os.Chmod(a.ws, 0o700); err != nil { // root's alone, as a session's workspace
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, want string
	}{
		{"nobody", fmt.Sprintf("%s %s %s|%s|%s", nb.Uid, nb.Gid, nb.Gid, nb.HomeDir, a.ws)},
		{nb.Uid, fmt.Sprintf("%s %s %s|%s|%s", nb.Uid, nb.Gid, nb.Gid, nb.HomeDir, a.ws)},
		{nb.Uid + ":4321", fmt.Sprintf("%s 4321 4321|%s|%s", nb.Uid, nb.HomeDir, a.ws)},
		// A uid with no passwd entry: gid 0, home /.
		{"4242", "4242 0 0|/|" + a.ws},
		{"4242:4343", "4242 4343 4343|/|" + a.ws},
		{"root", "0 0 0|/root|" + a.ws},
	} {
		spec := a.spec("sh", "-c", ids)
		spec.User = c.user
		res, out, errOut := a.run(t, spec)
		if res.ExitCode != 0 || out != c.want {
			t.Errorf("as %q: exit %d, stdout %q, stderr %q; want %q", c.user, res.ExitCode, out, errOut, c.want)
		}
	}
	// An env's HOME stands; nothing else is added.
	spec := a.spec("sh", "-c", `printf '%s|' "$HOME"; env | sort | tr '\n' ' '`)
	spec.User, spec.Env = "nobody", []string{"PATH=" + testPath, "HOME=/custom"}
	if _, out, _ := a.run(t, spec); !strings.HasPrefix(out, "/custom|") || strings.Count(out, "HOME=") != 1 {
		t.Errorf("as nobody with HOME=/custom in the env: %q; want HOME to stay /custom", out)
	}
	// Without a user, nothing changes: no HOME is added.
	if _, out, _ := a.run(t, a.spec("sh", "-c", `printf '%s %s' "$(id -u)" "${HOME-unset}"`)); out != "0 unset" {
		t.Errorf("without a user: %q; want uid 0 and no HOME", out)
	}
}

// A command its user may not execute is exit 126, as any other.
func TestExecUserCannotExecute(t *testing.T) {
	needRoot(t)
	nobody(t)
	a := startAgent(t)
	script := filepath.Join(a.ws, "root-only")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho ran\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	spec := a.spec(script)
	spec.User = "nobody"
	res, out, errOut := a.run(t, spec)
	if res.ExitCode != 126 || out != "" || errOut == "" {
		t.Errorf("a root-only script as nobody: exit %d, stdout %q, stderr %q; want 126 and the reason on stderr", res.ExitCode, out, errOut)
	}
}

// An interactive exec runs as its user too.
func TestExecStartUser(t *testing.T) {
	needRoot(t)
	nb := nobody(t)
	a := startAgent(t)
	spec := a.spec("sh", "-c", "read line; id -u; echo $line")
	spec.User, spec.Interactive = "nobody", true
	col := newCollector()
	p, err := a.c.Start(context.Background(), spec, col.out)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.WriteStdin(context.Background(), []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p, 30*time.Second)
	if want := nb.Uid + "\nhello\n"; col.stdout() != want || p.Result().ExitCode != 0 {
		t.Errorf("interactive as nobody: %q, exit %d; want %q", col.stdout(), p.Result().ExitCode, want)
	}
}

// A name the agent's /etc/passwd does not know is a *UserNotFoundError
// naming it, for an exec and an interactive one; nothing runs.
func TestExecUnknownUser(t *testing.T) {
	a := startAgent(t)
	for _, interactive := range []bool{false, true} {
		marker := filepath.Join(a.ws, fmt.Sprintf("ran-%v", interactive))
		spec := a.spec("touch", marker)
		spec.User, spec.Interactive = "tai42-no-such-user", interactive
		p, err := a.c.Start(context.Background(), spec, newCollector().out)
		if p != nil {
			p.Close()
		}
		var nf *sandbox.UserNotFoundError
		if !errors.As(err, &nf) || nf.User != "tai42-no-such-user" || !errors.Is(err, sandbox.ErrSandbox) {
			t.Errorf("interactive %v: Start as an unknown user = %v; want a *UserNotFoundError for it", interactive, err)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Errorf("interactive %v: the command ran", interactive)
		}
	}
}

// The agent speaks versions 1 and 2, answers a ping in its version, and
// refuses the others naming them.
func TestVersions(t *testing.T) {
	a := startAgent(t)
	for v := minVersion; v <= Version; v++ {
		fc := a.rawConn(t)
		if err := fc.writeJSON(frameRequest, request{V: v, Op: "ping"}); err != nil {
			t.Fatal(err)
		}
		var rep pingReply
		if ef, err := fc.readJSON(frameReply, &rep); err != nil || ef != nil || rep.V != v {
			t.Errorf("ping in version %d: %+v, %+v, %v; want a reply of version %d", v, rep, ef, err, v)
		}
	}
	for _, v := range []int{0, Version + 1} {
		fc := a.rawConn(t)
		if err := fc.writeJSON(frameRequest, request{V: v, Op: "ping"}); err != nil {
			t.Fatal(err)
		}
		if ef, err := fc.readJSON(frameReply, nil); err != nil || ef == nil || ef.Kind != kindVersion {
			t.Errorf("ping in version %d: %+v, %v; want a version error", v, ef, err)
		}
	}
}

// fakeAgent answers every request on its socket with reply; the requests
// it got are returned by the function it returns.
func fakeAgent(t *testing.T, reply func(*frameConn, request)) (*Client, func() []request) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []request
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			fc := newFrameConn(nc)
			var req request
			if _, err := fc.readJSON(frameRequest, &req); err == nil {
				mu.Lock()
				got = append(got, req)
				mu.Unlock()
				reply(fc, req)
			}
			nc.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return dialer(sock), func() []request { mu.Lock(); defer mu.Unlock(); return got }
}

// A client writes an exec with a user in version 2 and everything else in
// version 1; an agent of version 1 (a session an older tai42 started)
// refuses the first, and the client says why and what to do.
func TestUserNeedsVersion2(t *testing.T) {
	old, requests := fakeAgent(t, func(fc *frameConn, req request) {
		switch {
		case req.V != 1:
			_ = fc.writeJSON(frameError, errorFrame{Kind: kindVersion, Message: fmt.Sprintf("protocol version mismatch: the client speaks version %d, the agent speaks version 1", req.V)})
		case req.Op == "ping":
			_ = fc.writeJSON(frameReply, pingReply{V: 1})
		default:
			_ = fc.writeJSON(frameReply, startReply{Failed: true, ExitCode: 127, Message: []byte("not found\n")})
		}
	})
	spec := ExecSpec{Op: "exec", Argv: []string{"id"}, Dir: "/", DirOrig: "/", User: "nobody"}
	_, err := old.Start(context.Background(), spec, nil)
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || se.Op != "exec" || !strings.Contains(err.Error(), `"nobody"`) || !strings.Contains(err.Error(), "older tai42") {
		t.Errorf("an exec as nobody on an agent of version 1: %v; want a *SandboxError naming the user and saying the agent is older", err)
	}
	spec.User = ""
	p, err := old.Start(context.Background(), spec, nil)
	if err != nil {
		t.Fatalf("an exec without a user on an agent of version 1: %v", err)
	}
	p.Close()
	if err := old.Ping(context.Background()); err != nil {
		t.Errorf("Ping of an agent of version 1: %v", err)
	}
	var vs []int
	for _, r := range requests() {
		vs = append(vs, r.V)
	}
	if fmt.Sprint(vs) != "[2 1 1]" {
		t.Errorf("the requests were of versions %v; want [2 1 1] (the exec with a user, the one without, the ping)", vs)
	}
}
