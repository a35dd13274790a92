package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// readTokenFile reads a token from path (surrounding white space trimmed).
// It refuses a file that is not regular or that group or others may read
// or write; a missing file is an error matching fs.ErrNotExist. No error
// shows the token.
func readTokenFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", usagef(fmt.Errorf("token file %s is not a regular file", path))
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", usagef(fmt.Errorf("token file %s is open to group or others (mode %04o): refusing it; run chmod 600 %s", path, perm, path))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
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
