package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// mkdirPrivate creates dir and its missing parents, mode 0700.
func mkdirPrivate(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return nil
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
