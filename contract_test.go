package sandbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

const secretValue = "hunter2-s3cr3t-value"

type holder struct {
	Name   string
	Env    map[string]sandbox.Secret
	hidden sandbox.Secret
	inner  struct{ s sandbox.Secret }
}

// A Secret never shows its value in fmt verbs, slog, JSON or error text.
func TestSecretNeverShown(t *testing.T) {
	s := sandbox.NewSecret(secretValue)
	h := holder{Name: "x", Env: map[string]sandbox.Secret{"K": s}, hidden: s}
	h.inner.s = s
	spec := sandbox.SessionSpec{Image: "host", Env: map[string]sandbox.Secret{"TOKEN": s}}
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s", "%T"} {
		outs = append(outs, fmt.Sprintf(verb, s), fmt.Sprintf(verb, h), fmt.Sprintf(verb, &h), fmt.Sprintf(verb, spec))
	}
	outs = append(outs, fmt.Sprint(s), fmt.Sprintln(h), s.String(), s.GoString())
	var logBuf bytes.Buffer
	for _, hd := range []slog.Handler{slog.NewTextHandler(&logBuf, nil), slog.NewJSONHandler(&logBuf, nil)} {
		l := slog.New(hd)
		l.Info("msg", "secret", s, "spec", spec, "holder", h, slog.Any("any", s))
	}
	outs = append(outs, logBuf.String())
	for _, v := range []any{s, spec, h, &spec} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("json.Marshal(%T): %v", v, err)
		}
		outs = append(outs, string(b))
	}
	err := fmt.Errorf("wrapped: %v", s)
	outs = append(outs, err.Error(), (&sandbox.SandboxError{Message: fmt.Sprint(s)}).Error())
	for i, o := range outs {
		if strings.Contains(o, secretValue) || strings.Contains(o, fmt.Sprintf("%x", secretValue)) {
			t.Errorf("output %d shows the secret: %s", i, o)
		}
	}
	if !strings.Contains(fmt.Sprintf("%v", s), sandbox.Mask) {
		t.Errorf("%%v of a secret should show the mask %q", sandbox.Mask)
	}
	if s.Reveal() != secretValue {
		t.Errorf("Reveal = %q, want the value", s.Reveal())
	}
}

func TestSecretJSONRoundTripReadsValue(t *testing.T) {
	var spec sandbox.SessionSpec
	if err := json.Unmarshal([]byte(`{"env":{"K":"v1"}}`), &spec); err != nil {
		t.Fatal(err)
	}
	if got := spec.Env["K"].Reveal(); got != "v1" {
		t.Fatalf("unmarshalled secret = %q, want v1", got)
	}
	var s sandbox.Secret
	err := json.Unmarshal([]byte(`123456`), &s)
	if err == nil || strings.Contains(err.Error(), "123456") {
		t.Fatalf("a non-string secret must fail without echoing the input, got %v", err)
	}
	if !sandbox.NewSecret("a").Equal(sandbox.NewSecret("a")) || sandbox.NewSecret("a").Equal(sandbox.NewSecret("b")) {
		t.Fatal("Equal compares values")
	}
	var zero sandbox.Secret
	if zero.Reveal() != "" {
		t.Fatal("the zero Secret is empty")
	}
}

// JSON field names are the contract's snake_case names.
func TestJSONFieldNames(t *testing.T) {
	cases := []struct {
		v    any
		want []string
	}{
		{sandbox.SessionSpec{}, []string{"image", "workspace_key", "durability", "env", "network", "isolation", "cpu", "memory_mb", "ttl_seconds", "labels"}},
		{sandbox.SessionInfo{}, []string{"id", "image", "workspace_key", "workspace_path", "durability", "created_at", "expires_at", "labels"}},
		{sandbox.ExecResult{}, []string{"exit_code", "stdout", "stderr"}},
		{sandbox.StreamChunk{}, []string{"stream", "data"}},
		{sandbox.StreamExit{}, []string{"exit_code"}},
		{sandbox.Policy{}, []string{"egress", "isolation", "scrub_transcript", "durable"}},
	}
	for _, c := range cases {
		b, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) != len(c.want) {
			t.Errorf("%T has %d JSON fields, want %d: %s", c.v, len(m), len(c.want), b)
		}
		for _, k := range c.want {
			if _, ok := m[k]; !ok {
				t.Errorf("%T: no JSON field %q in %s", c.v, k, b)
			}
		}
	}
	b, _ := json.Marshal(sandbox.SessionSpec{})
	if !strings.Contains(string(b), `"isolation":null`) {
		t.Errorf("an unset isolation marshals to null: %s", b)
	}
	var spec sandbox.SessionSpec
	if err := json.Unmarshal([]byte(`{"isolation":null}`), &spec); err != nil || spec.Isolation != "" {
		t.Errorf("null isolation unmarshals to unset: %q %v", spec.Isolation, err)
	}
	if err := json.Unmarshal([]byte(`{"isolation":"vm"}`), &spec); err != nil || spec.Isolation != sandbox.IsolationVM {
		t.Errorf("isolation vm: %q %v", spec.Isolation, err)
	}
}

func TestRanks(t *testing.T) {
	if !(sandbox.IsolationStrength("none") < sandbox.IsolationStrength("container") &&
		sandbox.IsolationStrength("container") < sandbox.IsolationStrength("vm")) {
		t.Error("isolation strength must order none < container < vm")
	}
	if !(sandbox.NetworkOpenness("none") < sandbox.NetworkOpenness("internal") &&
		sandbox.NetworkOpenness("internal") < sandbox.NetworkOpenness("egress")) {
		t.Error("network openness must order none < internal < egress")
	}
	if sandbox.IsolationStrength("chroot") != -1 || sandbox.NetworkOpenness("wide") != -1 {
		t.Error("an unknown tier ranks -1")
	}
	for _, v := range []sandbox.Network{"none", "internal", "egress"} {
		if !v.Valid() {
			t.Errorf("%q should be valid", v)
		}
	}
	if sandbox.Network("").Valid() || sandbox.Isolation("").Valid() || sandbox.Durability("").Valid() {
		t.Error("empty tiers are not valid")
	}
}

// Every error of the family matches itself and the family, with errors.Is
// and errors.As, also when wrapped.
func TestErrorFamily(t *testing.T) {
	cases := []struct {
		err      error
		sentinel error
		as       func(error) bool
	}{
		{&sandbox.ExecTimeoutError{Timeout: time.Second, StdoutLen: 3}, sandbox.ErrExecTimeout, func(e error) bool { var x *sandbox.ExecTimeoutError; return errors.As(e, &x) && x.StdoutLen == 3 }},
		{&sandbox.FileNotFoundError{Path: "p"}, sandbox.ErrFileNotFound, func(e error) bool { var x *sandbox.FileNotFoundError; return errors.As(e, &x) && x.Path == "p" }},
		{&sandbox.SessionNotFoundError{SessionID: "id"}, sandbox.ErrSessionNotFound, func(e error) bool {
			var x *sandbox.SessionNotFoundError
			return errors.As(e, &x) && x.SessionID == "id"
		}},
		{&sandbox.SpecRejectedError{Field: "f", Reason: sandbox.ReasonPolicy}, sandbox.ErrSpecRejected, func(e error) bool { var x *sandbox.SpecRejectedError; return errors.As(e, &x) && x.Field == "f" }},
		{&sandbox.UnavailableError{Name: "n"}, sandbox.ErrUnavailable, func(e error) bool { var x *sandbox.UnavailableError; return errors.As(e, &x) && x.Name == "n" }},
		{&sandbox.OutputLimitError{Limit: 1}, sandbox.ErrOutputLimit, func(e error) bool { var x *sandbox.OutputLimitError; return errors.As(e, &x) && x.Limit == 1 }},
		{&sandbox.WorkspaceNotFoundError{Key: "k"}, sandbox.ErrWorkspaceNotFound, func(e error) bool { var x *sandbox.WorkspaceNotFoundError; return errors.As(e, &x) && x.Key == "k" }},
		{&sandbox.UserNotFoundError{User: "alice"}, sandbox.ErrUserNotFound, func(e error) bool { var x *sandbox.UserNotFoundError; return errors.As(e, &x) && x.User == "alice" }},
		{sandbox.Errorf("op", "m"), sandbox.ErrSandbox, func(e error) bool { var x *sandbox.SandboxError; return errors.As(e, &x) && x.Op == "op" }},
	}
	others := []error{sandbox.ErrExecTimeout, sandbox.ErrFileNotFound, sandbox.ErrSessionNotFound, sandbox.ErrSpecRejected, sandbox.ErrUnavailable, sandbox.ErrOutputLimit, sandbox.ErrWorkspaceNotFound, sandbox.ErrUserNotFound}
	for _, c := range cases {
		for _, e := range []error{c.err, fmt.Errorf("context: %w", c.err)} {
			if !errors.Is(e, c.sentinel) {
				t.Errorf("%T: errors.Is(err, its sentinel) is false", c.err)
			}
			if !errors.Is(e, sandbox.ErrSandbox) {
				t.Errorf("%T: errors.Is(err, ErrSandbox) is false", c.err)
			}
			if !c.as(e) {
				t.Errorf("%T: errors.As to itself failed", c.err)
			}
			var base *sandbox.SandboxError
			if !errors.As(e, &base) || base.Error() == "" {
				t.Errorf("%T: errors.As(err, **SandboxError) failed", c.err)
			}
			for _, o := range others {
				if o != c.sentinel && errors.Is(e, o) {
					t.Errorf("%T matches the wrong sentinel %v", c.err, o)
				}
			}
		}
	}
	cause := errors.New("disk on fire")
	w := sandbox.WrapError("put_file", "write failed", cause)
	if !errors.Is(w, cause) || !strings.Contains(w.Error(), "disk on fire") || !strings.Contains(w.Error(), "put_file") {
		t.Errorf("WrapError keeps its cause and names the op: %v", w)
	}
	te := &sandbox.ExecTimeoutError{Timeout: 2 * time.Second, StdoutLen: 12, StderrLen: 4, Note: "held"}
	if msg := te.Error(); !strings.Contains(msg, "12") || !strings.Contains(msg, "4") || !strings.Contains(msg, "2s") || !strings.Contains(msg, "held") {
		t.Errorf("the timeout message carries the timeout, the lengths and the note: %q", msg)
	}
}

// A user not known in the session names itself and the file it was looked
// up in, and converts to a *SandboxError of op exec.
// WrapForeign passes on an error of the family, a kind or the base,
// wrapped or not, as it is; wraps anything else; keeps nil nil.
func TestWrapForeign(t *testing.T) {
	if err := sandbox.WrapForeign("op", "m", nil); err != nil {
		t.Errorf("nil = %v", err)
	}
	for _, in := range []error{
		sandbox.Errorf("exec", "refused"),
		&sandbox.FileNotFoundError{Path: "a"},
		&sandbox.SpecRejectedError{Field: "image", Reason: sandbox.ReasonConflict, Message: "x"},
		fmt.Errorf("context: %w", &sandbox.SessionNotFoundError{SessionID: "s"}),
	} {
		if got := sandbox.WrapForeign("op", "m", in); got != in {
			t.Errorf("WrapForeign(%v) = %v; want it as it is", in, got)
		}
	}
	cause := errors.New("EBUSY")
	got := sandbox.WrapForeign("remove_workspace", "could not remove", cause)
	se, ok := errors.AsType[*sandbox.SandboxError](got)
	if !ok || se.Op != "remove_workspace" || se.Message != "could not remove" || !errors.Is(got, cause) {
		t.Errorf("WrapForeign(EBUSY) = %#v; want a remove_workspace SandboxError whose cause is EBUSY", got)
	}
}

func TestUserNotFoundError(t *testing.T) {
	err := fmt.Errorf("running: %w", &sandbox.UserNotFoundError{User: "alice"})
	if msg := err.Error(); !strings.Contains(msg, `"alice"`) || !strings.Contains(msg, "/etc/passwd") {
		t.Errorf("message %q; want it to name the user and /etc/passwd", msg)
	}
	var se *sandbox.SandboxError
	if !errors.As(err, &se) || se.Op != "exec" {
		t.Errorf("errors.As to *SandboxError: %#v; want op exec", se)
	}
}

// ValidUser takes "", a name, a uid and uid:gid, and refuses anything else.
func TestValidUser(t *testing.T) {
	for _, u := range []string{"", "root", "nobody", "www-data", "user.name_1", "ünïcode", "0", "65534", "007", "1000:1000", "0:0", "4294967294", "4294967294:4294967294", strings.Repeat("u", sandbox.MaxUserLen)} {
		if err := sandbox.ValidUser(u); err != nil {
			t.Errorf("ValidUser(%q) = %v; want nil", u, err)
		}
	}
	for _, u := range []string{
		"a:b", "1000:", ":1000", ":", "1:2:3", "root:0", "0:root", "1000:x",
		"4294967295", "4294967295:0", "0:4294967295", "99999999999999999999", "-1", "+1",
		"a b", " root", "root\n", "ro\x00ot", "tab\there", "\x7f", "\xff\xfe", strings.Repeat("u", sandbox.MaxUserLen+1),
	} {
		err := sandbox.ValidUser(u)
		if err == nil {
			t.Errorf("ValidUser(%q) = nil; want it refused", u)
			continue
		}
		if strings.ContainsRune(err.Error(), 0) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ValidUser(%q) = %q: the message carries a raw control byte", u, err)
		}
	}
}

func validSpec() sandbox.SessionSpec {
	return sandbox.SessionSpec{Image: "host", Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: 60}
}

func TestSpecValidate(t *testing.T) {
	if err := validSpec().Validate(); err != nil {
		t.Fatalf("a valid spec: %v", err)
	}
	bad := []struct {
		field string
		mut   func(*sandbox.SessionSpec)
	}{
		{"image", func(s *sandbox.SessionSpec) { s.Image = "" }},
		{"image", func(s *sandbox.SessionSpec) { s.Image = "a\nb" }},
		{"durability", func(s *sandbox.SessionSpec) { s.Durability = "forever" }},
		{"durability", func(s *sandbox.SessionSpec) { s.Durability = "" }},
		{"workspace_key", func(s *sandbox.SessionSpec) { s.Durability = sandbox.Persistent }},
		{"workspace_key", func(s *sandbox.SessionSpec) { s.WorkspaceKey = "../etc" }},
		{"workspace_key", func(s *sandbox.SessionSpec) { s.WorkspaceKey = ".." }},
		{"workspace_key", func(s *sandbox.SessionSpec) { s.WorkspaceKey = strings.Repeat("k", 129) }},
		{"env", func(s *sandbox.SessionSpec) { s.Env = map[string]sandbox.Secret{"A=B": sandbox.NewSecret("v")} }},
		{"env", func(s *sandbox.SessionSpec) { s.Env = map[string]sandbox.Secret{"": sandbox.NewSecret("v")} }},
		{"env", func(s *sandbox.SessionSpec) {
			s.Env = map[string]sandbox.Secret{"K": sandbox.NewSecret("a\x00" + secretValue)}
		}},
		{"network", func(s *sandbox.SessionSpec) { s.Network = "wide" }},
		{"network", func(s *sandbox.SessionSpec) { s.Network = "" }},
		{"isolation", func(s *sandbox.SessionSpec) { s.Isolation = "chroot" }},
		{"cpu", func(s *sandbox.SessionSpec) { s.CPU = -1 }},
		{"memory_mb", func(s *sandbox.SessionSpec) { s.MemoryMB = -5 }},
		{"ttl_seconds", func(s *sandbox.SessionSpec) { s.TTLSeconds = 0 }},
		{"ttl_seconds", func(s *sandbox.SessionSpec) { s.TTLSeconds = -3 }},
		{"labels", func(s *sandbox.SessionSpec) { s.Labels = map[string]string{"has space": "v"} }},
		{"labels", func(s *sandbox.SessionSpec) { s.Labels = map[string]string{"": "v"} }},
		{"labels", func(s *sandbox.SessionSpec) { s.Labels = map[string]string{"k": "bad\x01value"} }},
	}
	for _, c := range bad {
		spec := validSpec()
		c.mut(&spec)
		err := spec.Validate()
		var rej *sandbox.SpecRejectedError
		if !errors.As(err, &rej) {
			t.Errorf("%s: want *SpecRejectedError, got %v", c.field, err)
			continue
		}
		if rej.Field != c.field || rej.Reason != sandbox.ReasonInvalid || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: got field %q reason %q message %q", c.field, rej.Field, rej.Reason, err)
		}
		if strings.Contains(err.Error(), secretValue) {
			t.Errorf("%s: the error shows an env value: %v", c.field, err)
		}
	}
	good := validSpec()
	good.Durability, good.WorkspaceKey = sandbox.Persistent, "proj-1.a_b"
	good.Isolation, good.CPU, good.MemoryMB = sandbox.IsolationNone, 0.5, 128
	good.Labels = map[string]string{"app.kubernetes.io/name": "x", "team": "ünïcode ok"}
	if err := good.Validate(); err != nil {
		t.Errorf("a valid persistent spec: %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := (sandbox.Policy{Egress: "egress", Isolation: "none"}).Validate(); err != nil {
		t.Error(err)
	}
	if (sandbox.Policy{Egress: "wide", Isolation: "none"}).Validate() == nil || (sandbox.Policy{Egress: "none"}).Validate() == nil {
		t.Error("a policy with unknown tiers is invalid")
	}
}

type fakeSandbox struct{ sandbox.Sandbox }

func TestRegistry(t *testing.T) {
	var r sandbox.Registry
	_, err := r.Require("")
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("empty registry: want UnavailableError, got %v", err)
	}
	a, b := &fakeSandbox{}, &fakeSandbox{}
	if err := r.Register("a", a); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("b", b); err != nil {
		t.Fatal(err)
	}
	if r.Register("a", b) == nil || r.Register("", a) == nil || r.Register("c", nil) == nil {
		t.Error("duplicate, unnamed and nil registrations must fail")
	}
	if got, _ := r.Require(""); got != a {
		t.Error(`Require("") returns the first registered`)
	}
	if got, _ := r.Require("b"); got != b {
		t.Error(`Require("b") returns b`)
	}
	_, err = r.Require("zzz")
	var ue *sandbox.UnavailableError
	if !errors.As(err, &ue) || ue.Name != "zzz" || !strings.Contains(err.Error(), "a, b") {
		t.Errorf("unknown name: want UnavailableError listing a, b; got %v", err)
	}
	if !r.Unregister("a") || r.Unregister("a") {
		t.Error("Unregister reports whether the name was registered")
	}
	if got, _ := r.Require(""); got != b {
		t.Error("after unregistering a, the first is b")
	}
}

// TestRegistryFunc: a name registered with an opener is opened on its
// first Require, once, and every Require returns that sandbox; a failed
// open is the opener's error and keeps nothing, so the next Require opens
// again; an unknown name lists the lazily registered names too, opening
// none.
func TestRegistryFunc(t *testing.T) {
	var r sandbox.Registry
	opened, fail := 0, errors.New("state directory in use")
	want := &fakeSandbox{}
	if err := r.RegisterFunc("lazy", func() (sandbox.Sandbox, error) {
		opened++
		if opened == 1 {
			return nil, fail
		}
		return want, nil
	}); err != nil {
		t.Fatal(err)
	}
	never := func() (sandbox.Sandbox, error) { t.Error("an opener not asked for ran"); return nil, fail }
	if err := r.RegisterFunc("other", never); err != nil {
		t.Fatal(err)
	}
	if r.RegisterFunc("lazy", never) == nil || r.Register("lazy", want) == nil || r.RegisterFunc("", never) == nil || r.RegisterFunc("x", nil) == nil {
		t.Error("duplicate, unnamed and nil registrations must fail")
	}

	_, err := r.Require("zzz")
	var ue *sandbox.UnavailableError
	if !errors.As(err, &ue) || !slices.Equal(ue.Registered, []string{"lazy", "other"}) {
		t.Errorf("unknown name: want UnavailableError listing lazy, other; got %v", err)
	}
	_, err = r.Require("lazy")
	if !errors.Is(err, fail) || errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), `"lazy"`) {
		t.Errorf("failed open: want the opener's error naming lazy, got %v", err)
	}
	for range 3 {
		if got, err := r.Require(""); got != want || err != nil {
			t.Fatalf(`Require("") after a failed open = %v, %v; want the sandbox opened now`, got, err)
		}
	}
	if opened != 2 {
		t.Errorf("opener ran %d times, want 2 (a failure, then once)", opened)
	}
}

// TestRegistryFuncConcurrent: concurrent first Requires of one name share
// one open.
func TestRegistryFuncConcurrent(t *testing.T) {
	var r sandbox.Registry
	var opened atomic.Int32
	release := make(chan struct{})
	want := &fakeSandbox{}
	if err := r.RegisterFunc("slow", func() (sandbox.Sandbox, error) {
		opened.Add(1)
		<-release
		return want, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("ready", &fakeSandbox{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make([]sandbox.Sandbox, 8)
	for i := range got {
		wg.Go(func() { got[i], _ = r.Require("slow") })
	}
	for opened.Load() == 0 {
		runtime.Gosched()
	}
	// An open under way holds up neither another name nor Names.
	if _, err := r.Require("ready"); err != nil || len(r.Names()) != 2 {
		t.Errorf("while slow opens: Require(ready) = %v, Names %v", err, r.Names())
	}
	close(release)
	wg.Wait()
	if n := opened.Load(); n != 1 {
		t.Errorf("opener ran %d times, want 1", n)
	}
	for i, sb := range got {
		if sb != want {
			t.Errorf("Require %d got %v, want the opened sandbox", i, sb)
		}
	}
}
