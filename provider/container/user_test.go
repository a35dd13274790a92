package container_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/provider/container"
)

// asUser runs a shell script in sess as user.
func asUser(t *testing.T, sess sandbox.Session, user, script string) (sandbox.ExecResult, error) {
	t.Helper()
	return sess.Exec(ctxFor(t), []string{"sh", "-c", script}, sandbox.ExecOptions{Timeout: execTimeout, User: user})
}

// TestExecUser: an exec as a user of the session's own /etc/passwd (the
// image's nobody, and a user an exec added) runs with its ids and
// home, in the workspace, which stays root's: the user cannot write there
// until root shares it. A uid the session's user namespace does not map
// is refused naming it; with the provider in mode off every uid is
// mapped.
func TestExecUser(t *testing.T) {
	forEachSetup(t, func(t *testing.T, p *testProvider, image string) {
		sess := p.session(t, spec(image, sandbox.NetworkNone))
		res, err := asUser(t, sess, "nobody", `printf '%s %s|%s|%s' "$(id -u)" "$(id -g)" "$HOME" "$(pwd)"`)
		if want := "65534 65534|/nonexistent|/workspace"; err != nil || res.Stdout != want {
			t.Errorf("as nobody: %+v, %v; want stdout %q", res, err, want)
		}
		if res, err := asUser(t, sess, "nobody", "touch /workspace/by-nobody"); err != nil || res.ExitCode == 0 {
			t.Errorf("nobody writing in root's workspace: %+v, %v; want it refused by the workspace's mode", res, err)
		}
		mustSh(t, sess, "chmod 1777 /workspace")
		if res, err := asUser(t, sess, "nobody", "touch /workspace/by-nobody && stat -c %u /workspace/by-nobody"); err != nil || res.Stdout != "65534\n" {
			t.Errorf("nobody writing in a shared workspace: %+v, %v; want a file of uid 65534", res, err)
		}

		// A user an exec adds is known to the next exec.
		mustSh(t, sess, `echo 'tai42-tester:x:4321:4322::/home/tester:/bin/sh' >> /etc/passwd && echo 'tai42-extra:x:4400:tai42-tester' >> /etc/group`)
		res, err = asUser(t, sess, "tai42-tester", `printf '%s %s %s|%s' "$(id -u)" "$(id -g)" "$(id -G)" "$HOME"`)
		if want := "4321 4322 4322 4400|/home/tester"; err != nil || res.Stdout != want {
			t.Errorf("as a user an exec added: %+v, %v; want stdout %q", res, err, want)
		}

		_, err = asUser(t, sess, "tai42-no-such-user", "true")
		if nf, ok := errors.AsType[*sandbox.UserNotFoundError](err); !ok || nf.User != "tai42-no-such-user" {
			t.Errorf("as an unknown user: %v; want a *UserNotFoundError for it", err)
		}

		for _, u := range []string{fmt.Sprint(container.UserNamespaceSize), fmt.Sprintf("0:%d", container.UserNamespaceSize+4)} {
			res, err := asUser(t, sess, u, "id -u")
			if !container.RemapsUsers(p.sb) {
				if err != nil || res.ExitCode != 0 {
					t.Errorf("as %s without a user namespace: %+v, %v; want it run", u, res, err)
				}
				continue
			}
			var se *sandbox.SandboxError
			if !errors.As(err, &se) || errors.Is(err, sandbox.ErrUserNotFound) || !strings.Contains(err.Error(), "outside") ||
				!strings.Contains(err.Error(), fmt.Sprintf("0-%d", container.UserNamespaceSize-1)) {
				t.Errorf("as %s in a remapped session: %+v, %v; want a *SandboxError naming the id and the mapped range", u, res, err)
			}
		}
	})
}

// TestExecStartUser: an interactive exec runs as its user too.
func TestExecStartUser(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		p := newProvider(t, rt)
		sess := p.session(t, spec(sandbox.HostImage, sandbox.NetworkNone))
		h, err := sess.ExecStart(ctxFor(t), []string{"sh", "-c", "id -u"}, sandbox.StartOptions{Timeout: execTimeout, User: "65534:65534"})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = h.Kill(ctxFor(t)) }()
		var out strings.Builder
		for {
			it, err := h.Next(ctxFor(t))
			if err != nil {
				t.Fatalf("Next: %v (output so far %q)", err, out.String())
			}
			if c, ok := it.(*sandbox.StreamChunk); ok {
				out.Write(c.Data)
				continue
			}
			if ex := it.(*sandbox.StreamExit); ex.ExitCode != 0 || out.String() != "65534\n" {
				t.Errorf("interactive as 65534:65534: exit %d, output %q; want 0 and 65534", ex.ExitCode, out.String())
			}
			return
		}
	})
}
