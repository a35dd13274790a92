package main

import (
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/kubernetes"
)

// TestKubeSettings: each kubernetes setting is a flag, a variable and a
// config key, in that order of precedence, the same for serve and run; a
// relative kubeconfig in the file is the file's directory's, and with none
// given the provider's own default is left to it ($KUBECONFIG is
// client-go's, read by the provider, not by the CLI).
func TestKubeSettings(t *testing.T) {
	file := writeConfig(t, `provider = "kubernetes"
[kubernetes]
kubeconfig = "kube/admin.conf"
namespace = "from-file"
agent_image = "reg.test:5000/agent:file"
pod_user = "1000:1000"
runtime_class = "kata"
image_pull_secrets = ["one", "two"]
storage_class = "local-path"
create_timeout = "45s"
network_probe_image = "reg.test:5000/busybox:1"
trust_network_policy = true
workspace_size = "5Gi"
`)
	dir := filepath.Dir(file)
	all := []string{"--kubeconfig", "--namespace", "--agent-image", "--pod-user", "--runtime-class", "--image-pull-secret", "--storage-class", "--create-timeout",
		"--network-probe-image", "--trust-network-policy", "--workspace-size"}
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want kubeConfig
	}{
		"defaults":    {want: kubeConfig{}},
		"$KUBECONFIG": {env: map[string]string{"KUBECONFIG": "/home/u/.kube/config"}, want: kubeConfig{}},
		"file": {env: map[string]string{configEnv: file}, want: kubeConfig{
			kubeconfig: filepath.Join(dir, "kube/admin.conf"), namespace: "from-file",
			agentImage: "reg.test:5000/agent:file", podUser: "1000:1000", runtimeClass: "kata", pullSecrets: []string{"one", "two"},
			storageClass: "local-path", createTimeout: 45 * time.Second,
			probeImage: "reg.test:5000/busybox:1", trustNetwork: true, workspaceSize: "5Gi", given: all}},
		"env over file": {env: map[string]string{configEnv: file, "TAI42_NAMESPACE": "from-env", "TAI42_IMAGE_PULL_SECRET": "a,b,c",
			"TAI42_CREATE_TIMEOUT": "1m", "TAI42_AGENT_IMAGE": "reg.test:5000/agent@sha256:" + strings.Repeat("a", 64), "TAI42_KUBECONFIG": "/env/kubeconfig"},
			want: kubeConfig{kubeconfig: "/env/kubeconfig", namespace: "from-env",
				agentImage: "reg.test:5000/agent@sha256:" + strings.Repeat("a", 64), podUser: "1000:1000", runtimeClass: "kata",
				pullSecrets: []string{"a", "b", "c"}, storageClass: "local-path", createTimeout: time.Minute,
				probeImage: "reg.test:5000/busybox:1", trustNetwork: true, workspaceSize: "5Gi", given: all}},
		"flag over env": {env: map[string]string{configEnv: file, "TAI42_NAMESPACE": "from-env", "TAI42_POD_USER": "2000:2000"},
			args: []string{"--namespace", "from-flag", "--image-pull-secret", "x", "--image-pull-secret", "y", "--kubeconfig", "/flag/kc", "--storage-class", "fast"},
			want: kubeConfig{kubeconfig: "/flag/kc", namespace: "from-flag",
				agentImage: "reg.test:5000/agent:file", podUser: "2000:2000", runtimeClass: "kata",
				pullSecrets: []string{"x", "y"}, storageClass: "fast", createTimeout: 45 * time.Second,
				probeImage: "reg.test:5000/busybox:1", trustNetwork: true, workspaceSize: "5Gi", given: all}},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{stateDirEnv: "/state"}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg, err := resolveServe(t, env, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.kube, tc.want) {
				t.Errorf("serve:\n %+v\nwant\n %+v", cfg.kube, tc.want)
			}
			// run: $TAI42_CONFIG, the same settings.
			var f kubeFlags
			fl := pflag.NewFlagSet("run", pflag.ContinueOnError)
			addKubeFlags(fl, &f)
			if err := fl.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := resolveKubeSettings(fl, &f, lookupFrom(env))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("run:\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}

// TestKubeOptions: the resolved settings are the provider's options, the
// kit's from the daemon's settings, and no ledger of the state
// directory's (the apiserver is the kubernetes provider's ledger).
func TestKubeOptions(t *testing.T) {
	cfg, err := resolveServe(t, map[string]string{stateDirEnv: "/state"}, "--provider", "kubernetes",
		"--kubeconfig", "/kc", "--namespace", "ns", "--agent-image", "reg.test/agent:1", "--pod-user", "1001:1002",
		"--runtime-class", "gvisor", "--image-pull-secret", "regcred", "--storage-class", "sc", "--create-timeout", "30s",
		"--network-probe-image", "reg.test/busybox:1", "--trust-network-policy", "--workspace-size", "2Gi",
		"--exec-timeout", "5s", "--reap-interval", "2s", "--disk-mb", "2048")
	if err != nil {
		t.Fatal(err)
	}
	o, err := providerConfig{policy: cfg.policy, reapInterval: cfg.reapInterval, execTimeout: cfg.execTimeout, maxOutputBytes: cfg.maxOutputBytes,
		kube: cfg.kube, disk: cfg.disk, durable: true, stateDir: "/state"}.kubernetesOptions()
	if err != nil {
		t.Fatal(err)
	}
	want := kubernetes.Options{Kubeconfig: "/kc", Namespace: "ns", AgentImage: "reg.test/agent:1", PodUser: "1001:1002",
		RuntimeClass: "gvisor", ImagePullSecrets: []string{"regcred"}, StorageClass: "sc", CreateTimeout: 30 * time.Second,
		NetworkProbeImage: "reg.test/busybox:1", TrustNetworkPolicy: true, WorkspaceSize: "2Gi", DiskMB: 2048}
	want.Policy, want.ReapInterval, want.ExecDefaultTimeout = cfg.policy, 2*time.Second, 5*time.Second
	want.ProviderOptions = kit.ProviderOptions{StateDir: "/state", MaxOutputBytes: defaultMaxOutputBytes}
	if !reflect.DeepEqual(o, want) {
		t.Errorf("kubernetes.Options:\n %+v\nwant\n %+v", o, want)
	}
	// --disk-mb 0 is no cap, as on the container provider.
	off, err := resolveServe(t, map[string]string{stateDirEnv: "/state"}, "--provider", "kubernetes", "--agent-image", "reg.test/agent:1", "--disk-mb", "0")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := (providerConfig{kube: off.kube, disk: off.disk}).kubernetesOptions(); err != nil || !o.DiskOff {
		t.Errorf("--disk-mb 0: DiskOff %v (%v); want true", o.DiskOff, err)
	}
	if _, err := (providerConfig{}).kubernetesOptions(); err == nil || !strings.Contains(err.Error(), "--agent-image") || errorExitCode(err) != exitUsage {
		t.Errorf("options without an agent image: %v (exit %d); want a usage error naming --agent-image", err, errorExitCode(err))
	}
}

func TestKubeSettingsErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		file string
		env  map[string]string
		args []string
		msg  []string
	}{
		"no agent image":     {args: []string{"--provider", "kubernetes"}, msg: []string{"--agent-image REF", "tai42 agent-image push REF", "TAI42_AGENT_IMAGE"}},
		"no agent, by file":  {file: "provider = \"kubernetes\"\n", msg: []string{"--agent-image REF"}},
		"bad agent image":    {args: []string{"--agent-image", "Reg/UPPER:tag"}, msg: []string{"--agent-image", "Reg/UPPER:tag"}},
		"bad namespace":      {args: []string{"--namespace", "Not_A_Name"}, msg: []string{"--namespace", "Not_A_Name"}},
		"bad namespace, env": {env: map[string]string{"TAI42_NAMESPACE": "a.b"}, msg: []string{"--namespace", "a.b"}},
		"pod user no gid":    {args: []string{"--pod-user", "1000"}, msg: []string{"--pod-user", "UID:GID"}},
		"pod user root":      {file: "[kubernetes]\npod_user = \"0:1000\"\n", msg: []string{"--pod-user", "root"}},
		"pod user words":     {args: []string{"--pod-user", "nobody:nogroup"}, msg: []string{"--pod-user", "UID"}},
		"pod user negative":  {args: []string{"--pod-user", "1000:-1"}, msg: []string{"--pod-user", "GID"}},
		"bad runtime class":  {args: []string{"--runtime-class", "Kata Fast"}, msg: []string{"--runtime-class", "Kata Fast"}},
		"bad storage class":  {env: map[string]string{"TAI42_STORAGE_CLASS": "_x"}, msg: []string{"--storage-class", "_x"}},
		"bad pull secret":    {args: []string{"--image-pull-secret", "ok", "--image-pull-secret", "not ok"}, msg: []string{"--image-pull-secret", "not ok"}},
		"comma in secrets":   {file: "[kubernetes]\nimage_pull_secrets = [\"a,b\"]\n", msg: []string{"kubernetes.image_pull_secrets", "comma"}},
		"negative timeout":   {args: []string{"--create-timeout", "-1s"}, msg: []string{"--create-timeout"}},
		"bad probe image":    {args: []string{"--network-probe-image", "Busy Box"}, msg: []string{"--network-probe-image", "Busy Box"}},
		"bad workspace size": {env: map[string]string{"TAI42_WORKSPACE_SIZE": "lots"}, msg: []string{"--workspace-size", "lots"}},
		"zero workspace":     {args: []string{"--workspace-size", "0"}, msg: []string{"--workspace-size", "positive"}},
		"bool trust":         {file: "[kubernetes]\ntrust_network_policy = \"maybe\"\n", msg: []string{"trust_network_policy"}},
		"int timeout":        {file: "[kubernetes]\ncreate_timeout = 5\n", msg: []string{"create_timeout"}},
		"unknown key":        {file: "[kubernetes]\nnamespaces = \"x\"\n", msg: []string{"kubernetes.namespaces", "[kubernetes] kubeconfig"}},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{stateDirEnv: "/state"}
			for k, v := range tc.env {
				env[k] = v
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
		})
	}
}

// TestRunKubeFlags: run's kubernetes flags are usage errors when bad or
// when the agent image is missing, are refused with a daemon, and have
// no effect on another provider.
func TestRunKubeFlags(t *testing.T) {
	dir := t.TempDir()
	r := runCLI(t, nil, nil, "run", "--state-dir", dir, "--provider", "kubernetes", "--image", "busybox", "--", "true")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--agent-image REF") || !strings.Contains(r.stderr, "tai42 agent-image push") {
		t.Errorf("run --provider kubernetes without an agent image: %q", r.stderr)
	}
	r = runCLI(t, nil, map[string]string{"TAI42_POD_USER": "0:0"}, "run", "--state-dir", dir, "--", "true")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--pod-user") {
		t.Errorf("run with $TAI42_POD_USER root: %q", r.stderr)
	}
	r = runCLI(t, nil, nil, "run", "--state-dir", dir, "--provider", "host", "--namespace", "ns", "--", "true")
	r.want(t, exitOK)
	d := startDaemon(t)
	for _, args := range [][]string{{"--namespace", "ns"}, {"--agent-image", "reg.test/a:1"}, {"--kubeconfig", "/kc"}} {
		r = d.cli(t, nil, append(append([]string{"run"}, args...), "--", "true")...)
		r.want(t, exitUsage)
		if !strings.Contains(r.stderr, args[0]+" does not apply to a daemon") {
			t.Errorf("run %v on a daemon: %q", args, r.stderr)
		}
	}
}

// TestServeKubeSettingsElsewhere: kubernetes settings given to another
// provider are said to have no effect, naming them, and the daemon
// serves.
func TestServeKubeSettingsElsewhere(t *testing.T) {
	s := startServe(t, map[string]string{tokenEnv: testToken, "TAI42_NAMESPACE": "ns"}, "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(),
		"--agent-image", "reg.test/agent:1")
	if s.addr == "" {
		t.Fatalf("serve exited; stderr:\n%s", s.stderr.String())
	}
	defer s.stop(t, syscall.SIGTERM)
	out := s.stderr.String()
	if !strings.Contains(out, "the kubernetes settings have no effect on provider host") || !strings.Contains(out, "--namespace, --agent-image") {
		t.Errorf("no warning naming the kubernetes settings:\n%s", out)
	}
}
