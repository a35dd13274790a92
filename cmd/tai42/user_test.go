package main

import (
	"os"
	"os/user"
	"strings"
	"testing"
)

// "tai42 run --user" and "tai42 exec --user" run the command as that user
// of the session; a malformed user is a usage error (2) before anything is
// made, a name the session does not know an error naming it (1).
func TestUserFlag(t *testing.T) {
	nb, err := user.Lookup("nobody")
	if os.Geteuid() != 0 || err != nil {
		t.Skip("running a command as nobody needs root and a nobody in /etc/passwd")
	}
	dir := t.TempDir()
	r := runIn(t, dir, nil, "--user", "nobody", "--", "sh", "-c", `printf '%s %s' "$(id -u)" "$HOME"`)
	r.want(t, 0)
	if want := nb.Uid + " " + nb.HomeDir; r.stdout != want {
		t.Errorf("run --user nobody: stdout %q; want %q", r.stdout, want)
	}
	r = runIn(t, dir, nil, "-u", "tai42-no-such-user", "--", "true")
	r.want(t, 1)
	if !strings.Contains(r.stderr, `"tai42-no-such-user"`) || !strings.Contains(r.stderr, "/etc/passwd") {
		t.Errorf("run as an unknown user: stderr %q; want it to name the user and /etc/passwd", r.stderr)
	}
	r = runIn(t, dir, nil, "--user", "a:b", "--", "true")
	r.want(t, 2)
	if !strings.Contains(r.stderr, "--user") || !strings.Contains(r.stderr, "uid:gid") {
		t.Errorf("run --user a:b: stderr %q; want a usage error naming --user", r.stderr)
	}

	d := startDaemon(t)
	id := d.create(t)
	for _, args := range [][]string{
		{"exec", "-u", "nobody", id, "--", "id", "-u"},
		{"exec", id, "--user", nb.Uid + ":" + nb.Gid, "--", "id", "-u"},
	} {
		r := d.cli(t, nil, args...)
		r.want(t, 0)
		if r.stdout != nb.Uid+"\n" {
			t.Errorf("%q: stdout %q; want %s", args, r.stdout, nb.Uid)
		}
	}
	r = d.cli(t, nil, "exec", "--user", "tai42-no-such-user", id, "--", "true")
	r.want(t, 1)
	if !strings.Contains(r.stderr, `"tai42-no-such-user"`) {
		t.Errorf("exec as an unknown user: stderr %q; want it to name the user", r.stderr)
	}
	r = d.cli(t, nil, "exec", "--user", "ro ot", id, "--", "true")
	r.want(t, 2)
	if !strings.Contains(r.stderr, "--user") {
		t.Errorf("exec --user 'ro ot': stderr %q; want a usage error naming --user", r.stderr)
	}
}
