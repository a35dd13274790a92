package sandboxtest

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
)

// UserOptions name a user the provider's image knows (in its
// /etc/passwd, with its group in /etc/group or not) and the provider can
// run an exec as: for most images "nobody", 65534, 65534, "/nonexistent".
type UserOptions struct {
	// Name is the user's name, UID and GID its passwd entry's ids.
	Name     string
	UID, GID int
	// Home is its passwd entry's home directory.
	Home string
}

// HostUser is the user name of this machine's /etc/passwd (as os/user
// finds it) as UserOptions, or nil when there is no such user or its entry
// has no home: the user for a provider whose execs run as the host's users
// (a runner on the host, a container of the host's root filesystem).
func HostUser(name string) *UserOptions {
	u, err := user.Lookup(name)
	if err != nil {
		return nil
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil || u.HomeDir == "" {
		return nil
	}
	return &UserOptions{Name: u.Username, UID: uid, GID: gid, Home: u.HomeDir}
}

func (s *suite) userClauses() []clause {
	return []clause{
		{"Name", s.testUserName},
		{"UID", s.testUserUID},
		{"Home", s.testUserHome},
		{"ExecStart", s.testUserExecStart},
		{"Unknown", s.testUserUnknown},
		{"Malformed", s.testUserMalformed},
		{"Refused", s.testUserRefused},
	}
}

func (s *suite) needUser(t *testing.T) *UserOptions {
	t.Helper()
	if s.opts.User == nil {
		t.Skip("Options.User is nil: the provider runs no exec as a user (User/Refused checks that it refuses one)")
	}
	return s.opts.User
}

// idScript prints the exec's uid, gid, HOME and working directory.
const idScript = `printf '%s %s|%s|%s' "$(id -u)" "$(id -g)" "$HOME" "$(pwd)"`

// ids is what idScript prints for uid, gid and home in ws.
func ids(uid, gid int, home, ws string) string {
	return fmt.Sprintf("%d %d|%s|%s", uid, gid, home, ws)
}

// An exec as a user name runs with its passwd entry's uid and gid, its home
// as HOME, in the workspace (the default cwd), whatever the workspace's
// owner: the user starts there even where it may not enter it, as Docker's
// does; and the exec after it, without a user, runs as before.
func (s *suite) testUserName(t *testing.T) {
	u := s.needUser(t)
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	before := run(t, ctx, sess, sandbox.ExecOptions{}, shArgv(idScript)...)
	res := run(t, ctx, sess, sandbox.ExecOptions{User: u.Name}, shArgv(idScript)...)
	if want := ids(u.UID, u.GID, u.Home, sess.WorkspacePath()); res.ExitCode != 0 || res.Stdout != want {
		t.Errorf("Exec as %q: exit %d, stdout %q, stderr %q; want %q (uid gid|HOME|cwd)", u.Name, res.ExitCode, res.Stdout, res.Stderr, want)
	}
	if after := run(t, ctx, sess, sandbox.ExecOptions{}, shArgv(idScript)...); after != before {
		t.Errorf("an exec without a user after one as %q: %+v; want it as before the user's: %+v", u.Name, after, before)
	}
}

// An exec as a decimal uid runs as that uid with its passwd entry's gid;
// as uid:gid with exactly those ids.
func (s *suite) testUserUID(t *testing.T) {
	u := s.needUser(t)
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, spec := range []string{strconv.Itoa(u.UID), fmt.Sprintf("%d:%d", u.UID, u.GID)} {
		res := run(t, ctx, sess, sandbox.ExecOptions{User: spec}, shArgv(`printf '%s %s' "$(id -u)" "$(id -g)"`)...)
		if want := fmt.Sprintf("%d %d", u.UID, u.GID); res.ExitCode != 0 || res.Stdout != want {
			t.Errorf("Exec as %q: exit %d, stdout %q, stderr %q; want %q (uid gid)", spec, res.ExitCode, res.Stdout, res.Stderr, want)
		}
	}
}

// An exec as a user gets its home as HOME unless the spec's env or the
// exec's sets HOME, which then stands (the exec's over the spec's).
func (s *suite) testUserHome(t *testing.T) {
	u := s.needUser(t)
	ctx := s.testContext(t)
	sb, sess := s.fresh(t, func(sp *sandbox.SessionSpec) {
		sp.Env = sandbox.SecretEnv(map[string]string{"TAI42_SUITE_KEEP": "kept"})
	})
	home := shArgv(`printf '%s|%s' "$HOME" "$TAI42_SUITE_KEEP"`)
	if res := run(t, ctx, sess, sandbox.ExecOptions{User: u.Name}, home...); res.Stdout != u.Home+"|kept" {
		t.Errorf("Exec as %q: HOME|spec env = %q; want %q", u.Name, res.Stdout, u.Home+"|kept")
	}
	env := sandbox.SecretEnv(map[string]string{"HOME": "/tai42-exec-home"})
	if res := run(t, ctx, sess, sandbox.ExecOptions{User: u.Name, Env: env}, home...); res.Stdout != "/tai42-exec-home|kept" {
		t.Errorf("Exec as %q with HOME in the exec's env: %q; want that HOME", u.Name, res.Stdout)
	}
	withHome := s.newSession(t, sb, func(sp *sandbox.SessionSpec) {
		sp.Env = sandbox.SecretEnv(map[string]string{"HOME": "/tai42-spec-home"})
	})
	if res := run(t, ctx, withHome, sandbox.ExecOptions{User: u.Name}, shArgv(`printf %s "$HOME"`)...); res.Stdout != "/tai42-spec-home" {
		t.Errorf("Exec as %q in a session whose spec sets HOME: %q; want the spec's", u.Name, res.Stdout)
	}
	if res := run(t, ctx, withHome, sandbox.ExecOptions{User: u.Name, Env: env}, shArgv(`printf %s "$HOME"`)...); res.Stdout != "/tai42-exec-home" {
		t.Errorf("Exec as %q with HOME in the spec's env and the exec's: %q; want the exec's", u.Name, res.Stdout)
	}
}

// An interactive exec runs as its user too, stdin and all.
func (s *suite) testUserExecStart(t *testing.T) {
	u := s.needUser(t)
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{User: u.Name}, shArgv(`read line; `+idScript+`; printf '|%s' "$line"`)...)
	if err := r.h.WriteStdin(ctx, []byte("hello\n")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	r.drain(ctx, execTimeout)
	r.wantExit(0, "the script exits 0")
	if want := ids(u.UID, u.GID, u.Home, sess.WorkspacePath()) + "|hello"; string(r.stdout) != want {
		t.Errorf("ExecStart as %q: stdout %q, stderr %q; want %q", u.Name, r.stdout, r.stderr, want)
	}
}

// A user name the session's /etc/passwd does not know is a
// *UserNotFoundError naming it, from Exec and ExecStart alike, and
// nothing runs.
func (s *suite) testUserUnknown(t *testing.T) {
	s.needUser(t)
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	const name = "tai42-no-such-user"
	check := func(err error, what string) {
		t.Helper()
		if !wantKind(t, err, sandbox.ErrUserNotFound, what) {
			return
		}
		var nf *sandbox.UserNotFoundError
		if !errors.As(err, &nf) || nf.User != name {
			t.Errorf("%s: %q; want a *UserNotFoundError whose User is %q", what, err, name)
		}
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%s: the message %q does not name the user", what, err)
		}
	}
	_, err := sess.Exec(ctx, shArgv("touch ran-exec"), sandbox.ExecOptions{Timeout: execTimeout, User: name})
	check(err, "Exec as an unknown user")
	h, err := sess.ExecStart(ctx, shArgv("touch ran-start"), sandbox.StartOptions{Timeout: execTimeout, User: name})
	check(err, "ExecStart as an unknown user")
	if h != nil {
		_ = h.Kill(ctx)
	}
	for _, f := range []string{"ran-exec", "ran-start"} {
		if exists(t, ctx, sess, f) {
			t.Errorf("the command refused for its unknown user ran (it made %s)", f)
		}
	}
}

// malformedUsers are users no session knows the form of.
var malformedUsers = []string{"a:b", "0:", ":0", "1:2:3", "ro\x00ot", "a user", "-1", "4294967295", strings.Repeat("u", sandbox.MaxUserLen+1)}

// A malformed user (a:b, a NUL, a space, an id out of range, too long) is
// refused with a plain *SandboxError by Exec and ExecStart alike, before
// anything runs: it is never taken for the default user.
func (s *suite) testUserMalformed(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, u := range malformedUsers {
		_, err := sess.Exec(ctx, shArgv("touch ran"), sandbox.ExecOptions{Timeout: execTimeout, User: u})
		wantPlain(t, err, fmt.Sprintf("Exec as the malformed user %q", u))
		h, err := sess.ExecStart(ctx, shArgv("touch ran"), sandbox.StartOptions{Timeout: execTimeout, User: u})
		wantPlain(t, err, fmt.Sprintf("ExecStart as the malformed user %q", u))
		if h != nil {
			_ = h.Kill(ctx)
		}
	}
	if exists(t, ctx, sess, "ran") {
		t.Error("a command refused for its malformed user ran")
	}
}

// A provider that runs no exec as a user (Options.User nil) refuses one
// with a *SandboxError, by Exec and ExecStart alike, and runs nothing: it
// never runs the exec as its default user instead.
func (s *suite) testUserRefused(t *testing.T) {
	if s.opts.User != nil {
		t.Skipf("Options.User names %q: the provider runs execs as users (the other User clauses)", s.opts.User.Name)
	}
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, u := range []string{"nobody", "65534", "65534:65534"} {
		res, err := sess.Exec(ctx, shArgv("id -u; touch ran"), sandbox.ExecOptions{Timeout: execTimeout, User: u})
		if err == nil {
			t.Errorf("Exec as %q: ran (%+v); a provider whose Options.User is nil must refuse it, not run it as another user", u, res)
		} else {
			wantKind(t, err, sandbox.ErrSandbox, "Exec as "+u)
		}
		h, err := sess.ExecStart(ctx, shArgv("touch ran"), sandbox.StartOptions{Timeout: execTimeout, User: u})
		if err == nil {
			_ = h.Kill(ctx)
			t.Errorf("ExecStart as %q: started; a provider whose Options.User is nil must refuse it", u)
		} else {
			wantKind(t, err, sandbox.ErrSandbox, "ExecStart as "+u)
		}
	}
	if exists(t, ctx, sess, "ran") {
		t.Error("a command refused for its user ran")
	}
}
