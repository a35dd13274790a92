// Package oscmd holds what the host runner and the in-sandbox agent share
// about starting commands and cleaning up after them: finding a command as
// a shell would, mapping a failed execve to the shell's exit codes, and
// removing a directory a command may have left unwritable.
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
