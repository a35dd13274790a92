package host_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/host"
)

// execAs runs a shell script in s as user.
func execAs(s sandbox.Session, user, script string) (sandbox.ExecResult, error) {
	return s.Exec(context.Background(), []string{"sh", "-c", script}, sandbox.ExecOptions{Timeout: 20 * time.Second, User: user})
}

// A root runner runs an exec as the user it names, resolved in the host's
// /etc/passwd: with its ids and home, in the workspace (the runner's, mode
// 0700) and the session's network namespace; the env's HOME stands.
func TestExecUser(t *testing.T) {
	needRoot(t)
	nb, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("this host has no user nobody: %v", err)
	}
	sb, _ := newHost(t, host.Options{})
	for _, network := range []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkEgress} {
		s := mustCreate(t, sb, hostSpec(network))
		const ids = `printf '%s %s %s|%s|%s' "$(id -u)" "$(id -g)" "$(id -G)" "$HOME" "$(pwd)"`
		for _, c := range []struct{ user, want string }{
			{"nobody", fmt.Sprintf("%s %s %s|%s|%s", nb.Uid, nb.Gid, nb.Gid, nb.HomeDir, s.WorkspacePath())},
			{nb.Uid + ":4321", fmt.Sprintf("%s 4321 4321|%s|%s", nb.Uid, nb.HomeDir, s.WorkspacePath())},
			{"4242", "4242 0 0|/|" + s.WorkspacePath()},
		} {
			res, err := execAs(s, c.user, ids)
			if err != nil || res.ExitCode != 0 || res.Stdout != c.want {
				t.Errorf("network %s, as %q: %+v, %v; want stdout %q", network, c.user, res, err, c.want)
			}
		}
		if network == sandbox.NetworkNone {
			// The session's own loopback, not the host's network.
			if res, err := execAs(s, "nobody", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"); err != nil || res.Stdout != "lo\n" {
				t.Errorf("network none, as nobody: network devices %+v, %v; want lo alone", res, err)
			}
		}
		res, err := s.Exec(context.Background(), []string{"sh", "-c", `printf %s "$HOME"`}, sandbox.ExecOptions{Timeout: 20 * time.Second, User: "nobody", Env: sandbox.SecretEnv(map[string]string{"HOME": "/custom"})})
		if err != nil || res.Stdout != "/custom" {
			t.Errorf("as nobody with HOME=/custom: %+v, %v; want HOME to stay", res, err)
		}
		if res := run(t, s, nil, "sh", "-c", `printf %s "$HOME"`); res.Stdout != s.WorkspacePath() {
			t.Errorf("without a user, HOME is %q; want the workspace", res.Stdout)
		}
	}
}

// A name the host does not know is a *UserNotFoundError; nothing runs.
func TestExecUnknownUser(t *testing.T) {
	sb, _ := newHost(t, host.Options{})
	s := mustCreate(t, sb, hostSpec(sandbox.NetworkEgress))
	_, err := execAs(s, "tai42-no-such-user", "touch ran")
	if nf, ok := errors.AsType[*sandbox.UserNotFoundError](err); !ok || nf.User != "tai42-no-such-user" {
		t.Errorf("as an unknown user: %v; want a *UserNotFoundError for it", err)
	}
	_, err = s.ExecStart(context.Background(), []string{"touch", "ran"}, sandbox.StartOptions{Timeout: 20 * time.Second, User: "tai42-no-such-user"})
	if !errors.Is(err, sandbox.ErrUserNotFound) {
		t.Errorf("ExecStart as an unknown user: %v; want a *UserNotFoundError", err)
	}
	if _, err := os.Stat(s.WorkspacePath() + "/ran"); err == nil {
		t.Error("the command ran")
	}
}

// A root runner cannot run an exec as a user in a session with caps: it
// refuses it, saying why, and runs nothing.
func TestExecUserCapped(t *testing.T) {
	needRoot(t)
	sb, _ := newHost(t, host.Options{})
	spec := hostSpec(sandbox.NetworkEgress)
	spec.MemoryMB = 256
	s := mustCreate(t, sb, spec)
	_, err := execAs(s, "nobody", "touch ran")
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || errors.Is(err, sandbox.ErrUserNotFound) || !strings.Contains(err.Error(), "caps") {
		t.Errorf("as nobody in a capped session: %v; want a *SandboxError saying the caps are why", err)
	}
	if _, err := os.Stat(s.WorkspacePath() + "/ran"); err == nil {
		t.Error("the command ran")
	}
}

// A runner that is not root runs an exec as its own user alone, and
// refuses another, naming its own uid; TestUnprivileged runs this as
// nobody when the tests run as root.
func TestExecUserUnprivileged(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root: TestUnprivileged runs this test as nobody")
	}
	me, err := user.Current()
	if err != nil {
		t.Skipf("this process's user is not in /etc/passwd: %v", err)
	}
	sb, _ := newHost(t, host.Options{})
	s := mustCreate(t, sb, hostSpec(sandbox.NetworkEgress))
	for _, u := range []string{me.Username, me.Uid} {
		res, err := execAs(s, u, "id -u")
		if err != nil || res.Stdout != me.Uid+"\n" {
			t.Errorf("as its own user %q: %+v, %v; want uid %s", u, res, err, me.Uid)
		}
	}
	for _, u := range []string{"root", "0", me.Uid + ":0"} {
		if me.Gid == "0" && u == me.Uid+":0" {
			continue
		}
		_, err := execAs(s, u, "touch ran")
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || errors.Is(err, sandbox.ErrUserNotFound) || !strings.Contains(err.Error(), "runs as uid "+me.Uid) {
			t.Errorf("as %q: %v; want a *SandboxError saying the runner runs as uid %s", u, err, me.Uid)
		}
	}
	if _, err := os.Stat(s.WorkspacePath() + "/ran"); err == nil {
		t.Error("a refused command ran")
	}
}
