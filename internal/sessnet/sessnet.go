// Package sessnet builds the network namespaces of the container provider's
// sessions, one per session, for the three network tiers:
//
//   - none: loopback only, up.
//   - internal: a veth whose host side is attached to a bridge shared by the
//     host's internal sessions (<prefix>-int), an address from the internal
//     subnet and the route for that subnet only. Internal sessions reach each
//     other and nothing else: not the host (no address of it, loopback
//     services included) and nothing beyond.
//   - egress: the same on a bridge of its own (<prefix>-egr) with its own
//     subnet, plus a default route via the bridge address and NAT
//     (masquerade) out through the host. Egress sessions reach the public
//     internet only, through fences: not the host's own services (the
//     gateway only forwards, and answers DNS when Fences.ResolverPort is
//     set), not each other, not the internal bridge, and no private,
//     shared, link-local (cloud metadata), loopback, multicast or reserved
//     address nor any network of the host's own interfaces. A refused
//     attempt fails at once (a TCP reset, an ICMP administratively
//     prohibited error), is counted per reason (Blocked) and reported
//     (Config.OnBlocked). The operator opens exceptions, adds denials and
//     turns on a domain filter with Fences (Config.Fences, SetFences,
//     AllowAddrs).
//
// Everything is made with rtnetlink and nftables from Go, never by running
// ip or nft. The host-side objects carry a recognisable prefix: veths
// <prefix>v<8 hex>, the bridges <prefix>-int and <prefix>-egr, and one
// nftables table, inet <prefix>, that holds every rule. A Manager sweeps what
// a crashed earlier run with the same directory and prefix left behind when
// it is made, tears everything down at Close, and makes the shared bridges
// and table lazily, at the first session that needs them.
//
// A daemon restarting after a crash can keep the networks of the sessions
// it brings back (Config.Keep): New then finds each kept session's
// namespace file <Dir>/<id>, the address on its eth0 and, through eth0's
// peer link, its veth on the host, leases the address again, sweeps
// everything else, keeps the bridges of the adopted tiers and reinstalls the
// table with the current rules and fences in one atomic step (the
// fences' counters carry over; the domain filter's sets start empty).
// Adopted hands each
// adopted Net out, to be used (and torn down) as if Setup had made it; the
// sessions keep their connectivity throughout.
//
// Setting up the first egress network turns on net.ipv4.ip_forward, a
// setting global to the host's network namespace that Close leaves on (other
// software may rely on it by then).
package sessnet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/tai42/sandbox/internal/netns"
	"github.com/tai42/sandbox/internal/nsthread"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	sandbox "github.com/tai42/sandbox"
)

// DefaultPrefix is the name prefix when Config.Prefix is empty.
const DefaultPrefix = "tai42"

var (
	// DefaultInternalSubnet is the internal tier's subnet when
	// Config.InternalSubnet is zero.
	DefaultInternalSubnet = netip.MustParsePrefix("10.242.0.0/17")
	// DefaultEgressSubnet is the egress tier's subnet when
	// Config.EgressSubnet is zero.
	DefaultEgressSubnet = netip.MustParsePrefix("10.242.128.0/17")
)

// ErrClosed is returned by Setup once Close has been called.
var ErrClosed = errors.New("sessnet: the network manager is closed")

// maxPrefix keeps every name within IFNAMSIZ-1 (15) bytes: a veth is the
// prefix, "v" and 8 hex digits.
const maxPrefix = 6

// poolSize is how many network namespaces are kept made ahead.
const poolSize = 4

// Config says where a Manager keeps its namespace files, which subnets it
// uses and how it names what it makes.
type Config struct {
	// Dir is the directory the sessions' network namespaces are
	// bind-mounted in, as <Dir>/<id>; created (0700) if missing. It belongs
	// to the Manager: New unmounts and removes the empty files it finds
	// there (and leaves anything else). A tmpfs (under /run) makes creating
	// a namespace file cheapest.
	Dir string
	// InternalSubnet and EgressSubnet are the tiers' IPv4 subnets (the
	// first host address is the bridge's). Zero means DefaultInternalSubnet
	// and DefaultEgressSubnet. They must not overlap each other or any
	// route or address the host already has when the tier's bridge is made.
	InternalSubnet, EgressSubnet netip.Prefix
	// Prefix names the links, the bridges and the nftables table: 1 to 6
	// lower-case letters or digits, starting with a letter. Empty means
	// DefaultPrefix. Two Managers on a machine must not share a prefix (a
	// test uses a unique one so it never clashes with a running daemon).
	Prefix string
	// Keep names the sessions whose networks New keeps rather than sweeps,
	// with the tier each was set up for (a daemon restarting after a crash
	// keeps the networks of the sessions it brings back). Their Nets are
	// then returned by Adopted.
	Keep map[string]sandbox.Network
	// Fences are the operator's exceptions to and additions of the egress
	// tier's fences (see Fences); SetFences changes them later. New
	// refuses malformed ones (see ValidateFences).
	Fences Fences
	// OnBlocked, when set, is told of attempts the fences refuse (at a
	// debug level of interest: up to 20 a second, with bursts of 40, over
	// all sessions; Blocked counts every one). The Manager reads them from
	// an NFLOG group of its own and calls OnBlocked from one goroutine of
	// its own, in order; a slow OnBlocked loses reports, never blocks a
	// session. When the kernel's NFLOG is not usable, New errs wrapping
	// ErrNoNFLOG.
	OnBlocked func(Blocked)
}

// tierNet is one of the two bridged tiers.
type tierNet struct {
	kind   sandbox.Network
	bridge string
	subnet netip.Prefix
	leases *leases // guarded by Manager.mu

	bridgeIndex int // guarded by Manager.infraMu; 0 while there is no bridge
}

// Manager makes and removes the sessions' network namespaces and the shared
// bridges and nftables table they need. Its methods are safe for
// concurrent use.
type Manager struct {
	dir      string
	prefix   string
	internal *tierNet
	egress   *tierNet
	hostNS   nsID
	host     *netlink.Handle // rtnetlink socket in the host's namespace
	nft      *nftables.Conn  // lasting nftables socket in the host's namespace
	pool     *netns.Pool

	infraMu sync.Mutex // guards the shared bridges, the table and m.nft's batches
	tableUp bool
	fences  Fences // guarded by infraMu

	// fast is a second nftables socket, for AllowAddrs and Blocked, so
	// that they never wait for a bridge being made; nil once released.
	// setConn is a raw nfnetlink socket for AllowAddrs.
	fastMu  sync.Mutex
	fast    *nftables.Conn
	setConn *mdnetlink.Conn

	onBlocked func(Blocked) // nil: no log rules, no NFLOG socket
	nflog     *nflog
	logGroup  uint16

	stopWatch chan struct{} // closed to stop watchAddrs
	watchDone chan struct{} // closed when watchAddrs returned

	closeMu sync.Mutex // serialises Close calls

	mu       sync.Mutex
	nets     map[string]*Net
	adopted  map[string]adoption // the kept sessions; guarded by mu
	closed   bool
	released bool // Close finished: sockets closed
	inflight sync.WaitGroup
}

// Net is one session's network namespace.
type Net struct {
	m    *Manager
	id   string
	tier *tierNet // nil for none
	path string
	addr netip.Addr

	mu      sync.Mutex
	mounted bool   // path is a bind mount of the namespace
	veth    string // host-side veth to delete, "" when there is none
	leased  bool   // addr is leased from tier
	gone    bool   // torn down
}

// Path is the namespace file, for the OCI runtime spec's network namespace
// path.
func (n *Net) Path() string { return n.path }

// Addr is the session's IPv4 address; the zero (invalid) Addr for tier none.
func (n *Net) Addr() netip.Addr { return n.addr }

// ID is the session id the namespace was made for.
func (n *Net) ID() string { return n.id }

// Tier is the network tier the namespace was made for.
func (n *Net) Tier() sandbox.Network {
	if n.tier == nil {
		return sandbox.NetworkNone
	}
	return n.tier.kind
}

// Gateway is the bridge address the session routes through (the default
// gateway of an egress session); the zero Addr for tier none.
func (n *Net) Gateway() netip.Addr {
	if n.tier == nil {
		return netip.Addr{}
	}
	return n.tier.leases.gateway
}

// New checks cfg and returns a Manager. It sets nothing up on the machine
// but first sweeps what a crashed earlier run with the same Dir and Prefix
// left behind: namespace files under Dir (unmounted and removed), veths and
// bridges named with the prefix, and the nftables table of the prefix. It
// is safe to call when nothing is left.
//
// The networks of the sessions in cfg.Keep are adopted rather than swept
// when New finds them whole and of the kept tier (see Adopted): their
// namespace files and veths stay, their addresses are leased again, the
// bridges of their tiers stay (made again if gone, with the veths put back
// on them) and the table is replaced, atomically, by a fresh one. A kept
// session New cannot adopt is swept like the rest; Adopted says why.
//
// It errs when cfg is invalid, when Dir cannot be made, when the sweep
// fails (the error names what could not be removed), or when the table or a
// bridge the adopted networks need cannot be made; the Manager is then not
// returned, and the kept networks are left on the machine for a later New.
func New(cfg Config) (*Manager, error) {
	m, err := newManager(cfg)
	if err != nil {
		return nil, err
	}
	adopted := m.findKept(cfg.Keep)
	files, links := keptNames(adopted)
	if err := m.sweep(files, links); err != nil {
		m.release()
		return nil, fmt.Errorf("sessnet: sweeping what an earlier run left: %w", err)
	}
	if err := m.restoreInfra(adopted); err != nil {
		m.release()
		return nil, fmt.Errorf("sessnet: restoring the bridges and nftables table of the adopted networks: %w", err)
	}
	m.adopted = adopted
	for _, a := range adopted {
		if a.n != nil {
			m.nets[a.n.id] = a.n
		}
	}
	return m, nil
}

func newManager(cfg Config) (*Manager, error) {
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	internal, egress := cfg.InternalSubnet, cfg.EgressSubnet
	if !internal.IsValid() {
		internal = DefaultInternalSubnet
	}
	if !egress.IsValid() {
		egress = DefaultEgressSubnet
	}
	if err := validSubnet("internal", internal); err != nil {
		return nil, err
	}
	if err := validSubnet("egress", egress); err != nil {
		return nil, err
	}
	if internal.Overlaps(egress) {
		return nil, fmt.Errorf("sessnet: the internal subnet %s and the egress subnet %s overlap", internal, egress)
	}
	if cfg.Dir == "" {
		return nil, errors.New("sessnet: Config.Dir is empty: say where the namespace files go")
	}
	if err := ValidateFences(cfg.Fences); err != nil {
		return nil, fmt.Errorf("%w (in Config.Fences)", err)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("sessnet: namespace directory %s: %w", cfg.Dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sessnet: making the namespace directory: %w", err)
	}
	// Mount points in /proc/self/mountinfo are real paths.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, fmt.Errorf("sessnet: namespace directory %s: %w", cfg.Dir, err)
	}
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("sessnet: namespace directory: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("sessnet: namespace directory %s is not a directory", dir)
	}
	m := &Manager{
		dir:    dir,
		prefix: prefix,
		internal: &tierNet{kind: sandbox.NetworkInternal, bridge: prefix + "-int", subnet: internal,
			leases: newLeases(internal)},
		egress: &tierNet{kind: sandbox.NetworkEgress, bridge: prefix + "-egr", subnet: egress,
			leases: newLeases(egress)},
		nets:      map[string]*Net{},
		pool:      netns.NewPool(poolSize, nsOptions),
		fences:    cloneFences(cfg.Fences),
		onBlocked: cfg.OnBlocked,
	}
	// The host's namespace is the one of a thread of our own, read while it
	// is locked: a thread of the process may be inside a session's namespace
	// at that moment (see nsthread.Locked), never this one.
	err = nsthread.Locked(func() (bool, error) {
		id, err := threadNS()
		if err != nil {
			return false, fmt.Errorf("reading the host's network namespace: %w", err)
		}
		m.hostNS = id
		if m.host, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return false, fmt.Errorf("opening a rtnetlink socket: %w", err)
		}
		if m.nft, err = nftables.New(nftables.AsLasting()); err != nil {
			return false, fmt.Errorf("opening an nftables socket: %w", err)
		}
		if m.fast, err = nftables.New(nftables.AsLasting()); err != nil {
			return false, fmt.Errorf("opening an nftables socket: %w", err)
		}
		if m.setConn, err = mdnetlink.Dial(unix.NETLINK_NETFILTER, nil); err != nil {
			return false, fmt.Errorf("opening an nfnetlink socket: %w", err)
		}
		return false, nil
	})
	if err != nil {
		m.release()
		return nil, fmt.Errorf("sessnet: %w", err)
	}
	// Before any table: a change from here on updates the host's networks
	// in the table that the installation fills with the then current ones.
	sub, err := m.subscribeAddrs()
	if err != nil {
		m.release()
		return nil, fmt.Errorf("sessnet: %w", err)
	}
	m.stopWatch, m.watchDone = make(chan struct{}), make(chan struct{})
	go m.watchAddrs(sub, m.stopWatch, m.watchDone)
	if m.onBlocked != nil {
		if m.nflog, err = m.openNFLOG(); err != nil {
			m.release()
			return nil, err
		}
		m.logGroup = m.nflog.group
		m.nflog.run(m)
	}
	return m, nil
}

func validPrefix(p string) error {
	ok := len(p) >= 1 && len(p) <= maxPrefix && p[0] >= 'a' && p[0] <= 'z'
	for i := 0; ok && i < len(p); i++ {
		c := p[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
	}
	if !ok {
		return fmt.Errorf("sessnet: prefix %q must be 1 to %d lower-case letters or digits starting with a letter", p, maxPrefix)
	}
	return nil
}

// reserved are IPv4 ranges a session subnet must stay out of.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

func validSubnet(tier string, p netip.Prefix) error {
	if !p.Addr().Is4() {
		return fmt.Errorf("sessnet: the %s subnet %s is not IPv4", tier, p)
	}
	if p.Bits() > 30 || p.Bits() < 8 {
		return fmt.Errorf("sessnet: the %s subnet %s must be between /8 and /30", tier, p)
	}
	if p != p.Masked() {
		return fmt.Errorf("sessnet: the %s subnet %s has host bits set (did you mean %s?)", tier, p, p.Masked())
	}
	for _, r := range reserved {
		if p.Overlaps(r) {
			return fmt.Errorf("sessnet: the %s subnet %s overlaps the reserved range %s", tier, p, r)
		}
	}
	return nil
}

// validID accepts the ids the namespace file can be named after: 1 to 128
// letters, digits, '.', '_' or '-', neither "." nor "..".
func validID(id string) error {
	ok := len(id) >= 1 && len(id) <= 128 && id != "." && id != ".."
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("sessnet: session id %q cannot name a namespace file: use 1 to 128 letters, digits, '.', '_' or '-'", clip(id))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Setup makes the network namespace of session id for tier and returns it.
// The namespace file is <Dir>/<id>. For internal and egress it makes the
// tier's bridge and the nftables table first if they do not exist yet (once,
// shared by all sessions; again if someone removed them since), and for
// egress turns net.ipv4.ip_forward on when it is off.
//
// Safe for concurrent use; sessions are set up in parallel. It errs when id
// or tier is invalid, when id already has a network, when ctx is done, when
// the Manager is closed (ErrClosed), when the tier's subnet is exhausted or
// collides with the host's routes, or when the kernel refuses a step; the
// error names the step. On error nothing of this session is left behind
// (when even the cleanup fails, the error says so and Close retries it).
func (m *Manager) Setup(ctx context.Context, id string, tier sandbox.Network) (n *Net, err error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	var t *tierNet
	switch tier {
	case sandbox.NetworkNone:
	case sandbox.NetworkInternal:
		t = m.internal
	case sandbox.NetworkEgress:
		t = m.egress
	default:
		return nil, fmt.Errorf("sessnet: network tier %q is not one of none, internal, egress", clip(string(tier)))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sessnet: network of session %s: %w", id, err)
	}
	n = &Net{m: m, id: id, tier: t, path: filepath.Join(m.dir, id)}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if _, dup := m.nets[id]; dup {
		m.mu.Unlock()
		return nil, fmt.Errorf("sessnet: session %s already has a network", id)
	}
	m.nets[id] = n
	m.inflight.Add(1)
	m.mu.Unlock()
	defer m.inflight.Done()

	defer func() {
		if err == nil {
			return
		}
		err = fmt.Errorf("sessnet: %s network of session %s: %w", tier, id, err)
		if cerr := m.teardown(n); cerr != nil {
			err = fmt.Errorf("%w; cleaning up also failed (Close retries): %w", err, cerr)
		}
		n = nil
	}()

	bridgeIndex := 0
	if t != nil {
		if bridgeIndex, err = m.ensureTier(t); err != nil {
			return n, err
		}
	}
	ns, err := m.pool.Take()
	if err != nil {
		return n, err
	}
	defer ns.Close() // the bind mount holds the namespace from here on
	if err := n.mount(ns); err != nil {
		return n, err
	}
	if t == nil {
		return n, nil
	}
	if err := ctx.Err(); err != nil {
		return n, err
	}
	m.mu.Lock()
	n.addr, err = t.leases.take()
	n.leased = err == nil
	m.mu.Unlock()
	if err != nil {
		return n, err
	}
	for retried := false; ; retried = true {
		err := m.addVeth(n, ns, bridgeIndex)
		if err == nil {
			return n, nil
		}
		if retried || !m.forgetBridgeIfGone(t, bridgeIndex) {
			return n, err
		}
		// The bridge went behind the Manager's back: drop the half-made
		// veth (its namespace end goes with it), remake the bridge, retry.
		if derr := m.delLink(n.veth); derr != nil {
			return n, fmt.Errorf("%w; removing the half-made veth: %w", err, derr)
		}
		n.veth = ""
		if bridgeIndex, err = m.ensureTier(t); err != nil {
			return n, err
		}
	}
}

// mount bind-mounts the namespace onto a new file at n.path.
func (n *Net) mount(ns *netns.NS) error {
	f, err := os.OpenFile(n.path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("the namespace file %s exists already: another Manager uses %s", n.path, filepath.Dir(n.path))
		}
		return fmt.Errorf("creating the namespace file: %w", err)
	}
	f.Close()
	if err := bindMount(ns.FdPath(), n.path); err != nil {
		os.Remove(n.path)
		return fmt.Errorf("bind-mounting the namespace onto %s: %w", n.path, err)
	}
	n.mounted = true
	return nil
}

// Teardown removes the session's veth, releases its address and unmounts
// and removes its namespace file. The namespace itself ends when nothing
// else (a container's processes) holds it any more. Idempotent: tearing
// down twice, or a Net that Close already tore down, does nothing. On error
// (naming what could not be removed) the rest is still attempted and a
// later Teardown or Close retries what is left. Safe for concurrent use.
func (m *Manager) Teardown(n *Net) error {
	if n == nil {
		return nil
	}
	if n.m != m {
		return fmt.Errorf("sessnet: the network of session %s belongs to another Manager", n.id)
	}
	if err := m.teardown(n); err != nil {
		return fmt.Errorf("sessnet: tearing down the network of session %s: %w", n.id, err)
	}
	return nil
}

func (m *Manager) teardown(n *Net) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gone {
		return nil
	}
	var errs []error
	if n.veth != "" {
		// Before the unmount: deleting the host side takes the session's end
		// with it now, not whenever the kernel gets round to the namespace.
		if err := m.delLink(n.veth); err != nil {
			errs = append(errs, err)
		} else {
			n.veth = ""
		}
	}
	if n.leased && n.veth == "" {
		m.mu.Lock()
		n.tier.leases.release(n.addr)
		m.mu.Unlock()
		n.leased = false
	}
	if n.mounted {
		if err := unmountRemove(n.path); err != nil {
			errs = append(errs, err)
		} else {
			n.mounted = false
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	n.gone = true
	m.mu.Lock()
	if m.nets[n.id] == n {
		delete(m.nets, n.id)
	}
	m.mu.Unlock()
	return nil
}

// Close tears down every Net still set up (waiting for Setups in progress
// to finish first), then removes the bridges and, once they are gone, the
// nftables table; ip_forward stays as it is. Setup fails with ErrClosed from
// the first call on. Idempotent: after a Close that succeeded, Close returns
// nil; after one that failed (the error names what is left), the next Close
// retries. Safe for concurrent use.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.inflight.Wait()

	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	m.mu.Lock()
	if m.released {
		m.mu.Unlock()
		return nil
	}
	nets := slices.Collect(maps.Values(m.nets))
	m.mu.Unlock()

	var errs []error
	for _, n := range nets {
		if err := m.teardown(n); err != nil {
			errs = append(errs, fmt.Errorf("the network of session %s: %w", n.id, err))
		}
	}
	m.pool.Close()
	if err := m.removeInfra(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("sessnet: close: %w", errors.Join(errs...))
	}
	m.release()
	return nil
}

// release closes the Manager's sockets and pool, leaving whatever is on the
// machine as it is (which is all a crash leaves).
// Abandon lets go of what the Manager holds in this process (its sockets
// and the namespaces made ahead) as the process's death would, and tears
// nothing down: the sessions' networks, the bridges and the table stay for
// a Manager made next with Config.Keep. Setup fails from then on, and
// Close does nothing. For tests of recovery in one process.
func (m *Manager) Abandon() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.inflight.Wait()
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	m.mu.Lock()
	done := m.released
	m.mu.Unlock()
	if !done {
		m.release()
	}
}

func (m *Manager) release() {
	m.pool.Close()
	// Before taking m.mu: the goroutines take it (and infraMu) as they
	// work.
	if m.stopWatch != nil {
		close(m.stopWatch)
		<-m.watchDone
		m.stopWatch = nil
	}
	m.nflog.close()
	m.nflog = nil
	m.fastMu.Lock()
	if m.fast != nil {
		_ = m.fast.CloseLasting()
		m.fast = nil
	}
	if m.setConn != nil {
		m.setConn.Close()
		m.setConn = nil
	}
	m.fastMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = true
	if m.host != nil {
		m.host.Close()
	}
	if m.nft != nil {
		_ = m.nft.CloseLasting()
	}
}

// Leftovers lists what of this Manager's kind exists on the machine: files
// and mounts under Dir, links with the prefix's names, the nftables table.
// Each entry names its kind and name ("link tai42-int", "nft table inet
// tai42", "mount /dir/id", "netns file /dir/id"). It works before, during
// and after Close; tests use it to check nothing leaks. Safe for concurrent
// use; it errs when the kernel cannot be asked.
func (m *Manager) Leftovers() ([]string, error) {
	var out []string
	mounts, err := mountsUnder(m.dir)
	if err != nil {
		return nil, err
	}
	for _, mp := range mounts {
		out = append(out, "mount "+mp)
	}
	files, err := nsFiles(m.dir)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		out = append(out, "netns file "+f)
	}
	err = m.inHost(func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("opening a rtnetlink socket: %w", err)
		}
		defer h.Close()
		links, err := listLinks(h)
		if err != nil {
			return fmt.Errorf("listing links: %w", err)
		}
		for _, l := range links {
			if name := l.Attrs().Name; m.ours(name) {
				out = append(out, "link "+name)
			}
		}
		c, err := nftables.New()
		if err != nil {
			return fmt.Errorf("opening an nftables socket: %w", err)
		}
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
		if err != nil {
			return fmt.Errorf("listing nftables tables: %w", err)
		}
		for _, t := range tables {
			if t.Name == m.prefix {
				out = append(out, "nft table inet "+t.Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sessnet: leftovers: %w", err)
	}
	return out, nil
}

// ours reports whether a link name is one this Manager makes: its two
// bridges, or a veth <prefix>v<8 lower-case hex>. The exact shape keeps a
// prefix that begins another's (t1, t1a) from claiming the other's links.
func (m *Manager) ours(name string) bool {
	if name == m.internal.bridge || name == m.egress.bridge {
		return true
	}
	rest, ok := strings.CutPrefix(name, m.prefix+"v")
	if !ok || len(rest) != 8 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// inHost runs fn on a locked thread proven to be in the host's network
// namespace, so that sockets and /proc/sys/net files fn opens are the
// host's. A thread found elsewhere is never reused.
func (m *Manager) inHost(fn func() error) error {
	return nsthread.Locked(func() (bool, error) {
		id, err := threadNS()
		if err != nil {
			return false, fmt.Errorf("reading the thread's network namespace: %w", err)
		}
		if id != m.hostNS {
			return true, errors.New("a thread of this process is outside the host's network namespace")
		}
		return false, fn()
	})
}
