package container

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/oscmd"
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

// RuntimeView is the prefix that shows, from this process, a path as the
// OCI runtime of sb's provider sees it: "" for runc (this process's mount
// namespace), /proc/PID/task/TID/root for crun in its own mount namespace
// (a path walked from there resolves in that namespace, where the
// sessions' disks and roots are mounted).
func RuntimeView(sb *kit.Sandbox) string {
	p := sb.Provider().(*provider)
	if p.rt.ns == nil {
		return ""
	}
	var tid int
	_ = p.rt.ns.Do(func() error { tid = unix.Gettid(); return nil })
	return fmt.Sprintf("/proc/%d/task/%d/root", os.Getpid(), tid)
}

// SessionDirs are session id's directories where the runtime runs (to be
// read through RuntimeView): its root overlay's upper layer, where writes
// to its root land, and the directory bound at its /workspace. They are on
// the session's disk when the cap is on.
func SessionDirs(sb *kit.Sandbox, id string) (upper, workspace string, err error) {
	p := sb.Provider().(*provider)
	b, err := os.ReadFile(filepath.Join(p.sessDir, id, "config.json"))
	if err != nil {
		return "", "", err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return "", "", err
	}
	for _, m := range s.Mounts {
		if m.Destination == workspaceDir {
			workspace = m.Source
		}
	}
	var mi []byte
	if err := p.rt.do(func() (err error) { mi, err = os.ReadFile("/proc/thread-self/mountinfo"); return err }); err != nil {
		return "", "", err
	}
	for line := range strings.Lines(string(mi)) {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 || g[0] != "overlay" || oscmd.UnescapeMount(f[4]) != s.Root.Path {
			continue
		}
		for _, o := range strings.Split(g[2], ",") {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = oscmd.UnescapeMount(v)
			}
		}
	}
	if upper == "" || workspace == "" {
		return "", "", fmt.Errorf("session %s: no root overlay mounted at %s where the runtime runs, or no workspace in its config", id, s.Root.Path)
	}
	return upper, workspace, nil
}

// FailCreateSteps has every create of the provider of sb ask fail before
// each of its steps, with the session's id and the step's name: an error
// fail returns fails that step (the steps before it are undone as on any
// failure); nil lets it run. nil turns it off. Set it while no create runs.
func FailCreateSteps(sb *kit.Sandbox, fail func(id, step string) error) {
	sb.Provider().(*provider).faults = fail
}

// KeptTeardown is the teardown recovery pushes for a kept session (see
// keptTeardown) that has a disk, a workspace image and all its mounts
// mounted, remapped or not: its undos' step names, the first pushed first.
func KeptTeardown(remap bool) []string {
	r := &session{p: &provider{}, id: "sb-0", dir: "/state/container/sessions/sb-0", disk: &disk{}, wsDisk: &disk{}}
	r.rootfs = filepath.Join(r.dir, "rootfs")
	if remap {
		r.rootDir = filepath.Join(rootsDir, r.id)
		r.rootfs = filepath.Join(r.rootDir, "rootfs")
	}
	mounted := map[string]bool{filepath.Join(r.dir, "lower"): true, r.rootfs: true, filepath.Join(r.dir, "sys"): true}
	r.keptTeardown(sessionHandle{Remap: remap}, mounted)
	return r.teardown.Steps()
}

// MountOverlay and MountOverlayOptions mount an overlay of lowers (lowest
// first) as a session's root is mounted: with the new mount API, one
// lowerdir+ per layer, and with mount(2)'s one option string, which
// kernels without lowerdir+ get.
var (
	MountOverlay        = mountOverlay
	MountOverlayOptions = mountOverlayOptions
)

// DefaultAgent is defaultAgent, for the test of where the agent comes from.
var DefaultAgent = defaultAgent

// Owners hands out the owners of sessions' user namespaces (see owners).
type Owners = owners

func (o *owners) Take() (int, error) { return o.take() }
func (o *owners) Hold(uid int) bool  { return o.hold(uid) }
func (o *owners) Release(uid int)    { o.release(uid) }

// SessionLimit is the limit of a remapped session of sb's provider on the
// per-user count name (a file of /proc/sys/user); 0: none.
func SessionLimit(sb *kit.Sandbox, name string) int64 {
	for _, l := range sb.Provider().(*provider).userLimits {
		if k, v, _ := strings.Cut(l, "="); k == name {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// CheckSubIDs is checkSubIDs.
var CheckSubIDs = checkSubIDs

// AheadInts is an ahead of ints, with the creates its refill waits for,
// for the tests of ahead.
type AheadInts struct {
	a *ahead[int]
	c *creates
}

func NewAheadInts(want int, mk func() (int, error), discard func(int)) *AheadInts {
	c := &creates{}
	return &AheadInts{a: newAhead("ints", want, mk, discard, c, slog.New(slog.DiscardHandler)), c: c}
}

func (x *AheadInts) Take() (int, bool)                       { return x.a.take() }
func (x *AheadInts) Wait(ctx context.Context) ([]int, error) { return x.a.wait(ctx) }
func (x *AheadInts) Close()                                  { x.a.close() }
func (x *AheadInts) Abandon()                                { x.a.abandon() }
func (x *AheadInts) BeginCreate()                            { x.c.begin() }
func (x *AheadInts) EndCreate()                              { x.c.end() }

// OwnerHeld reports whether the provider of sb holds uid as the owner of
// a session's user namespace (see owners).
func OwnerHeld(sb *kit.Sandbox, uid int) bool {
	o := &sb.Provider().(*provider).owners
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.used[uid]
}
