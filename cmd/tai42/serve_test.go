package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serving is an in-process "tai42 serve" with a signal channel.
type serving struct {
	sigs   chan os.Signal
	stderr *syncBuffer
	done   chan int
	addr   string // from the "listening on" line
}

var listeningRE = regexp.MustCompile(`(?m)^tai42: listening on (\S+) \(provider (\S+)\)$`)

// startServe runs "tai42 serve ARGS..." in-process with env and waits for
// its listening line (or its exit).
func startServe(t *testing.T, env map[string]string, args ...string) *serving {
	t.Helper()
	s := &serving{sigs: make(chan os.Signal, 1), stderr: &syncBuffer{}, done: make(chan int, 1)}
	c := &cli{stdout: &syncBuffer{}, stderr: s.stderr, lookupEnv: lookupFrom(env), signals: s.sigs}
	go func() { s.done <- c.main(append([]string{"serve"}, args...)) }()
	deadline := time.After(20 * time.Second)
	for {
		if m := listeningRE.FindStringSubmatch(s.stderr.String()); m != nil {
			s.addr = m[1]
			if m[2] != "host" {
				t.Errorf("listening line names provider %q", m[2])
			}
			break
		}
		select {
		case code := <-s.done:
			s.done <- code
			return s
		case <-deadline:
			t.Fatalf("serve did not start; stderr:\n%s", s.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Cleanup(func() {
		select {
		case s.sigs <- syscall.SIGTERM:
		default:
		}
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop")
		}
	})
	return s
}

// stop sends sig and returns the exit code.
func (s *serving) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	s.sigs <- sig
	select {
	case code := <-s.done:
		s.done <- code // for the cleanup
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop after %v", sig)
	}
	return -1
}

// exited returns serve's exit code once it has exited on its own.
func (s *serving) exited(t *testing.T) int {
	t.Helper()
	select {
	case code := <-s.done:
		s.done <- code
		return code
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not exit; stderr:\n%s", s.stderr.String())
	}
	return -1
}

func TestServeTokenAndShutdown(t *testing.T) {
	state := t.TempDir()
	tokenPath := filepath.Join(state, tokenFileName)

	// First start: the token is generated, 0600, and its path printed.
	s := startServe(t, nil, "--listen", "127.0.0.1:0", "--state-dir", state, "--log-level", "debug")
	if s.addr == "" {
		t.Fatalf("serve exited; stderr:\n%s", s.stderr.String())
	}
	if !strings.Contains(s.stderr.String(), "tai42: token written to "+tokenPath+"\n") {
		t.Errorf("no token line on stderr:\n%s", s.stderr.String())
	}
	fi, err := os.Stat(tokenPath)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, %v", fi, err)
	}
	token, err := readTokenFile(tokenPath)
	if err != nil || len(token) != 2*tokenBytes {
		t.Fatalf("token %d chars, %v", len(token), err)
	}
	// A second daemon on the same state directory is refused.
	s2 := startServe(t, nil, "--listen", "127.0.0.1:0", "--state-dir", state)
	if code := s2.exited(t); code != 1 || !strings.Contains(s2.stderr.String(), "in use by another tai42 serve") {
		t.Errorf("second daemon: exit %d, stderr %q", code, s2.stderr.String())
	}

	// The bare HOST:PORT of the listening line is a TAI42_URL; the token is
	// found in the state directory.
	env := map[string]string{urlEnv: s.addr, stateDirEnv: state}
	eph := strings.TrimSpace(runCLI(t, nil, env, "create").stdout)
	per := strings.TrimSpace(runCLI(t, nil, env, "create", "--persistent", "keep").stdout)
	runCLI(t, strings.NewReader("data\n"), env, "cp", "-", per+":f.txt").want(t, 0)
	runCLI(t, strings.NewReader("data\n"), env, "cp", "-", eph+":f.txt").want(t, 0)
	if _, err := os.Stat(filepath.Join(state, "host", "sessions", eph)); err != nil {
		t.Fatalf("ephemeral workspace: %v", err)
	}
	logs := s.stderr.String()
	if strings.Contains(logs, token) {
		t.Errorf("the token is in the logs:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"serving"`) {
		t.Errorf("no JSON log line:\n%s", logs)
	}

	// SIGTERM: exit 0, sessions destroyed, the persistent workspace kept.
	if code := s.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d after SIGTERM; stderr:\n%s", code, s.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(state, "host", "sessions", eph)); !os.IsNotExist(err) {
		t.Errorf("ephemeral workspace after shutdown: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(state, "host", "workspaces", "keep", "f.txt")); err != nil || string(b) != "data\n" {
		t.Errorf("persistent workspace after shutdown: %q, %v", b, err)
	}

	// Second start: the token is reused, no token line.
	s = startServe(t, nil, "--listen", "127.0.0.1:0", "--state-dir", state, "--log-format", "text")
	if strings.Contains(s.stderr.String(), "token written") {
		t.Errorf("token written again:\n%s", s.stderr.String())
	}
	if again, _ := readTokenFile(tokenPath); again != token {
		t.Error("the token changed at the second start")
	}
	r := runCLI(t, nil, map[string]string{urlEnv: "http://" + s.addr, tokenEnv: token}, "ls", "--json")
	r.want(t, 0)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("sessions survived the restart: %s", r.stdout)
	}
	if code := s.stop(t, syscall.SIGINT); code != 0 {
		t.Errorf("exit %d after SIGINT", code)
	}

	// A token file group or others can read is refused.
	if err := os.Chmod(tokenPath, 0o644); err != nil {
		t.Fatal(err)
	}
	s = startServe(t, nil, "--listen", "127.0.0.1:0", "--state-dir", state)
	if code := s.exited(t); code != 2 || !strings.Contains(s.stderr.String(), "chmod 600") || strings.Contains(s.stderr.String(), token) {
		t.Errorf("0644 token file: exit %d, stderr %q", code, s.stderr.String())
	}
	// ... and so is it for a client reading it.
	r = runCLI(t, nil, map[string]string{urlEnv: "127.0.0.1:9", stateDirEnv: state}, "ls")
	if r.code != 2 || !strings.Contains(r.stderr, "chmod 600") {
		t.Errorf("client with a 0644 token file: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestServeUnixSocketTokenFromEnv(t *testing.T) {
	state := t.TempDir()
	sock := filepath.Join(t.TempDir(), "tai42.sock")
	s := startServe(t, map[string]string{tokenEnv: testToken, "TAI42_LISTEN": "unix:" + sock, stateDirEnv: state})
	if s.addr != "unix:"+sock {
		t.Fatalf("listening on %q, want unix:%s; stderr:\n%s", s.addr, sock, s.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(state, tokenFileName)); !os.IsNotExist(err) {
		t.Errorf("a token file was written though TAI42_TOKEN was set: %v", err)
	}
	for _, u := range []string{"unix:" + sock, sock} {
		r := runCLI(t, nil, map[string]string{urlEnv: u, tokenEnv: testToken}, "run", "--", "echo", "over unix")
		r.want(t, 0)
		if r.stdout != "over unix\n" {
			t.Errorf("TAI42_URL=%s: %q", u, r.stdout)
		}
	}
	if code := s.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
}

func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	cert, key, ca := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem")
	for path, b := range map[string][]byte{cert: certPEM, key: keyPEM, ca: certPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := startServe(t, map[string]string{tokenEnv: testToken}, "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(s.addr, "https://") {
		t.Fatalf("with TLS the listening line names %q; want an https:// URL, usable as $TAI42_URL as printed", s.addr)
	}
	r := runCLI(t, nil, map[string]string{urlEnv: s.addr, tokenEnv: testToken, tlsCAEnv: ca}, "run", "--", "echo", "tls")
	r.want(t, 0)
	if r.stdout != "tls\n" {
		t.Errorf("run over TLS: %q", r.stdout)
	}
}

func TestServeStartErrors(t *testing.T) {
	state := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for name, tc := range map[string]struct {
		args []string
		code int
		msg  string
	}{
		"address in use":     {[]string{"--listen", busy.Addr().String()}, 1, "address already in use"},
		"malformed address":  {[]string{"--listen", "bogus"}, 2, "bogus"},
		"floor above host":   {[]string{"--policy-isolation", "container", "--listen", "127.0.0.1:0"}, 2, "isolation floor"},
		"unknown provider":   {[]string{"--provider", "docker", "--listen", "127.0.0.1:0"}, 2, `"docker" is registered (registered: host, container, kubernetes)`},
		"kube, no agent":     {[]string{"--provider", "kubernetes", "--listen", "127.0.0.1:0"}, 2, "--agent-image REF"},
		"kube with fences":   {[]string{"--provider", "kubernetes", "--agent-image", "reg.test/agent:1", "--egress-deny", "203.0.113.0/24", "--listen", "127.0.0.1:0"}, 2, "NetworkPolicy of its own"},
		"kube, inode cap":    {[]string{"--provider", "kubernetes", "--agent-image", "reg.test/agent:1", "--disk-inodes", "1000", "--listen", "127.0.0.1:0"}, 2, "--disk-inodes needs --provider container"},
		"kube, bad user":     {[]string{"--provider", "kubernetes", "--agent-image", "reg.test/agent:1", "--pod-user", "0:0"}, 2, "--pod-user"},
		"cert without key":   {[]string{"--tls-cert", "c.pem"}, 2, "--tls-key"},
		"bad cert":           {[]string{"--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"}, 2, "TLS"},
		"bad level":          {[]string{"--log-level", "loud"}, 2, "log level"},
		"bad policy":         {[]string{"--policy-isolation", "strong"}, 2, "strong"},
		"args":               {[]string{"extra"}, 2, "extra"},
		"missing config":     {[]string{"--config", "/nonexistent/tai42.toml"}, 2, "/nonexistent/tai42.toml"},
		"missing token file": {[]string{"--token-file", "/nonexistent/token", "--listen", "127.0.0.1:0"}, 1, "/nonexistent/token"},
		"host with fences":   {[]string{"--egress-deny", "203.0.113.0/24", "--listen", "127.0.0.1:0"}, 2, "cannot fence egress"},
		"host with a cap":    {[]string{"--disk-mb", "100", "--listen", "127.0.0.1:0"}, 2, "cannot cap a session's disk"},
		"bad fence":          {[]string{"--egress-allow", "10.1.2.3/8"}, 2, "10.1.2.3/8"},
		"bad domain":         {[]string{"--egress-allow-domain", "*"}, 2, `"*"`},
		"host with a pool":   {[]string{"--pool", "host:none=2", "--listen", "127.0.0.1:0"}, 2, "provider host cannot keep sessions ready ahead"},
		"bad pool":           {[]string{"--pool", "host=2"}, 2, "IMAGE:NETWORK=N"},
		"bad pool size":      {[]string{"--pool", "host:none=0"}, 2, "≥ 1"},
		"pool refills":       {[]string{"--pool", "host:none=1", "--pool-refills", "0"}, 2, "--pool-refills"},
	} {
		s := startServe(t, map[string]string{tokenEnv: testToken}, append([]string{"--state-dir", state}, tc.args...)...)
		code := s.exited(t)
		if code != tc.code || !strings.Contains(s.stderr.String(), tc.msg) {
			t.Errorf("%s: exit %d, stderr %q; want %d with %q", name, code, s.stderr.String(), tc.code, tc.msg)
		}
	}
}

// selfSigned returns a PEM certificate for 127.0.0.1 and its PEM key.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tai42 test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pemCert(der), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// pemCert encodes a DER certificate as PEM.
func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestServeHostSaysNoFences: the host runner, which neither fences egress
// nor caps disks, says so at every start and in GET /v1/policy, and still
// serves plain egress.
func TestServeHostSaysNoFences(t *testing.T) {
	s := startServe(t, map[string]string{tokenEnv: testToken}, "--listen", "127.0.0.1:0", "--state-dir", t.TempDir())
	if s.addr == "" {
		t.Fatalf("serve exited; stderr:\n%s", s.stderr.String())
	}
	defer s.stop(t, syscall.SIGTERM)
	for _, want := range []string{"the host runner does not fence egress", "the host runner does not cap a session's disk"} {
		if !strings.Contains(s.stderr.String(), want) {
			t.Errorf("no %q at start:\n%s", want, s.stderr.String())
		}
	}
	pol := getPolicy(t, s.addr)
	if pol.EgressFences == nil || pol.EgressFences.Enforced || pol.Disk == nil || pol.Disk.Enforced {
		t.Errorf("GET /v1/policy of the host runner: fences %+v, disk %+v; want both there, not enforced", pol.EgressFences, pol.Disk)
	}
	env := map[string]string{urlEnv: s.addr, tokenEnv: testToken}
	id := strings.TrimSpace(runCLI(t, nil, env, "create", "--network", "egress").stdout)
	runCLI(t, nil, env, "exec", id, "--", "true").want(t, 0)
}

// TestServeReload: SIGHUP reloads rather than stops the daemon; a
// configuration that no longer resolves, or fences the host runner cannot
// keep, are refused in the log and change nothing.
func TestServeReload(t *testing.T) {
	conf := writeConfig(t, "log_format = \"text\"\n")
	s := startServe(t, map[string]string{tokenEnv: testToken}, "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--config", conf)
	if s.addr == "" {
		t.Fatalf("serve exited; stderr:\n%s", s.stderr.String())
	}
	hup := func(file, wantLog string) {
		t.Helper()
		if err := os.WriteFile(conf, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		s.sigs <- syscall.SIGHUP
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(s.stderr.String(), wantLog) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log after SIGHUP:\n%s", wantLog, s.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		select {
		case code := <-s.done:
			t.Fatalf("serve exited %d on SIGHUP", code)
		default:
		}
	}
	hup("[egress]\ndeny = [\"10.1.2.3/8\"]\n", "10.1.2.3/8")
	hup("[egress]\ndeny = [\"203.0.113.0/24\"]\n", "the host runner cannot fence egress")
	env := map[string]string{urlEnv: s.addr, tokenEnv: testToken}
	runCLI(t, nil, env, "ls").want(t, 0)
	if code := s.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
}
