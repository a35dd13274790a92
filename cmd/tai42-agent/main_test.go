package main

import (
	"bytes"
	"strings"
	"testing"
)

// The agent's serving is the container provider's tests' (every session
// there runs this binary); these are its command line's answers.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		out, errIn string
	}{
		{[]string{"version"}, 0, "tai42-agent ", ""},
		{[]string{"--bogus"}, 2, "", "flag provided but not defined: -bogus"},
		{[]string{"agent", "extra"}, 2, "", `unexpected arguments ["extra"]`},
		{[]string{"agent", "--listen", "127.0.0.1:0", "--listen-fd", "3"}, 2, "", "--listen and --listen-fd exclude each other"},
		{[]string{"--workspace", "/nonexistent/ws"}, 1, "", "agent: the workspace"},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		if code != tc.code || !strings.HasPrefix(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.errIn) {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out.String(), errOut.String(), tc.code, tc.out, tc.errIn)
		}
	}
}
