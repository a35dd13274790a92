package container

import (
	"io"
	"net/netip"

	"github.com/tai42/sandbox/kit"
)

// Bare is the provider New wraps, without the kit: its Recover is the
// caller's to call (once, before any Create), its Close too.
type Bare interface {
	kit.Provider
	kit.Recoverer
	io.Closer
}

// NewBare makes the provider New wraps, without the kit and without
// recovering anything: the test calls Recover itself.
func NewBare(opts Options) (Bare, error) { return newProvider(opts) }

// Crash lets go of what the provider of sb holds in this process, as the
// process's death would, and touches no session (the provider's Abandon):
// the OCI runtime's mount namespace (crun's, on a host with hybrid cgroups:
// its thread ends, and with it the mounts made there), the user namespace
// handle, its own network manager's sockets and made-ahead namespaces, and
// the sessions' locks. sb must not be used, nor closed, afterwards.
//
// Some of what a dead process would lose stays: the sessions' directory
// handles and pidfds, and the agents' connections of execs still running
// (none should be). A test takes its descriptor and goroutine baseline
// after Crash.
func Crash(sb *kit.Sandbox) {
	sb.Provider().(*provider).Abandon()
}

// RemoveByHand removes container id from runtime kind's state under the
// provider of sb as Recover does when that runtime is not installed.
func RemoveByHand(sb *kit.Sandbox, kind, id string) error {
	return sb.Provider().(*provider).removeByHand(kind, id)
}

// EgressStatsOf are the fences' and the egress resolver's counts of the
// provider of sb (see provider.EgressStats).
func EgressStatsOf(sb *kit.Sandbox) (EgressStats, error) {
	return sb.Provider().(*provider).EgressStats()
}

// EgressOf is what the provider of sb enforces on network "egress".
func EgressOf(sb *kit.Sandbox) EgressInfo { return sb.Provider().(*provider).Egress() }

// SetEgressFencesOf changes the operator's egress fences of the provider
// of sb (see provider.SetEgressFences).
func SetEgressFencesOf(sb *kit.Sandbox, allow, deny []netip.Prefix, domains []string) error {
	return sb.Provider().(*provider).SetEgressFences(allow, deny, domains)
}
