package sessnet

import (
	"net/netip"
	"slices"
	"testing"
)

// TestIntervalElements: an nftables interval set refuses overlapping
// elements, so prefixes that overlap, nest or touch become one range, a
// range is its first address and the address after its last (an interval
// end), and a range that reaches the family's last address has no end.
func TestIntervalElements(t *testing.T) {
	for _, c := range []struct {
		prefixes []string
		want     []string // "+A" an interval start, "-A" an interval end
	}{
		{nil, nil},
		{[]string{"10.0.0.0/8"}, []string{"+10.0.0.0", "-11.0.0.0"}},
		{[]string{"10.1.2.3/8"}, []string{"+10.0.0.0", "-11.0.0.0"}}, // masked
		{[]string{"10.0.0.0/8", "10.1.0.0/16"}, []string{"+10.0.0.0", "-11.0.0.0"}},
		{[]string{"10.0.0.0/24", "10.0.1.0/24"}, []string{"+10.0.0.0", "-10.0.2.0"}}, // adjacent: joined
		{[]string{"192.168.0.0/16", "10.0.0.0/8", "172.16.0.0/12"},
			[]string{"+10.0.0.0", "-11.0.0.0", "+172.16.0.0", "-172.32.0.0", "+192.168.0.0", "-192.169.0.0"}},
		{[]string{"224.0.0.0/3"}, []string{"+224.0.0.0"}},           // up to 255.255.255.255
		{[]string{"0.0.0.0/0", "10.0.0.0/8"}, []string{"+0.0.0.0"}}, // everything
		{[]string{"203.0.113.7/32"}, []string{"+203.0.113.7", "-203.0.113.8"}},
		{[]string{"fd00::/8", "fc00::/8"}, []string{"+fc00::", "-fe00::"}},
		{[]string{"2001:db8::/32", "::1/128"}, []string{"+::1", "-::2", "+2001:db8::", "-2001:db9::"}},
		{[]string{"ff00::/8"}, []string{"+ff00::"}},
	} {
		var ps []netip.Prefix
		for _, p := range c.prefixes {
			ps = append(ps, netip.MustParsePrefix(p))
		}
		var got []string
		for _, e := range intervalElements(ps) {
			a, ok := netip.AddrFromSlice(e.Key)
			if !ok {
				t.Fatalf("%v: key %x is not an address", c.prefixes, e.Key)
			}
			sign := "+"
			if e.IntervalEnd {
				sign = "-"
			}
			got = append(got, sign+a.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%v: %v, want %v", c.prefixes, got, c.want)
		}
	}
}
