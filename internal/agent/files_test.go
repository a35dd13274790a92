package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
)

func (a *testAgent) ref(rel string) FileRef { return FileRef{Root: a.ws, Rel: rel, Orig: rel} }

func (a *testAgent) get(t *testing.T, f FileRef) ([]byte, error) {
	t.Helper()
	rc, size, err := a.c.OpenFile(context.Background(), f)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err == nil && int64(len(b)) != size {
		t.Errorf("get %q: %d bytes, but the size said %d", f.Orig, len(b), size)
	}
	return b, err
}

func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tai42-put-") {
			t.Errorf("a temporary file is left: %s", e.Name())
		}
	}
}

func TestFileRoundTrip(t *testing.T) {
	a := startAgent(t)
	ctx := context.Background()
	f := a.ref("a/b/c.txt") // parents are created
	if err := a.c.PutFile(ctx, f, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(a.ws, "a/b/c.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("on disk: %q, %v", b, err)
	}
	if b, err := a.get(t, f); err != nil || string(b) != "hello" {
		t.Fatalf("get: %q, %v", b, err)
	}
	// Replace keeps the existing mode; an empty file is fine.
	if err := os.Chmod(filepath.Join(a.ws, "a/b/c.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.c.PutFile(ctx, f, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(a.ws, "a/b/c.txt"))
	if err != nil || fi.Size() != 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("after replace: %v %v", fi, err)
	}
	if b, err := a.get(t, f); err != nil || len(b) != 0 {
		t.Fatalf("get empty: %q, %v", b, err)
	}
	noTempFiles(t, filepath.Join(a.ws, "a/b"))
	// A new file gets 0644 whatever the umask.
	if err := a.c.PutFile(ctx, a.ref("new"), strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(a.ws, "new")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("new file: %v %v", fi, err)
	}
}

func TestFileLarge(t *testing.T) {
	a := startAgent(t)
	data := make([]byte, 64<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	f := a.ref("big.bin")
	if err := a.c.PutFile(context.Background(), f, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, err := a.get(t, f)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("64 MiB round trip: %d bytes, %v; want byte-exact", len(got), err)
	}
}

type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// A failed upload keeps the old file and leaves no temporary file.
func TestFileAbortKeepsOld(t *testing.T) {
	a := startAgent(t)
	f := a.ref("keep.txt")
	if err := a.c.PutFile(context.Background(), f, strings.NewReader("old")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := a.c.PutFile(context.Background(), f, &failingReader{strings.NewReader(strings.Repeat("new", 200000)), boom})
	var se *sandbox.SandboxError
	if !errors.Is(err, boom) || !errors.As(err, &se) || se.Op != "put_file" || !strings.Contains(err.Error(), "old content stays") {
		t.Fatalf("PutFile with a failing reader: %v", err)
	}
	if b, err := a.get(t, f); err != nil || string(b) != "old" {
		t.Fatalf("after the abort: %q, %v; want the old content", b, err)
	}
	noTempFiles(t, a.ws)

	// A cancelled upload too.
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("partial"))
		cancel()
		pw.CloseWithError(errors.New("never read"))
	}()
	err = a.c.PutFile(ctx, f, pr)
	if !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "never read") {
		t.Fatalf("cancelled PutFile: %v", err)
	}
	if b, err := a.get(t, f); err != nil || string(b) != "old" {
		t.Fatalf("after the cancel: %q, %v; want the old content", b, err)
	}
}

func TestFileErrors(t *testing.T) {
	a := startAgent(t)
	ctx := context.Background()
	if err := os.Mkdir(filepath.Join(a.ws, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", filepath.Join(a.ws, "dangling")); err != nil {
		t.Fatal(err)
	}
	// Missing: FileNotFoundError with the caller's path.
	_, err := a.get(t, FileRef{Root: a.ws, Rel: "no/such", Orig: "./no/such"})
	var nf *sandbox.FileNotFoundError
	if !errors.As(err, &nf) || nf.Path != "./no/such" || !errors.Is(err, sandbox.ErrFileNotFound) {
		t.Errorf("missing: %T %v", err, err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"get dir", func() error { _, err := a.get(t, a.ref("dir")); return err }(), `sandbox: get_file: "dir" is a directory, not a file`},
		{"get root", func() error { _, err := a.get(t, a.ref(".")); return err }(), `sandbox: get_file: "." is a directory, not a file`},
		{"get dangling", func() error { _, err := a.get(t, a.ref("dangling")); return err }(), `sandbox: get_file: "dangling" is a symlink whose target does not exist in the workspace`},
		{"put dir", a.c.PutFile(ctx, a.ref("dir"), strings.NewReader("x")), `sandbox: put_file: "dir" is a directory`},
		{"put root", a.c.PutFile(ctx, a.ref("."), strings.NewReader("x")), `sandbox: put_file: "." is the workspace itself; name a file`},
	} {
		var se *sandbox.SandboxError
		if !errors.As(tc.err, &se) || errors.Is(tc.err, sandbox.ErrFileNotFound) || tc.err.Error() != tc.want {
			t.Errorf("%s: %T %v, want %q", tc.name, tc.err, tc.err, tc.want)
		}
	}
	// A parent that is a file.
	if err := os.WriteFile(filepath.Join(a.ws, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = a.c.PutFile(ctx, a.ref("file/x"), strings.NewReader("x"))
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), `"file/x": cannot create its parent directory`) {
		t.Errorf("put under a file: %v", err)
	}
	// A FIFO is not a regular file (and does not block the get).
	if err := mkfifo(filepath.Join(a.ws, "fifo")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.get(t, a.ref("fifo")); err == nil || err.Error() != `sandbox: get_file: "fifo" is not a regular file (a FIFO)` {
		t.Errorf("get fifo: %v", err)
	}
}

// A symlink or .. that leads out of the root is refused, for put and get,
// and nothing outside is read or written.
func TestFileEscapes(t *testing.T) {
	a := startAgent(t)
	ctx := context.Background()
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"abs": secret, "rel": "../../" + filepath.Base(outside) + "/secret", "dirlink": outside} {
		if err := os.Symlink(target, filepath.Join(a.ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(a.ws, "rel")); err != nil || string(b) != "outside" {
		t.Fatalf("the relative link does not lead to the file outside (%q, %v): the test would prove nothing", b, err)
	}
	for _, rel := range []string{"abs", "rel", "dirlink/secret"} {
		_, err := a.get(t, a.ref(rel))
		var se *sandbox.SandboxError
		if !errors.As(err, &se) || errors.Is(err, sandbox.ErrFileNotFound) {
			t.Errorf("get %s: %v, want a SandboxError", rel, err)
		} else if !strings.Contains(err.Error(), "leads out of the workspace") {
			t.Errorf("get %s: %v, want the escape named", rel, err)
		}
		// A put replaces the link itself (as the host runner does): it
		// does not follow it.
		err = a.c.PutFile(ctx, a.ref(rel), strings.NewReader("in"))
		if rel == "dirlink/secret" {
			if !errors.As(err, &se) || !strings.Contains(err.Error(), "leads out of the workspace") {
				t.Errorf("put %s: %v, want the escape refused", rel, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("put %s: %v", rel, err)
		}
		if fi, err := os.Lstat(filepath.Join(a.ws, rel)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("put %s: %v %v, want the link replaced by a regular file", rel, fi, err)
		}
	}
	err := a.c.PutFile(ctx, a.ref("dirlink/new"), strings.NewReader("pwned"))
	if err == nil || !strings.Contains(err.Error(), "leads out of the workspace") {
		t.Errorf("put through a directory link: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "outside" {
		t.Fatalf("the file outside was changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Fatal("a file was created outside the root")
	}
	// .. in the path is refused before any access.
	for _, rel := range []string{"../x", "a/../../x", "/etc/passwd", ""} {
		if _, err := a.get(t, FileRef{Root: a.ws, Rel: rel, Orig: rel}); err == nil {
			t.Errorf("get %q: no error", rel)
		}
		if err := a.c.PutFile(ctx, FileRef{Root: a.ws, Rel: rel, Orig: rel}, strings.NewReader("x")); err == nil {
			t.Errorf("put %q: no error", rel)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(a.ws), "x")); err == nil {
		t.Fatal("a file was created outside the root through ..")
	}
}

// Root "/" is the agent's whole filesystem: absolute symlinks resolve.
func TestFileRootSlash(t *testing.T) {
	a := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("t"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	rel := strings.TrimPrefix(dir, "/")
	if b, err := a.get(t, FileRef{Root: "/", Rel: rel + "/link", Orig: dir + "/link"}); err != nil || string(b) != "t" {
		t.Fatalf("get through an absolute symlink under /: %q, %v", b, err)
	}
	f := FileRef{Root: "/", Rel: rel + "/sub/new", Orig: dir + "/sub/new"}
	if err := a.c.PutFile(ctx, f, strings.NewReader("n")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "sub/new")); err != nil || string(b) != "n" {
		t.Fatalf("put under /: %q, %v", b, err)
	}
	_, err := a.get(t, FileRef{Root: "/", Rel: rel + "/none", Orig: dir + "/none"})
	var nf *sandbox.FileNotFoundError
	if !errors.As(err, &nf) || nf.Path != dir+"/none" {
		t.Fatalf("missing under /: %v", err)
	}
}

// Names that are not UTF-8 are carried intact.
func TestFileNonUTF8Name(t *testing.T) {
	a := startAgent(t)
	name := "f\xff\xfe"
	if err := a.c.PutFile(context.Background(), a.ref(name), strings.NewReader("bytes")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(a.ws, name)); err != nil || string(b) != "bytes" {
		t.Fatalf("on disk: %q %v", b, err)
	}
	if b, err := a.get(t, a.ref(name)); err != nil || string(b) != "bytes" {
		t.Fatalf("get: %q %v", b, err)
	}
}

// A reader closed early stops the agent; reading after Close fails.
func TestOpenFileCloseEarly(t *testing.T) {
	a := startAgent(t)
	data := make([]byte, 8<<20)
	if err := os.WriteFile(filepath.Join(a.ws, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	rc, size, err := a.c.OpenFile(context.Background(), a.ref("f"))
	if err != nil || size != int64(len(data)) {
		t.Fatalf("OpenFile: %d %v", size, err)
	}
	buf := make([]byte, 1000)
	if n, err := io.ReadFull(rc, buf); n != 1000 || err != nil {
		t.Fatalf("read: %d %v", n, err)
	}
	rc.Close()
	if _, err := rc.Read(buf); err == nil {
		t.Fatal("Read after Close succeeded")
	}
}
