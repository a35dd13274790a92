package registrytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"
)

// The token flow's names, as the registry's config and the JWTs carry
// them.
const (
	tokenService = "registrytest"
	tokenIssuer  = "registrytest-issuer"
)

// tokenServer is the token flow's authorization server (docker's token
// authentication, spec/auth/token.md of the registry's documentation):
// GET /token?service=S&scope=repository:NAME:ACTIONS with basic auth
// answers {"token": JWT} for a known user, 401 for anyone else.
//
// The JWT is ES256, signed by a key of the server's own whose
// self-signed certificate is the registry's rootcertbundle; the
// certificate rides in the header's x5c, which distribution 2.8 checks
// against that bundle (token.go, VerifySigningKey). The standard
// library writes it: a JWS of one header, one claim set and an ECDSA
// signature is a few lines, where a JWT library would add a dependency
// to the module for a test harness alone.
type tokenServer struct {
	srv     *httptest.Server
	url     string
	key     *ecdsa.PrivateKey
	certDER []byte
	certPEM []byte
	users   map[string]string
}

func startTokenServer(opts Options, serverCert tls.Certificate) (*tokenServer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "registrytest token signer"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ts := &tokenServer{key: key, certDER: der, users: opts.Users,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ts.srv = httptest.NewUnstartedServer(http.HandlerFunc(ts.serve))
	ts.srv.Listener.Close()
	ts.srv.Listener = l
	if opts.TLS {
		ts.srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}
		ts.srv.StartTLS()
	} else {
		ts.srv.Start()
	}
	// The realm names the server by "localhost": go-containerregistry
	// refuses a realm at a loopback or private IP literal unless it is
	// the registry's own host:port, and the token server has a port of its
	// own.
	ts.url = strings.Replace(ts.srv.URL, "127.0.0.1", "localhost", 1)
	return ts, nil
}

func (ts *tokenServer) close() { ts.srv.Close() }

func (ts *tokenServer) serve(w http.ResponseWriter, req *http.Request) {
	user, pass, ok := req.BasicAuth()
	want, known := ts.users[user]
	if !ok || !known || subtle.ConstantTimeCompare([]byte(pass), []byte(want)) != 1 {
		w.Header().Set("WWW-Authenticate", `Basic realm="registrytest token"`)
		http.Error(w, `{"details":"incorrect username or password"}`, http.StatusUnauthorized)
		return
	}
	q := req.URL.Query()
	if q.Get("service") != tokenService {
		http.Error(w, `{"details":"unknown service"}`, http.StatusBadRequest)
		return
	}
	var access []resourceActions
	for _, scope := range q["scope"] {
		if a, ok := parseScope(scope); ok {
			access = append(access, a)
		}
	}
	tok, err := ts.sign(user, access)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"token": tok, "access_token": tok, "expires_in": 300,
		"issued_at": time.Now().UTC().Format(time.RFC3339),
	})
}

// resourceActions is a claim's grant, as distribution's token package
// reads it.
type resourceActions struct {
	Type    string   `json:"type"`
	Name    string   `json:"name"`
	Actions []string `json:"actions"`
}

// parseScope parses "repository:NAME:pull,push" (NAME may hold ':' for
// a port, so the actions are after the last one).
func parseScope(s string) (resourceActions, bool) {
	typ, rest, ok := strings.Cut(s, ":")
	i := strings.LastIndex(rest, ":")
	if !ok || i < 0 {
		return resourceActions{}, false
	}
	return resourceActions{Type: typ, Name: rest[:i], Actions: strings.Split(rest[i+1:], ",")}, true
}

// sign makes the JWT granting access to user.
func (ts *tokenServer) sign(user string, access []resourceActions) (string, error) {
	now := time.Now()
	header, err := json.Marshal(map[string]any{
		"typ": "JWT", "alg": "ES256",
		"x5c": []string{base64.StdEncoding.EncodeToString(ts.certDER)},
	})
	if err != nil {
		return "", err
	}
	claims, err := json.Marshal(map[string]any{
		"iss": tokenIssuer, "sub": user, "aud": tokenService,
		"exp": now.Add(5 * time.Minute).Unix(), "nbf": now.Add(-time.Minute).Unix(),
		"iat": now.Unix(), "jti": randomID(), "access": access,
	})
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, ts.key, sum[:])
	if err != nil {
		return "", err
	}
	// JWS ES256: the signature is r and s, 32 bytes each, big-endian.
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signing + "." + enc.EncodeToString(sig), nil
}

func randomID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
