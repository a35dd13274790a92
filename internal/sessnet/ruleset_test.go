package sessnet

import (
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"

	sandbox "github.com/tai42/sandbox"
)

var (
	hostSetElements = regexp.MustCompile(`(?s)(set host[46] \{[^}]*?)\s*elements = \{[^}]*\}`)
	counterValues   = regexp.MustCompile(`packets \d+ bytes \d+`)
)

// stripVolatile drops from nft's listing of a table what changes as it
// runs: the elements of the host's networks and the counters' values.
func stripVolatile(s string) string {
	s = hostSetElements.ReplaceAllString(s, "$1")
	return counterValues.ReplaceAllString(s, "packets N bytes N")
}

// TestRuleset reads the table back with nft and checks each rule says what
// the package's documentation says it does, with every kind of fence on.
func TestRuleset(t *testing.T) {
	t.Parallel()
	m, _, _ := newFenceManager(t, Fences{
		Allow:        []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24"), netip.MustParsePrefix("10.1.3.0/24")},
		Deny:         []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("0.0.0.0/0")},
		DomainFilter: true,
		ResolverPort: 5353,
	})
	setup(t, m, "sb-egr", sandbox.NetworkEgress)
	out := stripVolatile(run(t, "nft", "list", "table", "inet", m.prefix))
	t.Log(out)
	i, e := m.internal.bridge, m.egress.bridge
	egr := m.egress.subnet.String()
	gw := m.EgressGateway().String()
	var want []string
	for _, r := range BlockReasons() {
		want = append(want, "counter "+r+" {", "packets N bytes N")
	}
	want = append(want,
		"limit log {", "rate 20/second burst 40 packets",
		"set host4 {", "type ipv4_addr", "flags interval",
		"set host6 {", "type ipv6_addr", "flags interval",
		"set opallow4 {", "type ipv4_addr", "flags interval", "elements = { 10.1.2.0/23 }",
		"set opallow6 {", "type ipv6_addr", "flags interval",
		"set opdeny4 {", "type ipv4_addr", "flags interval", "elements = { 0.0.0.0/0 }",
		"set opdeny6 {", "type ipv6_addr", "flags interval", "elements = { 2001:db8::/32 }",
		"set allow4 {", "type ipv4_addr", "flags timeout",
		"set allow6 {", "type ipv6_addr", "flags timeout",
		"chain input {",
		"type filter hook input priority filter; policy accept;",
		`iifname "`+e+`" ip saddr `+egr+` ip daddr `+gw+` udp dport 5353 accept`,
		`iifname "`+e+`" ip saddr `+egr+` ip daddr `+gw+` tcp dport 5353 accept`,
		`iifname "`+i+`" drop`,
		`iifname "`+e+`" drop`,
		"chain forward {",
		"type filter hook forward priority filter; policy accept;",
		`iifname "`+i+`" oifname "`+i+`" accept`,
		`iifname "`+i+`" drop`,
		`oifname "`+i+`" drop`,
		`iifname "`+e+`" ip saddr `+egr+` jump fence`,
		`iifname "`+e+`" drop`,
		`oifname "`+e+`" ct state established,related accept`,
		`oifname "`+e+`" drop`,
		"chain prerouting {",
		"type nat hook prerouting priority dstnat; policy accept;",
		`iifname "`+e+`" ip saddr `+egr+` ip daddr `+gw+` udp dport 53 dnat ip to `+gw+`:5353`,
		`iifname "`+e+`" ip saddr `+egr+` ip daddr `+gw+` tcp dport 53 dnat ip to `+gw+`:5353`,
		"chain postrouting {",
		"type nat hook postrouting priority srcnat; policy accept;",
		`ip saddr `+egr+` oifname != "`+e+`" masquerade`,
		"chain fence {",
		"ip daddr @opallow4 accept",
		"ip6 daddr @opallow6 accept",
		"ip daddr @opdeny4 goto refuse_operator_deny",
		"ip6 daddr @opdeny6 goto refuse_operator_deny",
	)
	for _, b := range builtinFences {
		for _, p := range b.prefixes {
			ip := "ip"
			if p.Addr().Is6() {
				ip = "ip6"
			}
			dst := p.String()
			if p.IsSingleIP() {
				dst = p.Addr().String()
			}
			want = append(want, ip+" daddr "+dst+" goto refuse_"+b.reason)
		}
	}
	want = append(want,
		"ip daddr @host4 goto refuse_host_network",
		"ip6 daddr @host6 goto refuse_host_network",
		"ct state established,related accept",
		"ip daddr @allow4 accept",
		"ip6 daddr @allow6 accept",
		"goto refuse_not_allowed_domain",
		"accept",
	)
	for _, r := range BlockReasons() {
		want = append(want,
			"chain refuse_"+r+" {",
			`counter name "`+r+`" limit name "log" log prefix "`+m.prefix+` blocked `+r+`" group `+itoa(int(m.logGroup))+` snaplen 48`,
			"meta l4proto tcp reject with tcp reset",
			"reject with icmpx admin-prohibited",
		)
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

func itoa(n int) string { return strconv.Itoa(n) }
