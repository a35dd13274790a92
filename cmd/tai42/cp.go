package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
)

// cpCmd is "tai42 cp SRC DST".
func (c *cli) cpCmd() *cobra.Command {
	var rf remoteFlags
	cmd := &cobra.Command{
		Use:   "cp LOCAL ID:PATH | ID:PATH LOCAL",
		Short: "Copy a file into or out of a session's workspace",
		Long: `Cp copies one file between this machine and the workspace of the daemon's
session ID, streaming it (a large file is never held whole in memory).
Exactly one side is ID:PATH; PATH is relative to the workspace.

LOCAL "-" is stdin (copying in) or stdout (copying out). Copying in, missing
parent directories are created and an existing file is replaced atomically;
an empty PATH or one ending in "/" takes LOCAL's base name. Copying out to
a directory writes the file there under PATH's base name; an existing local
file is replaced atomically, keeping its mode.

A LOCAL path with a ':' before any '/' reads as ID:PATH: write it as
./NAME:REST.`,
		Example: `  tai42 cp ./data.csv "$id":in/data.csv
  tai42 cp "$id":out/report.pdf .
  tar czf - src | tai42 cp - "$id":src.tgz
  tai42 cp "$id":log.txt - | tail`,
		Args: exactArgs(2, "cp: name a source and a destination, one of them ID:PATH, e.g. tai42 cp ./f.txt ID:f.txt"),
		RunE: func(_ *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			switch {
			case srcRemote == dstRemote:
				return &exitError{code: exitUsage, err: errors.New("cp: exactly one of the two paths must be ID:PATH (a session's file), the other a local path or -")}
			case srcRemote:
				if srcPath == "" {
					return &exitError{code: exitUsage, err: fmt.Errorf("cp: %q names no file in the session (want ID:PATH)", args[0])}
				}
				return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
					return c.copyOut(ctx, cl, srcID, srcPath, args[1])
				})
			}
			remotePath, err := uploadPath(args[0], dstPath)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			src, err := c.openLocal(args[0])
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			defer src.Close()
			return c.daemonCall(rf, func(ctx context.Context, _ *interruption, cl *client.Client) error {
				return copyIn(ctx, cl, dstID, remotePath, src)
			})
		},
	}
	addRemoteFlags(cmd.Flags(), &rf)
	return cmd
}

// splitRemote splits "ID:PATH" into the session id and the path; ok is
// false for a local path: "-", or one with no ':' before its first '/'.
func splitRemote(arg string) (id, p string, ok bool) {
	id, p, found := strings.Cut(arg, ":")
	if !found || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return id, p, true
}

// uploadPath is the workspace path a local file is copied to: dst, or,
// when dst is empty or ends in "/", dst plus the local file's base name.
func uploadPath(local, dst string) (string, error) {
	if dst != "" && !strings.HasSuffix(dst, "/") {
		return dst, nil
	}
	if local == "-" {
		return "", errors.New("cp: copying stdin needs a file name in the session (ID:PATH, not ending in /)")
	}
	return dst + filepath.Base(local), nil
}

// openLocal opens the local source of a copy in: stdin for "-", else a
// regular file.
func (c *cli) openLocal(name string) (io.ReadCloser, error) {
	if name == "-" {
		return io.NopCloser(readerOrEmpty(c.stdin)), nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("cp: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cp: %w", err)
	}
	if fi.IsDir() {
		f.Close()
		return nil, fmt.Errorf("cp: %s is a directory: cp copies one file (tar it: tar czf - DIR | tai42 cp - ID:DIR.tgz)", name)
	}
	return f, nil
}

// copyIn streams r to path in the session id: through
// sandbox.FileStreamer when the session has it, else read whole and put.
func copyIn(ctx context.Context, sb sandbox.Sandbox, id, path string, r io.Reader) error {
	sess, err := sb.GetSession(ctx, id)
	if err != nil {
		return err
	}
	if st, ok := sess.(sandbox.FileStreamer); ok {
		return st.PutFileFrom(ctx, path, r)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("cp: reading the local file: %w", err)
	}
	return sess.PutFile(ctx, path, data)
}

// copyOut streams path of the session id to local: stdout for "-", else a
// file replaced atomically (a directory gets the file under path's base
// name).
func (c *cli) copyOut(ctx context.Context, sb sandbox.Sandbox, id, p, local string) error {
	sess, err := sb.GetSession(ctx, id)
	if err != nil {
		return err
	}
	var src io.Reader
	if st, ok := sess.(sandbox.FileStreamer); ok {
		rc, _, err := st.OpenFile(ctx, p)
		if err != nil {
			return err
		}
		defer rc.Close()
		src = rc
	} else {
		data, err := sess.GetFile(ctx, p)
		if err != nil {
			return err
		}
		src = bytes.NewReader(data)
	}
	src = errReader{src}
	if local == "-" {
		if _, err := io.Copy(c.stdout, src); err != nil {
			if isReadErr(err) {
				return err
			}
			return outputErr(err)
		}
		return nil
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(p))
	}
	return writeFileAtomic(local, src)
}

// errReader marks r's errors (but io.EOF) as *readErr, so that a copy
// tells a failure reading the session's file from one writing ours.
type errReader struct{ r io.Reader }

func (e errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		err = &readErr{err}
	}
	return n, err
}

// readErr marks an error reading the session's file (not writing ours).
type readErr struct{ err error }

func (e *readErr) Error() string { return e.err.Error() }
func (e *readErr) Unwrap() error { return e.err }

func isReadErr(err error) bool {
	var re *readErr
	return errors.As(err, &re)
}

// writeFileAtomic writes r to name through a temporary file in the same
// directory renamed over it, so a failed copy leaves the old file (or
// nothing). An existing file's mode is kept; a new file gets 0644.
func writeFileAtomic(name string, r io.Reader) error {
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(name); err == nil {
		if !fi.Mode().IsRegular() {
			return usagef(fmt.Errorf("cp: %s is not a regular file", name))
		}
		mode = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tai42-*")
	if err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r); err != nil {
		if isReadErr(err) {
			return err
		}
		return fmt.Errorf("cp: writing %s: %w", name, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("cp: writing %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	ok = true
	return nil
}
