package sessnet

import (
	"strings"
	"testing"

	sandbox "github.com/tai42/sandbox"
)

// TestRuleset reads the table back with nft and checks each rule says what
// the package's documentation says it does.
func TestRuleset(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	setup(t, m, "sb-egr", sandbox.NetworkEgress)
	out := run(t, "nft", "list", "table", "inet", m.prefix)
	t.Log(out)
	i, e := m.internal.bridge, m.egress.bridge
	egr := m.egress.subnet.String()
	want := []string{
		"chain input {",
		"type filter hook input priority filter; policy accept;",
		`iifname "` + i + `" drop`,
		`iifname "` + e + `" drop`,
		"chain forward {",
		"type filter hook forward priority filter; policy accept;",
		`iifname "` + i + `" oifname "` + i + `" accept`,
		`iifname "` + i + `" drop`,
		`oifname "` + i + `" drop`,
		`iifname "` + e + `" ip saddr ` + egr + ` accept`,
		`iifname "` + e + `" drop`,
		`oifname "` + e + `" ct state established,related accept`,
		`oifname "` + e + `" drop`,
		"chain postrouting {",
		"type nat hook postrouting priority srcnat; policy accept;",
		`ip saddr ` + egr + ` oifname != "` + e + `" masquerade`,
	}
	var lines []string
	for l := range strings.Lines(out) {
		if l = strings.TrimSpace(l); l != "" && l != "}" {
			lines = append(lines, l)
		}
	}
	lines = lines[1:] // table inet <prefix> {
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("the table reads\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
