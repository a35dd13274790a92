// Package registrytest runs a real registry for tests, as httptest runs
// an HTTP server: Debian's docker-registry (distribution 2.8,
// /usr/bin/docker-registry) on 127.0.0.1 at a free port, its storage
// under the test's temporary directory, stopped (SIGTERM, then SIGKILL)
// at the test's end. It serves plain HTTP, or TLS with a certificate of
// a CA made for it; open, or with basic auth (htpasswd) or the token flow
// (a token server of the harness's own signs the JWTs the registry
// checks).
//
// The blobs the registry served are counted from its own log (one JSON
// line per request), and its storage is edited on disk to make it serve
// a wrong blob or none: the tests see a real registry's answers, not a
// stand-in's.
//
// Start skips the test, saying why, where the registry cannot run (no
// docker-registry, or htpasswd missing for Users).
package registrytest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Binary is Debian's distribution registry (apt-get install docker-registry).
const Binary = "/usr/bin/docker-registry"

// Options choose how the registry is reached.
type Options struct {
	// TLS serves HTTPS with a certificate for 127.0.0.1 signed by a CA
	// made for this registry (see Registry.CAPEM); else plain HTTP.
	TLS bool
	// Users, when not empty, are the only accounts (name -> password):
	// with Token false the registry checks them itself (htpasswd, bcrypt),
	// with Token true the token server does.
	Users map[string]string
	// Token puts the registry behind the token flow: it answers 401 with
	// a Bearer challenge naming the harness's token server, which checks
	// Users' credentials (basic auth) and signs a JWT granting the
	// requested scopes.
	Token bool
}

// Registry is a running registry.
type Registry struct {
	opts   Options
	dir    string // the registry's own files: config, storage, log
	host   string // 127.0.0.1:PORT
	caPEM  []byte
	cert   tls.Certificate // the server's, shared by the token server and fronts
	log    string          // the registry's log file
	cmd    *exec.Cmd
	exited chan struct{}
	token  *tokenServer
}

// Start runs a registry for t, stopped at t's end.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Skipf("the real registry is not installed (%s: apt-get install -y docker-registry)", Binary)
	}
	if len(opts.Users) > 0 && !opts.Token {
		if _, err := exec.LookPath("htpasswd"); err != nil {
			t.Skip("htpasswd is not installed (apt-get install -y apache2-utils): the registry's basic auth needs its bcrypt file")
		}
	}
	r, err := Run(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// Run runs a registry with its files under dir (which must exist), for a
// caller that has no testing.TB (a TestMain, a command): Close stops it.
// Unlike Start it does not skip: a missing docker-registry is an error.
func Run(dir string, opts Options) (*Registry, error) {
	r := &Registry{opts: opts, dir: dir}
	r.log = filepath.Join(r.dir, "registry.log")
	if opts.TLS || opts.Token {
		ca, err := newCA()
		if err != nil {
			return nil, err
		}
		r.caPEM = ca.certPEM
		if r.cert, err = ca.serverCert(); err != nil {
			return nil, err
		}
	}
	if opts.Token {
		ts, err := startTokenServer(opts, r.cert)
		if err != nil {
			return nil, err
		}
		r.token = ts
	}
	// A free port is chosen by binding it and letting it go: another
	// process may take it meanwhile, so a registry that cannot listen is
	// started again on another one.
	var err error
	for range 3 {
		if err = r.start(); err == nil {
			return r, nil
		}
	}
	if r.token != nil {
		r.token.close()
	}
	return nil, fmt.Errorf("starting the registry: %w", err)
}

// Close stops the registry (and its token server).
func (r *Registry) Close() error {
	err := r.stop()
	if r.token != nil {
		r.token.close()
	}
	return err
}

// start runs the registry on a free port and waits until /v2/ answers.
func (r *Registry) start() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	r.host = fmt.Sprintf("127.0.0.1:%d", port)
	cfg, err := r.writeConfig()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(r.log, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(Binary, "serve", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"} // no REGISTRY_* of the caller's
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s serve: %w", Binary, err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(r.exited) }()
	if err := r.waitReady(); err != nil {
		return errors.Join(fmt.Errorf("%w; its log:\n%s", err, r.tailLog()), r.stop())
	}
	return nil
}

// waitReady waits until the registry answers /v2/ (200, or 401 behind
// auth), or exits.
func (r *Registry) waitReady() error {
	c := &http.Client{Transport: r.Transport(), Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-r.exited:
			return fmt.Errorf("the registry exited: %s", r.cmd.ProcessState)
		default:
		}
		resp, err := c.Get(r.URL() + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the registry at %s did not answer /v2/ within 15s", r.host)
}

// stop ends the registry by its PID: SIGTERM, then SIGKILL after 5s, and
// reports whether it exited.
func (r *Registry) stop() error {
	select {
	case <-r.exited:
		return nil
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
		return nil
	case <-time.After(5 * time.Second):
	}
	_ = r.cmd.Process.Kill()
	select {
	case <-r.exited:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("the registry (pid %d) did not exit after SIGKILL", r.cmd.Process.Pid)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeConfig writes the registry's config (the format of
// /etc/docker/registry/config.yml; JSON is YAML) and the files it names.
func (r *Registry) writeConfig() (string, error) {
	httpCfg := map[string]any{
		"addr": r.host,
		// A fixed secret: the registry warns without one.
		"secret": "registrytest",
	}
	if r.opts.TLS {
		cert, key, err := writeKeyPair(r.dir, "server", r.cert)
		if err != nil {
			return "", err
		}
		httpCfg["tls"] = map[string]any{"certificate": cert, "key": key}
	}
	cfg := map[string]any{
		"version": "0.1",
		// JSON lines, one per request ("response completed"), which
		// BlobGETs counts; the Apache-style access log is not wanted.
		"log": map[string]any{"level": "info", "formatter": "json", "accesslog": map[string]any{"disabled": true}},
		// No blob descriptor cache: a blob edited on disk is what the
		// registry serves next.
		"storage": map[string]any{
			"filesystem":  map[string]any{"rootdirectory": r.storage()},
			"delete":      map[string]any{"enabled": true},
			"maintenance": map[string]any{"uploadpurging": map[string]any{"enabled": false}},
		},
		"http": httpCfg,
	}
	switch {
	case r.opts.Token:
		bundle := filepath.Join(r.dir, "token-signer.pem")
		if err := os.WriteFile(bundle, r.token.certPEM, 0o600); err != nil {
			return "", err
		}
		cfg["auth"] = map[string]any{"token": map[string]any{
			"realm":          r.token.url + "/token",
			"service":        tokenService,
			"issuer":         tokenIssuer,
			"rootcertbundle": bundle,
		}}
	case len(r.opts.Users) > 0:
		file, err := writeHtpasswd(r.dir, r.opts.Users)
		if err != nil {
			return "", err
		}
		cfg["auth"] = map[string]any{"htpasswd": map[string]any{"realm": "registrytest", "path": file}}
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(r.dir, "config.yml")
	return path, os.WriteFile(path, b, 0o600)
}

// writeHtpasswd writes users as an htpasswd file of bcrypt hashes, made
// by apache2-utils' htpasswd (the password on its stdin, never in argv).
func writeHtpasswd(dir string, users map[string]string) (string, error) {
	var out bytes.Buffer
	names := make([]string, 0, len(users))
	for u := range users {
		names = append(names, u)
	}
	slices.Sort(names)
	for _, u := range names {
		cmd := exec.Command("htpasswd", "-niB", u)
		cmd.Stdin = strings.NewReader(users[u] + "\n")
		b, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("htpasswd for %s: %w", u, err)
		}
		out.Write(bytes.TrimSpace(b))
		out.WriteByte('\n')
	}
	path := filepath.Join(dir, "htpasswd")
	return path, os.WriteFile(path, out.Bytes(), 0o600)
}

// storage is the registry's storage root.
func (r *Registry) storage() string { return filepath.Join(r.dir, "storage") }

// Host is "127.0.0.1:PORT", the registry part of its references.
func (r *Registry) Host() string { return r.host }

// URL is the registry's base URL, http:// or https://.
func (r *Registry) URL() string {
	if r.opts.TLS {
		return "https://" + r.host
	}
	return "http://" + r.host
}

// TokenHost is the token server's "localhost:PORT" (Options.Token),
// for a test to list it as insecure beside Host when it serves plain
// HTTP; "" without Token.
func (r *Registry) TokenHost() string {
	if r.token == nil {
		return ""
	}
	return strings.TrimPrefix(strings.TrimPrefix(r.token.url, "http://"), "https://")
}

// Ref is the reference HOST/repo:tag.
func (r *Registry) Ref(repo, tag string) string { return r.host + "/" + repo + ":" + tag }

// CAPEM is the PEM of the CA that signed the registry's (and the token
// server's) certificate; nil without TLS or Token.
func (r *Registry) CAPEM() []byte { return slices.Clone(r.caPEM) }

// Transport is an HTTP transport that trusts the registry's CA (and only
// it), for a client to reach it.
func (r *Registry) Transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if r.caPEM != nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(r.caPEM)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return tr
}

// Keychain gives user's credentials (its password from Options.Users)
// for this registry, and anonymous for every other.
func (r *Registry) Keychain(user string) authn.Keychain {
	return keychain{host: r.host, auth: &authn.Basic{Username: user, Password: r.opts.Users[user]}}
}

// KeychainFor gives these credentials for this registry.
func (r *Registry) KeychainFor(user, password string) authn.Keychain {
	return keychain{host: r.host, auth: &authn.Basic{Username: user, Password: password}}
}

type keychain struct {
	host string
	auth authn.Authenticator
}

func (k keychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if res.RegistryStr() == k.host {
		return k.auth, nil
	}
	return authn.Anonymous, nil
}

// remoteOptions are go-containerregistry's options to write to the
// registry as the first of Options.Users (by name), over Transport.
func (r *Registry) remoteOptions() []remote.Option {
	opts := []remote.Option{remote.WithTransport(r.Transport())}
	if len(r.opts.Users) > 0 {
		names := make([]string, 0, len(r.opts.Users))
		for u := range r.opts.Users {
			names = append(names, u)
		}
		slices.Sort(names)
		opts = append(opts, remote.WithAuthFromKeychain(r.Keychain(names[0])))
	}
	return opts
}

// parseRef parses a reference of this registry, plain HTTP allowed.
func (r *Registry) parseRef(ref string) (name.Reference, error) {
	var nopts []name.Option
	if !r.opts.TLS {
		nopts = append(nopts, name.Insecure)
	}
	return name.ParseReference(ref, nopts...)
}

// Push writes img to the registry under ref (HOST/repo:tag) with
// go-containerregistry's remote.Write, as the first user by name.
func (r *Registry) Push(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	if err := r.PushImage(ref, img); err != nil {
		t.Fatal(err)
	}
}

// PushImage is Push for a caller without a testing.TB.
func (r *Registry) PushImage(ref string, img v1.Image) error {
	nr, err := r.parseRef(ref)
	if err != nil {
		return err
	}
	if err := remote.Write(nr, img, r.remoteOptions()...); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	return nil
}

// PushIndex writes the image index idx (and its images) under ref.
func (r *Registry) PushIndex(t testing.TB, ref string, idx v1.ImageIndex) {
	t.Helper()
	nr, err := r.parseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(nr, idx, r.remoteOptions()...); err != nil {
		t.Fatalf("pushing the index %s: %v", ref, err)
	}
}

// logLine is what BlobGETs reads of a line of the registry's log.
type logLine struct {
	Msg    string `json:"msg"`
	Method string `json:"http.request.method"`
	URI    string `json:"http.request.uri"`
	Status int    `json:"http.response.status"`
}

// BlobGETs is how many times the registry served blob digest (a GET
// answered 200 or 206), read from its own log.
func (r *Registry) BlobGETs(t testing.TB, digest v1.Hash) int {
	t.Helper()
	r.syncLog(t)
	f, err := os.Open(r.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	suffix := "/blobs/" + digest.String()
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || !strings.HasPrefix(l.Msg, "response completed") {
			continue
		}
		if l.Method == http.MethodGet && strings.HasSuffix(l.URI, suffix) && (l.Status == http.StatusOK || l.Status == http.StatusPartialContent) {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// syncLog waits until the registry has logged the requests answered so
// far: it logs a request after its response is sent, so a client may see
// a response before its line is written. A request of a path of its own
// is sent and its line waited for.
func (r *Registry) syncLog(t testing.TB) {
	t.Helper()
	marker := fmt.Sprintf("/v2/registrytest-sync-%x/tags/list", time.Now().UnixNano())
	c := &http.Client{Transport: r.Transport(), Timeout: 5 * time.Second}
	resp, err := c.Get(r.URL() + marker)
	if err != nil {
		t.Fatalf("the registry's log: %v", err)
	}
	resp.Body.Close()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(r.log); err == nil && bytes.Contains(b, []byte(marker)) {
			// Lines of requests answered before it are written by now,
			// but a handler may log a moment after the next one's.
			time.Sleep(20 * time.Millisecond)
			return
		}
	}
	t.Fatalf("the registry did not log the request %s within 5s", marker)
}

// blobData is the file the registry serves blob digest from.
func (r *Registry) blobData(digest v1.Hash) string {
	return filepath.Join(r.storage(), "docker/registry/v2/blobs", digest.Algorithm, digest.Hex[:2], digest.Hex, "data")
}

// CorruptBlob flips bytes in the middle of blob digest on the registry's
// disk, keeping its size: the registry goes on serving it under its
// digest, with content that no longer matches.
func (r *Registry) CorruptBlob(t testing.TB, digest v1.Hash) {
	t.Helper()
	path := r.blobData(digest)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("corrupting blob %s: %v", digest, err)
	}
	for i := len(b) / 2; i < len(b) && i < len(b)/2+16; i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// DeleteBlob removes blob digest from the registry's disk: a manifest
// naming it now points at a blob the registry does not have.
func (r *Registry) DeleteBlob(t testing.TB, digest v1.Hash) {
	t.Helper()
	if err := os.RemoveAll(filepath.Dir(r.blobData(digest))); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(r.blobData(digest))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("blob %s is still on the registry's disk: %v", digest, err)
	}
}

// tailLog is the end of the registry's log, for an error.
func (r *Registry) tailLog() string {
	b, _ := os.ReadFile(r.log)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
