package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/client"
)

// Environment variables of the client commands.
const (
	urlEnv       = "TAI42_URL"
	tokenEnv     = "TAI42_TOKEN"
	tokenFileEnv = "TAI42_TOKEN_FILE"
	tlsCAEnv     = "TAI42_TLS_CA"
)

// remoteFlags are the flags naming the daemon a client command talks to.
type remoteFlags struct {
	url, token, tokenFile, tlsCA string
}

// addRemoteFlags registers --url, --token, --token-file and --tls-ca.
func addRemoteFlags(fl *pflag.FlagSet, f *remoteFlags) {
	fl.StringVar(&f.url, "url", "", "the daemon's `ADDRESS`: http://HOST:PORT, https://HOST:PORT, HOST:PORT or unix:/PATH (default: $"+urlEnv+")")
	fl.StringVar(&f.token, "token", "", "the daemon's `TOKEN` (default: $"+tokenEnv+", else --token-file, else for a daemon on this machine the state directory's token file); a flag's value is visible to every user of this machine in ps: prefer --token-file or $"+tokenEnv)
	fl.StringVar(&f.tokenFile, "token-file", "", "read the daemon's token from this `FILE`, yours and mode 0600 (default: $"+tokenFileEnv+")")
	fl.StringVar(&f.tlsCA, "tls-ca", "", "PEM `FILE` of the CA certificates to trust for an https daemon (default: $"+tlsCAEnv+", else the system's)")
}

// remote is a resolved daemon: where it is, the token, and where each came
// from (for messages; never the token itself).
type remote struct {
	url       string
	urlFrom   string // "--url" or "TAI42_URL"
	token     string
	tokenFrom string // "--token", "TAI42_TOKEN" or the token file's path
	tlsCA     string
}

// errNoDaemon is the usage error of a client command without a daemon.
var errNoDaemon = errors.New("no daemon to talk to: set " + urlEnv + " (or --url) to its address, e.g. " +
	urlEnv + "=http://127.0.0.1:4242, after starting one with `tai42 serve`")

// resolveRemote finds the daemon: --url, else $TAI42_URL (an empty value is
// unset). ok is false when neither names one. The token is --token, else
// --token-file, else $TAI42_TOKEN, else $TAI42_TOKEN_FILE, else, for a
// daemon on this machine (a unix socket or a
// loopback address), the token file of the default state directory that
// `tai42 serve` writes; with none of them it is a usage error.
func (c *cli) resolveRemote(f remoteFlags) (r remote, ok bool, err error) {
	r.url, r.urlFrom = f.url, "--url"
	if r.url == "" {
		r.url, _ = c.lookupEnv(urlEnv)
		r.urlFrom = urlEnv
	}
	if r.url == "" {
		return remote{}, false, nil
	}
	if r.url, err = normalizeURL(r.url); err != nil {
		return remote{}, true, usagef(fmt.Errorf("%s: %w", r.urlFrom, err))
	}
	r.tlsCA = f.tlsCA
	if r.tlsCA == "" {
		r.tlsCA, _ = c.lookupEnv(tlsCAEnv)
	}
	if r.token, r.tokenFrom, err = c.remoteToken(f); err != nil {
		return remote{}, true, err
	}
	if r.token == "" && isLocalURL(r.url) {
		if dir, err := resolveStateDir("", c.lookupEnv); err == nil {
			path := filepath.Join(dir, tokenFileName)
			if _, err := os.Stat(path); err == nil {
				if r.token, err = readTokenFile(path); err != nil {
					return remote{}, true, usagef(err)
				}
				r.tokenFrom = path
			}
		}
	}
	if r.token == "" {
		return remote{}, true, usagef(fmt.Errorf("no token for the daemon at %s: set %s to the daemon's token, or %s (or --token-file) to a copy of the token file `tai42 serve` printed at its first start", r.url, tokenEnv, tokenFileEnv))
	}
	if err := validToken(r.token); err != nil {
		return remote{}, true, usagef(fmt.Errorf("%s: %w", r.tokenFrom, err))
	}
	return r, true, nil
}

// remoteToken is the token a flag or a variable gives, and where it came
// from: --token, else --token-file, else $TAI42_TOKEN, else the file
// $TAI42_TOKEN_FILE names (an empty variable is unset); "" when none
// does. Both a token and a token file from one level is a usage error.
func (c *cli) remoteToken(f remoteFlags) (token, from string, err error) {
	envToken, _ := envValue(c.lookupEnv, tokenEnv)
	envFile, _ := envValue(c.lookupEnv, tokenFileEnv)
	for _, lvl := range []struct{ token, file, tokenName, fileName string }{
		{f.token, f.tokenFile, "--token", "--token-file"},
		{envToken, envFile, tokenEnv, tokenFileEnv},
	} {
		switch {
		case lvl.token != "" && lvl.file != "":
			return "", "", usagef(fmt.Errorf("both %s and %s are given: give one", lvl.tokenName, lvl.fileName))
		case lvl.token != "":
			return lvl.token, lvl.tokenName, nil
		case lvl.file != "":
			t, err := readTokenFile(lvl.file)
			if err != nil {
				return "", "", usagef(fmt.Errorf("%s: %w", lvl.fileName, err))
			}
			return t, lvl.file, nil
		}
	}
	return "", "", nil
}

// requireRemote is resolveRemote for a command that needs a daemon.
func (c *cli) requireRemote(f remoteFlags) (remote, error) {
	r, ok, err := c.resolveRemote(f)
	if err != nil {
		return remote{}, err
	}
	if !ok {
		return remote{}, usagef(errNoDaemon)
	}
	return r, nil
}

// normalizeURL accepts what `tai42 serve --listen` takes and prints:
// http:// and https:// URLs as they are, unix:/PATH, an absolute socket
// path (made unix:PATH), and a bare HOST:PORT (made http://HOST:PORT).
func normalizeURL(s string) (string, error) {
	switch {
	case strings.HasPrefix(s, "unix:"):
		if strings.TrimPrefix(s, "unix:") == "" {
			return "", fmt.Errorf("%q names no socket path (want unix:/PATH)", s)
		}
		return s, nil
	case strings.HasPrefix(s, "/"):
		return "unix:" + s, nil
	case !strings.Contains(s, "://"):
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("%q: the scheme must be http, https or unix", s)
	}
	if u.Host == "" {
		return "", fmt.Errorf("%q names no host", s)
	}
	return s, nil
}

// isLocalURL reports whether u is a unix socket or a loopback address: a
// daemon of this machine, to which the local token file may be sent.
func isLocalURL(u string) bool {
	if strings.HasPrefix(u, "unix:") {
		return true
	}
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	h := p.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// dial builds the client of r and records r for error messages.
func (c *cli) dial(r remote) (*client.Client, error) {
	var opts []client.Option
	if r.tlsCA != "" {
		pem, err := os.ReadFile(r.tlsCA)
		if err != nil {
			return nil, usagef(fmt.Errorf("TLS CA file: %w", err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef(fmt.Errorf("TLS CA file %s holds no PEM certificate", r.tlsCA))
		}
		opts = append(opts, client.WithTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	c.remote = &r
	return client.New(r.url, r.token, opts...), nil
}

// explain adds what a user needs to know to an error from the daemon: a
// refused token names where it came from and $TAI42_TOKEN; a daemon that
// cannot be reached names the address and where it came from. Other errors,
// and every error of a command run without a daemon, stay as they are.
func (c *cli) explain(err error) error {
	r := c.remote
	if r == nil || err == nil {
		return err
	}
	var te *api.TransportError
	if errors.As(err, &te) && te.Kind == api.KindUnauthorized {
		return fmt.Errorf("the daemon at %s refused the token from %s (%s): set %s (or --token) to the daemon's token", r.url, r.tokenFrom, te.Message, tokenEnv)
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("%w (the address is from %s: is `tai42 serve` running there?)", err, r.urlFrom)
	}
	return err
}

// daemonCall runs fn with a client of the daemon rf names, under a context
// a signal cancels, and maps fn's error to the command's exit (see
// finish). Without a daemon it is a usage error.
func (c *cli) daemonCall(rf remoteFlags, fn func(ctx context.Context, in *interruption, cl *client.Client) error) error {
	r, err := c.requireRemote(rf)
	if err != nil {
		return &exitError{code: errorExitCode(err), err: err}
	}
	cl, err := c.dial(r)
	if err != nil {
		return &exitError{code: errorExitCode(err), err: err}
	}
	defer cl.Close()
	ctx, in, stop := c.interruptible()
	defer stop()
	return c.finish(in, fn(ctx, in, cl))
}
