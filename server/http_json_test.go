package server

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tai42/sandbox/api"
)

// TestStrictJSONKeys: a key that is not exactly a field's name (encoding/json
// would take "ARGV" for argv) and a duplicate key at any depth (the last
// would win silently) are refused with bad_request naming the key; a body
// that is not one JSON object is refused as such.
func TestStrictJSONKeys(t *testing.T) {
	e := newEnv(t)
	id := e.create(hostSpec()).ID
	execPath := "/v1/sessions/" + id + "/exec"
	for _, c := range []struct {
		name, path, body string
		mention          string
	}{
		{"upper-case field", execPath, `{"ARGV":["true"],"timeout_seconds":1}`, `"ARGV"`},
		{"mixed-case field", execPath, `{"argv":["true"],"Timeout_Seconds":1}`, `"Timeout_Seconds"`},
		{"capitalised spec field", "/v1/sessions", `{"Image":"host","durability":"ephemeral","network":"egress","ttl_seconds":60}`, `"Image"`},
		{"duplicate field", execPath, `{"argv":["true"],"argv":["false"],"timeout_seconds":1}`, `"argv"`},
		{"duplicate by escape", execPath, `{"argv":["true"],"\u0061rgv":["false"],"timeout_seconds":1}`, `"argv"`},
		{"duplicate env key", execPath, `{"argv":["true"],"env":{"A":"1","B":"2","A":"3"},"timeout_seconds":1}`, `"env.A"`},
		{"duplicate label", "/v1/sessions", `{"image":"host","durability":"ephemeral","network":"egress","ttl_seconds":60,"labels":{"x":"1","x":"1"}}`, `"labels.x"`},
		{"null", execPath, `null`, "must be one JSON object, not null"},
		{"number", execPath, `42`, "must be one JSON object, not a number"},
		{"string", "/v1/sessions", `"host"`, "must be one JSON object, not a string"},
		{"boolean", "/v1/sessions", `true`, "must be one JSON object, not a boolean"},
		{"array", "/v1/sessions", `[{}]`, "must be one JSON object, not an array"},
		{"object then null", "/v1/sessions", `{} null`, "more than one JSON value"},
		// Nesting is JSON v2's to bound (at 10000, as encoding/json's); a
		// deep value where the API takes none is a wrong type, named.
		{"deep nesting", execPath, `{"argv":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`, `"/argv/0"`},
		{"nesting over the bound", execPath, `{"argv":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, "exceeded max depth"},
	} {
		t.Run(c.name, func(t *testing.T) {
			er := e.callErr("POST", c.path, c.body, http.StatusBadRequest, api.KindBadRequest)
			if !strings.Contains(er.Message, c.mention) {
				t.Errorf("message %q does not mention %s", er.Message, c.mention)
			}
		})
	}
	// Exact keys, distinct env and label keys (case matters there: they
	// are names, not fields) are taken.
	res := e.exec(id, api.ExecRequest{Argv: []string{"sh", "-c", `echo "$A$a"`}, Env: map[string]string{"A": "1", "a": "2"}, TimeoutSeconds: 10})
	if res.Stdout != "12\n" {
		t.Errorf("exec with env A and a: %+v", res)
	}
	spec := hostSpec()
	spec.Labels = map[string]string{"x": "1", "X": "2"}
	if info := e.create(spec); info.Labels["x"] != "1" || info.Labels["X"] != "2" {
		t.Errorf("labels %v", info.Labels)
	}
	e.call("POST", execPath, "\n {\"argv\":[\"true\"],\"timeout_seconds\":1} \n", http.StatusOK, nil)
}

// TestDecodeStrict: the strict decode on its own, over the API's bodies.
func TestDecodeStrict(t *testing.T) {
	var spec api.SessionSpec
	var req api.ExecRequest
	for _, c := range []struct {
		v    any
		body string
		want string // "" ok; else in the error
	}{
		{&req, `{"argv":["a","b"],"env":{"K":"v"},"stdin_base64":null,"timeout_seconds":1.5,"cwd":"x","type":""}`, ""},
		{&req, `{"argv":[{"a":1,"a":2}]}`, `"argv.0.a" twice`}, // a wrong type, yet a duplicate first
		{&req, `{"env":{"K":{"x":1}}}`, ""},                    // a wrong type: JSON v2's to refuse
		{&req, `{"argv":[],"stdin":"eA=="}`, `unknown field "stdin"`},
		{&req, `{"Argv":[]}`, `unknown field "Argv"`},
		{&spec, `{"image":"h","isolation":null,"cpu":null,"memory_mb":1,"labels":{"a":"b"}}`, ""},
		{&spec, `{"isolation":"none","isolation":"none"}`, `"isolation" twice`},
		{&spec, `{"env":{"a":"1","A":"2"}}`, ""},
		{&spec, ``, "empty"},
		{&spec, `   `, "empty"},
		{&spec, `{"image":`, "unexpected EOF"},
		{&spec, `{"image" "h"}`, "invalid character"},
		{&spec, `{}}`, "invalid character"},
	} {
		err := decodeStrict([]byte(c.body), c.v)
		var se *shapeError
		switch {
		case c.want == "" && err != nil && errors.As(err, &se):
			t.Errorf("%s: %v", c.body, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one with %q", c.body, err, c.want)
		}
	}
}

// TestDecodeStrictAsBefore: what JSON v2 would do otherwise than
// encoding/json is kept as the API took it: invalid UTF-8 in a string
// becomes U+FFFD, a null isolation is unset, and a value that fails to
// decode is not echoed (it may be a secret) while its place is named.
func TestDecodeStrictAsBefore(t *testing.T) {
	var req api.ExecRequest
	if err := decodeStrict([]byte("{\"argv\":[\"a\xffb\"]}"), &req); err != nil || len(req.Argv) != 1 || req.Argv[0] != "a\uFFFDb" {
		t.Errorf("invalid UTF-8: %v, argv %q; want it taken as U+FFFD", err, req.Argv)
	}
	var spec api.SessionSpec
	if err := decodeStrict([]byte(`{"isolation":null,"cpu":null}`), &spec); err != nil || spec.Isolation != nil || spec.CPU != nil {
		t.Errorf("null isolation and cpu: %v, %v, %v; want both unset", err, spec.Isolation, spec.CPU)
	}
	if err := decodeStrict([]byte(`{"isolation":"vm"}`), &spec); err != nil || spec.Isolation == nil || *spec.Isolation != "vm" {
		t.Errorf("isolation vm: %v, %v", err, spec.Isolation)
	}
	err := decodeStrict([]byte(`{"env":{"TOKEN":31415926535}}`), &spec)
	if err == nil || strings.Contains(err.Error(), "31415926535") || !strings.Contains(err.Error(), "/env/TOKEN") {
		t.Errorf("env value of the wrong type: %v; want its place named and the value left out", err)
	}
}
