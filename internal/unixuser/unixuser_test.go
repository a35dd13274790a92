package unixuser

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
)

// root makes a root directory whose etc holds passwd and group (a file is
// left out when its content is "-").
func root(t testing.TB, passwd, group string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"passwd": passwd, "group": group} {
		if content == "-" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const passwd = `# a comment
root:x:0:0:root:/root:/bin/sh

daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
+nisuser::1234:1234:::
-excluded
broken-line
badid:x:notanumber:5:bad:/bad:/bin/sh
toobig:x:4294967295:5:big:/big:/bin/sh
alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash` + "\r" + `
nohome:x:2000:2000::
short:x:3000:3001
alice:x:1001:1001:a second alice, passed over:/elsewhere:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`

const group = `# groups
root:x:0:
daemon:x:1:
users:x:100:alice, bob
wheel:x:10:root,alice
dup:x:100:alice
broken
staff:x:bad:alice
audio:x:29:bob,alice
nogroup:x:65534:
`

func TestLookup(t *testing.T) {
	dir := root(t, passwd, group)
	cases := []struct {
		spec string
		want User
	}{
		{"root", User{UID: 0, GID: 0, Groups: []uint32{10}, Home: "/root"}},
		{"alice", User{UID: 1000, GID: 1000, Groups: []uint32{100, 10, 29}, Home: "/home/alice"}},
		{"nobody", User{UID: 65534, GID: 65534, Home: "/nonexistent"}},
		{"nohome", User{UID: 2000, GID: 2000, Home: "/"}},
		{"short", User{UID: 3000, GID: 3001, Home: "/"}},
		// A uid: its entry's gid, groups and home.
		{"1000", User{UID: 1000, GID: 1000, Groups: []uint32{100, 10, 29}, Home: "/home/alice"}},
		{"0", User{UID: 0, GID: 0, Groups: []uint32{10}, Home: "/root"}},
		// A uid without an entry: gid 0, no groups, home /.
		{"4242", User{UID: 4242, GID: 0, Home: "/"}},
		// uid:gid: exactly those, the uid's home.
		{"1000:29", User{UID: 1000, GID: 29, Home: "/home/alice"}},
		{"4242:4343", User{UID: 4242, GID: 4343, Home: "/"}},
		{"0:0", User{Home: "/root"}},
	}
	for _, c := range cases {
		got, err := Lookup(dir, c.spec)
		if err != nil {
			t.Errorf("Lookup(%q): %v", c.spec, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("Lookup(%q) = %+v; want %+v", c.spec, got, c.want)
		}
	}
}

func TestLookupNotFound(t *testing.T) {
	for _, c := range []struct{ name, passwd string }{
		{"with a passwd", passwd},
		{"without one", "-"},
		{"empty", ""},
	} {
		dir := root(t, c.passwd, group)
		// A comment, a NIS entry, a malformed line and a line with a bad
		// id name nobody.
		for _, spec := range []string{"carol", "nisuser", "broken-line", "badid", "toobig", "excluded", "Alice"} {
			_, err := Lookup(dir, spec)
			var nf *sandbox.UserNotFoundError
			if !errors.As(err, &nf) || nf.User != spec || !errors.Is(err, sandbox.ErrUserNotFound) {
				t.Errorf("%s: Lookup(%q) = %v; want a *UserNotFoundError for it", c.name, spec, err)
			}
		}
	}
	// Without a passwd file a uid still resolves, as Docker's does.
	if u, err := Lookup(root(t, "-", "-"), "1000"); err != nil || !reflect.DeepEqual(u, User{UID: 1000, Home: "/"}) {
		t.Errorf("Lookup(1000) without /etc/passwd = %+v, %v; want uid 1000, gid 0, home /", u, err)
	}
}

// Without a group file a user has no supplementary groups.
func TestLookupNoGroupFile(t *testing.T) {
	u, err := Lookup(root(t, passwd, "-"), "alice")
	if err != nil || len(u.Groups) != 0 || u.UID != 1000 {
		t.Errorf("Lookup(alice) without /etc/group = %+v, %v; want uid 1000 and no groups", u, err)
	}
}

func TestLookupRefusals(t *testing.T) {
	dir := root(t, passwd, group)
	for _, spec := range []string{"", "a:b", "1:2:3", "bad name", "ro\x00ot"} {
		_, err := Lookup(dir, spec)
		if err == nil || errors.Is(err, sandbox.ErrUserNotFound) {
			t.Errorf("Lookup(%q) = %v; want it refused as malformed", spec, err)
		}
	}
	var nf *sandbox.UserNotFoundError
	if _, err := Lookup(filepath.Join(dir, "missing"), "root"); !errors.As(err, &nf) {
		t.Errorf("Lookup in a root that does not exist = %v; want a *UserNotFoundError (it has no /etc/passwd)", err)
	}
	notDir := root(t, "-", "-")
	if err := os.WriteFile(filepath.Join(notDir, "etc", "passwd"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Lookup(filepath.Join(notDir, "etc", "passwd"), "root"); err == nil || errors.Is(err, sandbox.ErrUserNotFound) {
		t.Errorf("Lookup in a root that is a file = %v; want an error saying /etc/passwd cannot be read", err)
	}
	long := root(t, "root:x:0:0:"+strings.Repeat("g", maxLine+1)+":/root:/bin/sh\n", group)
	if _, err := Lookup(long, "root"); err == nil || !strings.Contains(err.Error(), "/etc/passwd") || errors.Is(err, sandbox.ErrUserNotFound) {
		t.Errorf("Lookup with a passwd line over %d bytes = %v; want an error naming /etc/passwd", maxLine, err)
	}
	unreadable := root(t, passwd, group)
	if err := os.Chmod(filepath.Join(unreadable, "etc", "passwd"), 0); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 { // root reads a file of mode 000
		if _, err := Lookup(unreadable, "root"); err == nil || !strings.Contains(err.Error(), "/etc/passwd") {
			t.Errorf("Lookup with an unreadable passwd = %v; want an error naming /etc/passwd", err)
		}
	}
}

func TestCredential(t *testing.T) {
	u := User{UID: 7, GID: 8, Groups: []uint32{9, 10}}
	c := u.Credential()
	if c.Uid != 7 || c.Gid != 8 || !reflect.DeepEqual(c.Groups, []uint32{9, 10}) || c.NoSetGroups {
		t.Errorf("Credential = %+v", c)
	}
	c.Groups[0] = 99
	if u.Groups[0] != 9 {
		t.Error("the credential shares the user's groups slice")
	}
	if c := (User{UID: 1}).Credential(); len(c.Groups) != 0 || c.NoSetGroups {
		t.Errorf("a user without groups gets %+v; want its groups set to none", c)
	}
}

func TestCheckMapped(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	session := write("session", "         0    1000000      65536\n")
	split := write("split", "0 1000 1\n1000 2000000 10\n")
	full := write("full", "         0          0 4294967295\n")
	ok := []struct {
		u          User
		uids, gids string
	}{
		{User{UID: 0, GID: 0}, session, session},
		{User{UID: 65535, GID: 65534, Groups: []uint32{100}}, session, session},
		{User{UID: 1009, GID: 0}, split, split},
		{User{UID: 4294967294, GID: 4294967294}, full, full},
	}
	for _, c := range ok {
		if err := checkMapped(c.u, c.uids, c.gids); err != nil {
			t.Errorf("checkMapped(%+v): %v", c.u, err)
		}
	}
	bad := []struct {
		u    User
		file string
		want string
	}{
		{User{UID: 65536}, session, "uid 65536"},
		{User{UID: 1, GID: 70000}, session, "gid 70000"},
		{User{UID: 1, GID: 1, Groups: []uint32{5, 65536}}, session, "supplementary group 65536"},
		{User{UID: 1010}, split, "uid 1010"},
		{User{UID: 1}, split, "uid 1"},
	}
	for _, c := range bad {
		err := checkMapped(c.u, c.file, c.file)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("checkMapped(%+v) = %v; want an error naming %s", c.u, err, c.want)
		}
	}
	if err := checkMapped(User{UID: 65536}, session, session); err == nil || !strings.Contains(err.Error(), "0-65535") {
		t.Errorf("the refusal %v does not say which ids are mapped", err)
	}
	if err := checkMapped(User{}, filepath.Join(dir, "none"), session); err == nil {
		t.Error("an unreadable uid_map: want an error")
	}
	if err := CheckMapped(User{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}); err != nil {
		t.Errorf("CheckMapped of this process's own ids: %v", err)
	}
}

// FuzzScan: no content of a passwd or group file makes Lookup panic, and
// what it resolves by name comes from a line that names it.
func FuzzScan(f *testing.F) {
	f.Add(passwd, group, "alice")
	f.Add("a:b:c:d", "g:x:1:a,,b", "a")
	f.Add("::::::", ":::", "1")
	f.Add("x:x:1:2\n", "", "1:2")
	f.Fuzz(func(t *testing.T, pw, gr, spec string) {
		if sandbox.ValidUser(spec) != nil || spec == "" {
			return
		}
		dir := root(t, pw, gr)
		u, err := Lookup(dir, spec)
		if err != nil {
			return
		}
		if !strings.Contains(spec, ":") && !digits(spec) && !strings.Contains(pw, spec+":") {
			t.Errorf("Lookup(%q) = %+v from a passwd that has no line naming it", spec, u)
		}
		if u.Home == "" {
			t.Errorf("Lookup(%q) has an empty home", spec)
		}
	})
}

func digits(s string) bool { _, ok := parseID(s); return ok && s != "" }
