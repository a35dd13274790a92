package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func (s *suite) fileClauses() []clause {
	return []clause{
		{"RoundTrip", s.testFilesRoundTrip},
		{"Parents", s.testFilesParents},
		{"Overwrite", s.testFilesOverwrite},
		{"AbsoluteInside", s.testFilesAbsoluteInside},
		{"SharedWithExec", s.testFilesSharedWithExec},
		{"NotFound", s.testFilesNotFound},
		{"Directory", s.testFilesDirectory},
		{"PutOverDirectory", s.testFilesPutOverDirectory},
		{"Unreadable", s.testFilesUnreadable},
		{"DanglingSymlink", s.testFilesDanglingSymlink},
		{"PermissionDenied", s.testFilesPermissionDenied},
		{"BadPaths", s.testFilesBadPaths},
		{"Escapes", s.testFilesEscapes},
		{"SymlinkEscapes", s.testFilesSymlinkEscapes},
	}
}

func mustGet(t *testing.T, ctx context.Context, sess sandbox.Session, p string) []byte {
	t.Helper()
	data, err := sess.GetFile(ctx, p)
	if err != nil {
		t.Fatalf("GetFile(%q): %v", p, err)
	}
	return data
}

// roundTrip puts data at p and checks that GetFile(get) returns it intact.
func roundTrip(t *testing.T, ctx context.Context, sess sandbox.Session, p, get string, data []byte) {
	t.Helper()
	mustPut(t, ctx, sess, p, data)
	if got := mustGet(t, ctx, sess, get); !bytes.Equal(got, data) {
		t.Errorf("GetFile(%q) after PutFile(%q) of %d bytes returned %d bytes (equal: false); want the bytes put, intact", get, p, len(data), len(got))
	}
}

// Binary data round-trips intact.
func (s *suite) testFilesRoundTrip(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	roundTrip(t, ctx, sess, "every-byte.bin", "every-byte.bin", every)
	roundTrip(t, ctx, sess, "random.bin", "random.bin", randomBytes(4<<20))
	roundTrip(t, ctx, sess, "empty.bin", "empty.bin", []byte{})
}

// PutFile creates missing parent directories.
func (s *suite) testFilesParents(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	roundTrip(t, ctx, sess, "a/b/c/f.bin", "a/b/c/f.bin", []byte("deep"))
	mustSh(t, ctx, sess, `[ -d a/b/c ]`)
}

// PutFile replaces an existing file whole: no tail of the old content stays.
func (s *suite) testFilesOverwrite(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustPut(t, ctx, sess, "f.txt", bytes.Repeat([]byte("long content "), 100))
	roundTrip(t, ctx, sess, "f.txt", "f.txt", []byte("short"))
}

// An absolute path inside the workspace is the same file as the relative
// one.
func (s *suite) testFilesAbsoluteInside(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	abs := path.Join(sess.WorkspacePath(), "abs", "f.txt")
	roundTrip(t, ctx, sess, abs, "abs/f.txt", []byte("absolute"))
	roundTrip(t, ctx, sess, "abs/g.txt", path.Join(sess.WorkspacePath(), "abs", "g.txt"), []byte("relative"))
}

// Files put are what execs see, and files execs make are what GetFile reads.
func (s *suite) testFilesSharedWithExec(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustPut(t, ctx, sess, "in/put.txt", []byte("from put_file"))
	if got := mustSh(t, ctx, sess, "cat in/put.txt"); got != "from put_file" {
		t.Errorf("Exec(cat in/put.txt) = %q; want \"from put_file\", the file PutFile wrote", got)
	}
	mustSh(t, ctx, sess, "mkdir -p out && printf 'from exec' > out/made.txt")
	if got := mustGet(t, ctx, sess, "out/made.txt"); string(got) != "from exec" {
		t.Errorf("GetFile(out/made.txt) = %q; want \"from exec\", the file the exec made", got)
	}
}

// GetFile of a path where nothing exists is a *FileNotFoundError naming the
// path.
func (s *suite) testFilesNotFound(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, p := range []string{"missing.txt", "no/such/dir/missing.txt", path.Join(sess.WorkspacePath(), "missing.txt")} {
		_, err := sess.GetFile(ctx, p)
		what := "GetFile(" + strconv.Quote(p) + ") of a path where nothing exists"
		if !wantKind(t, err, sandbox.ErrFileNotFound, what) {
			continue
		}
		var nf *sandbox.FileNotFoundError
		if !errors.As(err, &nf) {
			t.Errorf("%s: %q does not convert to *sandbox.FileNotFoundError", what, err)
		} else if !strings.Contains(nf.Path, "missing.txt") {
			t.Errorf("%s: FileNotFoundError.Path = %q; want the path asked for", what, nf.Path)
		}
	}
}

// GetFile of a directory is a plain *SandboxError, never a
// FileNotFoundError: something exists there.
func (s *suite) testFilesDirectory(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustPut(t, ctx, sess, "d/f", []byte("f"))
	for _, p := range []string{"d", "d/", ".", sess.WorkspacePath()} {
		_, err := sess.GetFile(ctx, p)
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+") of a directory")
	}
}

// PutFile over a directory fails and leaves the directory as it was.
func (s *suite) testFilesPutOverDirectory(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustPut(t, ctx, sess, "d/f", []byte("kept"))
	err := sess.PutFile(ctx, "d", []byte("over"))
	wantPlainPath(t, err, "d", "PutFile onto a directory")
	if got := mustGet(t, ctx, sess, "d/f"); string(got) != "kept" {
		t.Errorf("GetFile(d/f) after a PutFile onto d = %q; want \"kept\": a failed PutFile changes nothing", got)
	}
}

// GetFile of something that exists but cannot be read as a file is a plain
// *SandboxError, and returns promptly.
func (s *suite) testFilesUnreadable(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustSh(t, ctx, sess, "mkfifo fifo && ln -s loop loop")
	unreadable := map[string]string{"fifo": "a FIFO", "loop": "a symlink loop"}
	for p, what := range unreadable {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := sess.GetFile(fctx, p)
		cancel()
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+") of "+what)
	}
}

// GetFile of a symlink whose target, inside the workspace, does not exist
// is a plain *SandboxError naming the path: something (the link) exists
// there, and FileNotFoundError is for where nothing exists, and only then.
func (s *suite) testFilesDanglingSymlink(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustSh(t, ctx, sess, "mkdir d && ln -s missing-target dangling && ln -s ../missing-target d/dangling")
	for _, p := range []string{"dangling", "d/dangling", path.Join(sess.WorkspacePath(), "dangling")} {
		_, err := sess.GetFile(ctx, p)
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+") of a symlink to a missing file in the workspace")
	}
}

// GetFile of a file the session's user may not read, or below a directory
// it may not search, is a plain *SandboxError naming the path: a
// permission error is a real fault, never reported as a missing file. A
// session whose user reads a file of mode 000 anyway (root) cannot show it.
func (s *suite) testFilesPermissionDenied(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	mustSh(t, ctx, sess, "printf secret > locked && mkdir closed && printf secret > closed/f && chmod 000 locked closed")
	// Give the workspace back its modes, so that its removal at destroy
	// does not depend on the user bypassing them.
	defer func() {
		_, _ = sess.Exec(ctx, []string{"chmod", "755", "closed"}, sandbox.ExecOptions{Timeout: execTimeout})
	}()
	if res := run(t, ctx, sess, sandbox.ExecOptions{}, "cat", "locked"); res.ExitCode == 0 {
		t.Skip("the session's user reads a file of mode 000 (it bypasses permissions, as root does): no permission error can be made")
	}
	for p, what := range map[string]string{"locked": "a file without read permission", "closed/f": "a file below a directory without search permission"} {
		_, err := sess.GetFile(ctx, p)
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+") of "+what)
	}
}

// An empty path or one holding a NUL byte is refused.
func (s *suite) testFilesBadPaths(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	for _, p := range []string{"", "a\x00b"} {
		_, err := sess.GetFile(ctx, p)
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+")")
		err = sess.PutFile(ctx, p, []byte("x"))
		wantPlainPath(t, err, p, "PutFile("+strconv.Quote(p)+")")
	}
	// A trailing slash names a directory: PutFile refuses it rather than
	// write a file under the name without the slash.
	err := sess.PutFile(ctx, "d/", []byte("x"))
	wantPlainPath(t, err, "d/", `PutFile("d/")`)
	if exists(t, ctx, sess, "d") {
		t.Errorf(`PutFile("d/") wrote something at "d"; a path naming a directory must not be written as a file`)
	}
}

// A path climbing out of the workspace is refused with a plain *SandboxError
// (never a FileNotFoundError), and nothing outside is read or written.
func (s *suite) testFilesEscapes(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	ws := sess.WorkspacePath()
	name := "tai42-escape-" + rand.Text()[:8]
	outside := path.Join(path.Dir(ws), name)
	// Put a file where the escaping paths lead when the session can, so a
	// read that escapes would have something to read.
	planted := run(t, ctx, sess, sandbox.ExecOptions{}, shArgv(`printf outside > "$1"`, outside)...).ExitCode == 0
	if planted {
		defer func() {
			_, _ = sess.Exec(ctx, []string{"rm", "-f", outside}, sandbox.ExecOptions{Timeout: execTimeout})
		}()
	}
	escapes := []string{"../" + name, "a/../../" + name, "./../" + name}
	if s.opts.AbsoluteOutsideWorkspaceRefused {
		escapes = append(escapes, outside)
	}
	for _, p := range escapes {
		data, err := sess.GetFile(ctx, p)
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+"), outside the workspace")
		if bytes.Contains(data, []byte("outside")) {
			t.Errorf("GetFile(%q) read the file outside the workspace", p)
		}
		err = sess.PutFile(ctx, p, []byte("written"))
		wantPlainPath(t, err, p, "PutFile("+strconv.Quote(p)+"), outside the workspace")
	}
	switch {
	case planted:
		if got := mustSh(t, ctx, sess, `cat "$1"`, outside); got != "outside" {
			t.Errorf("the file outside the workspace holds %q after the refused PutFiles; want it untouched", got)
		}
	case exists(t, ctx, sess, outside):
		t.Errorf("a refused PutFile created %s, outside the workspace", outside)
	}
	if !s.hostFS() {
		return
	}
	dir, hostFile := hostTempFile(t)
	_, err := sess.GetFile(ctx, hostFile)
	wantPlainPath(t, err, hostFile, "GetFile of an absolute host path outside the workspace")
	err = sess.PutFile(ctx, filepath.Join(dir, "new.txt"), []byte("x"))
	wantPlainPath(t, err, filepath.Join(dir, "new.txt"), "PutFile of an absolute host path outside the workspace")
	wantNoHostFile(t, filepath.Join(dir, "new.txt"))
}

// hostTempFile makes a host directory holding host.txt ("host"), for the
// escape checks of a provider that shares the host's filesystem.
func hostTempFile(t *testing.T) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	file = filepath.Join(dir, "host.txt")
	if err := os.WriteFile(file, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

func wantNoHostFile(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the host path %s exists (%v) after a refused PutFile; nothing outside the workspace is written", p, err)
	}
}

// A symlink in the workspace that leads out is refused like a path that
// climbs out: nothing outside is read or written through it.
func (s *suite) testFilesSymlinkEscapes(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	// A shell that runs sh as a builtin (busybox) says just "sh" to
	// command -v: look in PATH then.
	shPath := strings.TrimSpace(mustSh(t, ctx, sess, `p=$(command -v sh); case $p in /*) echo "$p"; exit; esac; IFS=:; for d in $PATH; do [ -x "$d/sh" ] && { echo "$d/sh"; exit; }; done`))
	if !path.IsAbs(shPath) {
		t.Fatalf("sh found at %q; want an absolute path", shPath)
	}
	mustSh(t, ctx, sess, `ln -s "$1" link && ln -s "$2" escape`, shPath, path.Dir(shPath))
	for _, p := range []string{"link", "escape/" + path.Base(shPath)} {
		_, err := sess.GetFile(ctx, p)
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+") through a symlink leading out of the workspace")
	}
	name := "tai42-escape-" + rand.Text()[:8]
	err := sess.PutFile(ctx, "escape/"+name, []byte("x"))
	wantPlainPath(t, err, "escape/"+name, "PutFile through a symlink leading out of the workspace")
	if p := path.Join(path.Dir(shPath), name); exists(t, ctx, sess, p) {
		t.Errorf("PutFile through the symlink escape created %s, outside the workspace", p)
	}
	if !s.hostFS() {
		return
	}
	dir, hostFile := hostTempFile(t)
	mustSh(t, ctx, sess, `ln -s "$1" hostdir && ln -s "$2" hostfile`, dir, hostFile)
	for _, p := range []string{"hostdir/host.txt", "hostfile"} {
		_, err := sess.GetFile(ctx, p)
		wantPlainPath(t, err, p, "GetFile("+strconv.Quote(p)+") through a symlink to the host")
	}
	err = sess.PutFile(ctx, "hostdir/new.txt", []byte("x"))
	wantPlainPath(t, err, "hostdir/new.txt", "PutFile through a symlink to a host directory")
	wantNoHostFile(t, filepath.Join(dir, "new.txt"))
	// PutFile onto the symlink itself may replace the link, but never the
	// host file it points to.
	_ = sess.PutFile(ctx, "hostfile", []byte("overwritten"))
	if got, err := os.ReadFile(hostFile); err != nil || string(got) != "host" {
		t.Errorf("the host file holds %q (%v) after PutFile onto a symlink to it; want it untouched", got, err)
	}
}
