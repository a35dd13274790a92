package container

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// sessionShare is the part of what the host gives each user that a
// remapped runc session may hold, per uid of its own, of the kernel's
// per-user counts charged to host root as well (see limitsHook): an eighth.
const sessionShare = 8

// sessionLimits are the per-user counts a remapped runc session's user
// namespace bounds (see limitsHook), each to the host's limit's share, or, for the
// namespaces (which the seccomp profile refuses a session anyway), to a
// few beyond what the runtime makes there itself.
var sessionLimits = []struct {
	name  string
	fixed int64 // when not 0, the limit (at most the host's)
}{
	{name: "max_inotify_instances"},
	{name: "max_inotify_watches"},
	{name: "max_fanotify_groups"},
	{name: "max_fanotify_marks"},
	{name: "max_user_namespaces", fixed: 8},
	{name: "max_mnt_namespaces", fixed: 16},
}

// userLimits reads the host's per-user limits and returns a remapped runc
// session's, as NAME=VALUE (see limitsHook); a count this kernel does not
// have is left out.
func userLimits() ([]string, error) {
	var out []string
	for _, l := range sessionLimits {
		b, err := os.ReadFile("/proc/sys/user/" + l.name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		host, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/sys/user/%s: %w", l.name, err)
		}
		v := max(host/sessionShare, 1)
		if l.fixed != 0 {
			v = min(l.fixed, host)
		}
		out = append(out, fmt.Sprintf("%s=%d", l.name, v))
	}
	return out, nil
}

// limitsHook is the createContainer hook that writes limits (NAME=VALUE,
// NAME a file of /proc/sys/user) in a remapped runc session's user
// namespace (see ownUserNS for crun's).
//
// The kernel charges an inotify instance (a user namespace, a mount
// namespace, a fanotify group...) to its creator's uid in the creator's
// user namespace, against that namespace's limit, and then, a level up at
// a time, to each namespace's owner in its parent, against the parent's
// limit. A session's user namespace is made by the runtime as host root:
// every session's use is charged to host root's own count as well (128
// inotify instances by default, fs.inotify.max_user_instances). The
// limits in the session's own namespace are the bound one can set: a new
// namespace's are unlimited, the runtimes refuse them as sysctls, and
// only a process in the namespace with CAP_SYS_RESOURCE there may write
// them (/proc/sys/user shows the namespace of whoever opens it). A
// createContainer hook is one: the runtime runs it in the container's
// namespaces before the container's process starts, with every
// capability; the session, without CAP_SYS_RESOURCE, cannot raise them.
// They count per uid of the session: root in a session, which may become
// any of its uids, gets the bound for each uid it uses.
//
// The hook is the host's shell: it runs as root in the session, an
// unprivileged host uid, before the container's root is pivoted into,
// and reaches /bin/sh where it may not reach the agent binary (a state
// directory under /root, a test's temporary directory). The values are
// numbers of this provider's making; nothing of the session's is in the
// script.
func limitsHook(limits []string) specs.Hook {
	script := "set -e"
	for _, l := range limits {
		name, value, _ := strings.Cut(l, "=")
		script += fmt.Sprintf("; echo %s > /proc/sys/user/%s", value, name)
	}
	return specs.Hook{Path: hookShell, Args: []string{"sh", "-c", script}, Env: []string{}}
}

// hookShell is the shell limitsHook runs.
const hookShell = "/bin/sh"

// sessionUserLimits are the limits a session's config has its runtime
// write (see limitsHook): on runc alone. None without a user namespace,
// where root in a session is host root and its use is host root's own, nor
// on crun, whose sessions' namespaces are owned by uids of their own (see
// ownUserNS). (crun 1.8.1 fails the hook here besides: "executable path
// not specified", the shell never runs.)
func (p *provider) sessionUserLimits() []string {
	if p.userns == nil || p.ownUserNS() {
		return nil
	}
	return p.userLimits
}
