package mcpserver

import (
	"strings"
	"testing"

	"github.com/tai42/sandbox"
)

// The agent is told how isolated its sessions really are, in the
// server's instructions and in every create_session result: isolation
// none is said to be no sandbox, and a server that does not know says
// so rather than promise a sandbox.
func TestIsolationTold(t *testing.T) {
	for _, tc := range []struct {
		iso        sandbox.Isolation
		asked      string // the create's isolation
		wantIns    []string
		notIns     []string
		wantCreate string
	}{
		{iso: sandbox.IsolationNone, wantIns: []string{"Isolation: none", "NOT sandboxed", "user's machine"}, notIns: []string{"sandbox sessions"}, wantCreate: "none"},
		{iso: "", wantIns: []string{"not known", "Do not assume"}, notIns: []string{"sandbox sessions"}, wantCreate: "unknown"},
		{iso: sandbox.IsolationNone, asked: "none", wantIns: []string{"Isolation: none"}, wantCreate: "none"},
		// The instructions of the other tiers; the host sandbox under
		// them makes no difference to what the server says.
		{iso: sandbox.IsolationContainer, wantIns: []string{"Isolation: container"}, notIns: []string{"NOT sandboxed"}, wantCreate: "container"},
		{iso: sandbox.IsolationVM, wantIns: []string{"Isolation: vm"}, notIns: []string{"NOT sandboxed"}, wantCreate: "vm"},
	} {
		e := newEnv(t, Options{Isolation: tc.iso})
		cs := e.connect()
		ins := cs.InitializeResult().Instructions
		for _, w := range tc.wantIns {
			if !strings.Contains(ins, w) {
				t.Errorf("isolation %q: the instructions do not say %q: %s", tc.iso, w, ins)
			}
		}
		for _, w := range tc.notIns {
			if strings.Contains(ins, w) {
				t.Errorf("isolation %q: the instructions say %q: %s", tc.iso, w, ins)
			}
		}
		args := map[string]any{"network": "none"}
		if tc.asked != "" {
			args["isolation"] = tc.asked
		}
		out := ok[createOut](t, cs, "create_session", args)
		if out.Isolation != tc.wantCreate || out.Network != "none" || out.SessionID == "" {
			t.Errorf("isolation %q: create_session says isolation %q, network %q (session %q); want %q, none", tc.iso, out.Isolation, out.Network, out.SessionID, tc.wantCreate)
		}
	}
	// A create that names no network gets none, and is told so.
	cs := newEnv(t, Options{Isolation: sandbox.IsolationNone}).connect()
	if out := ok[createOut](t, cs, "create_session", nil); out.Network != "none" {
		t.Errorf("a create naming no network says network %q", out.Network)
	}
}
