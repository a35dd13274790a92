package container

import (
	"context"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/agent"
	"github.com/tai42/sandbox/internal/agentexec"
	"github.com/tai42/sandbox/kit"
)

// connectAgent gives the session its agent client and the exec side over
// it (internal/agentexec: timeouts, output limits, exit grace, kill,
// interactive handles, shared with the kubernetes provider). r.env and
// r.user are set by then.
func (r *session) connectAgent() {
	r.agent = &agent.Client{Dial: r.dial}
	r.ex = agentexec.New(agentexec.Config{
		ID:           r.id,
		Spec:         r.spec,
		Agent:        r.agent,
		Opts:         r.p.opts.ProviderOptions,
		WorkspaceDir: workspaceDir,
		BaseEnv:      r.env,
		User:         r.user,
		// An exec killed by SIGKILL in a session with memory_mb is
		// reported as the limit's when the cgroup's OOM kill count grew.
		OOMKills: func() int64 { return r.p.cgroups.oomKills(cgroupsPath(r.id)) },
	})
}

// Exec runs req to completion, its output held in memory up to the limit.
func (r *session) Exec(ctx context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	return r.ex.Exec(ctx, req)
}

// ExecStart starts req as an interactive exec.
func (r *session) ExecStart(ctx context.Context, req kit.ExecRequest) (sandbox.ExecHandle, error) {
	return r.ex.ExecStart(ctx, req)
}
