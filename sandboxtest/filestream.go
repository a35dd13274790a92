package sandboxtest

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
)

// fileStreamClauses check the optional sandbox.FileStreamer of a session:
// the same rules and errors as PutFile and GetFile. A session without it
// skips them.
func (s *suite) fileStreamClauses() []clause {
	return []clause{
		{"RoundTrip", s.testStreamFilesRoundTrip},
		{"FailedReaderKeepsOld", s.testStreamFilesFailedReader},
		{"OpenErrors", s.testStreamFilesOpenErrors},
		{"Escapes", s.testStreamFilesEscapes},
	}
}

func (s *suite) streamer(t *testing.T) (sandbox.Session, sandbox.FileStreamer) {
	t.Helper()
	_, sess := s.fresh(t, nil)
	fs, ok := sess.(sandbox.FileStreamer)
	if !ok {
		t.Skipf("the session (%T) does not implement sandbox.FileStreamer", sess)
	}
	return sess, fs
}

// PutFileFrom writes what the reader yields; OpenFile reads it back with
// its size; both agree with PutFile and GetFile.
func (s *suite) testStreamFilesRoundTrip(t *testing.T) {
	ctx := s.testContext(t)
	sess, fs := s.streamer(t)
	data := randomBytes(3<<20 + 17)
	if err := fs.PutFileFrom(ctx, "big/stream.bin", bytes.NewReader(data)); err != nil {
		t.Fatalf("PutFileFrom of %d bytes: %v", len(data), err)
	}
	if got := mustGet(t, ctx, sess, "big/stream.bin"); !bytes.Equal(got, data) {
		t.Errorf("GetFile after PutFileFrom of %d bytes returned %d bytes (equal: false)", len(data), len(got))
	}
	rc, size, err := fs.OpenFile(ctx, "big/stream.bin")
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	got, err := io.ReadAll(rc)
	if cerr := rc.Close(); cerr != nil {
		t.Errorf("closing the OpenFile reader: %v", cerr)
	}
	if err != nil {
		t.Fatalf("reading the OpenFile reader: %v", err)
	}
	if size != int64(len(data)) || !bytes.Equal(got, data) {
		t.Errorf("OpenFile: size %d, %d bytes read (equal: %v); want size %d and the bytes put", size, len(got), bytes.Equal(got, data), len(data))
	}
	if err := fs.PutFileFrom(ctx, "empty", strings.NewReader("")); err != nil {
		t.Fatalf("PutFileFrom of an empty reader: %v", err)
	}
	if got := mustGet(t, ctx, sess, "empty"); len(got) != 0 {
		t.Errorf("GetFile of an empty streamed file returned %d bytes", len(got))
	}
}

// failingReader yields some bytes, then fails.
type failingReader struct {
	head []byte
	err  error
}

func (f *failingReader) Read(b []byte) (int, error) {
	if len(f.head) == 0 {
		return 0, f.err
	}
	n := copy(b, f.head)
	f.head = f.head[n:]
	return n, nil
}

// A reader that fails midway fails PutFileFrom with a family error and
// leaves the old content intact, never a mix.
func (s *suite) testStreamFilesFailedReader(t *testing.T) {
	ctx := s.testContext(t)
	sess, fs := s.streamer(t)
	mustPut(t, ctx, sess, "keep.txt", []byte("old content"))
	err := fs.PutFileFrom(ctx, "keep.txt", &failingReader{head: bytes.Repeat([]byte("new"), 100000), err: errors.New("disk on fire")})
	wantKind(t, err, sandbox.ErrSandbox, "PutFileFrom with a reader that fails midway")
	if got := mustGet(t, ctx, sess, "keep.txt"); string(got) != "old content" {
		t.Errorf("GetFile after a failed PutFileFrom = %d bytes starting %q; want the old content intact", len(got), got[:min(len(got), 20)])
	}
	if ls := mustSh(t, ctx, sess, "ls -A"); strings.TrimSpace(ls) != "keep.txt" {
		t.Errorf("the workspace after a failed PutFileFrom holds %q; want only keep.txt (no temporary file left)", ls)
	}
}

// OpenFile's errors are GetFile's: not found only where nothing exists.
func (s *suite) testStreamFilesOpenErrors(t *testing.T) {
	ctx := s.testContext(t)
	sess, fs := s.streamer(t)
	_, _, err := fs.OpenFile(ctx, "missing.txt")
	var nf *sandbox.FileNotFoundError
	if wantKind(t, err, sandbox.ErrFileNotFound, "OpenFile of a missing path") && (!errors.As(err, &nf) || !strings.Contains(nf.Path, "missing.txt")) {
		t.Errorf("OpenFile of a missing path: %q; want a *FileNotFoundError naming it", err)
	}
	mustPut(t, ctx, sess, "d/f", []byte("f"))
	_, _, err = fs.OpenFile(ctx, "d")
	wantPlainPath(t, err, "d", "OpenFile of a directory")
	_, _, err = fs.OpenFile(ctx, "")
	wantPlain(t, err, "OpenFile of an empty path")
}

// Paths that climb out are refused by both directions, and nothing outside
// is written.
func (s *suite) testStreamFilesEscapes(t *testing.T) {
	ctx := s.testContext(t)
	_, fs := s.streamer(t)
	for _, p := range []string{"../escape.txt", "a/../../escape.txt"} {
		err := fs.PutFileFrom(ctx, p, strings.NewReader("x"))
		wantPlainPath(t, err, p, "PutFileFrom("+p+")")
		_, _, err = fs.OpenFile(ctx, p)
		wantPlainPath(t, err, p, "OpenFile("+p+")")
	}
}
