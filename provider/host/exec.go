package host

import (
	"context"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/execout"
	"github.com/tai42/sandbox/kit"
)

// Exec runs req to completion: stdin is written by a goroutine while the
// readers collect the output, so a command that reads and writes a lot
// cannot deadlock against us.
func (r *session) Exec(ctx context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	sk := &execout.Buffer{Limit: r.p.opts.MaxOutputBytes}
	st, err := r.start("exec", req, len(req.Stdin) > 0, sk)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	if st.p == nil {
		return sandbox.ExecResult{ExitCode: st.exitCode, Stderr: st.message}, nil
	}
	p := st.p
	if p.stdin != nil {
		go func() {
			// A failed write (the command exited or closed its stdin) is
			// the command's choice, not a failure of the exec; the
			// supervisor closes the pipe at the end, which unblocks a
			// stuck write.
			_, _ = p.stdin.Write(req.Stdin)
			p.stdin.Close()
		}()
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		p.end(execout.EndKill)
		<-p.done
		return sandbox.ExecResult{}, sandbox.WrapError("exec", "the call was cancelled and the exec killed", ctx.Err())
	}
	return sk.Result()
}
