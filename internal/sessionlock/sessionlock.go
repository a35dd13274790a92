// Package sessionlock marks which process owns a session's resources on
// the machine: each session has a lock file, flocked by the process that
// runs it for as long as it does. A process starting on a state directory
// removes only the sessions whose lock it can take (their process is
// gone: it ended, or was killed), never those of another live process
// sharing the directory (concurrent `tai42 run`s do).
//
// The kernel drops a flock with its process, so a SIGKILL frees it. A
// lock is taken before anything else of the session is made, and its
// file is removed after everything else is.
package sessionlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/tai42/sandbox/internal/flock"
	"golang.org/x/sys/unix"
)

const suffix = ".lock"

// Dir is a directory of session lock files. It knows the locks it handed
// out, for [Dir.Abandon].
type Dir struct {
	path string
	mu   sync.Mutex
	held map[*Lock]struct{}
}

// Open makes (if needed) and returns the lock directory at path.
func Open(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("session locks: %w", err)
	}
	return &Dir{path: path, held: map[*Lock]struct{}{}}, nil
}

// Lock is one session's held lock.
type Lock struct {
	d    *Dir
	f    *os.File
	path string
}

// ErrHeld is returned by Hold when another process holds the lock.
var ErrHeld = errors.New("the session is in use by another process")

// Hold takes id's lock, creating its file: for a new session, or one this
// process takes over. It fails with ErrHeld when another live process
// holds it.
func (d *Dir) Hold(id string) (*Lock, error) {
	if id == "" || !filepath.IsLocal(id) || strings.ContainsRune(id, '/') {
		return nil, fmt.Errorf("session locks: %q is not a session id", id)
	}
	path := filepath.Join(d.path, id+suffix)
	f, err := flock.TryExclusive(path)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil, fmt.Errorf("session %s: %w", id, ErrHeld)
	}
	if err != nil {
		return nil, fmt.Errorf("session lock %s: %w", path, err)
	}
	l := &Lock{d: d, f: f, path: path}
	d.mu.Lock()
	d.held[l] = struct{}{}
	d.mu.Unlock()
	return l, nil
}

// Abandon drops every lock this Dir handed out and leaves their files, as
// the process's death would: for tests that simulate a crash in process.
func (d *Dir) Abandon() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for l := range d.held {
		l.f.Close()
		l.f = nil
	}
	clear(d.held)
}

// IDs lists the sessions that have a lock file, held or not.
func (d *Dir) IDs() ([]string, error) {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("session locks: %w", err)
	}
	var out []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), suffix); ok {
			out = append(out, id)
		}
	}
	return out, nil
}

// Release removes the lock file (when remove: the session is gone) and
// then drops the lock. Safe on a nil Lock and twice.
func (l *Lock) Release(remove bool) {
	if l == nil {
		return
	}
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	if l.f == nil {
		return
	}
	if remove {
		_ = os.Remove(l.path)
	}
	l.f.Close()
	l.f = nil
	delete(l.d.held, l)
}
