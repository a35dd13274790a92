// Package oscmd holds what the host runner and the in-sandbox agent share
// about starting commands, reaching files and cleaning up after them:
// finding a command as a shell would, mapping a failed execve to the
// shell's exit codes, naming os.Root's refusals and file kinds in errors,
// and removing a directory a command may have left unwritable.
package oscmd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// LookPath finds file as a shell would, in pathEnv and relative to dir
// (the command's cwd). code is 127 (not found) or 126 (found, not
// executable) with a message for stderr, or 0 with the path.
func LookPath(file, pathEnv, dir string) (path string, code int, msg string) {
	if strings.Contains(file, "/") {
		return file, 0, ""
	}
	denied := ""
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		cand := filepath.Join(d, file)
		fi, err := os.Stat(cand)
		if err != nil || fi.IsDir() {
			continue
		}
		if fi.Mode()&0o111 != 0 {
			return cand, 0, ""
		}
		if denied == "" {
			denied = cand
		}
	}
	if denied != "" {
		return "", 126, fmt.Sprintf("tai42: %s: permission denied (not executable)\n", denied)
	}
	return "", 127, fmt.Sprintf("tai42: %s: command not found\n", file)
}

// StartFailure maps a failed execve of name to the shell's exit code (127
// or 126) and a message for stderr; 0 for an error that is not the
// command's (the caller reports it as a failure of its own).
func StartFailure(name string, err error) (int, string) {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return 0, ""
	}
	switch errno {
	case syscall.ENOENT, syscall.ENOTDIR:
		return 127, fmt.Sprintf("tai42: %s: no such file or directory\n", name)
	case syscall.EACCES, syscall.EPERM, syscall.ENOEXEC, syscall.EISDIR:
		return 126, fmt.Sprintf("tai42: %s: cannot execute: %s\n", name, errno.Error())
	}
	return 0, ""
}

// RemoveAll removes dir even when a session left directories in it
// without write or search permission.
func RemoveAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// RootErr rewrites os.Root's escape error so that it says what happened.
// os.Root's escape error is unexported; it may sit under several
// *fs.PathError layers (MkdirAll: "mkdirat a: statat a: path escapes from
// parent").
func RootErr(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "path escapes from parent" {
			return errors.New("it leads out of the workspace (through a symlink or ..)")
		}
	}
	return err
}

// FileKind names a file type that is not a regular file, for errors.
func FileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return m.Type().String()
}

// Missing reports an error that says the path (or one of its parents) does
// not exist.
func Missing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}
