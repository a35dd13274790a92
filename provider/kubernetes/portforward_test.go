package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The tunnel's tests run against the package's harness cluster
// (kubetest), each in a namespace of its own: the agent from the
// harness's agent image installed by an init container into its busybox
// image, as the provider does.

const testAgentPort = 7421

// pfCluster is the cluster to test on and the test's namespace.
type pfCluster struct {
	kc        *kubetest.Cluster
	cfg       *rest.Config
	cs        *kubernetes.Clientset
	ns        string
	agentImg  string
	sessImg   string
	closeIdle func()
}

func newPFCluster(tb testing.TB) *pfCluster {
	tb.Helper()
	kc := kubetest.Require(tb)
	cfg := kc.RESTConfig()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		tb.Fatal(err)
	}
	c := &pfCluster{kc: kc, cfg: cfg, cs: cs, ns: newNamespace(tb, kc), agentImg: kc.AgentImage, sessImg: kc.Busybox,
		closeIdle: hc.CloseIdleConnections}
	tb.Cleanup(c.closeIdle)
	return c
}

func pfRandName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// agentPod creates a Pod like a session's (the agent installed by an init
// container, serving on loopback; restricted security) and waits until its
// agent answers a ping through a tunnel, which it returns. The Pod is
// deleted at cleanup.
func (c *pfCluster) agentPod(tb testing.TB) (string, *tunnel) {
	tb.Helper()
	name := pfRandName("pf-")
	f, tr, u := false, true, int64(65532)
	zero := int64(0)
	sc := &corev1.SecurityContext{
		AllowPrivilegeEscalation: &f, RunAsNonRoot: &tr, RunAsUser: &u, RunAsGroup: &u,
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "tai42-test"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			SecurityContext:               &corev1.PodSecurityContext{FSGroup: &u},
			InitContainers: []corev1.Container{{
				Name: "agent", Image: c.agentImg, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"/tai42", "agent", "install", "/.tai42/tai42"},
				VolumeMounts:    []corev1.VolumeMount{{Name: "agent", MountPath: "/.tai42"}},
				SecurityContext: sc,
			}},
			Containers: []corev1.Container{{
				Name: "session", Image: c.sessImg, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"/.tai42/tai42", "agent", "--listen", fmt.Sprintf("127.0.0.1:%d", testAgentPort)},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "agent", MountPath: "/.tai42", ReadOnly: true},
					{Name: "workspace", MountPath: "/workspace"},
				},
				SecurityContext: sc,
			}},
			Volumes: []corev1.Volume{
				{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pods := c.cs.CoreV1().Pods(c.ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create pod: %v", err)
	}
	tb.Cleanup(func() { c.deletePod(tb, name) })
	for {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			tb.Fatalf("pod %s: %v", name, err)
		}
		if p.Status.Phase == corev1.PodRunning {
			break
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			tb.Fatalf("pod %s ended: %+v", name, p.Status)
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("pod %s not running within 90 s: %+v", name, p.Status)
		case <-time.After(100 * time.Millisecond):
		}
	}
	tun := newTunnel(c.cfg, c.ns, name, testAgentPort)
	tb.Cleanup(func() { tun.Close() })
	cl := &agent.Client{Dial: tun.Dial}
	for {
		err := cl.Ping(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			tb.Fatalf("the agent of pod %s does not answer: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return name, tun
}

func (c *pfCluster) deletePod(tb testing.TB, name string) {
	zero := int64(0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pods := c.cs.CoreV1().Pods(c.ns)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		tb.Errorf("delete pod %s: %v", name, err)
		return
	}
	for {
		if _, err := pods.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			tb.Errorf("pod %s still there 60 s after its delete", name)
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var pfEnv = []string{"PATH=/bin:/usr/bin"}

// run runs argv through c and returns its stdout, stderr and result.
func pfRun(ctx context.Context, c *agent.Client, stdin []byte, argv ...string) (string, string, agent.Result, error) {
	return pfRunDir(ctx, c, "/workspace", stdin, argv...)
}

func pfRunDir(ctx context.Context, c *agent.Client, dir string, stdin []byte, argv ...string) (string, string, agent.Result, error) {
	var mu sync.Mutex
	var out, errb bytes.Buffer
	p, err := c.Start(ctx, agent.ExecSpec{Argv: argv, Env: pfEnv, Dir: dir, Stdin: stdin},
		func(s int, b []byte) bool {
			mu.Lock()
			defer mu.Unlock()
			if s == 0 {
				out.Write(b)
			} else {
				errb.Write(b)
			}
			return true
		})
	if err != nil {
		return "", "", agent.Result{}, err
	}
	defer p.Close()
	select {
	case <-p.Done():
	case <-ctx.Done():
		return "", "", agent.Result{}, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	return out.String(), errb.String(), p.Result(), nil
}

func TestTunnel(t *testing.T) {
	c := newPFCluster(t)
	pod, tun := c.agentPod(t)
	cl := &agent.Client{Dial: tun.Dial}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("Echo", func(t *testing.T) {
		out, _, res, err := pfRun(ctx, cl, []byte("in"), "sh", "-c", "echo hello; cat")
		if err != nil || res.ExitCode != 0 || out != "hello\nin" {
			t.Errorf("echo: %q %+v %v", out, res, err)
		}
		_, _, res, err = pfRun(ctx, cl, nil, "sh", "-c", "exit 3")
		if err != nil || res.ExitCode != 3 {
			t.Errorf("exit 3: %+v %v", res, err)
		}
	})

	t.Run("Interactive", func(t *testing.T) {
		var mu sync.Mutex
		var out bytes.Buffer
		p, err := cl.Start(ctx, agent.ExecSpec{Argv: []string{"cat"}, Env: pfEnv, Dir: "/workspace", Interactive: true},
			func(_ int, b []byte) bool { mu.Lock(); out.Write(b); mu.Unlock(); return true })
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for _, s := range []string{"one\n", "two\n"} {
			if _, err := p.WriteStdin(ctx, []byte(s)); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.CloseStdin(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Done():
		case <-time.After(60 * time.Second):
			t.Fatal("interactive cat did not exit within 60s of its stdin's close")
		}
		mu.Lock()
		defer mu.Unlock()
		if res := p.Result(); res.ExitCode != 0 || res.Err != nil || out.String() != "one\ntwo\n" {
			t.Errorf("interactive cat: %q %+v", out.String(), res)
		}
	})

	t.Run("PutGet100MB", func(t *testing.T) {
		data := make([]byte, 100<<20)
		rand.Read(data)
		want := sha256.Sum256(data)
		f := agent.FileRef{Root: "/workspace", Rel: "big", Orig: "big"}
		start := time.Now()
		if err := cl.PutFile(ctx, f, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		put := time.Since(start)
		start = time.Now()
		r, size, err := cl.OpenFile(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, r)
		r.Close()
		get := time.Since(start)
		if err != nil || n != int64(len(data)) || size != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("get: %d bytes (size %d) %v, content same: %v", n, size, err, bytes.Equal(h.Sum(nil), want[:]))
		}
		t.Logf("100 MiB put %v (%.0f MiB/s), get %v (%.0f MiB/s)", put, 100/put.Seconds(), get, 100/get.Seconds())
		out, _, _, _ := pfRun(ctx, cl, nil, "sh", "-c", "rm big && echo gone")
		if out != "gone\n" {
			t.Errorf("rm: %q", out)
		}
	})

	t.Run("Concurrent50", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for i := range 50 {
			wg.Go(func() {
				want := fmt.Sprintf("n%d\n", i)
				out, _, res, err := pfRun(ctx, cl, nil, "echo", fmt.Sprintf("n%d", i))
				if err != nil || res.ExitCode != 0 || out != want {
					errs <- fmt.Errorf("exec %d: %q %+v %v", i, out, res, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("Reconnect", func(t *testing.T) {
		tun.mu.Lock()
		old := tun.conn
		tun.mu.Unlock()
		if old == nil {
			t.Fatal("no connection after the execs")
		}
		tun.dropConnection()
		if err := cl.Ping(ctx); err != nil {
			t.Fatalf("ping after the connection closed: %v", err)
		}
		tun.mu.Lock()
		now := tun.conn
		tun.mu.Unlock()
		if now == nil || now == old {
			t.Errorf("no new connection")
		}
	})

	t.Run("NobodyListens", func(t *testing.T) {
		other := newTunnel(c.cfg, c.ns, pod, 7999)
		defer other.Close()
		err := (&agent.Client{Dial: other.Dial}).Ping(ctx)
		var te *TunnelError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), "7999") || !strings.Contains(err.Error(), pod) {
			t.Fatalf("ping on a port nobody listens on: %v, want a *TunnelError naming the pod and port", err)
		}
		t.Logf("nobody listens: %v", err)
	})

	t.Run("MissingPod", func(t *testing.T) {
		other := newTunnel(c.cfg, c.ns, "tai42-nope", testAgentPort)
		defer other.Close()
		start := time.Now()
		_, err := other.Dial(ctx)
		if !errors.Is(err, ErrPodNotFound) || !strings.Contains(err.Error(), "tai42-nope") || !strings.Contains(err.Error(), tun.host) {
			t.Fatalf("dial a missing pod: %v, want ErrPodNotFound naming the pod and apiserver", err)
		}
		t.Logf("missing pod (%v): %v", time.Since(start), err)
	})

	t.Run("Bounded", func(t *testing.T) {
		// An apiserver that accepts and never answers: the dial ends at
		// its bound.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var held []net.Conn
		var hmu sync.Mutex
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				hmu.Lock()
				held = append(held, c)
				hmu.Unlock()
			}
		}()
		defer func() {
			hmu.Lock()
			for _, c := range held {
				c.Close()
			}
			hmu.Unlock()
		}()
		cfg := rest.CopyConfig(c.cfg)
		cfg.Host = "https://" + ln.Addr().String()
		other := newTunnel(cfg, c.ns, pod, testAgentPort)
		other.dialTimeout = 500 * time.Millisecond
		defer other.Close()
		start := time.Now()
		_, err = other.Dial(ctx)
		if d := time.Since(start); err == nil || d > 3*time.Second || !strings.Contains(err.Error(), ln.Addr().String()) {
			t.Fatalf("dial a silent apiserver: %v after %v", err, d)
		}
	})

	t.Run("PodDeletedMidStream", func(t *testing.T) {
		p, err := cl.Start(ctx, agent.ExecSpec{Argv: []string{"sleep", "1000"}, Env: pfEnv, Dir: "/workspace"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		zero := int64(0)
		start := time.Now()
		if err := c.cs.CoreV1().Pods(c.ns).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Done():
			// Either the tunnel broke first (an error), or the agent, sent
			// SIGTERM with its Pod, saw its command killed and said so
			// before it went (exit 137, SIGKILL's).
			if r := p.Result(); r.Err == nil && r.ExitCode != 137 {
				t.Errorf("the exec ended neither with an error nor killed: %+v", r)
			}
			t.Logf("exec ended %v after the delete: %v", time.Since(start), p.Result().Err)
		case <-time.After(30 * time.Second):
			t.Fatal("the exec did not fail within 30 s of its pod's delete")
		}
	})
}
