package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func lookupFrom(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func defaultFlags() runFlags {
	return runFlags{
		image:   defaultImage,
		network: defaultNetwork,
		ttl:     defaultTTL,
		embeddedFlags: embeddedFlags{
			provider:        defaultProvider,
			policyEgress:    string(defaultPolicy.Egress),
			policyIsolation: string(defaultPolicy.Isolation),
			policyDurable:   defaultPolicy.Durable,
		},
	}
}

func TestTTLSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want int
		bad  bool
	}{
		{time.Second, 1, false},
		{1500 * time.Millisecond, 2, false},
		{10 * time.Minute, 600, false},
		{time.Second + time.Nanosecond, 2, false},
		{999 * time.Millisecond, 0, true},
		{0, 0, true},
		{-time.Second, 0, true},
	} {
		got, err := ttlSeconds(tc.in)
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("ttlSeconds(%v) = %d, %v; want %d, bad=%v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestParseEnv(t *testing.T) {
	lookup := lookupFrom(map[string]string{"FROM_CALLER": "callerval", "EMPTY": ""})
	got, err := parseEnv([]string{"A=1", "B=x=y", "C=", "FROM_CALLER", "EMPTY", "UNSET", "A=2"}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": "2", "B": "x=y", "C": "", "FROM_CALLER": "callerval", "EMPTY": ""}
	if len(got) != len(want) {
		t.Fatalf("got %d keys, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if s, ok := got[k]; !ok || s.Reveal() != v {
			t.Errorf("env %s = %q (present %v), want %q", k, s.Reveal(), ok, v)
		}
	}
	if _, ok := got["UNSET"]; ok {
		t.Error("a bare K unset in the caller's environment must be skipped")
	}
	for _, bad := range []string{"=hunter2", ""} {
		_, err := parseEnv([]string{bad}, lookup)
		if err == nil {
			t.Errorf("parseEnv(%q): want an error", bad)
		} else if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("parseEnv(%q) error shows the value: %v", bad, err)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got, err := parseLabels([]string{"a=1", "b=", "c=x=y"})
	if err != nil || got["a"] != "1" || got["b"] != "" || got["c"] != "x=y" {
		t.Fatalf("parseLabels = %v, %v", got, err)
	}
	for _, bad := range []string{"novalue", "=v"} {
		if _, err := parseLabels([]string{bad}); err == nil {
			t.Errorf("parseLabels(%q): want an error", bad)
		}
	}
}

func TestParsePuts(t *testing.T) {
	got, err := parsePuts([]string{"a.txt:b/c.txt", "dir/x.py", "l:r:with:colons", "/abs/f:/ws/abs"})
	if err != nil {
		t.Fatal(err)
	}
	want := []putSpec{{"a.txt", "b/c.txt"}, {"dir/x.py", "x.py"}, {"l", "r:with:colons"}, {"/abs/f", "/ws/abs"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("parsePuts = %v, want %v", got, want)
	}
	for _, bad := range []string{":r", "l:", ""} {
		if _, err := parsePuts([]string{bad}); err == nil {
			t.Errorf("parsePuts(%q): want an error", bad)
		}
	}
}

func TestBuildPlan(t *testing.T) {
	f := defaultFlags()
	f.env = []string{"K=v"}
	f.labels = []string{"team=ai"}
	f.persistent = "proj"
	f.ttl = 1500 * time.Millisecond
	f.cpu, f.memoryMB = 1.5, 256
	f.workdir = "sub"
	p, err := buildPlan(f, []string{"echo", "hi"}, lookupFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := p.spec
	if s.Image != "host" || s.Network != sandbox.NetworkNone || s.Durability != sandbox.Persistent ||
		s.WorkspaceKey != "proj" || s.TTLSeconds != 2 || s.CPU != 1.5 || s.MemoryMB != 256 ||
		s.Labels["team"] != "ai" || s.Env["K"].Reveal() != "v" || s.Isolation != "" {
		t.Errorf("spec = %+v", s)
	}
	if p.policy != defaultPolicy {
		t.Errorf("policy = %+v, want %+v", p.policy, defaultPolicy)
	}
	if p.timeout != 0 || p.cwd != "sub" || len(p.argv) != 2 {
		t.Errorf("plan = %+v", p)
	}

	// Ephemeral by default.
	p, err = buildPlan(defaultFlags(), []string{"true"}, lookupFrom(nil))
	if err != nil || p.spec.Durability != sandbox.Ephemeral || p.spec.WorkspaceKey != "" || p.spec.TTLSeconds != 600 {
		t.Errorf("default plan = %+v, %v", p.spec, err)
	}
}

func TestBuildPlanErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		mod  func(*runFlags)
		argv []string
		code int
	}{
		"no command":        {nil, nil, exitUsage},
		"empty command":     {nil, []string{""}, exitUsage},
		"short ttl":         {func(f *runFlags) { f.ttl = 500 * time.Millisecond }, nil, exitUsage},
		"zero timeout":      {func(f *runFlags) { f.timeoutSet = true; f.timeout = 0 }, nil, exitUsage},
		"negative timeout":  {func(f *runFlags) { f.timeoutSet = true; f.timeout = -time.Second }, nil, exitUsage},
		"bad policy egress": {func(f *runFlags) { f.policyEgress = "wide" }, nil, exitUsage},
		"bad policy iso":    {func(f *runFlags) { f.policyIsolation = "strong" }, nil, exitUsage},
		"bad network":       {func(f *runFlags) { f.network = "lan" }, nil, exitUsage},
		"bad key":           {func(f *runFlags) { f.persistent = "a/b" }, nil, exitUsage},
		"bad label":         {func(f *runFlags) { f.labels = []string{"x"} }, nil, exitUsage},
		"negative cpu":      {func(f *runFlags) { f.cpu = -1 }, nil, exitUsage},
		"empty image":       {func(f *runFlags) { f.image = "" }, nil, exitUsage},
		"env NUL":           {func(f *runFlags) { f.env = []string{"K=hunter2\x00"} }, nil, exitUsage},
	} {
		t.Run(name, func(t *testing.T) {
			f := defaultFlags()
			if tc.mod != nil {
				tc.mod(&f)
			}
			argv := tc.argv
			if argv == nil && name != "no command" {
				argv = []string{"true"}
			}
			_, err := buildPlan(f, argv, lookupFrom(nil))
			if err == nil {
				t.Fatal("want an error")
			}
			if got := errorExitCode(err); got != tc.code {
				t.Errorf("exit code %d, want %d (err %v)", got, tc.code, err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows an env value: %v", err)
			}
		})
	}
}

func TestErrorExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{&sandbox.ExecTimeoutError{Timeout: time.Second}, 124},
		{fmt.Errorf("wrapped: %w", &sandbox.ExecTimeoutError{}), 124},
		{&sandbox.SpecRejectedError{Field: "network", Reason: sandbox.ReasonPolicy}, 2},
		{&sandbox.UnavailableError{Name: "x"}, 2},
		{usagef(errors.New("bad flag")), 2},
		{&sandbox.SessionNotFoundError{SessionID: "s"}, 1},
		{sandbox.Errorf("exec_start", "cwd missing"), 1},
		{&sandbox.OutputLimitError{}, 1},
		{errors.New("io"), 1},
	} {
		if got := errorExitCode(tc.err); got != tc.want {
			t.Errorf("errorExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestResolveStateDir(t *testing.T) {
	all := map[string]string{
		"TAI42_STATE_DIR": "/from/env",
		"XDG_STATE_HOME":  "/xdg",
		"HOME":            "/home/u",
	}
	without := func(keys ...string) map[string]string {
		m := map[string]string{}
		for k, v := range all {
			m[k] = v
		}
		for _, k := range keys {
			delete(m, k)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		flag string
		env  map[string]string
		want string
	}{
		{"flag wins", "/from/flag", all, "/from/flag"},
		{"TAI42_STATE_DIR next", "", all, "/from/env"},
		{"empty TAI42_STATE_DIR is unset", "", map[string]string{"TAI42_STATE_DIR": "", "XDG_STATE_HOME": "/xdg"}, "/xdg/tai42"},
		{"XDG_STATE_HOME next", "", without("TAI42_STATE_DIR"), "/xdg/tai42"},
		{"relative XDG_STATE_HOME ignored", "", map[string]string{"XDG_STATE_HOME": "rel", "HOME": "/home/u"}, "/home/u/.local/state/tai42"},
		{"HOME last", "", without("TAI42_STATE_DIR", "XDG_STATE_HOME"), filepath.Join("/home/u", ".local", "state", "tai42")},
		{"relative flag kept", "state", all, "state"},
	} {
		got, err := resolveStateDir(tc.flag, lookupFrom(tc.env))
		if err != nil || got != tc.want {
			t.Errorf("%s: resolveStateDir = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if got, err := resolveStateDir("", lookupFrom(nil)); err == nil {
		t.Errorf("no flag and no env: got %q, want an error", got)
	}
}

func TestLockWorkspaceKey(t *testing.T) {
	dir := t.TempDir()
	l1, err := lockWorkspaceKey(dir, "k")
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockWorkspaceKey(dir, "k")
	if !errors.Is(err, sandbox.ErrSpecRejected) {
		t.Fatalf("second lock: %v, want a spec rejection", err)
	}
	l2, err := lockWorkspaceKey(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	l2.Close()
	l1.Close()
	l3, err := lockWorkspaceKey(dir, "k")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	l3.Close()
}
