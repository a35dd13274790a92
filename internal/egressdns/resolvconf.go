package egressdns

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// DefaultResolvConf is where the host's resolvers are read when
// Config.Upstreams and Config.ResolvConf are empty.
const DefaultResolvConf = "/etc/resolv.conf"

// readResolvConf returns the resolvers of the nameserver lines of a
// resolv.conf(5) file, on port 53, in the file's order. Comments (# or ;),
// options, search and other keywords are skipped. A file without one usable
// nameserver line is an error that says so, naming what it could not use.
func readResolvConf(path string) ([]netip.AddrPort, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("egressdns: no upstream resolvers given and the host's cannot be read: %w", err)
	}
	var (
		ups []netip.AddrPort
		bad []string
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "nameserver" {
			continue
		}
		if len(f) < 2 {
			bad = append(bad, "a nameserver line without an address")
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			bad = append(bad, fmt.Sprintf("%.60q", f[1]))
			continue
		}
		ups = append(ups, netip.AddrPortFrom(a.Unmap(), 53))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("egressdns: reading the host's resolvers from %s: %w", path, err)
	}
	if len(ups) == 0 {
		why := "it has no nameserver line"
		if len(bad) > 0 {
			why = "none of its nameserver lines holds an IP address (" + strings.Join(bad, ", ") + ")"
		}
		return nil, fmt.Errorf("egressdns: no upstream resolvers given and none found in %s: %s; set the upstreams explicitly", path, why)
	}
	return ups, nil
}
