package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// tokenFileName is the token file's name in the state directory.
const tokenFileName = "token"

// tokenBytes is how many random bytes a generated token holds (hex-encoded).
const tokenBytes = 32

// serveToken resolves the token of "tai42 serve": cfg.token (--token or
// $TAI42_TOKEN), else the token file cfg.tokenFile (which must exist),
// else <state-dir>/token, generated at the first start. from says where
// the token came from, for the daemon to print: the path of the token file
// read, or "--token or $TAI42_TOKEN". generated reports that the file was
// written now. A token file that group or others may access is refused (a
// *usageError).
func serveToken(cfg serveConfig) (token, from string, generated bool, err error) {
	if cfg.token != "" {
		return cfg.token, "--token or $" + tokenEnv, false, nil
	}
	if cfg.tokenFile != "" {
		t, err := readTokenFile(cfg.tokenFile)
		return t, cfg.tokenFile, false, err
	}
	path := filepath.Join(cfg.stateDir, tokenFileName)
	t, err := readTokenFile(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return t, path, false, err
	}
	t, err = generateTokenFile(path)
	if errors.Is(err, fs.ErrExist) {
		// Another daemon wrote it first: use that one.
		t, err = readTokenFile(path)
		return t, path, false, err
	}
	if err != nil {
		return "", "", false, err
	}
	return t, path, true, nil
}

// maxTokenFileBytes bounds what is read of a token file: a token is a
// line, and a path given by mistake (a log, a device) is not read whole.
const maxTokenFileBytes = 64 << 10

// readTokenFile reads a token from path (surrounding white space trimmed).
// It opens path without following a symbolic link at its end, and
// refuses a file that is not regular, that another user owns, or that
// group or others may read or write (an *untrustedError, a *usageError):
// a token someone else could plant or read is no secret of this
// process's. A missing file is an error matching fs.ErrNotExist. No error
// shows the token.
func readTokenFile(path string) (string, error) {
	// O_NONBLOCK: a FIFO planted there does not block the open; the
	// check below refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return "", usagef(&untrustedError{what: "token file", path: path, cause: "is a symbolic link",
			fix: "give the path of the file itself (--token-file or $TAI42_TOKEN_FILE), or replace the link with the file"})
	}
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	uid := os.Geteuid()
	switch o := fileOwner(fi); {
	case !fi.Mode().IsRegular():
		return "", usagef(fmt.Errorf("token file %s is not a regular file", path))
	case o != uid:
		return "", usagef(&untrustedError{what: "token file", path: path, cause: "is owned by " + describeUID(o) + ", not by " + describeUID(uid) + " that tai42 runs as",
			fix: fmt.Sprintf("if you wrote that token yourself, run chown %d %s; else remove it, since someone else may know it", uid, path)})
	case fi.Mode().Perm()&0o077 != 0:
		return "", usagef(fmt.Errorf("token file %s is open to group or others (mode %04o): refusing it; run chmod 600 %s", path, fi.Mode().Perm(), path))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if len(b) > maxTokenFileBytes {
		return "", usagef(fmt.Errorf("token file %s is larger than %d bytes: it holds no token", path, maxTokenFileBytes))
	}
	t := strings.TrimSpace(string(b))
	if err := validToken(t); err != nil {
		return "", usagef(fmt.Errorf("token file %s: %w", path, err))
	}
	return t, nil
}

// generateTokenFile writes a new random token to path, which must not
// exist (fs.ErrExist otherwise), with mode 0600, creating its directory
// (0700) when missing.
func generateTokenFile(path string) (string, error) {
	var b [tokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generating a token: %w", err)
	}
	t := hex.EncodeToString(b[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("state directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	_, err = f.WriteString(t + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("writing the token file %s: %w", path, err)
	}
	return t, nil
}

// validToken checks that t can travel in an Authorization header: not
// empty, printable ASCII without spaces. The error never shows t.
func validToken(t string) error {
	if t == "" {
		return errors.New("the token is empty")
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return fmt.Errorf("the token holds a space, control or non-ASCII character (at byte %d); want printable ASCII", i)
		}
	}
	return nil
}
