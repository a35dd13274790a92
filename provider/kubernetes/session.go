package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/internal/agentexec"
	"github.com/tai42/sandbox/internal/undo"
	"github.com/tai42/sandbox/kit"
)

// destroyTimeout bounds a destroy's wait for the Pod to be gone.
const destroyTimeout = 60 * time.Second

// apiCallTimeout bounds each of the teardown's and the ledger's writes by
// itself: the kit hands them a context that is never cancelled
// (context.WithoutCancel), so nothing else would end a call to an
// apiserver that stopped answering. A var for the tests.
var apiCallTimeout = 30 * time.Second

// session is one session Pod as this process serves it: the tunnel to its
// agent and the execs it started.
type session struct {
	p      *provider
	id     string
	spec   sandbox.SessionSpec
	pod    string
	uid    types.UID
	tun    *tunnel
	ex     *agentexec.Session
	timing Timing

	// teardown is what Create (or Adopt) made, the last made on top;
	// Destroy unwinds it.
	teardown undo.Stack
}

var (
	_ kit.Resources    = (*session)(nil)
	_ kit.FileStreamer = (*session)(nil)
	_ kit.Recoverable  = (*session)(nil)
)

// handle is the ledger's reference to a session's Pod.
type handle struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
}

func (r *session) Handle() json.RawMessage {
	b, _ := json.Marshal(handle{Namespace: r.p.ns, Pod: r.pod})
	return b
}

func (r *session) WorkspacePath() string { return workspaceDir }

// connect opens the tunnel to the session's agent (r.tun; its closing is
// the caller's): pings it until it answers (it listens a moment after its
// container starts), then reads the image's environment from it, the base
// of every exec's.
func (r *session) connect(ctx context.Context) error {
	var client *agent.Client
	var err error
	for delay := 2 * time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		// A fresh tunnel for each attempt until one is answered, so that
		// nothing of a failed attempt's is kept. (A forward the runtime
		// could not make, the agent not listening yet, can leave the
		// connection unable to carry streams; the tunnel drops such a
		// connection itself: see tunnelConn.readErrors.)
		r.tun = newTunnel(r.p.cfg, r.p.ns, r.pod, AgentPort)
		client = &agent.Client{Dial: r.tun.Dial}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = client.Ping(pctx)
		cancel()
		if err == nil || ctx.Err() != nil || !pingRetryable(err) {
			break
		}
		_ = r.tun.Close()
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
	}
	if err != nil {
		return sandbox.WrapError("create_session", fmt.Sprintf("the agent of pod %s/%s did not answer through the apiserver %s", r.p.ns, r.pod, apiserverHost(r.p.cfg.Host)), err)
	}
	env, err := readEnviron(ctx, client)
	if err != nil {
		return sandbox.WrapError("create_session", fmt.Sprintf("cannot read the environment of pod %s/%s's agent", r.p.ns, r.pod), err)
	}
	r.ex = agentexec.New(agentexec.Config{
		ID:           r.id,
		Spec:         r.spec,
		Agent:        client,
		Opts:         r.p.opts.ProviderOptions,
		WorkspaceDir: workspaceDir,
		BaseEnv:      env,
		OOMKills:     func() int64 { return oomKills(client) },
	})
	return nil
}

// pingRetryable reports whether a failed ping may pass by itself: the
// forward not made or lost (the agent not listening yet), the connection
// reset or timed out. An agent that answered (an error, another protocol
// version) or an apiserver that refused the port-forward's credentials
// or RBAC answers the same next time: the create fails at once with it.
func pingRetryable(err error) bool {
	var te *TunnelError
	if errors.As(err, &te) {
		return te.Status != http.StatusUnauthorized && te.Status != http.StatusForbidden
	}
	var ne net.Error
	var errno syscall.Errno
	return errors.As(err, &ne) || errors.As(err, &errno) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// readEnviron is the agent's own environment (PID 1 of the session's
// container: the image's Env and what the runtime set), less what
// Kubernetes adds about the cluster, over the defaults an image without
// them gets.
func readEnviron(ctx context.Context, c *agent.Client) (map[string]string, error) {
	rc, _, err := c.OpenFile(ctx, agent.FileRef{Root: "/", Rel: "proc/1/environ", Orig: "/proc/1/environ"})
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	env := map[string]string{
		"PATH":   "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"TMPDIR": "/tmp",
		"LANG":   "C.UTF-8",
	}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok || k == "" || strings.HasPrefix(k, "KUBERNETES_") {
			continue
		}
		env[k] = v
	}
	return env, nil
}

// oomKills is how many processes the session container's memory limit has
// killed: its cgroup's count, read through the agent (cgroup v2's
// memory.events, else v1's memory.oom_control). -1 when neither reads.
func oomKills(c *agent.Client) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, f := range []string{"sys/fs/cgroup/memory.events", "sys/fs/cgroup/memory/memory.oom_control"} {
		rc, _, err := c.OpenFile(ctx, agent.FileRef{Root: "/", Rel: f, Orig: "/" + f})
		if err != nil {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(rc, 4096))
		rc.Close()
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

func (r *session) Exec(ctx context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	return r.ex.Exec(ctx, req)
}

func (r *session) ExecStart(ctx context.Context, req kit.ExecRequest) (sandbox.ExecHandle, error) {
	return r.ex.ExecStart(ctx, req)
}

func (r *session) PutFile(ctx context.Context, p kit.Path, data []byte) error {
	return r.PutFileFrom(ctx, p, bytes.NewReader(data))
}

// PutFileFrom writes through the agent (a temp file renamed into place);
// in a persistent workspace the agent flushes it to disk before it answers.
func (r *session) PutFileFrom(ctx context.Context, p kit.Path, src io.Reader) error {
	ref := r.ex.FileRef(p)
	ref.Sync = r.spec.Durability == sandbox.Persistent && p.InWorkspace()
	return r.ex.PutFileFrom(ctx, ref, src)
}

func (r *session) GetFile(ctx context.Context, p kit.Path) ([]byte, error) {
	return r.ex.GetFile(ctx, p)
}

func (r *session) OpenFile(ctx context.Context, p kit.Path) (io.ReadCloser, int64, error) {
	return r.ex.OpenFile(ctx, p)
}

// Destroy ends every exec (with *sandbox.SessionNotFoundError), deletes
// the Pod with grace 0 and waits until it is gone (bounded), and lets go
// of the tunnel and the workspace's hold. The env Secret goes with the Pod
// (its owner); it is deleted here too, so that nothing waits on the
// garbage collector. Idempotent.
func (r *session) Destroy(ctx context.Context) error {
	procs, first := r.ex.Close()
	if !first {
		return nil
	}
	err := r.teardown.Unwind(ctx)
	return errors.Join(err, agentexec.WaitEnded(procs, 10*time.Second))
}

// Detach closes the tunnel and nothing else: the Pod runs on, for another
// daemon (or this one started again) to serve.
func (r *session) Detach() {
	if procs, first := r.ex.Close(); first {
		_ = agentexec.WaitEnded(procs, time.Second)
	}
	if r.tun != nil {
		_ = r.tun.Close()
	}
}

// closeTunnel closes the tunnel to the agent, if one is open.
func (r *session) closeTunnel(context.Context) error {
	if r.tun == nil {
		return nil
	}
	return r.tun.Close()
}

// deletePod deletes the session's Pod with grace 0 and waits, bounded,
// until the apiserver no longer holds it. A Pod already gone is not an
// error.
func (r *session) deletePod(ctx context.Context) error { return r.removePod(ctx, true) }

// removePod deletes the session's Pod with grace 0; wait: until the
// apiserver no longer holds it (bounded). A create's rollback does not
// wait: it must return promptly once its context ended.
func (r *session) removePod(ctx context.Context, wait bool) error {
	ctx, cancel := context.WithTimeout(ctx, destroyTimeout)
	defer cancel()
	pods := r.p.cs.CoreV1().Pods(r.p.ns)
	opts := metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}
	if r.uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &r.uid}
	}
	err := pods.Delete(ctx, r.pod, opts)
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil // gone already (or another Pod of the name: not ours)
	case err != nil:
		return r.p.apiError("destroy", fmt.Sprintf("cannot delete pod %s", r.pod), err)
	}
	if !wait {
		return nil
	}
	return r.p.waitGone(ctx, r.pod, r.uid)
}

// waitGone watches until the Pod name (of uid, when given) is gone.
func (p *provider) waitGone(ctx context.Context, name string, uid types.UID) error {
	pods := p.cs.CoreV1().Pods(p.ns)
	for {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			return p.apiError("destroy", fmt.Sprintf("cannot read pod %s", name), err)
		}
		if len(list.Items) == 0 || uid != "" && list.Items[0].UID != uid {
			return nil
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: list.ResourceVersion,
		})
		if err != nil {
			return p.apiError("destroy", fmt.Sprintf("cannot watch pod %s", name), err)
		}
		gone := false
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				gone = true
				break
			}
		}
		w.Stop()
		if gone {
			return nil
		}
		if ctx.Err() != nil {
			return sandbox.WrapError("destroy", fmt.Sprintf("pod %s/%s was not gone within %s", p.ns, name, destroyTimeout), ctx.Err())
		}
	}
}

// deleteSecret deletes the session's env Secret; a missing one is not an
// error.
func (r *session) deleteSecret(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	err := r.p.cs.CoreV1().Secrets(r.p.ns).Delete(ctx, secretName(r.id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return r.p.apiError("destroy", "cannot delete the session's env Secret", err)
	}
	return nil
}
