package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/tai42/sandbox/api"
)

// do sends one authorised request from any goroutine (no t.Fatal) and
// returns the status and the body.
func (e *env) do(method, path string, in any) (int, []byte, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, err
		}
		body = bytes.NewReader(b)
	}
	r, err := http.NewRequest(method, e.ts.URL+path, body)
	if err != nil {
		return 0, nil, err
	}
	r.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := e.hc.Do(r)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// TestConcurrentExecs: 200 execs over 50 sessions at once, over plain
// HTTP, each output exact.
func TestConcurrentExecs(t *testing.T) {
	e := newEnv(t)
	const sessions, perSession = 50, 4
	ids := make([]string, sessions)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for i := range sessions {
		wg.Go(func() {
			spec := hostSpec()
			spec.Env = map[string]string{"SESSION": fmt.Sprint("s", i)}
			status, b, err := e.do("POST", "/v1/sessions", spec)
			var info struct{ ID string }
			if err != nil || status != http.StatusCreated || json.Unmarshal(b, &info) != nil {
				fail("create %d: %d %s %v", i, status, b, err)
				return
			}
			ids[i] = info.ID
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatal(failures)
	}
	for i, id := range ids {
		for n := range perSession {
			wg.Go(func() {
				want := fmt.Sprintf("s%d-%d-%s\n", i, n, id)
				status, b, err := e.do("POST", "/v1/sessions/"+id+"/exec", api.ExecRequest{
					Argv:           []string{"sh", "-c", `echo "$SESSION-$1-$2"`, "sh", fmt.Sprint(n), id},
					TimeoutSeconds: 60,
				})
				var res api.ExecResult
				if err != nil || status != http.StatusOK || json.Unmarshal(b, &res) != nil {
					fail("exec %d/%d: %d %s %v", i, n, status, b, err)
					return
				}
				if res.ExitCode != 0 || res.Stdout != want || res.Stderr != "" {
					fail("exec %d/%d: %+v, want stdout %q", i, n, res, want)
				}
			})
		}
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), failures[0])
	}
	var list api.SessionList
	e.call("GET", "/v1/sessions", nil, http.StatusOK, &list)
	if len(list.Sessions) != sessions {
		t.Errorf("%d sessions listed", len(list.Sessions))
	}
}
