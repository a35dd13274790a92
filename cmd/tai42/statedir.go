package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/flock"
)

// stateDirEnv names the environment variable that sets the state directory.
const stateDirEnv = "TAI42_STATE_DIR"

// resolveStateDir picks the state directory (workspaces, persistent keys):
// the --state-dir flag, else $TAI42_STATE_DIR, else $XDG_STATE_HOME/tai42
// (an XDG_STATE_HOME that is not absolute is ignored, as the XDG spec
// says), else $HOME/.local/state/tai42.
func resolveStateDir(flag string, lookupEnv func(string) (string, bool)) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if v, ok := lookupEnv(stateDirEnv); ok && v != "" {
		return v, nil
	}
	if v, ok := lookupEnv("XDG_STATE_HOME"); ok && filepath.IsAbs(v) {
		return filepath.Join(v, "tai42"), nil
	}
	if v, ok := lookupEnv("HOME"); ok && v != "" {
		return filepath.Join(v, ".local", "state", "tai42"), nil
	}
	return "", errors.New("cannot find a state directory: set --state-dir, " + stateDirEnv + ", XDG_STATE_HOME or HOME")
}

// errUntrusted matches every *untrustedError.
var errUntrusted = errors.New("a state directory or token file this process cannot trust")

// untrustedError refuses a state directory or a token file that another
// user made or may change: whoever controls it could plant a token a
// daemon then accepts, or swap a workspace for a link into the host.
type untrustedError struct {
	what  string // "state directory", "token file"
	path  string
	cause string // what is wrong, e.g. "is owned by uid 65534 (nobody)"
	fix   string // what to do
}

func (e *untrustedError) Error() string {
	return fmt.Sprintf("%s %s %s: refusing it, since another user could plant or change what tai42 reads there; %s", e.what, e.path, e.cause, e.fix)
}

func (e *untrustedError) Is(target error) bool { return target == errUntrusted }

// ensureStateDir creates the state directory dir and its missing parents
// (mode 0700) and refuses it, or a parent it made, unless this process's
// user owns it and neither group nor others may write to it: a directory
// someone else made beforehand (under /tmp, say) is theirs to fill. The
// refusal is a *usageError wrapping an *untrustedError.
func ensureStateDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	var missing []string
	for p := abs; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("state directory: %w", err)
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		// Another user may make it between the Lstat and here (EEXIST):
		// the check below refuses it then.
		if err := os.Mkdir(missing[i], 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("state directory: %w", err)
		}
		if err := checkPrivateDir(missing[i]); err != nil {
			return err
		}
	}
	return checkPrivateDir(abs)
}

// checkPrivateDir refuses path (the state directory, or a
// parent made for it) unless it is a directory this process's user owns
// that group and others may not write to. A symbolic link is followed,
// but the link too must be this user's or root's.
func checkPrivateDir(path string) error {
	refuse := func(cause, fix string) error {
		return usagef(&untrustedError{what: "state directory", path: path, cause: cause, fix: fix})
	}
	uid := os.Geteuid()
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if o := fileOwner(fi); o != uid && o != 0 {
			return refuse("is a symbolic link owned by "+describeUID(o)+", not by "+describeUID(uid),
				"remove the link, or give another --state-dir (or $"+stateDirEnv+")")
		}
		if fi, err = os.Stat(path); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	}
	switch o := fileOwner(fi); {
	case !fi.IsDir():
		return fmt.Errorf("state directory %s is not a directory (mode %s): give another --state-dir (or $%s)", path, fi.Mode(), stateDirEnv)
	case o != uid:
		return refuse("is owned by "+describeUID(o)+", not by "+describeUID(uid)+" that tai42 runs as",
			fmt.Sprintf("give a --state-dir (or $%s) of your own, such as %s, or, if that directory is meant for tai42 and holds nothing of another user's, chown it to %s", stateDirEnv, privateStateDirHint(uid), describeUID(uid)))
	case fi.Mode().Perm()&0o022 != 0:
		return refuse(fmt.Sprintf("is writable by group or others (mode %04o)", fi.Mode().Perm()),
			fmt.Sprintf("run chmod 700 %s, or give another --state-dir (or $%s)", path, stateDirEnv))
	}
	return nil
}

// fileOwner is the uid that owns fi's file.
func fileOwner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// describeUID names uid for a message: "uid 65534 (nobody)".
func describeUID(uid int) string {
	s := "uid " + strconv.Itoa(uid)
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		s += " (" + u.Username + ")"
	}
	return s
}

// privateStateDirHint is a state directory to suggest to uid: root's
// daemon's conventional one, else the default under the home directory.
func privateStateDirHint(uid int) string {
	if uid == 0 {
		return "/var/lib/tai42"
	}
	return "~/.local/state/tai42"
}

// lockWorkspaceKey takes an exclusive, non-blocking lock on a persistent
// workspace key for this process, so that two tai42 processes sharing a
// state directory never run two live sessions on one key (the kit's ledger
// enforces that only within one process). The lock file lives under
// <stateDir>/locks and is released when the returned file is closed or the
// process ends.
func lockWorkspaceKey(stateDir, key string) (*os.File, error) {
	dir := filepath.Join(stateDir, "locks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	f, err := flock.TryExclusive(filepath.Join(dir, key+".lock"))
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, &sandbox.SpecRejectedError{Field: "workspace_key", Reason: sandbox.ReasonConflict,
			Message: fmt.Sprintf("persistent workspace %q is in use by another tai42 process; one live session per key", key)}
	}
	if err != nil {
		return nil, fmt.Errorf("locking workspace %q: %w", key, err)
	}
	return f, nil
}
