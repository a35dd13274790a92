package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox/internal/imagestore/imagestoretest"
)

// TestBuild: the binaries are there, stamped, and report the pinned
// version.
func TestBuild(t *testing.T) {
	if why := CanRun(); why != "" {
		t.Skip(why)
	}
	t0 := time.Now()
	bin, err := Build(context.Background(), DefaultCacheDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Build: %.1fs", time.Since(t0).Seconds())
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Error(err)
		}
	}
	out, err := exec.Command(filepath.Join(bin, "kubectl"), "version", "--client").CombinedOutput()
	if err != nil || !strings.Contains(string(out), KubernetesVersion) {
		t.Errorf("kubectl version --client: %v: %s (want %s)", err, out, KubernetesVersion)
	}
	// A second Build reuses the first.
	t1 := time.Now()
	if _, err := Build(context.Background(), DefaultCacheDir()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t1); d > 2*time.Second {
		t.Errorf("a complete build was not reused: %s", d)
	}
}

// restricted is the restricted Pod Security standard's container
// security context.
func restricted() *corev1.SecurityContext {
	f, u := false, int64(65534)
	t := true
	return &corev1.SecurityContext{
		RunAsNonRoot: &t, RunAsUser: &u, RunAsGroup: &u,
		AllowPrivilegeEscalation: &f,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func pod(name, image string, labels map[string]string, cmd ...string) *corev1.Pod {
	f := false
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "c", Image: image, Command: cmd, SecurityContext: restricted(),
				ImagePullPolicy: corev1.PullIfNotPresent,
			}},
		},
	}
}

func waitPod(t *testing.T, c *Cluster, ns, name string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	err := waitPoll(context.Background(), 90*time.Second, func(ctx context.Context) (bool, error) {
		var err error
		p, err = c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodFailed && !ok(p) {
			return false, fmt.Errorf("pod %s failed: %+v", name, p.Status)
		}
		return ok(p), nil
	})
	if err != nil {
		ev, _ := c.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		var msgs []string
		for _, e := range ev.Items {
			msgs = append(msgs, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
		}
		t.Fatalf("pod %s/%s: %v; status %+v; events: %s", ns, name, err, p.Status, strings.Join(msgs, "; "))
	}
	return p
}

func running(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func succeeded(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded }

func (c *Cluster) kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := c.KubectlCmd(context.Background(), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func logs(t *testing.T, c *Cluster, ns, name string) string {
	t.Helper()
	b, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	return string(b)
}

// TestCluster starts a cluster, uses each part of it, closes it and
// checks that nothing is left.
func TestCluster(t *testing.T) {
	if why := CanRun(); why != "" {
		t.Skip(why)
	}
	ctx := context.Background()
	// The checks that nothing is left run at the end of Close, under the
	// machine lock: once it is let go, another test binary's cluster may
	// make the same bridge, rules and record again.
	var leftovers func()
	opts := Options{Logf: t.Logf, beforeUnlock: func() {
		if leftovers != nil {
			leftovers()
		}
	}}
	if os.Getenv("TAI42_KUBETEST_NO_ENFORCER") != "" {
		opts.NoEnforcer = true
	}
	netnsBefore := runNetns()
	t0 := time.Now()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start: %.2fs (machine lock waited %.2fs; then apiserver ready %.2fs, node Ready %.2fs)",
		time.Since(t0).Seconds(), c.LockWait.Seconds(), c.APIReady.Seconds(), c.NodeReady.Seconds())
	closed := false
	state, bridge, cgroot := c.StateDir, c.opts.Bridge, c.opts.CgroupRoot
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()

	t.Run("pod runs, pulled from the registry", func(t *testing.T) {
		ns := c.NewNamespace(t)
		t1 := time.Now()
		_, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("bb", c.Busybox, nil, "sh", "-c", "echo hello from busybox; sleep 3600"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "bb", running)
		t.Logf("busybox pod Running %.2fs after create (first pull included)", time.Since(t1).Seconds())
		out, err := c.kubectl(t, "-n", ns, "exec", "bb", "--", "id", "-u")
		if err != nil || strings.TrimSpace(out) != "65534" {
			t.Errorf("kubectl exec id -u: %v: %q", err, out)
		}
		// An image a test pushes runs too.
		bb, err := imagestoretest.BusyboxImage()
		if err != nil {
			t.Fatal(err)
		}
		ref, err := c.Push("test/pushed", "v1", bb)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("pushed", ref, nil, "true"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "pushed", succeeded)
		// The agent image: its one file runs.
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("agent", c.AgentImage, nil, "/tai42", "version"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "agent", succeeded)
		if l := logs(t, c, ns, "agent"); strings.TrimSpace(l) == "" {
			t.Error("tai42 version printed nothing")
		}
	})

	t.Run("provisioner", func(t *testing.T) {
		ns := c.NewNamespace(t)
		sc := StorageClass
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "data"},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: &sc,
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
			},
		}
		if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		withVolume := func(p *corev1.Pod) *corev1.Pod {
			p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
			return p
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, withVolume(pod("writer", c.Busybox, nil, "sh", "-c", "echo persisted > /data/f")), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "writer", succeeded)
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, withVolume(pod("reader", c.Busybox, nil, "cat", "/data/f")), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "reader", succeeded)
		if l := logs(t, c, ns, "reader"); strings.TrimSpace(l) != "persisted" {
			t.Errorf("the second pod read %q, want persisted", l)
		}
		got, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pv := got.Spec.VolumeName
		dir := filepath.Join(c.StateDir, "pv", pv)
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("the volume's directory: %v", err)
		}
		// Released: the PV and its directory go (reclaim policy Delete).
		zero := int64(0)
		for _, n := range []string{"writer", "reader"} {
			_ = c.Client.CoreV1().Pods(ns).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		if err := c.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err = waitPoll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
			_, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
			_, serr := os.Stat(dir)
			return err != nil && os.IsNotExist(serr), nil
		})
		if err != nil {
			t.Errorf("PV %s or %s still there after its claim was deleted", pv, dir)
		}
	})

	t.Run("networkpolicy enforced", func(t *testing.T) {
		if !c.Enforcer {
			t.Skip("no enforcer (TAI42_KUBETEST_NO_ENFORCER)")
		}
		ns := c.NewNamespace(t)
		srv := pod("server", c.Busybox, map[string]string{"app": "server"}, "sh", "-c",
			"mkdir -p /tmp/www && echo hello > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www")
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, srv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("client", c.Busybox, nil, "sleep", "3600"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		ip := waitPod(t, c, ns, "server", running).Status.PodIP
		waitPod(t, c, ns, "client", running)
		// fetch says whether the client reached the server: reached, or
		// denied (nc failed, the exec itself did not), or neither (the
		// exec failed: an error, not a denial).
		fetch := func() (reached, denied bool, out string) {
			// nc, not wget: the static busybox's wget looks the "http"
			// service up through NSS, which crashes a static glibc.
			out, err := c.kubectl(t, "-n", ns, "exec", "client", "--", "sh", "-c",
				"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 "+ip+" 8080; echo rc=$?")
			if err != nil || !strings.Contains(out, "rc=") {
				return false, false, fmt.Sprintf("exec failed: %v: %s", err, out)
			}
			ok := strings.Contains(out, "rc=0") && strings.Contains(out, "hello")
			return ok, !strings.Contains(out, "rc=0") && !strings.Contains(out, "hello"), out
		}
		// Before any policy: reached (a moment may pass until the server listens).
		var out string
		err := waitPoll(ctx, 20*time.Second, func(context.Context) (bool, error) {
			var reached bool
			reached, _, out = fetch()
			return reached, nil
		})
		if err != nil {
			t.Fatalf("the server is not reached before any policy: %q", out)
		}
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			},
		}
		if _, err := c.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		err = waitPoll(ctx, 30*time.Second, func(context.Context) (bool, error) {
			var denied bool
			_, denied, out = fetch()
			return denied, nil
		})
		if err != nil {
			t.Fatalf("the server is not denied 30s after a deny-all policy: %q", out)
		}
		t.Logf("deny-all enforced %.2fs after the policy was created", time.Since(t1).Seconds())
		// Still denied a moment later (not a blip).
		if _, denied, out := fetch(); !denied {
			t.Errorf("not denied again under deny-all: %q", out)
		}
		if err := c.Client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, "deny-all", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err = waitPoll(ctx, 30*time.Second, func(context.Context) (bool, error) {
			var reached bool
			reached, _, out = fetch()
			return reached, nil
		})
		if err != nil {
			t.Errorf("the server is not reached again after the policy was deleted: %q", out)
		}
	})

	t.Run("pod security, garbage collector, port-forward", func(t *testing.T) {
		ns := c.NewNamespace(t)
		// The restricted standard is enforced: a root pod is refused.
		bad := pod("root", c.Busybox, nil, "true")
		bad.Spec.Containers[0].SecurityContext = nil
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "restricted") {
			t.Errorf("a pod breaking the restricted standard: %v, want refused", err)
		}
		srv := pod("web", c.Busybox, nil, "sh", "-c",
			"mkdir -p /tmp/www && echo forwarded > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www")
		p, err := c.Client.CoreV1().Pods(ns).Create(ctx, srv, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// A Secret the Pod owns goes with it (the provider's env Secret).
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "owned", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID}}}}
		if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "web", running)
		// Port-forward to the pod's loopback (the provider's transport):
		// kubectl port-forward over the apiserver, kubelet and containerd.
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cmd := c.KubectlCmd(pctx, "-n", ns, "port-forward", "pod/web", "0:8080")
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		first := make(chan string, 1)
		go func() {
			buf := make([]byte, 256)
			n, _ := stdout.Read(buf) // "Forwarding from 127.0.0.1:PORT -> 8080"
			first <- string(buf[:n])
		}()
		var said string
		select {
		case said = <-first:
		case <-time.After(30 * time.Second):
			t.Fatal("kubectl port-forward said nothing in 30s")
		}
		var local int
		if _, err := fmt.Sscanf(said, "Forwarding from 127.0.0.1:%d", &local); err != nil {
			t.Fatalf("port-forward said %q", said)
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET / HTTP/1.0\r\n\r\n")
		resp, _ := io.ReadAll(conn)
		conn.Close()
		if !strings.Contains(string(resp), "forwarded") {
			t.Errorf("through port-forward: %q", resp)
		}
		zero := int64(0)
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		err = waitPoll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
			_, err := c.Client.CoreV1().Secrets(ns).Get(ctx, "owned", metav1.GetOptions{})
			return err != nil, nil
		})
		if err != nil {
			t.Error("the Secret the deleted Pod owned is still there: no garbage collector")
		}
	})

	t.Run("pull secret", func(t *testing.T) {
		ns := c.NewNamespace(t)
		reg := c.AuthRegistry(t, map[string]string{"puller": "s3cret"})
		bb, err := imagestoretest.BusyboxImage()
		if err != nil {
			t.Fatal(err)
		}
		ref := reg.Ref("private/busybox", "1")
		reg.Push(t, ref, bb)
		// Without credentials the pull fails.
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("nosecret", ref, nil, "true"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "nosecret", func(p *corev1.Pod) bool {
			for _, s := range p.Status.ContainerStatuses {
				if w := s.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
					return true
				}
			}
			return false
		})
		auth := fmt.Sprintf(`{"auths":{%q:{"username":"puller","password":"s3cret"}}}`, reg.Host())
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "pull"},
			Type:       corev1.SecretTypeDockerConfigJson,
			Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(auth)},
		}
		if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		withSecret := pod("withsecret", ref, nil, "true")
		withSecret.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "pull"}}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, withSecret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "withsecret", succeeded)
	})

	t.Run("apiserver stopped and started", func(t *testing.T) {
		if err := c.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := c.Client.CoreV1().Namespaces().List(sctx, metav1.ListOptions{})
		cancel()
		if err == nil {
			t.Error("the apiserver answered after StopAPIServer")
		}
		if err := c.StopAPIServer(); err == nil {
			t.Error("a second StopAPIServer did not fail")
		}
		t1 := time.Now()
		if err := c.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("apiserver back in %.2fs", time.Since(t1).Seconds())
		ns := c.NewNamespace(t)
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("after", c.Busybox, nil, "true"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, ns, "after", succeeded)
	})

	t.Run("leaks", func(t *testing.T) {
		ns := c.NewNamespace(t)
		cm := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "leaked", Labels: map[string]string{LabelManaged: "tai42"}}}
		if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		left := c.Leaks(ctx)
		if len(left) != 1 || !strings.Contains(left[0], "Secret "+ns+"/leaked") {
			t.Errorf("Leaks = %q, want the one secret", left)
		}
		if err := c.Client.CoreV1().Secrets(ns).Delete(ctx, "leaked", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.AssertNoLeaks(t)
	})

	// A pod still running at Close: Close stops it too.
	ns := "default"
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("left-running", c.Busybox, nil, "sleep", "3600"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, ns, "left-running", running)
	// Its network namespace is mounted under the state directory, none
	// under /run/netns; its veth is a port of the bridge.
	if len(netnsLeft(state)) == 0 {
		t.Errorf("no pod network namespace is mounted under %s", netnsDir(state))
	}
	// Its pods' namespaces (by inode): a namespace new in /run/netns is
	// this cluster's only if it is one of them (the dev cluster beside
	// may make its own meanwhile).
	podNets := podNetns(state)
	if len(podNets) == 0 {
		t.Error("no pod network namespace found from containerd's tasks")
	}
	if n := newNetns(netnsBefore, podNets); len(n) > 0 {
		t.Errorf("pod network namespaces in /run/netns: %v", n)
	}
	ports, err := bridgePorts(bridge)
	if err != nil || len(ports) == 0 {
		t.Errorf("the bridge %s has no port while a pod runs: %v", bridge, err)
	}

	// The processes it started (the apiserver and enforcer restarted by
	// the subtests among them), the registry too.
	c.recMu.Lock()
	procs := append([]recordProc(nil), c.rec.Procs...)
	c.recMu.Unlock()
	if len(procs) < len(c.procs)+1 {
		t.Errorf("the record holds %d processes, want the %d started and the registry", len(procs), len(c.procs))
	}
	// The shims, found from containerd's records as Close finds them.
	shims, socks := shimPIDs(state, c.rec.procStart("containerd")), shimSockets(state)
	if len(shims) == 0 || len(socks) == 0 {
		t.Errorf("while a pod runs, containerd's records name shims %v, sockets %v", shims, socks)
	}
	procs = append(procs, shims...)

	// Nothing is left: no process it started, no shim, no mount, no
	// bridge, no cgroup, no chain or set, no state directory.
	checked := false
	leftovers = func() {
		checked = true
		// A zombie counts: Close waits for each process it started. A shim's
		// zombie does not: the shim is reparented (it is not the harness's
		// child), and reaping it is its new parent's business.
		shimSet := map[int]bool{}
		for _, p := range shims {
			shimSet[p.PID] = true
		}
		for _, p := range procs {
			if s, state, err := procStat(p.PID); err == nil && s == p.Start && !(shimSet[p.PID] && state == 'Z') {
				t.Errorf("%s (pid %d) is still there (state %c)", p.Name, p.PID, state)
			}
		}
		for _, s := range socks {
			if _, err := os.Stat(s); err == nil {
				t.Errorf("a shim's socket is left: %s", s)
			}
		}
		if p := procsNaming(state + "/"); len(p) > 0 {
			t.Errorf("processes naming %s left (shims?): %v", state, p)
		}
		if _, err := os.Stat(stateRecord); err == nil {
			t.Errorf("%s is left after a clean Close", stateRecord)
		}
		if m := MountsUnder(state); len(m) > 0 {
			t.Errorf("mounts left under %s: %v", state, m)
		}
		if _, err := os.Stat(state); !os.IsNotExist(err) {
			t.Errorf("the state directory %s is still there: %v", state, err)
		}
		if LinkExists(bridge) {
			t.Errorf("the bridge %s is still there", bridge)
		}
		if l := podRoutesLeft(); len(l) > 0 {
			t.Errorf("the pods' rules or routes are left: %v", l)
		}
		for _, l := range ports {
			if LinkExists(l.Attrs().Name) {
				t.Errorf("the bridge's port %s is still there", l.Attrs().Name)
			}
		}
		if n := newNetns(netnsBefore, podNets); len(n) > 0 {
			t.Errorf("network namespaces left in /run/netns: %v", n)
		}
		if l := CgroupsLeft(cgroot); len(l) > 0 {
			t.Errorf("cgroups left: %v", l)
		}
		entries, _ := os.ReadDir("/var/log/containers")
		for _, e := range entries {
			if target, err := os.Readlink(filepath.Join("/var/log/containers", e.Name())); err == nil && strings.HasPrefix(target, state+"/") {
				t.Errorf("a log link is left: /var/log/containers/%s -> %s", e.Name(), target)
			}
		}
		if l := KubeRouterLeftovers(); len(l) > 0 {
			t.Errorf("kube-router left: %v", l)
		}
	}
	t2 := time.Now()
	closed = true
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close: %.2fs", time.Since(t2).Seconds())
	if !checked {
		t.Error("Close did not run the leftover checks before letting go of the machine lock")
	}
}

// TestStartFails: a Start that fails at a step undoes every step before
// it: no process, shim, mount, bridge, cgroup, chain or file left. Failed
// at the kubelet, the cluster is half up (containerd, the control plane,
// no node); at the provisioner, the last step, all of the rest is up.
func TestStartFails(t *testing.T) {
	if why := CanRun(); why != "" {
		t.Skip(why)
	}
	// Built once for both Starts (the build is most of a Start's time).
	agent, err := BuildAgent(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"kubelet", "provisioner"} {
		t.Run(step, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			injected := fmt.Errorf("injected")
			// Nothing is left: checked at the end of the failed Start's
			// teardown, under the machine lock (once it is let go, another
			// cluster may make the same names again).
			checked := false
			leftovers := func() {
				checked = true
				for _, p := range procsNaming(state) {
					t.Errorf("still runs: %s", p)
				}
				if m := MountsUnder(state); len(m) > 0 {
					t.Errorf("mounts left: %v", m)
				}
				if left, _ := os.ReadDir(state); len(left) > 0 {
					t.Errorf("the state directory is not emptied: %d entries", len(left))
				}
				if LinkExists("tai42kt0") {
					t.Error("the bridge is left")
				}
				if l := podRoutesLeft(); len(l) > 0 {
					t.Errorf("the pods' rules or routes are left: %v", l)
				}
				if l := CgroupsLeft("/tai42-kubetest"); len(l) > 0 {
					t.Errorf("cgroups left: %v", l)
				}
				if l := KubeRouterLeftovers(); len(l) > 0 {
					t.Errorf("kube-router left: %v", l)
				}
				if _, err := os.Stat(stateRecord); err == nil {
					t.Errorf("%s is left", stateRecord)
				}
			}
			c, err := Start(context.Background(), Options{StateDir: state, AgentBinary: agent, Logf: t.Logf, beforeUnlock: leftovers, fault: func(s string) error {
				if s == step {
					return injected
				}
				return nil
			}})
			if err == nil {
				c.Close()
				t.Fatal("Start succeeded")
			}
			if !errors.Is(err, injected) || !strings.Contains(err.Error(), "("+step+")") {
				t.Errorf("the error is not the injected one naming the step: %v", err)
			}
			if !checked {
				t.Error("the failed Start's teardown did not run the leftover checks before letting go of the machine lock")
			}
		})
	}
}

// runNetns is the set of named network namespaces in /run/netns.
func runNetns() map[string]bool {
	m := map[string]bool{}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		m[e.Name()] = true
	}
	return m
}

// podNetns is the set of the network namespaces (their inodes) of the
// running tasks of the containerd whose files are in state.
func podNetns(state string) map[uint64]bool {
	m := map[uint64]bool{}
	files, _ := filepath.Glob(filepath.Join(state, "containerd/state/io.containerd.runtime.v2.task/*/*/init.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+strings.TrimSpace(string(b))+"/ns/net", &st) == nil {
			m[st.Ino] = true
		}
	}
	return m
}

// newNetns lists the entries of /run/netns not in before that are one
// of the namespaces nets.
func newNetns(before map[string]bool, nets map[uint64]bool) []string {
	var n []string
	for name := range runNetns() {
		var st unix.Stat_t
		if !before[name] && unix.Stat("/run/netns/"+name, &st) == nil && nets[st.Ino] {
			n = append(n, name)
		}
	}
	return n
}

// TestDeleteBridge: deleting the bridge deletes its ports first (a
// bridge deleted alone frees them, and they stay).
func TestDeleteBridge(t *testing.T) {
	if why := CanRun(); why != "" {
		t.Skip(why)
	}
	const br, a, b = "tai42ktt9", "tai42ktt9a", "tai42ktt9b"
	t.Cleanup(func() { _ = deleteLink(a); _ = deleteLink(br) })
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}); err != nil {
		t.Fatal(err)
	}
	bl, err := netlink.LinkByName(br)
	if err != nil {
		t.Fatal(err)
	}
	al, err := netlink.LinkByName(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMaster(al, bl); err != nil {
		t.Fatal(err)
	}
	if p, err := bridgePorts(br); err != nil || len(p) != 1 || p[0].Attrs().Name != a {
		t.Fatalf("bridgePorts = %v, %v; want [%s]", p, err, a)
	}
	if err := deleteBridge(br); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{br, a, b} {
		if LinkExists(n) {
			t.Errorf("%s is still there", n)
		}
	}
	if err := deleteBridge(br); err != nil {
		t.Errorf("deleting a bridge that is not there: %v", err)
	}
}

// procsNaming lists the processes whose command line holds needle (the
// test's check that none of a cluster's is left; it kills nothing).
func procsNaming(needle string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if e.Name() == strconv.Itoa(os.Getpid()) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(needle)) {
			out = append(out, e.Name()+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return out
}

// sleeper starts a process of the test's own (killed and reaped at the end
// of t) and returns its PID, its start time and a channel closed once it
// exited.
func sleeper(t *testing.T) (int, uint64, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid, start, exited
}

// TestKillRecorded: a recorded process is killed by its PID only while
// its start time is the recorded one (a PID reused since is another
// process's).
func TestKillRecorded(t *testing.T) {
	if why := CanRun(); why != "" {
		t.Skip(why)
	}
	pid, start, exited := sleeper(t)
	if err := killRecorded([]recordProc{{Name: "other", PID: pid, Start: start + 1}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatal("a process whose start time is not the recorded one was killed")
	case <-time.After(200 * time.Millisecond):
	}
	if err := killRecorded([]recordProc{{Name: "sleep", PID: pid, Start: start}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the recorded process was not killed")
	}
}

// TestSweepStale: a dead run's record is swept by its own names: its
// processes by PID and start time, its state directory removed when
// Start made it and emptied when it was given.
func TestSweepStale(t *testing.T) {
	if why := CanRun(); why != "" {
		t.Skip(why)
	}
	pid, start, exited := sleeper(t)
	own := filepath.Join(t.TempDir(), "kubetest-dead")
	given := filepath.Join(t.TempDir(), "given")
	for _, d := range []string{own, given} {
		if err := os.MkdirAll(filepath.Join(d, "etcd"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(record{State: own, OwnState: true, Procs: []recordProc{{Name: "registry", PID: pid, Start: start}}})
	r, ok := parseRecord(b)
	if !ok {
		t.Fatalf("parseRecord(%s) not ok", b)
	}
	if err := sweepStale(r); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Error("the dead run's process was not killed")
	}
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Errorf("the state directory Start made is still there: %v", err)
	}
	// An older harness's record: the path alone; a given directory is
	// emptied and kept.
	r, ok = parseRecord([]byte(given + "\n"))
	if !ok || r.State != given || r.OwnState {
		t.Fatalf("parseRecord(legacy) = %+v, %v", r, ok)
	}
	if err := sweepStale(r); err != nil {
		t.Fatal(err)
	}
	if e, err := os.ReadDir(given); err != nil || len(e) != 0 {
		t.Errorf("the given state directory: %v, %d entries left", err, len(e))
	}
}

// TestKubeRouterSet: kube-router's sets, its restore's temporary ones
// among them (a kube-router killed mid-restore leaves them), and no
// other's.
func TestKubeRouterSet(t *testing.T) {
	for name, want := range map[string]bool{
		"KUBE-SRC-ABCDEF":       true,
		"KUBE-DST-ABCDEF":       true,
		"TMP-AAAAAAAAAAAAAAAA":  true, // "TMP-" and base32 of 10 bytes
		"TMP-ABCDEFGHIJKLMN27":  true,
		"TMP-mine":              false,
		"TMP-AAAAAAAAAAAAAAAAA": false,
		"cali40all-hosts":       false,
	} {
		if got := kubeRouterSet(name); got != want {
			t.Errorf("kubeRouterSet(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestProcStat: this process's parent and start time read from
// /proc/self/stat's fields after the command.
func TestProcStat(t *testing.T) {
	if got := ppid(os.Getpid()); got != os.Getppid() {
		t.Errorf("ppid(self) = %d, want %d", got, os.Getppid())
	}
	pid, start, _ := sleeper(t)
	if s, state, err := procStat(pid); err != nil || s != start || state == 'Z' {
		t.Errorf("procStat(%d) = %d %c %v, want start %d, not a zombie", pid, s, state, err, start)
	}
}
