package host

import (
	"bytes"
	"context"
	"sync"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// bufSink holds a non-interactive exec's output in memory, each stream up
// to a limit.
type bufSink struct {
	limit int64
	mu    sync.Mutex
	bufs  [2]bytes.Buffer
	item  sandbox.StreamItem
	err   error
}

func (s *bufSink) write(i int, b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int64(s.bufs[i].Len()+len(b)) > s.limit {
		return false
	}
	s.bufs[i].Write(b)
	return true
}

func (s *bufSink) stop() {}

func (s *bufSink) finish(item sandbox.StreamItem, err error, _ *sandbox.StreamExit) {
	s.mu.Lock()
	s.item, s.err = item, err
	s.mu.Unlock()
}

// Exec runs req to completion: stdin is written by a goroutine while the
// readers collect the output, so a command that reads and writes a lot
// cannot deadlock against us.
func (r *resources) Exec(ctx context.Context, req kit.ExecRequest) (sandbox.ExecResult, error) {
	sk := &bufSink{limit: r.p.opts.MaxOutputBytes}
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
		p.end(endKill)
		<-p.done
		return sandbox.ExecResult{}, sandbox.WrapError("exec", "the call was cancelled and the exec killed", ctx.Err())
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.err != nil {
		return sandbox.ExecResult{}, sk.err
	}
	return sandbox.ExecResult{
		ExitCode: sk.item.(*sandbox.StreamExit).ExitCode,
		Stdout:   sk.bufs[0].String(),
		Stderr:   sk.bufs[1].String(),
	}, nil
}
