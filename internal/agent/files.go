package agent

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/tai42/sandbox/internal/oscmd"
)

// fileSystem is what put and get use of a root: an *os.Root, or osRoot
// for the agent's whole filesystem.
type fileSystem interface {
	MkdirAll(name string, perm fs.FileMode) error
	Lstat(name string) (fs.FileInfo, error)
	OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error)
	Remove(name string) error
	Rename(oldname, newname string) error
	Close() error
}

// osRoot is root "/": the agent's whole filesystem, where nothing is
// outside, so paths resolve as usual (an absolute symlink, which os.Root
// refuses as an escape, is followed).
type osRoot struct{}

func (osRoot) abs(name string) string { return filepath.Join("/", name) }
func (r osRoot) MkdirAll(name string, perm fs.FileMode) error {
	return os.MkdirAll(r.abs(name), perm)
}
func (r osRoot) Lstat(name string) (fs.FileInfo, error) { return os.Lstat(r.abs(name)) }
func (r osRoot) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	return os.OpenFile(r.abs(name), flag, perm)
}
func (r osRoot) Remove(name string) error { return os.Remove(r.abs(name)) }
func (r osRoot) Rename(oldname, newname string) error {
	return os.Rename(r.abs(oldname), r.abs(newname))
}
func (osRoot) Close() error { return nil }

// openRoot checks a file request's root and path and opens the root.
func openRoot(op string, req *request) (fileSystem, *errorFrame) {
	if !filepath.IsAbs(req.Root) || filepath.Clean(req.Root) != req.Root {
		return nil, &errorFrame{Kind: kindProtocol, Message: fmt.Sprintf("agent protocol: the root %q is not a clean absolute path", req.Root)}
	}
	if req.Rel != "." && (!filepath.IsLocal(req.Rel) || filepath.Clean(req.Rel) != req.Rel) {
		return nil, &errorFrame{Kind: kindProtocol, Message: fmt.Sprintf("agent protocol: the path %q is not clean and relative to its root", req.Rel)}
	}
	if req.Root == "/" {
		return osRoot{}, nil
	}
	r, err := os.OpenRoot(req.Root)
	if err != nil {
		return nil, sandboxError(op, fmt.Sprintf("%q: cannot open %s", req.Orig, req.Root), err)
	}
	return r, nil
}

// handlePut writes data frames to a temporary file beside the target and
// renames it into place on the end frame, so a failed upload leaves the
// old content. Missing parents are created. Every step goes through the
// root, so a symlink that leads out of it is refused.
func (s *server) handlePut(c *frameConn, req *request) {
	const op = "put_file"
	fail := func(what string, err error) {
		_ = c.writeJSON(frameError, sandboxError(op, fmt.Sprintf("%q: %s", req.Orig, what), oscmd.RootErr(err)))
	}
	root, ef := openRoot(op, req)
	if ef != nil {
		_ = c.writeJSON(frameError, ef)
		return
	}
	defer root.Close()
	if req.Rel == "." {
		_ = c.writeJSON(frameError, sandboxError(op, fmt.Sprintf("%q is the workspace itself; name a file", req.Orig), nil))
		return
	}
	dir := filepath.Dir(req.Rel)
	newDirs := false
	if req.Sync {
		fi, err := root.Lstat(dir)
		newDirs = err != nil || !fi.IsDir()
	}
	if err := root.MkdirAll(dir, 0o755); err != nil {
		fail("cannot create its parent directory", err)
		return
	}
	mode := fs.FileMode(0o644)
	if fi, err := root.Lstat(req.Rel); err == nil {
		if fi.IsDir() {
			_ = c.writeJSON(frameError, sandboxError(op, fmt.Sprintf("%q is a directory", req.Orig), nil))
			return
		}
		if fi.Mode().IsRegular() {
			mode = fi.Mode().Perm()
		}
	}
	tmp := filepath.Join(dir, ".tai42-put-"+randomSuffix())
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		fail("cannot create a temporary file", err)
		return
	}
	placed := false
	defer func() {
		if !placed {
			f.Close()
			_ = root.Remove(tmp)
		}
	}()
	if err := c.writeJSON(frameReply, struct{}{}); err != nil {
		return
	}
	bp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bp)
	for {
		typ, n, err := c.readHeader()
		if err != nil {
			return // the client is gone: the old content stays
		}
		switch typ {
		case frameData:
			p, err := c.readPayload(n, *bp)
			if err != nil {
				return
			}
			if _, err := f.Write(p); err != nil {
				fail("write failed", err)
				return
			}
		case frameEnd:
			if err := f.Chmod(mode); err != nil { // the umask may have narrowed it
				fail("chmod failed", err)
				return
			}
			if req.Sync {
				if err := f.Sync(); err != nil {
					fail("cannot flush the new content to disk", err)
					return
				}
			}
			err := f.Close()
			if err != nil {
				fail("write failed", err)
				return
			}
			if err := root.Rename(tmp, req.Rel); err != nil {
				_ = root.Remove(tmp)
				placed = true // closed and removed
				fail("cannot move the new file into place", err)
				return
			}
			placed = true
			if req.Sync {
				openDir := func(name string) (*os.File, error) { return root.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY, 0) }
				if err := oscmd.SyncDirs(openDir, dir, newDirs); err != nil {
					fail("the new file is in place but its directory could not be flushed to disk", err)
					return
				}
			}
			_ = c.writeJSON(frameReply, struct{}{})
			return
		case frameAbort:
			f.Close()
			_ = root.Remove(tmp)
			placed = true // nothing left to clean
			_ = c.writeJSON(frameReply, struct{}{})
			return
		default:
			s.protocolFailure(c, fmt.Sprintf("a put expects data, end or abort frames, not a frame of type %q", typ))
			return
		}
	}
}

// handleGet sends a regular file: its size, data frames, an end frame.
func (s *server) handleGet(c *frameConn, req *request) {
	f, fi, ef := openForGet(req)
	if ef != nil {
		_ = c.writeJSON(frameError, ef)
		return
	}
	defer f.Close()
	if err := c.writeJSON(frameReply, getReply{Size: fi.Size()}); err != nil {
		return
	}
	bp := frameBufs.Get().(*[]byte)
	defer frameBufs.Put(bp)
	buf := *bp
	for {
		n, err := f.Read(buf[headerLen:])
		if n > 0 {
			if werr := c.writeBuf(frameData, buf[:headerLen+n]); werr != nil {
				return // the client closed the reader
			}
		}
		if err == io.EOF {
			_ = c.write(frameEnd, nil)
			return
		}
		if err != nil {
			_ = c.writeJSON(frameError, sandboxError("get_file", fmt.Sprintf("reading %q failed", req.Orig), err))
			return
		}
	}
}

// openForGet opens a regular file. Only a path where nothing exists is
// kind not_found; a directory, a FIFO, a socket, a dangling or looping
// symlink, an escape or an I/O error is kind sandbox.
func openForGet(req *request) (*os.File, fs.FileInfo, *errorFrame) {
	const op = "get_file"
	root, ef := openRoot(op, req)
	if ef != nil {
		return nil, nil, ef
	}
	defer root.Close()
	f, err := root.OpenFile(req.Rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		if oscmd.Missing(err) {
			if _, lerr := root.Lstat(req.Rel); oscmd.Missing(lerr) {
				return nil, nil, &errorFrame{Kind: kindNotFound, Op: op, Message: "no such file", Path: req.Orig}
			}
			return nil, nil, sandboxError(op, fmt.Sprintf("%q is a symlink whose target does not exist in the workspace", req.Orig), nil)
		}
		return nil, nil, sandboxError(op, fmt.Sprintf("cannot open %q", req.Orig), oscmd.RootErr(err))
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, sandboxError(op, fmt.Sprintf("cannot stat %q", req.Orig), err)
	}
	switch {
	case fi.IsDir():
		f.Close()
		return nil, nil, sandboxError(op, fmt.Sprintf("%q is a directory, not a file", req.Orig), nil)
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, nil, sandboxError(op, fmt.Sprintf("%q is not a regular file (%s)", req.Orig, oscmd.FileKind(fi.Mode())), nil)
	}
	return f, fi, nil
}

func randomSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}
