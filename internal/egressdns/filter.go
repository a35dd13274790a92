package egressdns

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// maxName is the longest a name may be in presentation form without its
// trailing dot (255 octets on the wire).
const maxName = 253

// PatternError is the error ValidPattern and New return for a domain
// pattern that is not a name or a wildcard over one.
type PatternError struct {
	Pattern string // as given (clipped when very long)
	Reason  string
}

func (e *PatternError) Error() string {
	return fmt.Sprintf("egressdns: domain pattern %q: %s", e.Pattern, e.Reason)
}

// ValidPattern reports, as a *PatternError naming the pattern and its bad
// part, why p is not a domain pattern, or nil. A pattern is a name
// ("example.org", matching only itself) or a wildcard "*.example.org",
// which matches every name below example.org (a.example.org,
// a.b.example.org) but not example.org itself: list both to allow both.
// Matching ignores case and a trailing dot. Labels hold letters, digits, -
// and _ only (internationalised names in their xn-- form); "*" may only be
// the whole first label and never stand alone.
func ValidPattern(p string) error {
	_, _, err := parsePattern(p)
	return err
}

// parsePattern returns p's name lowercased without a trailing dot, and
// whether it is a wildcard (the name is then the part below the "*.").
func parsePattern(p string) (name string, wildcard bool, err error) {
	bad := func(format string, a ...any) error {
		shown := p
		if len(shown) > 2*maxName {
			shown = shown[:2*maxName] + "..."
		}
		return &PatternError{Pattern: shown, Reason: fmt.Sprintf(format, a...)}
	}
	name = strings.TrimSuffix(p, ".")
	switch {
	case name == "":
		return "", false, bad("is empty")
	case name == "*":
		return "", false, bad("a bare * would allow every name: list the domains, as in *.example.org")
	case strings.HasPrefix(name, "*."):
		wildcard = true
		name = name[2:]
	}
	if len(name) > maxName {
		return "", false, bad("is %d characters long: a name has at most %d", len(name), maxName)
	}
	for label := range strings.SplitSeq(name, ".") {
		switch {
		case label == "":
			return "", false, bad("has an empty label (a leading dot or two dots in a row)")
		case strings.Contains(label, "*"):
			return "", false, bad("label %q: * is allowed only as the whole first label, as in *.example.org", label)
		case len(label) > 63:
			return "", false, bad("label %.20q... is %d characters long: a label has at most 63", label, len(label))
		}
		for _, c := range []byte(label) {
			if !ldh(c) {
				return "", false, bad("label %q has the character %q: only letters, digits, - and _ are allowed (an internationalised name in its xn-- form)", label, rune(c))
			}
		}
	}
	return strings.ToLower(name), wildcard, nil
}

func ldh(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

// allowlist is a parsed Config.Allow. Read-only once made: safe for
// concurrent use.
type allowlist struct {
	exact map[string]bool // names allowed as they are
	below map[string]bool // names every name below which is allowed
}

func newAllowlist(patterns []string) (*allowlist, error) {
	if len(patterns) == 0 {
		return nil, nil
	}
	a := &allowlist{exact: map[string]bool{}, below: map[string]bool{}}
	for _, p := range patterns {
		name, wild, err := parsePattern(p)
		if err != nil {
			return nil, err
		}
		if wild {
			a.below[name] = true
		} else {
			a.exact[name] = true
		}
	}
	return a, nil
}

// allows reports whether qname (presentation form, as miekg/dns parses a
// question) is allowed. A name holding an escape (\. inside a label, \DDD
// for a byte outside the LDH set) cannot match a pattern, whose labels are
// LDH only, and is refused outright rather than unescaped.
func (a *allowlist) allows(qname string) bool {
	name := strings.ToLower(strings.TrimSuffix(qname, "."))
	if name == "" || strings.IndexByte(name, '\\') >= 0 {
		return false
	}
	if a.exact[name] {
		return true
	}
	for i := strings.IndexByte(name, '.'); i >= 0; i = strings.IndexByte(name, '.') {
		name = name[i+1:]
		if a.below[name] {
			return true
		}
	}
	return false
}

// answerAddrs returns the A and AAAA addresses an answer gives for qname,
// following the CNAME chain from qname through the answer section, and the
// least TTL of the records on that chain. Address records of other owners
// (not on the chain) are left out: the question decides what is allowed.
func answerAddrs(qname string, qtype uint16, answer []dns.RR) (addrs []netip.Addr, minTTL uint32) {
	minTTL = ^uint32(0)
	owner := qname
	// Each step follows one CNAME; a chain longer than the section is a loop.
	for range len(answer) + 1 {
		next := ""
		for _, rr := range answer {
			h := rr.Header()
			if h.Class != dns.ClassINET || !strings.EqualFold(h.Name, owner) {
				continue
			}
			switch rr := rr.(type) {
			case *dns.A:
				if qtype == dns.TypeA {
					if a, ok := netip.AddrFromSlice(rr.A.To4()); ok {
						addrs = append(addrs, a)
						minTTL = min(minTTL, h.Ttl)
					}
				}
			case *dns.AAAA:
				if qtype == dns.TypeAAAA {
					if a, ok := netip.AddrFromSlice(rr.AAAA.To16()); ok {
						addrs = append(addrs, a)
						minTTL = min(minTTL, h.Ttl)
					}
				}
			case *dns.CNAME:
				if next == "" {
					next = rr.Target
					minTTL = min(minTTL, h.Ttl)
				}
			}
		}
		if next == "" || len(addrs) > 0 {
			break
		}
		owner = next
	}
	if len(addrs) == 0 {
		return nil, 0
	}
	return addrs, minTTL
}

// keepFor is how long the addresses of an answer whose least TTL is ttl
// stay allowed: the TTL floored at minTTL, plus grace (a client may use an
// address a little past the TTL it was given, and connects after it
// resolved).
func keepFor(ttl uint32, minTTL, grace time.Duration) time.Duration {
	return max(time.Duration(ttl)*time.Second, minTTL) + grace
}
