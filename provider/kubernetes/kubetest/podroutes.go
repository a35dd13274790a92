package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/tai42/sandbox/internal/undo"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The pods' way out of their subnet. The CNI bridge is their gateway (its
// host-side address is the node's, as on a real cluster), so a NetworkPolicy
// is what keeps a Pod from the node and from the test hosts a test routes
// to (sessnettest.Upstream, whose rule from the pod subnet comes first).
// Nothing else a Pod sends leaves the machine: a rule of the harness's own
// sends the rest from the pod subnet to a table holding only an unreachable
// default route, before the main table is ever looked at.
const (
	// podRoutesTable is that table (a number nothing else here uses).
	podRoutesTable = 0x6b740000
	// podRoutesPriority is its rule's priority: after the tests' own
	// rules (sessnettest's are at 100), before the main table's (32766).
	podRoutesPriority = 32000
)

// Gateway is the pods' gateway: the bridge's address, the first of the
// pod subnet (the CNI bridge plugin's default with isGateway).
func (c *Cluster) Gateway() netip.Addr { return c.PodSubnet().Masked().Addr().Next() }

// PodSubnet is the range the pods' addresses come from.
func (c *Cluster) PodSubnet() netip.Prefix { return netip.MustParsePrefix(c.opts.PodSubnet) }

// podRoutes installs the rules and the unreachable route; its undo removes
// them.
func (c *Cluster) podRoutes() (undo.Func, error) {
	subnet, err := netip.ParsePrefix(c.opts.PodSubnet)
	if err != nil || !subnet.Addr().Is4() {
		return nil, fmt.Errorf("the pod subnet %q is not an IPv4 prefix", c.opts.PodSubnet)
	}
	// A dead run's, on the same subnet, first.
	_ = removePodRoutes(subnet)
	route := podRoutesRoute()
	if err := netlink.RouteAdd(route); err != nil {
		return nil, fmt.Errorf("the pods' unreachable default route (table %#x): %w", podRoutesTable, err)
	}
	for _, r := range podRoutesRules(subnet) {
		if err := netlink.RuleAdd(r); err != nil {
			_ = removePodRoutes(subnet)
			return nil, fmt.Errorf("the rule from the pod subnet %s to table %d: %w", subnet, r.Table, err)
		}
	}
	return func(context.Context) error { return removePodRoutes(subnet) }, nil
}

// removePodRoutes removes the rules from subnet and the table's route; what
// is not there is not an error.
func removePodRoutes(subnet netip.Prefix) error {
	var errs []error
	for _, r := range podRoutesRules(subnet) {
		if err := netlink.RuleDel(r); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting the rule from the pod subnet %s (table %d): %w", subnet, r.Table, err))
		}
	}
	if err := netlink.RouteDel(podRoutesRoute()); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("deleting the pods' unreachable route: %w", err))
	}
	return errors.Join(errs...)
}

// podRoutesRules are the two rules: the subnet to itself by the main
// table (the node's replies from its bridge address, which is in the
// subnet too), then the rest from the subnet to podRoutesTable.
func podRoutesRules(subnet netip.Prefix) []*netlink.Rule {
	ipnet := &net.IPNet{IP: subnet.Masked().Addr().AsSlice(), Mask: net.CIDRMask(subnet.Bits(), 32)}
	inside := netlink.NewRule()
	inside.Family, inside.Src, inside.Dst = unix.AF_INET, ipnet, ipnet
	inside.Table, inside.Priority = unix.RT_TABLE_MAIN, podRoutesPriority-1
	out := netlink.NewRule()
	out.Family, out.Src = unix.AF_INET, ipnet
	out.Table, out.Priority = podRoutesTable, podRoutesPriority
	return []*netlink.Rule{inside, out}
}

func podRoutesRoute() *netlink.Route {
	return &netlink.Route{
		Dst:   &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Type:  unix.RTN_UNREACHABLE,
		Table: podRoutesTable,
	}
}

// podRoutesLeft lists the harness's rules and its table's routes still in
// place (for the tests' leak checks).
func podRoutesLeft() []string {
	var out []string
	rules, _ := netlink.RuleList(unix.AF_INET)
	for _, r := range rules {
		if r.Table == podRoutesTable || (r.Priority == podRoutesPriority-1 && r.Dst != nil && r.Src != nil && r.Dst.String() == r.Src.String()) {
			out = append(out, "rule "+r.String())
		}
	}
	routes, _ := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: podRoutesTable}, netlink.RT_FILTER_TABLE)
	for _, r := range routes {
		out = append(out, "route "+r.String())
	}
	return out
}
