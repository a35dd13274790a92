package mcpserver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// conn is one MCP connection's state: the ephemeral sessions it created,
// which end with it, and its background processes.
type conn struct {
	s  *Server
	id string

	mu       sync.Mutex
	sessions map[string]bool // created here and ephemeral: destroyed at the end
	procs    map[string]*process
	ended    bool
}

func newConn(s *Server, id string) *conn {
	return &conn{s: s, id: id, sessions: map[string]bool{}, procs: map[string]*process{}}
}

// own records an ephemeral session created here. It fails once the
// connection has ended; the caller destroys the session then.
func (c *conn) own(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return fmt.Errorf("the connection ended while the session was being created")
	}
	c.sessions[id] = true
	return nil
}

// addProcess keeps p, unless the connection ended or holds its maximum.
func (c *conn) addProcess(p *process) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return fmt.Errorf("the connection ended while the process was being started")
	}
	if len(c.procs) >= c.s.opts.MaxProcesses {
		return fmt.Errorf("this connection already holds %d processes, the most it may: kill_process the ones you are done with (a process's record stays until it is killed, even after it exited)", len(c.procs))
	}
	c.procs[p.id] = p
	return nil
}

func (c *conn) process(id string) (*process, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.procs[id]; ok {
		return p, nil
	}
	var ids []string
	for k := range c.procs {
		ids = append(ids, k)
	}
	slices.Sort(ids)
	known := "this connection has none"
	if len(ids) > 0 {
		known = "this connection's are " + strings.Join(ids, ", ")
	}
	return nil, fmt.Errorf("no process %q (%s)", clip(id), known)
}

func (c *conn) forget(id string) {
	c.mu.Lock()
	delete(c.procs, id)
	c.mu.Unlock()
}

func (c *conn) processes() []*process {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := make([]*process, 0, len(c.procs))
	for _, p := range c.procs {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *process) int { return a.started.Compare(b.started) })
	return ps
}

// dropSession forgets a session destroyed through this connection, and
// its processes, which ended with it.
func (c *conn) dropSession(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sessions, id)
	for pid, p := range c.procs {
		if p.sessionID == id {
			delete(c.procs, pid)
		}
	}
}

// end kills the connection's processes and destroys its ephemeral
// sessions. What fails is logged: nobody is left to tell.
func (c *conn) end(ctx context.Context) {
	c.mu.Lock()
	c.ended = true
	procs, sessions := c.procs, c.sessions
	c.procs, c.sessions = map[string]*process{}, map[string]bool{}
	c.mu.Unlock()

	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() {
			if err := p.kill(ctx); err != nil && !sessions[p.sessionID] {
				c.s.log.Warn("mcp: killing a process at the connection's end", "connection", c.id, "process", p.id, "err", err)
			}
		})
	}
	wg.Wait()
	for id := range sessions {
		wg.Go(func() {
			if err := c.s.sb.DestroySession(ctx, id); err != nil {
				c.s.log.Warn("mcp: destroying a session at the connection's end", "connection", c.id, "session", id, "err", err)
			}
		})
	}
	wg.Wait()
	c.s.log.Info("mcp: connection ended", "connection", c.id, "sessions_destroyed", len(sessions), "processes_killed", len(procs))
}
