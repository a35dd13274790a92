package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/provider/container"
)

// resolveServe parses args as the flags of "tai42 serve" and resolves the
// configuration with env as the environment.
func resolveServe(t *testing.T, env map[string]string, args ...string) (serveConfig, error) {
	t.Helper()
	var f serveFlags
	fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	addServeFlags(fl, &f)
	if err := fl.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return resolveServeConfig(fl, &f, lookupFrom(env))
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tai42.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestExampleConfigLoads(t *testing.T) {
	cfg, err := resolveServe(t, nil, "--config", filepath.Join("example", "tai42.toml"))
	if err != nil {
		t.Fatal(err)
	}
	// The example holds the defaults, but the state directory.
	def, err := resolveServe(t, map[string]string{stateDirEnv: "/var/lib/tai42"})
	if err != nil {
		t.Fatal(err)
	}
	def.configFile = cfg.configFile
	if !reflect.DeepEqual(cfg, def) {
		t.Errorf("example config:\n %+v\nwant the defaults:\n %+v", cfg, def)
	}
	want := serveConfig{
		configFile: filepath.Join("example", "tai42.toml"), listen: "127.0.0.1:4242", stateDir: "/var/lib/tai42", provider: "host", runtime: "runc",
		execTimeout: time.Minute, reapInterval: 30 * time.Second, shutdownGrace: 10 * time.Second,
		maxBodyBytes: 1 << 30, maxOutputBytes: 64 << 20, mcpResultBytes: 64 << 10,
		policy:   sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true},
		logLevel: slog.LevelInfo, logFormat: "json",
		disk:        diskConfig{mb: 10240, reserveMB: 1024, resolved: true},
		poolRefills: 1,
		images:      imageConfig{pull: container.PullMissing, maxSize: 20 << 30, maxInodes: 1 << 20},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("example config:\n %+v\nwant\n %+v", cfg, want)
	}
}

func TestConfigUnknownKey(t *testing.T) {
	path := writeConfig(t, "listen = \"127.0.0.1:1\"\nfrobnicate = 1\n[policy]\negres = \"none\"\n[extra]\nx = 1\n")
	_, err := resolveServe(t, nil, "--config", path)
	if err == nil {
		t.Fatal("want an error")
	}
	for _, s := range []string{path, "frobnicate", "policy.egres", "extra"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		file string
		env  map[string]string
		args []string
		msg  []string
	}{
		"int duration":      {file: "exec_default_timeout = 5\n", msg: []string{"exec_default_timeout"}},
		"bad duration":      {file: "[limits]\nshutdown_grace = \"soon\"\n", msg: []string{"limits.shutdown_grace", "soon"}},
		"string bool":       {file: "[policy]\ndurable = \"yes\"\n", msg: []string{"durable"}},
		"bad toml":          {file: "listen = \n", msg: []string{"tai42.toml"}},
		"bad env duration":  {env: map[string]string{"TAI42_REAP_INTERVAL": "often"}, msg: []string{"TAI42_REAP_INTERVAL", "often"}},
		"bad env bool":      {env: map[string]string{"TAI42_POLICY_DURABLE": "maybe"}, msg: []string{"TAI42_POLICY_DURABLE"}},
		"zero timeout":      {args: []string{"--exec-timeout", "0s"}, msg: []string{"exec timeout"}},
		"negative grace":    {file: "[limits]\nshutdown_grace = \"-1s\"\n", msg: []string{"shutdown grace"}},
		"zero body":         {file: "[limits]\nmax_body_bytes = 0\n", msg: []string{"max body bytes"}},
		"key without cert":  {file: "[tls]\nkey = \"k.pem\"\n", msg: []string{"--tls-cert"}},
		"bad format":        {env: map[string]string{"TAI42_LOG_FORMAT": "xml"}, msg: []string{"xml"}},
		"bad level":         {args: []string{"--log-level", "info+2"}, msg: []string{"info+2"}},
		"bad policy":        {file: "[policy]\negress = \"wide\"\n", msg: []string{"wide"}},
		"empty unix socket": {args: []string{"--listen", "unix:"}, msg: []string{"unix:"}},
		"bad token":         {env: map[string]string{tokenEnv: "has space-secret"}, msg: []string{"TAI42_TOKEN"}},
		"no state dir":      {env: map[string]string{}, msg: []string{"state directory"}},
		"bad cidr":          {args: []string{"--egress-allow", "10.0.0.0/33"}, msg: []string{"--egress-allow", "10.0.0.0/33"}},
		"host bits":         {file: "[egress]\ndeny = [\"10.1.2.3/8\"]\n", msg: []string{"--egress-deny", "10.1.2.3/8", "10.0.0.0/8"}},
		"mapped prefix":     {args: []string{"--egress-deny", "::ffff:10.0.0.0/104"}, msg: []string{"IPv4-mapped"}},
		"bad domain":        {env: map[string]string{"TAI42_EGRESS_ALLOW_DOMAIN": "ok.test,bad..test"}, msg: []string{"--egress-allow-domain", "bad..test"}},
		"wildcard inside":   {args: []string{"--egress-allow-domain", "a.*.test"}, msg: []string{"a.*.test"}},
		"bad resolver":      {args: []string{"--egress-dns", "resolver.test"}, msg: []string{"--egress-dns", "resolver.test"}},
		"comma in file":     {file: "[egress]\nallow = [\"10.0.0.0/8,11.0.0.0/8\"]\n", msg: []string{"egress.allow", "comma"}},
		"negative disk":     {args: []string{"--disk-mb", "-1"}, msg: []string{"--disk-mb"}},
		"inodes, no cap":    {args: []string{"--disk-mb", "0", "--disk-inodes", "5"}, msg: []string{"--disk-inodes"}},
		"bad pull":          {args: []string{"--pull", "sometimes"}, msg: []string{"--pull", "sometimes", "missing, always, never"}},
		"bad pull in file":  {file: "[images]\npull = \"Always\"\n", msg: []string{"--pull", "Always", "missing, always, never"}},
		"bad size":          {env: map[string]string{"TAI42_MAX_IMAGE_SIZE": "big"}, msg: []string{"--max-image-size", "big"}},
		"zero size":         {file: "[images]\nmax_size = 0\n", msg: []string{"--max-image-size", "> 0"}},
		"bool size":         {file: "[images]\nmax_size = true\n", msg: []string{"max_size"}},
		"zero inodes":       {file: "[images]\nmax_inodes = 0\n", msg: []string{"--max-image-inodes", "> 0"}},
		"bad mirror":        {file: "[registry]\nmirrors = [\"ftp://m.test\"]\n", msg: []string{"--registry-mirror", "ftp://m.test", "http or https"}},
		"mirror password":   {args: []string{"--registry-mirror", "https://u:secret@m.test"}, msg: []string{"--registry-mirror", "docker config"}},
		"bad insecure":      {env: map[string]string{"TAI42_INSECURE_REGISTRY": "h.test/path"}, msg: []string{"--insecure-registry", "h.test/path"}},
		"bad registries":    {file: "[registry]\nallowed = [\"r.test/x\"]\n", msg: []string{"--registries", "r.test/x"}},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{stateDirEnv: "/state"}
			if tc.env != nil {
				env = tc.env
				if _, ok := env[stateDirEnv]; !ok && name != "no state dir" {
					env[stateDirEnv] = "/state"
				}
			}
			args := tc.args
			if tc.file != "" {
				args = append(args, "--config", writeConfig(t, tc.file))
			}
			_, err := resolveServe(t, env, args...)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

func TestConfigPrecedence(t *testing.T) {
	file := writeConfig(t, `listen = "file:1"
state_dir = "rel/state"
token_file = "/abs/token"
exec_default_timeout = "5s"
log_format = "text"
[policy]
durable = false
[limits]
max_body_bytes = 1000
`)
	dir := filepath.Dir(file)
	env := map[string]string{
		configEnv:              file,
		"TAI42_LISTEN":         "env:2",
		"TAI42_EXEC_TIMEOUT":   "7s",
		"TAI42_POLICY_DURABLE": "true",
		"TAI42_MAX_BODY_BYTES": "2000",
		"TAI42_LOG_LEVEL":      "", // empty: unset
		"XDG_STATE_HOME":       "/xdg",
	}
	flags := []string{"--listen", "flag:3", "--exec-timeout", "9s", "--policy-durable=false", "--max-body-bytes", "3000"}

	// Flags win over everything.
	cfg, err := resolveServe(t, env, flags...)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != "flag:3" || cfg.execTimeout != 9*time.Second || cfg.policy.Durable || cfg.maxBodyBytes != 3000 {
		t.Errorf("flags: %+v", cfg)
	}
	// The environment wins over the file.
	if cfg, err = resolveServe(t, env); err != nil {
		t.Fatal(err)
	}
	if cfg.listen != "env:2" || cfg.execTimeout != 7*time.Second || !cfg.policy.Durable || cfg.maxBodyBytes != 2000 {
		t.Errorf("env: %+v", cfg)
	}
	// The file wins over the defaults; its relative paths are its directory's.
	if cfg.stateDir != filepath.Join(dir, "rel/state") || cfg.tokenFile != "/abs/token" || cfg.logFormat != "text" || cfg.configFile != file {
		t.Errorf("file: %+v", cfg)
	}
	// The defaults are last, and the state directory's own defaults after
	// the file.
	if cfg.logLevel != slog.LevelInfo || cfg.reapInterval != 30*time.Second || cfg.provider != "host" {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg, err = resolveServe(t, map[string]string{"XDG_STATE_HOME": "/xdg"}); err != nil || cfg.stateDir != "/xdg/tai42" || cfg.listen != defaultListen {
		t.Errorf("no file: %+v, %v", cfg, err)
	}
	// TAI42_STATE_DIR wins over the file's state_dir, --state-dir over both.
	env[stateDirEnv] = "/from/env"
	if cfg, _ = resolveServe(t, env); cfg.stateDir != "/from/env" {
		t.Errorf("TAI42_STATE_DIR: %q", cfg.stateDir)
	}
	if cfg, _ = resolveServe(t, env, "--state-dir", "/from/flag"); cfg.stateDir != "/from/flag" {
		t.Errorf("--state-dir: %q", cfg.stateDir)
	}
	// --config wins over TAI42_CONFIG.
	other := writeConfig(t, "listen = \"other:4\"\n")
	delete(env, "TAI42_LISTEN")
	if cfg, _ = resolveServe(t, env, "--config", other); cfg.listen != "other:4" {
		t.Errorf("--config: %q", cfg.listen)
	}
	// The token: --token, then TAI42_TOKEN; never from the file.
	if cfg, _ = resolveServe(t, map[string]string{tokenEnv: "env-token", stateDirEnv: "/s"}, "--token", "flag-token"); cfg.token != "flag-token" {
		t.Errorf("--token: %q", cfg.token)
	}
	if cfg, _ = resolveServe(t, map[string]string{tokenEnv: "env-token", stateDirEnv: "/s"}); cfg.token != "env-token" {
		t.Errorf("TAI42_TOKEN: %q", cfg.token)
	}
	if _, err := resolveServe(t, map[string]string{stateDirEnv: "/s"}, "--config", writeConfig(t, "token = \"x\"\n")); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("a token key in the file: %v", err)
	}
	// The token and the token file are one setting: the higher source wins.
	tf := writeConfig(t, "token_file = \"/file/token\"\n")
	for _, tc := range []struct {
		env       map[string]string
		args      []string
		token, tf string
		bad       bool
	}{
		{map[string]string{tokenEnv: "env-token"}, []string{"--token-file", "/flag/token"}, "", "/flag/token", false},
		{map[string]string{"TAI42_TOKEN_FILE": "/env/token"}, []string{"--token", "flag-token"}, "flag-token", "", false},
		{map[string]string{tokenEnv: "env-token", configEnv: tf}, nil, "env-token", "", false},
		{map[string]string{configEnv: tf}, nil, "", "/file/token", false},
		{nil, []string{"--token", "t", "--token-file", "/f"}, "", "", true},
		{map[string]string{tokenEnv: "t", "TAI42_TOKEN_FILE": "/f"}, nil, "", "", true},
	} {
		env := map[string]string{stateDirEnv: "/s"}
		for k, v := range tc.env {
			env[k] = v
		}
		cfg, err := resolveServe(t, env, tc.args...)
		if tc.bad != (err != nil) || cfg.token != tc.token || cfg.tokenFile != tc.tf {
			t.Errorf("env %v args %v: token %q file %q, %v", tc.env, tc.args, cfg.token, cfg.tokenFile, err)
		}
	}
}

func TestTokenFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := serveConfig{stateDir: filepath.Join(dir, "state")}
	// Generated at first: 0600, hex, in a new 0700 directory.
	tok, gen, wrote, err := serveToken(cfg)
	if err != nil || !wrote || gen != filepath.Join(cfg.stateDir, tokenFileName) || len(tok) != 64 {
		t.Fatalf("first: %d chars, %q (written %v), %v", len(tok), gen, wrote, err)
	}
	for path, mode := range map[string]os.FileMode{gen: 0o600, cfg.stateDir: 0o700} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want mode %o", path, fi.Mode(), err, mode)
		}
	}
	// Reused after.
	again, from, wrote2, err := serveToken(cfg)
	if err != nil || again != tok || wrote2 || from != gen {
		t.Errorf("second: same %v, from %q (written %v), %v; want it read from %s", again == tok, from, wrote2, err, gen)
	}
	// The flag or variable wins; a token file named must exist.
	if got, from, _, _ := serveToken(serveConfig{stateDir: cfg.stateDir, token: "given"}); got != "given" || !strings.Contains(from, tokenEnv) {
		t.Errorf("given token: %q from %q", got, from)
	}
	if _, _, _, err := serveToken(serveConfig{stateDir: cfg.stateDir, tokenFile: filepath.Join(dir, "none")}); err == nil {
		t.Error("missing token file: no error")
	}
	// Open to group or others: refused, saying how to fix it.
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620} {
		if err := os.Chmod(gen, mode); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := serveToken(cfg)
		if err == nil || !strings.Contains(err.Error(), "chmod 600") || strings.Contains(err.Error(), tok) || errorExitCode(err) != exitUsage {
			t.Errorf("mode %o: %v", mode, err)
		}
	}
	// An empty or malformed token file is refused too.
	bad := filepath.Join(dir, "bad")
	for _, content := range []string{"", "\n", "two words\n"} {
		if err := os.WriteFile(bad, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readTokenFile(bad); err == nil {
			t.Errorf("token file %q: no error", content)
		}
	}
}

func TestConfigEgressAndDisk(t *testing.T) {
	path := writeConfig(t, `[egress]
allow = ["10.20.0.0/16", "192.0.2.7"]
deny = ["2001:db8::/32"]
allow_domains = ["pypi.org", "*.pythonhosted.org"]
dns = ["10.0.0.2", "[2001:db8::53]:5353"]
[disk]
mb = 512
inodes = 4096
reserve_mb = 64
`)
	cfg, err := resolveServe(t, map[string]string{stateDirEnv: "/state"}, "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	want := egressConfig{
		allow:   []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("192.0.2.7/32")},
		deny:    []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")},
		domains: []string{"pypi.org", "*.pythonhosted.org"},
		dns:     []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:53"), netip.MustParseAddrPort("[2001:db8::53]:5353")},
	}
	if !reflect.DeepEqual(cfg.egress, want) {
		t.Errorf("egress from the file: %+v, want %+v", cfg.egress, want)
	}
	if d := (diskConfig{mb: 512, inodes: 4096, reserveMB: 64, explicit: true, resolved: true}); cfg.disk != d {
		t.Errorf("disk from the file: %+v, want %+v", cfg.disk, d)
	}
	// A flag replaces the file's list rather than adding to it, as for
	// every other setting.
	cfg, err = resolveServe(t, map[string]string{stateDirEnv: "/state"}, "--config", path, "--egress-deny", "198.51.100.0/24", "--egress-deny", "203.0.113.0/24")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cfg.egress.deny); got != "[198.51.100.0/24 203.0.113.0/24]" {
		t.Errorf("--egress-deny twice over the file's: %s", got)
	}
	// The defaults: no fence of the operator's, the cap on at 10 GiB but
	// not given.
	cfg, err = resolveServe(t, map[string]string{stateDirEnv: "/state"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.egress.given() || cfg.disk != (diskConfig{mb: defaultDiskMB, reserveMB: defaultDiskReserveMB, resolved: true}) {
		t.Errorf("defaults: egress %+v, disk %+v", cfg.egress, cfg.disk)
	}
}

// TestImageSettings: the image settings of serve, run and image pull
// resolve flag > variable > config file > default, and reach the container
// provider's options.
func TestImageSettings(t *testing.T) {
	file := writeConfig(t, "[images]\npull = \"never\"\nmax_size = \"1GiB\"\nmax_inodes = 5000\n[registry]\nmirrors = [\"mirror.test:5000\", \"https://m2.test/v2\"]\ninsecure = [\"127.0.0.1:5000\"]\nallowed = [\"docker.io\"]\n")
	intFile := writeConfig(t, "[images]\nmax_size = 1048576\n")
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want imageConfig
	}{
		"defaults": {want: imageConfig{pull: container.PullMissing, maxSize: 20 << 30, maxInodes: 1 << 20}},
		"file": {env: map[string]string{configEnv: file}, want: imageConfig{pull: container.PullNever, maxSize: 1 << 30, maxInodes: 5000,
			registry: imagestore.RegistryOptions{Mirrors: []string{"mirror.test:5000", "https://m2.test/v2"}, Insecure: []string{"127.0.0.1:5000"}, Registries: []string{"docker.io"}},
			given:    []string{"--pull", "--max-image-size", "--max-image-inodes", "--registry-mirror", "--insecure-registry", "--registries"}}},
		"bytes in the file": {env: map[string]string{configEnv: intFile}, want: imageConfig{pull: container.PullMissing, maxSize: 1 << 20, maxInodes: 1 << 20, given: []string{"--max-image-size"}}},
		"env over file": {env: map[string]string{configEnv: file, "TAI42_PULL": "always", "TAI42_INSECURE_REGISTRY": "a.test,b.test:443", "TAI42_MAX_IMAGE_INODES": "7000", "TAI42_REGISTRIES": "r.test:5000,docker.io"},
			want: imageConfig{pull: container.PullAlways, maxSize: 1 << 30, maxInodes: 7000,
				registry: imagestore.RegistryOptions{Mirrors: []string{"mirror.test:5000", "https://m2.test/v2"}, Insecure: []string{"a.test", "b.test:443"}, Registries: []string{"r.test:5000", "docker.io"}},
				given:    []string{"--pull", "--max-image-size", "--max-image-inodes", "--registry-mirror", "--insecure-registry", "--registries"}}},
		"flag over env": {env: map[string]string{configEnv: file, "TAI42_PULL": "always", "TAI42_MAX_IMAGE_SIZE": "2GB"},
			args: []string{"--pull", "missing", "--registry-mirror", "m3.test", "--registry-mirror", "m4.test", "--max-image-size", "500MB", "--max-image-inodes", "9000", "--registries", "r2.test"},
			want: imageConfig{pull: container.PullMissing, maxSize: 500_000_000, maxInodes: 9000,
				registry: imagestore.RegistryOptions{Mirrors: []string{"m3.test", "m4.test"}, Insecure: []string{"127.0.0.1:5000"}, Registries: []string{"r2.test"}},
				given:    []string{"--pull", "--max-image-size", "--max-image-inodes", "--registry-mirror", "--insecure-registry", "--registries"}}},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{stateDirEnv: "/state"}
			for k, v := range tc.env {
				env[k] = v
			}
			// serve: --config or $TAI42_CONFIG.
			cfg, err := resolveServe(t, env, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.images, tc.want) {
				t.Errorf("serve: %+v, want %+v", cfg.images, tc.want)
			}
			opts := providerConfig{images: cfg.images}.containerOptions(nil)
			if opts.Pull != tc.want.pull || opts.MaxImageSize != tc.want.maxSize || opts.MaxImageInodes != tc.want.maxInodes || !reflect.DeepEqual(opts.Registry, tc.want.registry) {
				t.Errorf("container.Options: Pull %q, MaxImageSize %d, MaxImageInodes %d, Registry %+v; want %+v", opts.Pull, opts.MaxImageSize, opts.MaxImageInodes, opts.Registry, tc.want)
			}
			// run and image pull: $TAI42_CONFIG.
			var f imageFlags
			fl := pflag.NewFlagSet("run", pflag.ContinueOnError)
			addImageFlags(fl, &f)
			if err := fl.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := resolveImageSettings(fl, &f, lookupFrom(env))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("run: %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestRunImageFlags: run's image flags are usage errors when bad, refused
// with a daemon, and said to have no effect on the host runner.
func TestRunImageFlags(t *testing.T) {
	dir := t.TempDir()
	r := runCLI(t, nil, nil, "run", "--state-dir", dir, "--pull", "sometimes", "--", "true")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, `--pull "sometimes" is not one of missing, always, never`) {
		t.Errorf("run --pull sometimes: %q", r.stderr)
	}
	r = runCLI(t, nil, map[string]string{configEnv: writeConfig(t, "[registry]\ninsecure = [\"bad/host\"]\n")}, "run", "--state-dir", dir, "--", "true")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "bad/host") || !strings.Contains(r.stderr, configEnv) && !strings.Contains(r.stderr, "--insecure-registry") {
		t.Errorf("run with a bad insecure registry in $TAI42_CONFIG: %q", r.stderr)
	}
	r = runCLI(t, nil, nil, "run", "--state-dir", dir, "--provider", "host", "--pull", "always", "--", "true")
	r.want(t, exitOK)
	if !strings.Contains(r.stderr, "warning: the host runner pulls no images") || !strings.Contains(r.stderr, "--pull have no effect") {
		t.Errorf("run --provider host --pull always: %q", r.stderr)
	}
	// From the config file, for the container provider: no warning.
	r = runCLI(t, nil, map[string]string{configEnv: writeConfig(t, "[images]\npull = \"always\"\n")}, "run", "--state-dir", dir, "--provider", "host", "--", "true")
	r.want(t, exitOK)
	if r.stderr != "" {
		t.Errorf("run with the config's pull policy on the host runner: %q", r.stderr)
	}
	d := startDaemon(t)
	r = d.cli(t, nil, "run", "--insecure-registry", "127.0.0.1:5000", "--", "true")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--insecure-registry does not apply to a daemon") {
		t.Errorf("run --insecure-registry on a daemon: %q", r.stderr)
	}
}
