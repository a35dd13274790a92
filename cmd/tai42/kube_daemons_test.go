package main

// The two-daemon test: two "tai42 serve --provider kubernetes" processes
// (the built binary) on one namespace of the harness cluster, whose
// apiserver is their one ledger. It runs only where this package's
// TestMain started the cluster (TAI42_KUBETEST=1, see main_test.go), else
// kubetest.Require skips it saying why:
//
//	TAI42_KUBETEST=1 go test -race -count=1 -run TestKubeDaemons -timeout 30m ./cmd/tai42/

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"github.com/tai42/sandbox/provider/kubernetes"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
)

// Labels and annotations of the provider's (names.go), as the test reads
// the cluster directly.
const (
	kubeLabelSession   = "tai42.dev/session"
	kubeLabelWorkspace = "tai42.dev/workspace"
	kubeAnnoState      = "tai42.dev/state"
)

// kubeDaemons is the test's world: the cluster, the namespace, the binary
// and the daemons' settings.
type kubeDaemons struct {
	t       *testing.T
	c       *kubetest.Cluster
	cs      k8s.Interface
	ns      string
	bin     string
	env     []string
	image   string
	timeout time.Duration // --create-timeout of each daemon
}

// kubeDaemon is one running daemon and its client.
type kubeDaemon struct {
	name string
	proc *daemonProc
	cl   *client.Client
}

func (k *kubeDaemons) start(name string) *kubeDaemon {
	k.t.Helper()
	d := startDaemonProc(k.t, k.bin, k.env, "--provider", "kubernetes",
		"--kubeconfig", k.c.Kubeconfig, "--namespace", k.ns, "--agent-image", k.c.AgentImage,
		"--storage-class", k.c.StorageClass, "--create-timeout", k.timeout.String(), "--network-probe-image", k.c.Busybox,
		"--listen", "127.0.0.1:0", "--state-dir", k.t.TempDir(), "--reap-interval", "500ms", "--log-format", "text")
	cl := client.New("http://"+d.addr, testToken)
	k.t.Cleanup(func() { cl.Close() })
	return &kubeDaemon{name: name, proc: d, cl: cl}
}

// kill ends d with SIGKILL and waits for it.
func (d *kubeDaemon) kill(t *testing.T) {
	t.Helper()
	if err := d.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing daemon %s: %v", d.name, err)
	}
	select {
	case <-d.proc.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("daemon %s did not die of SIGKILL", d.name)
	}
}

func (k *kubeDaemons) spec(ttl int, labels map[string]string) sandbox.SessionSpec {
	return sandbox.SessionSpec{Image: k.image, Durability: sandbox.Ephemeral, Network: sandbox.NetworkNone, TTLSeconds: ttl, Labels: labels}
}

// eventually polls fn until it returns nil or bound passes; the last
// error fails the test.
func eventually(t *testing.T, bound time.Duration, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, bound, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func listIDs(ctx context.Context, cl *client.Client) (map[string]sandbox.SessionInfo, error) {
	infos, err := cl.ListSessions(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]sandbox.SessionInfo{}
	for _, in := range infos {
		out[in.ID] = in
	}
	return out, nil
}

// sessionPods lists the session Pods of the namespace by id, with their
// state annotation.
func (k *kubeDaemons) sessionPods(ctx context.Context) (map[string]string, error) {
	pods, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: kubeLabelSession})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue // on its way out
		}
		out[p.Labels[kubeLabelSession]] = p.Annotations[kubeAnnoState]
	}
	return out, nil
}

// execEcho runs echo in id through cl and checks its output.
func execEcho(ctx context.Context, cl *client.Client, id, word string) error {
	s, err := cl.GetSession(ctx, id)
	if err != nil {
		return err
	}
	res, err := s.Exec(ctx, []string{"echo", word}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Stdout != word+"\n" {
		return fmt.Errorf("exec in %s: exit %d, stdout %q, stderr %q", id, res.ExitCode, res.Stdout, res.Stderr)
	}
	return nil
}

// TestKubeDaemons: sessions created on daemon A are listed, exec'd,
// written, touched and destroyed through daemon B; a short-TTL session A
// made is reaped after A is killed (B, then alone, holds the Lease);
// a daemon started again finds every session; and a daemon SIGKILLed
// under concurrent creates and execs loses no session it reported
// created, and leaves none half-made once swept.
func TestKubeDaemons(t *testing.T) {
	if os.Getenv(kubetestEnv) == "" {
		t.Skip("needs the harness cluster, which this package starts only when asked: " + kubetestEnv + "=1 go test -run TestKubeDaemons ./cmd/tai42/")
	}
	c := kubetest.Require(t)
	cs, err := k8s.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeDaemons{t: t, c: c, cs: cs, ns: c.NewNamespace(t), bin: buildBinary(t), image: c.Busybox, timeout: 60 * time.Second,
		env: []string{tokenEnv + "=" + testToken, "PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	a, b := k.start("A"), k.start("B")

	// Created on A, used through B.
	var made []string
	for i := range 2 {
		s, err := a.cl.CreateSession(ctx, k.spec(600, map[string]string{"made-on": "a", "n": fmt.Sprint(i)}))
		if err != nil {
			t.Fatalf("create on A: %v", err)
		}
		made = append(made, s.ID())
	}
	eventually(t, 10*time.Second, "B lists A's sessions", func() error {
		ids, err := listIDs(ctx, b.cl)
		if err != nil {
			return err
		}
		for _, id := range made {
			in, ok := ids[id]
			if !ok {
				return fmt.Errorf("B lists %v, not %s", slices.Collect(maps.Keys(ids)), id)
			}
			if in.Labels["made-on"] != "a" || in.Image != k.image {
				return fmt.Errorf("B's info of %s: %+v", id, in)
			}
		}
		return nil
	})
	for _, id := range made {
		if err := execEcho(ctx, b.cl, id, "through-b"); err != nil {
			t.Fatalf("exec through B: %v", err)
		}
	}
	sa, err := a.cl.GetSession(ctx, made[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := sa.PutFile(ctx, "from-a.txt", []byte("written on A\n")); err != nil {
		t.Fatal(err)
	}
	sb, err := b.cl.GetSession(ctx, made[0])
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sb.GetFile(ctx, "from-a.txt"); err != nil || string(got) != "written on A\n" {
		t.Fatalf("a file A wrote, read through B: %q, %v", got, err)
	}
	before, err := sa.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // a touch moves expires_at by whole seconds
	if err := sb.Touch(ctx); err != nil {
		t.Fatalf("touch through B: %v", err)
	}
	eventually(t, 10*time.Second, "A sees B's touch", func() error {
		in, err := sa.Info(ctx)
		if err != nil {
			return err
		}
		if !in.ExpiresAt.After(before.ExpiresAt) {
			return fmt.Errorf("expires_at on A %v, was %v", in.ExpiresAt, before.ExpiresAt)
		}
		return nil
	})
	if err := b.cl.DestroySession(ctx, made[1]); err != nil {
		t.Fatalf("destroy through B of a session A made: %v", err)
	}
	eventually(t, 10*time.Second, "A finds the session B destroyed gone", func() error {
		_, err := a.cl.GetSession(ctx, made[1])
		if !errors.Is(err, sandbox.ErrSessionNotFound) {
			return fmt.Errorf("GetSession on A = %v, want not found", err)
		}
		return nil
	})
	kept := []string{made[0]}

	// One live session per persistent key, across daemons.
	ps, err := a.cl.CreateSession(ctx, sandbox.SessionSpec{Image: k.image, Durability: sandbox.Persistent, WorkspaceKey: "two-daemons",
		Network: sandbox.NetworkNone, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("a persistent session on A: %v", err)
	}
	_, err = b.cl.CreateSession(ctx, sandbox.SessionSpec{Image: k.image, Durability: sandbox.Persistent, WorkspaceKey: "two-daemons",
		Network: sandbox.NetworkNone, TTLSeconds: 600})
	var sr *sandbox.SpecRejectedError
	if !errors.As(err, &sr) || sr.Field != "workspace_key" {
		t.Errorf("the same key on B while A's session holds it: %v; want a rejection of workspace_key", err)
	}
	kept = append(kept, ps.ID())
	eventually(t, 10*time.Second, "B lists the workspace of A's session", func() error {
		ws, err := b.cl.ListWorkspaces(ctx)
		if err != nil {
			return err
		}
		for _, w := range ws {
			if w.Key == "two-daemons" {
				return nil
			}
		}
		return fmt.Errorf("B's workspaces: %+v", ws)
	})

	// A short-TTL session made on A is reaped once A is dead: by B, the
	// Lease's holder once A's lease runs out.
	short, err := a.cl.CreateSession(ctx, k.spec(3, map[string]string{"short": "yes"}))
	if err != nil {
		t.Fatal(err)
	}
	// A holds the Lease now (else B's reap below would not show the Lease
	// changing hands).
	eventually(t, 30*time.Second, "A holds the reaper's Lease", func() error {
		if !k.holds(ctx, a) {
			return fmt.Errorf("the Lease's holder is %q", k.leaseHolder(ctx))
		}
		return nil
	})
	a.kill(t)
	eventually(t, 90*time.Second, "B reaps the expired session of the dead A", func() error {
		pods, err := k.sessionPods(ctx)
		if err != nil {
			return err
		}
		if _, ok := pods[short.ID()]; ok {
			return fmt.Errorf("the Pod of %s is still there", short.ID())
		}
		if _, err := b.cl.GetSession(ctx, short.ID()); !errors.Is(err, sandbox.ErrSessionNotFound) {
			return fmt.Errorf("B still finds %s: %v", short.ID(), err)
		}
		if !k.holds(ctx, b) {
			return fmt.Errorf("the Lease's holder is %q, not B", k.leaseHolder(ctx))
		}
		return nil
	})
	// A's other sessions outlive it.
	for _, id := range kept {
		if err := execEcho(ctx, b.cl, id, "after-a-died"); err != nil {
			t.Fatalf("a session of the dead A, through B: %v", err)
		}
	}

	// A started again finds them.
	a = k.start("A2")
	eventually(t, 10*time.Second, "A, started again, lists the sessions", func() error {
		ids, err := listIDs(ctx, a.cl)
		if err != nil {
			return err
		}
		for _, id := range kept {
			if _, ok := ids[id]; !ok {
				return fmt.Errorf("A2 lists %v, not %s", slices.Collect(maps.Keys(ids)), id)
			}
		}
		return nil
	})

	// A killed mid-load loses nothing.
	created := k.loadAndKill(ctx, a, kept)
	t.Logf("%d sessions reported created through A before its SIGKILL", len(created))
	want := append(slices.Clone(kept), created...)
	eventually(t, 30*time.Second, "B lists every session reported created", func() error {
		ids, err := listIDs(ctx, b.cl)
		if err != nil {
			return err
		}
		for _, id := range want {
			if _, ok := ids[id]; !ok {
				return fmt.Errorf("B does not list %s", id)
			}
		}
		return nil
	})
	for _, id := range want {
		if err := execEcho(ctx, b.cl, id, "survived"); err != nil {
			t.Errorf("a session reported created before the kill, through B: %v", err)
		}
	}
	// Half-made sessions (a Pod still creating, no record live) are swept
	// within the create timeout and a reap or two: every session Pod left
	// is a live session B lists.
	eventually(t, k.timeout+30*time.Second, "no half-made session left", func() error {
		pods, err := k.sessionPods(ctx)
		if err != nil {
			return err
		}
		ids, err := listIDs(ctx, b.cl)
		if err != nil {
			return err
		}
		var bad []string
		for id, state := range pods {
			if _, ok := ids[id]; !ok || state != "live" {
				bad = append(bad, fmt.Sprintf("%s (state %q, listed %v)", id, state, ok))
			}
		}
		if len(bad) > 0 {
			sort.Strings(bad)
			return fmt.Errorf("session Pods not live or not listed: %s", strings.Join(bad, ", "))
		}
		return nil
	})

	// Done: B destroys every session and the workspace, stops, and nothing
	// of a session is left in the namespace.
	ids, err := listIDs(ctx, b.cl)
	if err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		if err := b.cl.DestroySession(ctx, id); err != nil && !errors.Is(err, sandbox.ErrSessionNotFound) {
			t.Errorf("destroying %s: %v", id, err)
		}
	}
	eventually(t, 30*time.Second, "B removes the workspace once its session is gone", func() error {
		return b.cl.RemoveWorkspace(ctx, "two-daemons")
	})
	if code, _ := b.proc.stop(t); code != 0 {
		t.Errorf("B exited %d after SIGTERM; stderr:\n%s", code, b.proc.stderr.String())
	}
	// Nothing either daemon made is left but what a namespace's daemons
	// share (the tier policies, the Lease, released by B as it stopped).
	k.c.AssertNamespaceClean(t, k.ns,
		"NetworkPolicy "+kubernetes.NetworkPolicyNone, "NetworkPolicy "+kubernetes.NetworkPolicyInternal,
		"NetworkPolicy "+kubernetes.NetworkPolicyEgress, "Lease "+kubernetes.LeaseName)
	if h := k.leaseHolder(ctx); h != "" {
		t.Errorf("the reaper's Lease is still held by %q after both daemons stopped", h)
	}
}

// leaseHolder is the reaper Lease's holder ("" when free or absent).
func (k *kubeDaemons) leaseHolder(ctx context.Context) string {
	l, err := k.cs.CoordinationV1().Leases(k.ns).Get(ctx, kubernetes.LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// holds says whether d is the reaper Lease's holder (a daemon's identity
// is hostname_pid_random).
func (k *kubeDaemons) holds(ctx context.Context, d *kubeDaemon) bool {
	return strings.Contains(k.leaseHolder(ctx), fmt.Sprintf("_%d_", d.proc.cmd.Process.Pid))
}

// loadAndKill runs creates and execs through d from several goroutines,
// SIGKILLs d once a few creates have returned (or after a bound), waits
// for the load to stop, and returns the ids of the sessions whose create
// returned before the kill. Execs on the sessions of busy run meanwhile.
func (k *kubeDaemons) loadAndKill(ctx context.Context, d *kubeDaemon, busy []string) []string {
	t := k.t
	t.Helper()
	var (
		mu      sync.Mutex
		created []string
		killed  bool
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, k.timeout+10*time.Second)
				s, err := d.cl.CreateSession(cctx, k.spec(600, map[string]string{"load": fmt.Sprint(g)}))
				cancel()
				mu.Lock()
				if err == nil && !killed {
					created = append(created, s.ID())
				}
				mu.Unlock()
				if err != nil {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		})
	}
	for _, id := range busy {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = execEcho(ctx, d.cl, id, "load")
			}
		})
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		n := len(created)
		mu.Unlock()
		if n >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("only %d creates returned within 2 minutes; killing %s anyway", n, d.name)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Killed while creates are in flight: a create that returns after
	// this line is not counted (its answer may have been lost).
	mu.Lock()
	killed = true
	mu.Unlock()
	d.kill(t)
	close(stop)
	wg.Wait()
	if len(created) == 0 {
		// Nothing to lose: "loses nothing" would hold vacuously.
		t.Fatalf("no create through %s returned before it was killed", d.name)
	}
	return created
}
