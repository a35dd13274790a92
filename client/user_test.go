package client

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

// Exec sends its user in the body's "user", and none when it has none.
func TestExecSendsUser(t *testing.T) {
	bodies := make(chan map[string]any, 2)
	mux := sessionMux()
	mux.HandleFunc("POST /v1/sessions/s1/exec", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			writeError(w, api.ErrorFrom(api.Transportf(api.KindBadRequest, "%v", err)))
			return
		}
		bodies <- body
		writeJSON(w, http.StatusOK, api.ExecResult{})
	})
	_, c := newFake(t, mux)
	sess := getSession(t, c)
	for _, u := range []string{"nobody", ""} {
		if _, err := sess.Exec(t.Context(), []string{"id"}, sandbox.ExecOptions{Timeout: time.Second, User: u}); err != nil {
			t.Fatalf("Exec as %q: %v", u, err)
		}
		body := <-bodies
		got, ok := body["user"]
		if u == "" && ok {
			t.Errorf("Exec without a user sent user %v; want none", got)
		}
		if u != "" && got != u {
			t.Errorf("Exec as %q sent user %v", u, got)
		}
	}
}
