package client

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

var errSource = errors.New("the source broke")

// failingReader yields some data, then fails.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n >= 3 {
		return 0, errSource
	}
	r.n++
	return copy(p, "chunk "), nil
}

// PutFileFrom streams the reader as the body; a failing reader ends it
// with the upload-failed trailer (so the daemon fails the put before it
// answers) and is the error's cause. OpenFile's size is Content-Length.
func TestPutFileFrom(t *testing.T) {
	got := make(chan string, 4)
	mux := sessionMux()
	mux.HandleFunc("PUT /v1/sessions/s1/files", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get(api.QueryPath) != "dir/f.txt" {
			writeError(w, api.ErrorFrom(sandbox.Errorf("put_file", "wrong path")))
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil || r.Trailer.Get(api.TrailerUploadFailed) != "" {
			writeError(w, api.ErrorFrom(sandbox.Errorf("put_file", "the body broke off")))
			return
		}
		got <- string(b)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/sessions/s1/files", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "5")
		_, _ = io.WriteString(w, "12345")
	})
	_, c := newFake(t, mux)
	fs := getSession(t, c).(sandbox.FileStreamer)
	ctx := t.Context()

	if err := fs.PutFileFrom(ctx, "dir/f.txt", strings.NewReader("streamed")); err != nil {
		t.Fatalf("PutFileFrom: %v", err)
	}
	if b := <-got; b != "streamed" {
		t.Errorf("the daemon got %q", b)
	}
	err := fs.PutFileFrom(ctx, "dir/f.txt", &failingReader{})
	if !errors.Is(err, errSource) || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("PutFileFrom of a failing reader: %v; want a SandboxError caused by the reader's error", err)
	}
	select {
	case b := <-got:
		t.Errorf("the daemon stored %q from a broken upload", b)
	default:
	}

	rc, size, err := fs.OpenFile(ctx, "x")
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if string(b) != "12345" || size != 5 || err != nil {
		t.Errorf("OpenFile: %q, size %d, %v", b, size, err)
	}
}
