package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tai42/sandbox/internal/unixuser/unixusertest"
)

// needRoot skips a test that chowns files to another user.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a file another user's needs root")
	}
}

// wantUntrusted checks that err is the refusal of an untrusted path,
// a usage error (exit 2), and that its message says every one of want.
func wantUntrusted(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, errUntrusted) {
		t.Fatalf("%s: %v; want a refusal matching errUntrusted", what, err)
	}
	if code := errorExitCode(err); code != exitUsage {
		t.Errorf("%s: exit %d; want %d", what, code, exitUsage)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
}

// The attack: an unprivileged user makes the state directory a root
// daemon will use (the docs' /tmp examples) and plants a token of theirs
// in it, mode 0600. The daemon must refuse the directory, not accept the
// token; and a directory group or others may write to is refused too.
func TestStateDirForeign(t *testing.T) {
	needRoot(t)
	state := filepath.Join(t.TempDir(), "planted")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(state, tokenFileName)
	if err := os.WriteFile(token, []byte("planted-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{state, token} {
		if err := os.Chown(p, unixusertest.Nobody, unixusertest.Nobody); err != nil {
			t.Fatal(err)
		}
	}
	lock, err := lockStateDir(state)
	if err == nil {
		lock.Close()
	}
	wantUntrusted(t, "a state directory nobody made", err, state, "uid 65534", "--state-dir", "chown")
	if tok, _, _, err := serveToken(serveConfig{stateDir: state}); err == nil {
		t.Errorf("the planted token was accepted (%d bytes)", len(tok))
	} else if strings.Contains(err.Error(), "planted-token") {
		t.Errorf("the error shows the token: %v", err)
	}
	// tai42 run and tai42 mcp on the embedded provider refuse it too.
	r := runCLI(t, nil, nil, "run", "--provider", "host", "--state-dir", state, "--", "true")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "uid 65534") {
		t.Errorf("run on the planted state directory: stderr %q", r.stderr)
	}

	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	lock, err = lockStateDir(open)
	if err == nil {
		lock.Close()
	}
	wantUntrusted(t, "a state directory of mode 0777", err, open, "0777", "chmod 700")
}

// The parents a state directory needs are made private, and a parent
// another user made is refused like the directory itself.
func TestStateDirParents(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "state")
	lock, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	lock.Close()
	for _, p := range []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), dir} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v; want mode 0700", p, fi.Mode(), err)
		}
	}
	// A symbolic link another user made, to a directory of root's.
	link := filepath.Join(base, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, unixusertest.Nobody, unixusertest.Nobody); err != nil {
		t.Fatal(err)
	}
	err = ensureStateDir(link)
	wantUntrusted(t, "a state directory that is nobody's link", err, link, "symbolic link", "uid 65534")
}

// The token file is opened without following a link at its end, and one
// another user owns is refused even at mode 0600.
func TestTokenFileTrust(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := readTokenFile(file); err != nil || tok != "0123456789abcdef0123" {
		t.Fatalf("a token file of root's, 0600: %q %v", tok, err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	_, err := readTokenFile(link)
	wantUntrusted(t, "a token file that is a link", err, link, "symbolic link")

	foreign := filepath.Join(dir, "foreign")
	if err := os.WriteFile(foreign, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, unixusertest.Nobody, unixusertest.Nobody); err != nil {
		t.Fatal(err)
	}
	_, err = readTokenFile(foreign)
	wantUntrusted(t, "a token file nobody owns", err, foreign, "uid 65534", "chown 0")
	if _, _, _, err := serveToken(serveConfig{tokenFile: foreign}); !errors.Is(err, errUntrusted) {
		t.Errorf("serve --token-file of nobody's: %v", err)
	}
}

// The client commands read the token from --token-file or
// $TAI42_TOKEN_FILE, since --token shows in ps; --token's help says so.
func TestClientTokenFile(t *testing.T) {
	d := startDaemon(t)
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := map[string]string{urlEnv: d.url}
	runCLI(t, nil, url, "ls", "--token-file", path).want(t, exitOK)
	runCLI(t, nil, map[string]string{urlEnv: d.url, tokenFileEnv: path}, "ls").want(t, exitOK)
	// The flag wins over the variable.
	runCLI(t, nil, map[string]string{urlEnv: d.url, tokenEnv: "wrong-token-0123456789"}, "ls", "--token-file", path).want(t, exitOK)

	r := runCLI(t, nil, url, "ls", "--token-file", path, "--token", testToken)
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--token-file") || strings.Contains(r.stderr, testToken) {
		t.Errorf("both --token and --token-file: stderr %q", r.stderr)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, url, "ls", "--token-file", path)
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "chmod 600") || strings.Contains(r.stderr, testToken) {
		t.Errorf("a token file of mode 0644: stderr %q", r.stderr)
	}

	for _, args := range [][]string{{"ls", "--help"}, {"mcp", "--help"}, {"serve", "--help"}} {
		r := runCLI(t, nil, nil, args...)
		if !strings.Contains(r.stdout, "visible to every user of this machine in ps") || !strings.Contains(r.stdout, "--token-file") {
			t.Errorf("%q: --token's help does not say it shows in ps, or offer --token-file:\n%s", args, r.stdout)
		}
	}
}
