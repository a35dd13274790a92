package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/execgate"
	"github.com/tai42/sandbox/internal/execout"
	"github.com/tai42/sandbox/internal/netns"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/sessionlock"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/kit"
)

// session is one host session: its workspace, temp directory, optional
// network namespace and cgroup, and the execs it started.
type session struct {
	p        *provider
	id       string
	spec     sandbox.SessionSpec
	ws       string
	root     *os.Root
	tmp      string
	netns    *netns.NS
	cg       *cgroup
	grp      *group // the tracking cgroup; nil where there is none
	lock     *sessionlock.Lock
	teardown undo.Stack // the undos of what Create made, the last made on top

	execs execgate.Gate[*proc] // running execs

	mu     sync.Mutex
	groups map[int]struct{} // process groups that may still have members
}

var _ kit.Resources = (*session)(nil)

var tmpSeq atomic.Uint64

// putTempPrefix starts the name of put_file's temporary files.
const putTempPrefix = ".tai42-put-"

func (r *session) WorkspacePath() string { return r.ws }

func (r *session) gone() error {
	return &sandbox.SessionNotFoundError{SessionID: r.id, Detail: "it was destroyed"}
}

// Destroy ends every exec and every process group the session started,
// then removes its cgroup, network namespace, temp directory and (when
// ephemeral) its workspace.
func (r *session) Destroy(context.Context) error {
	// An exec admitted before the close finishes starting and registers
	// before anything it uses (the netns, the root) is released.
	procs, first := r.execs.Close()
	if !first {
		return nil
	}
	r.mu.Lock()
	groups := r.groups
	r.groups = nil
	r.mu.Unlock()

	for _, p := range procs {
		p.end(execout.EndDestroy)
	}
	for pg := range groups {
		_ = syscall.Kill(-pg, syscall.SIGKILL)
	}
	var errs []error
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			errs = append(errs, fmt.Errorf("exec %d did not end within 10s of SIGKILL", p.pid))
		}
	}
	return errors.Join(append(errs, r.cleanup())...)
}

// cleanup removes what Create (or reattach) made, last first: it unwinds
// the session's teardown; it is also the rollback of a failed create.
func (r *session) cleanup() error {
	err := r.teardown.Unwind(context.Background())
	// Last: while it is held, no other process sweeps the session. Its
	// file stays when something could not be removed, so the next start
	// retries.
	r.lock.Release(err == nil)
	return err
}

// register records a started exec and its process group. Destroy waits
// for admitted starts, so every started exec is registered before Destroy
// ends them.
func (r *session) register(p *proc) {
	r.execs.Add(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.groups == nil {
		r.groups = make(map[int]struct{})
	}
	r.groups[p.pid] = struct{}{}
}

// unregister drops a finished exec, and its process group when nothing is
// left running in it.
func (r *session) unregister(p *proc) {
	left := syscall.Kill(-p.pid, 0) == nil
	r.execs.Remove(p)
	r.mu.Lock()
	if !left {
		delete(r.groups, p.pid)
	}
	r.mu.Unlock()
}

// PutFile writes data to a temp file beside the target and renames it into
// place, so a reader sees the old content or the new, never a mix. Missing
// parents are created. Every step goes through os.Root, so a symlink that
// leads out of the workspace is refused.
func (r *session) PutFile(ctx context.Context, p kit.Path, data []byte) error {
	return r.PutFileFrom(ctx, p, bytes.NewReader(data))
}

// PutFileFrom implements kit.FileStreamer: it copies src into a temporary
// file beside the target and renames it into place, so a failed write (of
// the file or of src) leaves the old content.
func (r *session) PutFileFrom(ctx context.Context, p kit.Path, src io.Reader) (err error) {
	fail := func(what string, err error) error {
		return sandbox.WrapError("put_file", fmt.Sprintf("%q: %s", p.Orig, what), oscmd.RootErr(err))
	}
	if p.Rel == "." {
		return sandbox.Errorf("put_file", "%q is the workspace itself; name a file", p.Orig)
	}
	dir := filepath.Dir(p.Rel)
	durable := r.spec.Durability == sandbox.Persistent
	newDirs := durable && !r.dirExists(dir)
	if err := r.root.MkdirAll(dir, 0o755); err != nil {
		return fail("cannot create its parent directory", err)
	}
	mode := fs.FileMode(0o644)
	if fi, err := r.root.Lstat(p.Rel); err == nil {
		if fi.IsDir() {
			return sandbox.Errorf("put_file", "%q is a directory", p.Orig)
		}
		if fi.Mode().IsRegular() {
			mode = fi.Mode().Perm()
		}
	}
	tmp := filepath.Join(dir, fmt.Sprintf("%s%d-%d", putTempPrefix, os.Getpid(), tmpSeq.Add(1)))
	f, err := r.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fail("cannot create a temporary file", err)
	}
	defer func() {
		if err != nil {
			_ = r.root.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, ctxReader{ctx, src}); err != nil {
		f.Close()
		var re readError
		if errors.As(err, &re) {
			return sandbox.WrapError("put_file", fmt.Sprintf("%q: reading the new content failed; the old content stays", p.Orig), re.err)
		}
		return fail("write failed", err)
	}
	if err := f.Chmod(mode); err != nil { // the umask may have narrowed it
		f.Close()
		return fail("chmod failed", err)
	}
	if durable {
		// A persistent workspace outlives a crash of the machine: the new
		// content is on disk before it takes the name.
		if err := f.Sync(); err != nil {
			f.Close()
			return fail("cannot flush the new content to disk", err)
		}
	}
	if err := f.Close(); err != nil {
		return fail("write failed", err)
	}
	if err := r.root.Rename(tmp, p.Rel); err != nil {
		return fail("cannot move the new file into place", err)
	}
	if durable {
		if err := oscmd.SyncDirs(r.root.Open, dir, newDirs); err != nil {
			return fail("the new file is in place but its directory could not be flushed to disk", err)
		}
	}
	return nil
}

func (r *session) dirExists(dir string) bool {
	fi, err := r.root.Stat(dir)
	return err == nil && fi.IsDir()
}

// GetFile reads a regular file. Only a path where nothing exists is a
// *sandbox.FileNotFoundError; a directory, a FIFO, a socket, a dangling or
// looping symlink, an escape or an I/O error is a plain *sandbox.SandboxError.
func (r *session) GetFile(_ context.Context, p kit.Path) ([]byte, error) {
	f, fi, err := r.open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Read as os.ReadFile does: one buffer sized from the stat, +1 so that
	// end-of-file shows without a regrow. (bytes.Buffer.ReadFrom would
	// regrow and copy the whole file once it has fewer than 512 bytes free.)
	buf := make([]byte, 0, fi.Size()+1)
	for {
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			if errors.Is(err, io.EOF) {
				return buf, nil
			}
			return nil, sandbox.WrapError("get_file", fmt.Sprintf("reading %q failed", p.Orig), err)
		}
		if len(buf) == cap(buf) { // the file grew since the stat
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

// OpenFile implements kit.FileStreamer: the open regular file, with
// GetFile's errors.
func (r *session) OpenFile(_ context.Context, p kit.Path) (io.ReadCloser, int64, error) {
	f, fi, err := r.open(p)
	if err != nil {
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// open opens a regular file of the workspace for GetFile and OpenFile.
// Only a path where nothing exists is a *sandbox.FileNotFoundError; a
// directory, a FIFO, a socket, a dangling or looping symlink, an escape or
// an I/O error is a plain *sandbox.SandboxError.
func (r *session) open(p kit.Path) (*os.File, fs.FileInfo, error) {
	f, err := r.root.OpenFile(p.Rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		if oscmd.Missing(err) {
			if _, lerr := r.root.Lstat(p.Rel); oscmd.Missing(lerr) {
				return nil, nil, &sandbox.FileNotFoundError{Path: p.Orig}
			}
			return nil, nil, sandbox.Errorf("get_file", "%q is a symlink whose target does not exist in the workspace", p.Orig)
		}
		return nil, nil, sandbox.WrapError("get_file", fmt.Sprintf("cannot open %q", p.Orig), oscmd.RootErr(err))
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, sandbox.WrapError("get_file", fmt.Sprintf("cannot stat %q", p.Orig), err)
	}
	switch {
	case fi.IsDir():
		f.Close()
		return nil, nil, sandbox.Errorf("get_file", "%q is a directory, not a file", p.Orig)
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, nil, sandbox.Errorf("get_file", "%q is not a regular file (%s)", p.Orig, oscmd.FileKind(fi.Mode()))
	}
	return f, fi, nil
}

// ctxReader reads from r until ctx is done; r's own failures come back
// as readError, so that PutFileFrom can tell them from the file's.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, readError{err}
	}
	n, err := c.r.Read(b)
	if err != nil && err != io.EOF {
		err = readError{err}
	}
	return n, err
}

// WriteTo keeps a bytes.Reader's single write (PutFile's path) and copies
// any other reader through a 256 KiB buffer (io.Copy into an *os.File would
// use 32 KiB).
func (c ctxReader) WriteTo(w io.Writer) (int64, error) {
	if br, ok := c.r.(*bytes.Reader); ok {
		if err := c.ctx.Err(); err != nil {
			return 0, readError{err}
		}
		return br.WriteTo(w)
	}
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{c}, make([]byte, 256<<10))
}

type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }
func (e readError) Unwrap() error { return e.err }
