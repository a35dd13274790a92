package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// Every error of the contract's family survives the trip server → JSON →
// client with its kind, its fields and its text, and gets its kind's status.
func TestErrorRoundTrip(t *testing.T) {
	cases := []struct {
		err    error
		kind   Kind
		status int
	}{
		{&sandbox.ExecTimeoutError{Timeout: 300 * time.Millisecond, StdoutLen: 5, StderrLen: 0, Note: "a process the command started still held the output"}, KindExecTimeout, http.StatusGatewayTimeout},
		{&sandbox.ExecTimeoutError{Timeout: 90 * time.Second}, KindExecTimeout, http.StatusGatewayTimeout},
		{&sandbox.FileNotFoundError{Path: "a/b.txt"}, KindFileNotFound, http.StatusNotFound},
		{&sandbox.SessionNotFoundError{SessionID: "s-1", Detail: "destroyed while an exec ran"}, KindSessionNotFound, http.StatusNotFound},
		{&sandbox.SpecRejectedError{Field: "network", Reason: sandbox.ReasonPolicy, Message: "egress is above the ceiling none"}, KindSpecRejected, http.StatusUnprocessableEntity},
		{&sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict, Message: "live session s-2 holds it"}, KindSpecRejected, http.StatusUnprocessableEntity},
		{&sandbox.UnavailableError{Name: "vm", Registered: []string{"host"}}, KindUnavailable, http.StatusServiceUnavailable},
		{&sandbox.OutputLimitError{Limit: 64 << 20, StdoutLen: 64<<20 + 1, StderrLen: 3}, KindOutputLimit, http.StatusInsufficientStorage},
		{&sandbox.WorkspaceNotFoundError{Key: "alice-notebook"}, KindWorkspaceNotFound, http.StatusNotFound},
		{&sandbox.UserNotFoundError{User: "alice"}, KindUserNotFound, http.StatusBadRequest},
		{&sandbox.ImageNotFoundError{Name: "ghcr.io/o/r:tag"}, KindImageNotFound, http.StatusNotFound},
		{&sandbox.ImagePullError{Ref: "127.0.0.1:5000/r@sha256:0d", Reason: sandbox.PullNotFound, Message: "the registry has no manifest sha256:0d: MANIFEST_UNKNOWN"}, KindImagePull, http.StatusBadRequest},
		{&sandbox.ImagePullError{Ref: "Bad Ref", Reason: sandbox.PullInvalidReference, Message: "could not parse reference: Bad Ref"}, KindImagePull, http.StatusBadRequest},
		{sandbox.Errorf("get_file", "%q is a directory, not a file", "d"), KindSandbox, http.StatusBadRequest},
		{sandbox.Errorf("", "no op"), KindSandbox, http.StatusBadRequest},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%T/%s", c.err, c.kind), func(t *testing.T) {
			w := ErrorFrom(c.err)
			if w.Kind != c.kind || w.Status() != c.status {
				t.Fatalf("ErrorFrom(%v) = kind %q status %d; want %q %d", c.err, w.Kind, w.Status(), c.kind, c.status)
			}
			b, err := json.Marshal(ErrorBody{Error: w})
			if err != nil {
				t.Fatal(err)
			}
			var back ErrorBody
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			got := back.Error.Err()
			if got.Error() != c.err.Error() {
				t.Errorf("text after the trip:\n got  %q\n want %q", got.Error(), c.err.Error())
			}
			if !errors.Is(got, sandbox.ErrSandbox) {
				t.Errorf("%v is not in the sandbox family after the trip", got)
			}
			var se *sandbox.SandboxError
			if !errors.As(got, &se) {
				t.Errorf("%v does not convert to *SandboxError after the trip", got)
			}
			if c.kind != KindSandbox && !reflect.DeepEqual(got, c.err) {
				t.Errorf("after the trip: %#v; want %#v", got, c.err)
			}
			if c.kind == KindSandbox {
				orig := c.err.(*sandbox.SandboxError)
				if se.Op != orig.Op {
					t.Errorf("op after the trip %q; want %q", se.Op, orig.Op)
				}
			}
		})
	}
}

// A user_not_found error carries its user in the field user, and its op.
func TestUserNotFoundOnTheWire(t *testing.T) {
	b, _ := json.Marshal(ErrorBody{Error: ErrorFrom(fmt.Errorf("exec: %w", &sandbox.UserNotFoundError{User: "alice"}))})
	var m map[string]map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if e := m["error"]; e["kind"] != "user_not_found" || e["user"] != "alice" || e["op"] != "exec" || len(e) != 4 {
		t.Errorf("user_not_found on the wire: %s; want kind, message, op exec and user alice", b)
	}
}

// The image errors carry their fields (image; ref and reason) and their op,
// wrapped or not.
func TestImageErrorsOnTheWire(t *testing.T) {
	for _, c := range []struct {
		err  error
		want map[string]any
	}{
		{fmt.Errorf("remove: %w", &sandbox.ImageNotFoundError{Name: "python:3.12-slim"}),
			map[string]any{"kind": "image_not_found", "op": "remove_image", "image": "python:3.12-slim"}},
		{fmt.Errorf("pull: %w", &sandbox.ImagePullError{Ref: "python:3.12-slim", Reason: sandbox.PullNoPlatform, Message: "no linux/riscv64 manifest"}),
			map[string]any{"kind": "image_pull", "op": "pull_image", "ref": "python:3.12-slim", "reason": "no_platform"}},
	} {
		b, _ := json.Marshal(ErrorBody{Error: ErrorFrom(c.err)})
		var m map[string]map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		e := m["error"]
		for k, v := range c.want {
			if e[k] != v {
				t.Errorf("%s: %s = %v; want %v", b, k, e[k], v)
			}
		}
		if len(e) != len(c.want)+1 { // and the message
			t.Errorf("%s carries fields beyond %v and the message", b, c.want)
		}
	}
}

// A timeout error on the wire carries lengths, never output.
func TestTimeoutCarriesOnlyLengths(t *testing.T) {
	b, _ := json.Marshal(ErrorBody{Error: ErrorFrom(&sandbox.ExecTimeoutError{Timeout: time.Second, StdoutLen: 7})})
	var m map[string]map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k := range m["error"] {
		switch k {
		case "kind", "message", "op", "timeout_seconds", "stdout_len", "stderr_len", "note":
		default:
			t.Errorf("a timeout error carries field %q; only lengths and the timeout may travel", k)
		}
	}
	if m["error"]["stderr_len"] != 0.0 || m["error"]["stdout_len"] != 7.0 {
		t.Errorf("lengths on the wire: %v", m["error"])
	}
}

// Transport kinds and unknown kinds come back as *SandboxError with the
// *TransportError as cause; a foreign error goes out as internal.
func TestTransportAndForeignErrors(t *testing.T) {
	w := ErrorFrom(Transportf(KindUnauthorized, "missing bearer token"))
	if w.Kind != KindUnauthorized || w.Status() != http.StatusUnauthorized {
		t.Fatalf("transport error mapped to %q %d", w.Kind, w.Status())
	}
	err := w.Err()
	var te *TransportError
	if !errors.As(err, &te) || te.Kind != KindUnauthorized || !errors.Is(err, sandbox.ErrSandbox) {
		t.Errorf("unauthorized came back as %#v", err)
	}
	if w := ErrorFrom(errors.New("boom")); w.Kind != KindInternal || w.Status() != 500 {
		t.Errorf("a foreign error mapped to %q %d; want internal 500", w.Kind, w.Status())
	}
	if err := (Error{Kind: "from_the_future", Message: "m"}).Err(); !errors.Is(err, sandbox.ErrSandbox) || !errors.As(err, &te) || te.Kind != "from_the_future" {
		t.Errorf("an unknown kind came back as %#v", err)
	}
	if s := (Error{Kind: "from_the_future"}).Status(); s != 500 {
		t.Errorf("an unknown kind's status = %d; want 500", s)
	}
	for k := range KindStatus {
		if k == "" {
			t.Error("the kind table has an empty kind")
		}
	}
}

// Durations travel as seconds and come back exact to the nanosecond.
func TestSeconds(t *testing.T) {
	for _, d := range []time.Duration{300 * time.Millisecond, time.Nanosecond, 90 * time.Second, 1234567891 * time.Nanosecond} {
		if got := Seconds(SecondsOf(d)); got != d {
			t.Errorf("Seconds(SecondsOf(%v)) = %v", d, got)
		}
	}
	for _, bad := range []float64{1e300, -1e300} {
		if got := Seconds(bad); got != -1 {
			t.Errorf("Seconds(%g) = %v; want -1 (invalid)", bad, got)
		}
	}
}

// Output that is not UTF-8 travels in base64, byte-exact.
func TestResultEncoding(t *testing.T) {
	r := sandbox.ExecResult{ExitCode: 3, Stdout: "\xff\xfe binary \x00", Stderr: "plain ✓"}
	w := ResultFrom(r)
	if w.StdoutBase64 == nil || w.StderrBase64 != nil || w.Stderr != "plain ✓" {
		t.Fatalf("wire result %+v", w)
	}
	b, _ := json.Marshal(w)
	var back ExecResult
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, err := back.Result()
	if err != nil || got != r {
		t.Errorf("result after the trip %+v, %v; want %+v", got, err, r)
	}
	bad := "!!"
	if _, err := (ExecResult{StdoutBase64: &bad}).Result(); err == nil {
		t.Error("bad base64 must be an error")
	}
}

// The wire spec reveals env values (the client must send them) and maps
// null cpu/memory/isolation to the contract's zero values.
func TestSpecRoundTrip(t *testing.T) {
	s := sandbox.SessionSpec{Image: "host", Durability: sandbox.Persistent, WorkspaceKey: "k", Network: sandbox.NetworkNone,
		Env: sandbox.SecretEnv(map[string]string{"A": "secret"}), CPU: 1.5, MemoryMB: 256, TTLSeconds: 60, Labels: map[string]string{"x": "y"}}
	w := SpecFrom(s)
	if w.Env["A"] != "secret" || *w.CPU != 1.5 || *w.MemoryMB != 256 || w.Isolation != nil {
		t.Fatalf("wire spec %+v", w)
	}
	back := w.Spec()
	if back.Env["A"].Reveal() != "secret" || back.CPU != 1.5 || back.MemoryMB != 256 || back.Isolation != "" || back.Labels["x"] != "y" {
		t.Errorf("spec after the trip %+v", back)
	}
	var fromNull SessionSpec
	if err := json.Unmarshal([]byte(`{"image":"host","durability":"ephemeral","network":"none","isolation":null,"cpu":null,"memory_mb":null,"ttl_seconds":5}`), &fromNull); err != nil {
		t.Fatal(err)
	}
	if sp := fromNull.Spec(); sp.CPU != 0 || sp.MemoryMB != 0 || sp.Isolation != "" || sp.TTLSeconds != 5 {
		t.Errorf("nulls map to %+v", sp)
	}
}

// Stdin frames split and join.
func TestStdinFrame(t *testing.T) {
	id, data, err := ParseStdinFrame(StdinFrame(42, []byte("hello")))
	if err != nil || id != 42 || string(data) != "hello" {
		t.Errorf("stdin frame round trip: %d %q %v", id, data, err)
	}
	for _, bad := range [][]byte{nil, {0x00, 1, 2}, {0x01, 0, 0, 0, 0, 0, 0, 0, 1}} {
		if _, _, err := ParseStdinFrame(bad); err == nil {
			t.Errorf("ParseStdinFrame(%x) accepted a bad frame", bad)
		}
	}
}
