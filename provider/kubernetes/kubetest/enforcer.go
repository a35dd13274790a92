package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tai42/sandbox/internal/undo"
)

// bridgeNF is the sysctl that sends bridged traffic through iptables:
// the pods share one bridge, and kube-router's rules see their traffic
// only through it.
const bridgeNF = "/proc/sys/net/bridge/bridge-nf-call-iptables"

// kube-router's netpol names (v2.1.0, pkg/controllers/netpol): its
// top-level chains, the prefixes of its per-pod and per-policy chains and
// of its ipsets, and its temporary sets (pkg/utils/ipset.go: "TMP-" and
// base32 of 10 bytes), which live only during an ipset restore: a
// kube-router killed mid-restore leaves them.
var (
	kubeRouterChains      = []string{"KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT"}
	kubeRouterChainPrefix = []string{"KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"}
	kubeRouterIPSetPrefix = []string{"KUBE-SRC-", "KUBE-DST-"}
	kubeRouterTmpSet      = regexp.MustCompile(`^TMP-[A-Z2-7]{16}$`)
)

// kubeRouterSet says whether the ipset name is one of kube-router's.
func kubeRouterSet(name string) bool {
	return hasPrefix(name, kubeRouterIPSetPrefix) || kubeRouterTmpSet.MatchString(name)
}

// Why kube-router v2.1.0 (the only version the module proxy serves here),
// though advisories name it: GHSA-phqm-jgc3-qf8g is in its service proxy
// (Service externalIPs and load-balancer IPs copied onto the node
// unchecked) and GHSA-v5mh-h5hx-7v92 in its router (GoBGP's gRPC API
// bound to the node's IP without auth); the harness runs neither
// (--run-service-proxy=false --run-router=false): only the netpol
// controller, on a loopback test cluster whose one user is the test.
// kube-network-policies, the other enforcer at hand, needs NFQUEUE
// (CONFIG_NFT_QUEUE), which this kernel lacks.
//
// enforcer runs kube-router with its firewall alone (no routing, no
// service proxy): it enforces NetworkPolicy with iptables and ipsets on
// the pods' bridge. Its undo stops it, removes every kube-router chain
// and set on the machine (see cleanKubeRouter), and restores the sysctl.
func (c *Cluster) enforcer(ctx context.Context) (undo.Func, error) {
	if c.opts.NoEnforcer {
		return nil, nil
	}
	var undos []func() error
	undoAll := func(context.Context) error {
		var errs []error
		for i := len(undos) - 1; i >= 0; i-- {
			errs = append(errs, undos[i]())
		}
		return errors.Join(errs...)
	}
	old, err := os.ReadFile(bridgeNF)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (the br_netfilter module is needed)", bridgeNF, err)
	}
	if strings.TrimSpace(string(old)) != "1" {
		if err := os.WriteFile(bridgeNF, []byte("1\n"), 0o644); err != nil {
			return nil, err
		}
		undos = append(undos, func() error { return os.WriteFile(bridgeNF, old, 0o644) })
		// A run killed now leaves it set: the sweep restores it.
		c.recMu.Lock()
		c.rec.BridgeNF = string(old)
		c.recMu.Unlock()
		if err := c.saveRecord(); err != nil {
			return undoAll, err
		}
	}
	c.recMu.Lock()
	c.rec.Enforcer = true
	c.recMu.Unlock()
	if err := c.saveRecord(); err != nil {
		return undoAll, err
	}
	// Every kube-router chain and set on the machine is a harness
	// cluster's (the dev cluster runs none), and one harness cluster runs
	// at a time: what is there now a crashed run left.
	if err := cleanKubeRouter(); err != nil {
		// undoAll: the sysctl is set back.
		return undoAll, fmt.Errorf("removing a previous run's kube-router chains: %w", err)
	}
	undos = append(undos, cleanKubeRouter)
	undos = append(undos, func() error {
		if c.router == nil {
			return nil
		}
		return c.router.stop(10 * time.Second)
	})
	if err := c.runEnforcer(ctx); err != nil {
		return undoAll, err
	}
	c.Enforcer = true
	c.logf("kube-router enforcing NetworkPolicy")
	return undoAll, nil
}

// runEnforcer starts kube-router and waits until its firewall is in
// place.
func (c *Cluster) runEnforcer(ctx context.Context) error {
	p, _, err := c.start("kube-router", c.bin("kube-router"), []string{
		"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
		"--kubeconfig=" + c.Kubeconfig, "--hostname-override=localhost",
		"--service-cluster-ip-range=" + c.opts.ServiceSubnet,
		fmt.Sprintf("--health-port=%d", c.ports["enforcer-health"]),
		"--metrics-port=0", "--enable-ipv4=true", "--enable-ipv6=false",
		"--iptables-sync-period=1m",
		"--v=1",
	}, nil)
	if err != nil {
		return err
	}
	c.router = p
	hc := &http.Client{Timeout: time.Second}
	return c.waitFor(ctx, p, "kube-router healthy", 60*time.Second, func() bool {
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", c.ports["enforcer-health"]))
		if err != nil {
			return false
		}
		resp.Body.Close()
		// Its firewall is in place once its top-level chains are.
		return resp.StatusCode == http.StatusOK && hasChains(kubeRouterChains)
	})
}

// StopEnforcer stops kube-router (by its PID) and removes its chains and
// sets: the cluster then enforces no NetworkPolicy, for a test of what a
// cluster without an enforcer gets. The package's other tests share the
// cluster: a test that calls it must StartEnforcer again before it ends.
func (c *Cluster) StopEnforcer() error {
	if c.router == nil || !c.router.alive() {
		return errors.New("kubetest: no NetworkPolicy enforcer is running")
	}
	if err := c.router.stop(10 * time.Second); err != nil {
		return err
	}
	c.Enforcer = false
	return cleanKubeRouter()
}

// StartEnforcer starts the enforcer StopEnforcer stopped and waits until
// its firewall is in place.
func (c *Cluster) StartEnforcer(ctx context.Context) error {
	if c.router == nil {
		return errors.New("kubetest: the cluster was started without an enforcer")
	}
	if c.router.alive() {
		return errors.New("kubetest: the enforcer is running")
	}
	if err := c.runEnforcer(ctx); err != nil {
		return err
	}
	c.Enforcer = true
	return nil
}

func hasChains(names []string) bool {
	have := iptablesChains()
	for _, n := range names {
		if !have[n] {
			return false
		}
	}
	return true
}

// iptablesChains is the filter table's chains.
func iptablesChains() map[string]bool {
	out, _ := exec.Command("/usr/sbin/iptables-save", "-t", "filter").Output()
	m := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, ":") {
			m[strings.Fields(l[1:])[0]] = true
		}
	}
	return m
}

func ipsets() map[string]bool {
	out, _ := exec.Command("/usr/sbin/ipset", "list", "-n").Output()
	m := map[string]bool{}
	for _, n := range strings.Fields(string(out)) {
		m[n] = true
	}
	return m
}

func hasPrefix(s string, ps []string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// cleanKubeRouter removes every kube-router rule, chain and ipset on the
// machine, by their names' prefixes: all are a harness cluster's (the
// dev cluster runs no kube-router) and one harness cluster runs at a
// time, so what is there is this cluster's or a dead run's. The jumps
// to its chains from the others go first, then its chains (flushed,
// deleted), then its sets (their rules gone, none is in use).
func cleanKubeRouter() error {
	var errs []error
	var mine []string
	for c := range iptablesChains() {
		if hasPrefix(c, kubeRouterChainPrefix) {
			mine = append(mine, c)
		}
	}
	isMine := map[string]bool{}
	for _, c := range mine {
		isMine[c] = true
	}
	// Rules of other chains that jump to one of them, deleted by number
	// (last first, so the numbers before stay right).
	for chain := range iptablesChains() {
		if isMine[chain] {
			continue
		}
		out, err := exec.Command("/usr/sbin/iptables", "-t", "filter", "-L", chain, "-n", "--line-numbers").Output()
		if err != nil {
			continue
		}
		var nums []string
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) >= 2 && isMine[f[1]] {
				nums = append(nums, f[0])
			}
		}
		for i := len(nums) - 1; i >= 0; i-- {
			if out, err := exec.Command("/usr/sbin/iptables", "-t", "filter", "-D", chain, nums[i]).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("iptables -D %s %s: %v: %s", chain, nums[i], err, bytes.TrimSpace(out)))
			}
		}
	}
	for _, c := range mine {
		_ = exec.Command("/usr/sbin/iptables", "-t", "filter", "-F", c).Run()
	}
	for _, c := range mine {
		if out, err := exec.Command("/usr/sbin/iptables", "-t", "filter", "-X", c).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("iptables -X %s: %v: %s", c, err, bytes.TrimSpace(out)))
		}
	}
	for s := range ipsets() {
		if kubeRouterSet(s) {
			if out, err := exec.Command("/usr/sbin/ipset", "destroy", s).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ipset destroy %s: %v: %s", s, err, bytes.TrimSpace(out)))
			}
		}
	}
	return errors.Join(errs...)
}

// KubeRouterLeftovers lists the kube-router chains and ipsets on the
// machine, for a test that Close left none.
func KubeRouterLeftovers() []string {
	var left []string
	for c := range iptablesChains() {
		if hasPrefix(c, kubeRouterChainPrefix) {
			left = append(left, "chain "+c)
		}
	}
	for s := range ipsets() {
		if kubeRouterSet(s) {
			left = append(left, "ipset "+s)
		}
	}
	return left
}

// deleteLink removes the network interface name if it is there.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("finding %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// deleteBridge removes the bridge name and, first, every interface
// enslaved to it: the host ends of the pods' veths (deleting one deletes
// its peer in the pod's namespace). A bridge deleted alone frees its
// ports, which then stay, each keeping its pod's namespace alive.
func deleteBridge(name string) error {
	ports, err := bridgePorts(name)
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range ports {
		if err := netlink.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
			errs = append(errs, fmt.Errorf("deleting %s (a port of %s): %w", l.Attrs().Name, name, err))
		}
	}
	return errors.Join(append(errs, deleteLink(name))...)
}

// bridgePorts lists the interfaces whose master is the bridge name (none
// when there is no such bridge).
func bridgePorts(name string) ([]netlink.Link, error) {
	br, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil, nil
		}
		return nil, fmt.Errorf("finding %s: %w", name, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing the interfaces: %w", err)
	}
	var ports []netlink.Link
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			ports = append(ports, l)
		}
	}
	return ports, nil
}

// LinkExists says whether the interface name exists.
func LinkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}
