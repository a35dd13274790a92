package server

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/host"
)

// TestSessionLife walks one session through every route with plain
// net/http requests, as curl would.
func TestSessionLife(t *testing.T) {
	e := newEnv(t)
	greeting := "hello-" + randHex(t)
	spec := hostSpec()
	spec.Env = map[string]string{"GREETING": greeting, "OVERRIDE": "base"}
	spec.Labels = map[string]string{"team": "core"}

	b, _ := json.Marshal(spec)
	resp := e.req("POST", "/v1/sessions", bytes.NewReader(b), testToken)
	var info sandbox.SessionInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || info.ID == "" || info.Image != sandbox.HostImage || info.Labels["team"] != "core" {
		t.Fatalf("create: %d %+v", resp.StatusCode, info)
	}
	if loc := resp.Header.Get("Location"); loc != "/v1/sessions/"+info.ID {
		t.Errorf("Location %q", loc)
	}
	if resp.Header.Get(api.HeaderRequestID) == "" {
		t.Errorf("no %s in the response", api.HeaderRequestID)
	}
	base := "/v1/sessions/" + info.ID

	var got sandbox.SessionInfo
	e.call("GET", base, nil, http.StatusOK, &got)
	if got.ID != info.ID || got.WorkspacePath != info.WorkspacePath || !got.ExpiresAt.Equal(info.ExpiresAt) {
		t.Errorf("get: %+v, created %+v", got, info)
	}
	var list api.SessionList
	e.call("GET", "/v1/sessions", nil, http.StatusOK, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].ID != info.ID {
		t.Errorf("list: %+v", list)
	}

	res := e.exec(info.ID, api.ExecRequest{
		Argv:           []string{"sh", "-c", `echo "$GREETING $OVERRIDE $PER"; echo oops >&2; exit 3`},
		Env:            map[string]string{"OVERRIDE": "exec", "PER": "per-exec"},
		TimeoutSeconds: 10,
	})
	if res.ExitCode != 3 || res.Stdout != greeting+" exec per-exec\n" || res.Stderr != "oops\n" || res.StdoutBase64 != nil {
		t.Errorf("exec: %+v", res)
	}
	stdin := base64.StdEncoding.EncodeToString([]byte("from stdin\n"))
	res = e.exec(info.ID, api.ExecRequest{Argv: []string{"cat"}, StdinBase64: &stdin, TimeoutSeconds: 10})
	if res.ExitCode != 0 || res.Stdout != "from stdin\n" {
		t.Errorf("exec with stdin: %+v", res)
	}
	// Output that is not UTF-8 travels in stdout_base64, byte for byte.
	res = e.exec(info.ID, api.ExecRequest{Argv: []string{"printf", `\377\376abc\000`}, TimeoutSeconds: 10})
	if res.StdoutBase64 == nil || res.Stdout != "" {
		t.Fatalf("non-UTF-8 exec: %+v", res)
	}
	if raw, err := base64.StdEncoding.DecodeString(*res.StdoutBase64); err != nil || string(raw) != "\xff\xfeabc\x00" {
		t.Errorf("stdout_base64 decodes to %q, %v", raw, err)
	}

	// Files: binary content, a new parent directory, byte for byte back.
	data := make([]byte, 300<<10)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	fpath := "/files?path=" + url.QueryEscape("dir/sub/blob.bin")
	resp = e.req("PUT", base+fpath, bytes.NewReader(data), testToken, "Content-Type", "application/octet-stream")
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("put_file: %d", resp.StatusCode)
	}
	resp = e.req("GET", base+fpath, nil, testToken)
	back, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(back, data) {
		t.Fatalf("get_file: %d, %d bytes, equal %v", resp.StatusCode, len(back), bytes.Equal(back, data))
	}
	if resp.Header.Get("Content-Type") != "application/octet-stream" || resp.ContentLength != int64(len(data)) {
		t.Errorf("get_file headers: %q, length %d", resp.Header.Get("Content-Type"), resp.ContentLength)
	}
	res = e.exec(info.ID, api.ExecRequest{Argv: []string{"wc", "-c", "dir/sub/blob.bin"}, TimeoutSeconds: 10})
	if !strings.HasPrefix(res.Stdout, "307200 ") {
		t.Errorf("the exec sees %q", res.Stdout)
	}

	// Touch never shortens a life.
	time.Sleep(20 * time.Millisecond)
	e.call("POST", base+"/touch", nil, http.StatusNoContent, nil)
	var touched sandbox.SessionInfo
	e.call("GET", base, nil, http.StatusOK, &touched)
	if touched.ExpiresAt.Before(info.ExpiresAt) {
		t.Errorf("touch shrank expires_at: %v -> %v", info.ExpiresAt, touched.ExpiresAt)
	}
	if !touched.ExpiresAt.After(info.ExpiresAt) {
		t.Errorf("touch did not extend expires_at: %v -> %v", info.ExpiresAt, touched.ExpiresAt)
	}

	var pol sandbox.Policy
	e.call("GET", "/v1/policy", nil, http.StatusOK, &pol)
	if pol != testPolicy {
		t.Errorf("policy %+v", pol)
	}
	var si api.SandboxInfo
	e.call("GET", "/v1/sandbox", nil, http.StatusOK, &si)
	want := api.SandboxInfo{Provider: host.Name, ExecDefaultTimeoutSeconds: kit.DefaultExecTimeout.Seconds(),
		ReapIntervalSeconds: kit.DefaultReapInterval.Seconds(), Policy: testPolicy, MaxBodyBytes: DefaultMaxBodyBytes, Version: "v-test"}
	if si != want {
		t.Errorf("sandbox info %+v, want %+v", si, want)
	}

	e.call("DELETE", base, nil, http.StatusNoContent, nil)
	er := e.callErr("GET", base, nil, http.StatusNotFound, api.KindSessionNotFound)
	if er.SessionID != info.ID {
		t.Errorf("session_not_found names %q", er.SessionID)
	}
	e.call("DELETE", base, nil, http.StatusNoContent, nil)
	var reaped api.Reaped
	body := e.call("POST", "/v1/reap", nil, http.StatusOK, &reaped)
	if !bytes.Contains(body, []byte(`"reaped":[]`)) {
		t.Errorf("reap body %s", body)
	}
}

// TestSessionAcrossConnections: a session created by one request is used by
// the next, each on its own connection.
func TestSessionAcrossConnections(t *testing.T) {
	e := newEnv(t)
	fresh := func(method, path string, body []byte) (*http.Response, []byte) {
		t.Helper()
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		r, _ := http.NewRequest(method, e.ts.URL+path, bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := (&http.Client{Transport: tr}).Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	spec, _ := json.Marshal(hostSpec())
	resp, b := fresh("POST", "/v1/sessions", spec)
	var info sandbox.SessionInfo
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &info) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	resp, _ = fresh("PUT", "/v1/sessions/"+info.ID+"/files?path=note.txt", []byte("kept\n"))
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("put: %d", resp.StatusCode)
	}
	req, _ := json.Marshal(api.ExecRequest{Argv: []string{"cat", "note.txt"}, TimeoutSeconds: 10})
	resp, b = fresh("POST", "/v1/sessions/"+info.ID+"/exec", req)
	var res api.ExecResult
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &res) != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec: %d %s", resp.StatusCode, b)
	}
	resp, b = fresh("GET", "/v1/sessions/"+info.ID+"/files?path=note.txt", nil)
	if resp.StatusCode != http.StatusOK || string(b) != "kept\n" {
		t.Fatalf("get: %d %q", resp.StatusCode, b)
	}
}

// TestErrorMapping: the contract's errors reach the client with their kind,
// status and fields.
func TestErrorMapping(t *testing.T) {
	e := newEnv(t)

	spec := hostSpec()
	spec.Network = sandbox.NetworkInternal
	er := e.callErr("POST", "/v1/sessions", spec, http.StatusUnprocessableEntity, api.KindSpecRejected)
	if er.Field != "network" || er.Reason != string(sandbox.ReasonUnenforceable) {
		t.Errorf("network internal: %+v", er)
	}
	spec = hostSpec()
	spec.TTLSeconds = 0
	er = e.callErr("POST", "/v1/sessions", spec, http.StatusUnprocessableEntity, api.KindSpecRejected)
	if er.Field != "ttl_seconds" || er.Reason != string(sandbox.ReasonInvalid) {
		t.Errorf("ttl 0: %+v", er)
	}

	id := e.create(hostSpec()).ID
	base := "/v1/sessions/" + id
	start := time.Now()
	var eb api.ErrorBody
	body := e.call("POST", base+"/exec", api.ExecRequest{Argv: []string{"sh", "-c", "echo partial-output; echo err-output >&2; sleep 5"}, TimeoutSeconds: 0.3},
		http.StatusGatewayTimeout, &eb)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the timeout took %v", d)
	}
	to := eb.Error
	if to.Kind != api.KindExecTimeout || to.TimeoutSeconds != 0.3 || to.StdoutLen == nil || *to.StdoutLen != 15 || to.StderrLen == nil || *to.StderrLen != 11 {
		t.Errorf("exec timeout: %s", body)
	}
	if bytes.Contains(body, []byte("partial-output")) || bytes.Contains(body, []byte("err-output")) {
		t.Errorf("the timeout error carries output: %s", body)
	}
	er = e.callErr("POST", base+"/exec", api.ExecRequest{Argv: []string{"true"}}, http.StatusBadRequest, api.KindSandbox)
	if !strings.Contains(er.Message, "timeout") {
		t.Errorf("missing timeout: %+v", er)
	}

	er = e.callErr("GET", base+"/files?path=missing.txt", nil, http.StatusNotFound, api.KindFileNotFound)
	if er.Path != "missing.txt" {
		t.Errorf("file_not_found path %q", er.Path)
	}
	e.call("PUT", base+"/files?path=adir/f", "x", http.StatusNoContent, nil)
	e.callErr("GET", base+"/files?path=adir", nil, http.StatusBadRequest, api.KindSandbox)
	e.callErr("GET", base+"/files?path=../escape", nil, http.StatusBadRequest, api.KindSandbox)
	e.callErr("POST", "/v1/sessions/sb-nope/exec", api.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 1}, http.StatusNotFound, api.KindSessionNotFound)
	e.callErr("POST", "/v1/sessions/sb-nope/touch", nil, http.StatusNotFound, api.KindSessionNotFound)
	e.callErr("PUT", "/v1/sessions/sb-nope/files?path=x", "x", http.StatusNotFound, api.KindSessionNotFound)
}
