package egressdns

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func TestValidPattern(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	for _, p := range []string{
		"example.org", "example.org.", "EXAMPLE.Org", "*.example.org", "*.example.org.", "localhost",
		"a-b.c_d.example", "xn--bcher-kva.example", "*.org", "1.2.3.4", long63 + ".example",
		strings.Repeat(long63+".", 3) + strings.Repeat("b", 61), // 253 characters
	} {
		if err := ValidPattern(p); err != nil {
			t.Errorf("ValidPattern(%q) = %v, want nil", p, err)
		}
	}
	for p, why := range map[string]string{
		"":                                   "empty",
		".":                                  "empty",
		"*":                                  "bare *",
		"*.":                                 "bare *",
		"..":                                 "empty label",
		".example.org":                       "empty label",
		"example..org":                       "empty label",
		"*.*.example.org":                    "whole first label",
		"a.*.example.org":                    "whole first label",
		"*example.org":                       "whole first label",
		"ex*mple.org":                        "whole first label",
		"**.example.org":                     "whole first label",
		"exa mple.org":                       `character ' '`,
		"example.org/path":                   `character '/'`,
		"https://example.org":                `character ':'`,
		"bücher.example":                     "xn--",
		"ex\\.ample.org":                     `character '\\'`,
		strings.Repeat("a", 64) + ".example": "at most 63",
		strings.Repeat(long63+".", 4) + "a":  "at most 253",
		"*." + strings.Repeat(long63+".", 4): "at most 253",
		"example.org\n":                      `character '\n'`,
		"example.org..":                      "empty label",
		"*..example.org":                     "empty label",
		"127.0.0.1:53":                       `character ':'`,
		"example.org,other.org":              `character ','`,
		"exam\x00ple.org":                    `character '\x00'`,
		"*.example.org/" + strings.Repeat("x", 900): "at most 253",
	} {
		err := ValidPattern(p)
		var pe *PatternError
		if !errors.As(err, &pe) {
			t.Errorf("ValidPattern(%q) = %v, want a *PatternError", p, err)
			continue
		}
		if !strings.Contains(err.Error(), why) {
			t.Errorf("ValidPattern(%q) = %q, want it to say %q", p, err, why)
		}
		if len(p) < 500 && pe.Pattern != p {
			t.Errorf("ValidPattern(%q) names %q, want the pattern as given", p, pe.Pattern)
		}
	}
}

func TestAllows(t *testing.T) {
	a, err := newAllowlist([]string{"Example.org", "*.cdn.example.NET.", "*.deep.test"})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"example.org.":         true,
		"EXAMPLE.ORG":          true,
		"www.example.org.":     false, // exact names cover only themselves
		"org.":                 false,
		"xexample.org.":        false,
		"a.cdn.example.net.":   true,
		"A.B.CDN.EXAMPLE.NET.": true,
		"cdn.example.net.":     false,
		"xcdn.example.net.":    false,
		"a.cdn.example.net.x.": false,
		"x.deep.test.":         true,
		`a\.b.deep.test.`:      false, // escapes never match
		`a\046b.deep.test.`:    false,
		".":                    false,
		"":                     false,
	} {
		if got := a.allows(name); got != want {
			t.Errorf("allows(%q) = %v, want %v", name, got, want)
		}
	}
	if a, err := newAllowlist(nil); a != nil || err != nil {
		t.Errorf("newAllowlist(nil) = %v, %v: want no filter", a, err)
	}
}

func TestAnswerAddrs(t *testing.T) {
	rrs := func(ss ...string) []dns.RR {
		var out []dns.RR
		for _, s := range ss {
			rr, err := dns.NewRR(s)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, rr)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		qname  string
		qtype  uint16
		answer []dns.RR
		want   []string
		ttl    uint32
	}{
		{"plain", "a.test.", dns.TypeA, rrs("a.test. 60 IN A 192.0.2.1", "A.TEST. 30 IN A 192.0.2.2"), []string{"192.0.2.1", "192.0.2.2"}, 30},
		{"chain", "a.test.", dns.TypeA, rrs("b.test. 50 IN A 192.0.2.9", "a.test. 20 IN CNAME B.test.", "b.test. 40 IN A 192.0.2.8"), []string{"192.0.2.9", "192.0.2.8"}, 20},
		{"off-chain records are ignored", "a.test.", dns.TypeA, rrs("a.test. 60 IN A 192.0.2.1", "evil.test. 60 IN A 198.51.100.1"), []string{"192.0.2.1"}, 60},
		// Owners compare whole: a name that ends with the question's
		// (or the CNAME target's) is another name.
		{"owner ending with the question", "a.test.", dns.TypeA, rrs("xa.test. 60 IN A 198.51.100.1", "b.a.test. 60 IN A 198.51.100.2", "a.test. 60 IN A 192.0.2.1"), []string{"192.0.2.1"}, 60},
		{"only owners ending with the question", "a.test.", dns.TypeA, rrs("xa.test. 60 IN A 198.51.100.1"), nil, 0},
		{"owner ending with the CNAME target", "a.test.", dns.TypeA, rrs("a.test. 60 IN CNAME b.test.", "xb.test. 60 IN A 198.51.100.1", "B.test. 50 IN A 192.0.2.3"), []string{"192.0.2.3"}, 50},
		{"off-chain after a CNAME", "a.test.", dns.TypeA, rrs("a.test. 60 IN CNAME b.test.", "evil.test. 60 IN A 198.51.100.1"), nil, 0},
		{"loop", "a.test.", dns.TypeA, rrs("a.test. 60 IN CNAME b.test.", "b.test. 60 IN CNAME a.test."), nil, 0},
		{"aaaa", "a.test.", dns.TypeAAAA, rrs("a.test. 60 IN A 192.0.2.1", "a.test. 70 IN AAAA 2001:db8::2"), []string{"2001:db8::2"}, 70},
		{"other class", "a.test.", dns.TypeA, rrs("a.test. 60 CH A 192.0.2.1"), nil, 0},
		{"empty", "a.test.", dns.TypeA, nil, nil, 0},
	} {
		addrs, ttl := answerAddrs(tc.qname, tc.qtype, tc.answer)
		if !slices.Equal(addrs, mustAddrs(tc.want...)) || ttl != tc.ttl {
			t.Errorf("%s: answerAddrs = %v, %d; want %v, %d", tc.name, addrs, ttl, tc.want, tc.ttl)
		}
	}
}
