package client

import (
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// hit is one request the fake daemon of TestSessionIDEscaped saw.
type hit struct{ route, id, rawQuery string }

// idMux answers every per-session route for any id, recording each
// request's route, id (the path segment, unescaped) and query in hits.
func idMux(mu *sync.Mutex, hits *[]hit) *http.ServeMux {
	record := func(route string, answer func(w http.ResponseWriter, id string)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			*hits = append(*hits, hit{route, r.PathValue("id"), r.URL.RawQuery})
			mu.Unlock()
			answer(w, r.PathValue("id"))
		}
	}
	info := func(w http.ResponseWriter, id string) {
		si := fakeSession
		si.ID = id
		writeJSON(w, http.StatusOK, si)
	}
	noContent := func(w http.ResponseWriter, _ string) { w.WriteHeader(http.StatusNoContent) }
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sessions/{id}", record("get", info))
	mux.HandleFunc("DELETE /v1/sessions/{id}", record("delete", noContent))
	mux.HandleFunc("POST /v1/sessions/{id}/touch", record("touch", noContent))
	mux.HandleFunc("POST /v1/sessions/{id}/exec", record("exec", func(w http.ResponseWriter, _ string) {
		writeJSON(w, http.StatusOK, api.ExecResult{})
	}))
	mux.HandleFunc("PUT /v1/sessions/{id}/files", record("put_file", noContent))
	mux.HandleFunc("GET /v1/sessions/{id}/files", record("get_file", func(w http.ResponseWriter, _ string) {
		_, _ = w.Write([]byte("data"))
	}))
	mux.HandleFunc("GET /v1/sessions/{id}/exec/stream", record("exec_stream", func(w http.ResponseWriter, _ string) {
		writeError(w, api.ErrorFrom(sandbox.Errorf("exec_start", "refused by the fake")))
	}))
	return mux
}

// TestSessionIDEscaped: a session id holding '/', '?', '#' or '%' is sent
// as one escaped path segment by every call on it: the daemon sees the
// id whole, on the route meant, with no query or fragment made of it.
func TestSessionIDEscaped(t *testing.T) {
	var (
		mu   sync.Mutex
		hits []hit
	)
	_, c := newFake(t, idMux(&mu, &hits))
	ctx := t.Context()
	for _, id := range []string{"a/b", "a?b=c", "a#b", "a%2Fb", "../s1"} {
		t.Run(url.PathEscape(id), func(t *testing.T) {
			mu.Lock()
			hits = nil
			mu.Unlock()
			sess, err := c.GetSession(ctx, id)
			if err != nil {
				t.Fatalf("GetSession(%q): %v", id, err)
			}
			if _, err := sess.Info(ctx); err != nil {
				t.Errorf("Info: %v", err)
			}
			if err := sess.Touch(ctx); err != nil {
				t.Errorf("Touch: %v", err)
			}
			if _, err := sess.Exec(ctx, []string{"true"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
				t.Errorf("Exec: %v", err)
			}
			if err := sess.PutFile(ctx, "f", []byte("x")); err != nil {
				t.Errorf("PutFile: %v", err)
			}
			if _, err := sess.GetFile(ctx, "f"); err != nil {
				t.Errorf("GetFile: %v", err)
			}
			_, _ = sess.ExecStart(ctx, []string{"true"}, sandbox.StartOptions{Timeout: time.Second}) // refused: only the route counts
			if err := sess.Destroy(ctx); err != nil {
				t.Errorf("Destroy: %v", err)
			}
			if err := c.DestroySession(ctx, id); err != nil {
				t.Errorf("DestroySession: %v", err)
			}
			want := []string{"get", "get", "touch", "exec", "put_file", "get_file", "exec_stream", "delete", "delete"}
			mu.Lock()
			defer mu.Unlock()
			if len(hits) != len(want) {
				t.Fatalf("the daemon saw %+v; want the routes %v", hits, want)
			}
			for i, h := range hits {
				wantQuery := ""
				if h.route == "put_file" || h.route == "get_file" {
					wantQuery = "path=f"
				}
				if h.route != want[i] || h.id != id || h.rawQuery != wantQuery {
					t.Errorf("call %d: the daemon saw %+v; want route %s, id %q, query %q", i, h, want[i], id, wantQuery)
				}
			}
		})
	}
}
