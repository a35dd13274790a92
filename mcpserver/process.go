package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/tai42/sandbox"
)

// killWait bounds how long a kill waits for the exec's stream to end.
const killWait = 10 * time.Second

// process is a background exec: its handle, and the output a goroutine
// drains from it as it comes, so that the exec never blocks on a reader.
// The output is one log of chunks addressed by byte offset (the cursor);
// past the bound the oldest chunks are dropped and the offset of the first
// kept one (base) moves on.
type process struct {
	id, sessionID string
	argv          []string
	started       time.Time
	h             sandbox.ExecHandle
	limit         int

	mu       sync.Mutex
	chunks   []chunk
	base     int64 // the offset of chunks[0]
	end      int64 // the offset after the last byte received
	kept     int   // the bytes in chunks
	finished bool
	exitCode int
	err      error         // the stream's end other than an exit (a timeout, a lost exec)
	changed  chan struct{} // closed at each change, then replaced
	done     chan struct{} // closed when the drain has ended
}

type chunk struct {
	stream sandbox.StreamName
	data   []byte
}

func startProcess(id, sessionID string, argv []string, h sandbox.ExecHandle, limit int) *process {
	p := &process{id: id, sessionID: sessionID, argv: argv, started: time.Now(), h: h, limit: limit,
		changed: make(chan struct{}), done: make(chan struct{})}
	go p.drain()
	return p
}

func (p *process) drain() {
	defer close(p.done)
	for {
		item, err := p.h.Next(context.Background())
		p.mu.Lock()
		switch {
		case errors.Is(err, io.EOF):
			p.finished = true
		case err != nil:
			p.finished, p.err = true, err
		default:
			switch it := item.(type) {
			case *sandbox.StreamChunk:
				p.append(it.Stream, it.Data)
			case *sandbox.StreamExit:
				p.exitCode = it.ExitCode
			}
		}
		finished := p.finished
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
		if finished {
			return
		}
	}
}

// append adds data to the log and drops the oldest output past the limit.
func (p *process) append(stream sandbox.StreamName, data []byte) {
	if len(data) == 0 {
		return
	}
	p.chunks = append(p.chunks, chunk{stream, data})
	p.end += int64(len(data))
	p.kept += len(data)
	for p.kept > p.limit {
		over := p.kept - p.limit
		first := &p.chunks[0]
		if len(first.data) > over {
			first.data = first.data[over:]
			p.base += int64(over)
			p.kept -= over
			break
		}
		p.base += int64(len(first.data))
		p.kept -= len(first.data)
		p.chunks = p.chunks[1:]
	}
}

// processOutput is what one read returns.
type processOutput struct {
	stdout, stderr []byte
	next           int64
	dropped        int64
	more           bool // output past next is already there
	finished       bool
	exitCode       int
	err            error
}

// read returns the output from cursor on, at most limit bytes, waiting up
// to wait for some when there is none yet and the exec still runs.
func (p *process) read(ctx context.Context, cursor int64, wait time.Duration, limit int) (processOutput, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		if cursor < 0 || cursor > p.end {
			end := p.end
			p.mu.Unlock()
			return processOutput{}, fmt.Errorf("cursor %d is outside the output, which is %d bytes so far: pass 0 or the next_cursor of the last read", cursor, end)
		}
		if cursor < p.end || p.finished || wait <= 0 {
			out := p.collect(cursor, limit)
			p.mu.Unlock()
			return out, nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			wait = 0
		case <-ctx.Done():
			return processOutput{}, ctx.Err()
		}
	}
}

// collect reads the log from cursor, p.mu held.
func (p *process) collect(cursor int64, limit int) processOutput {
	out := processOutput{finished: p.finished, exitCode: p.exitCode, err: p.err}
	if cursor < p.base {
		out.dropped = p.base - cursor
		cursor = p.base
	}
	off := p.base
	taken := 0
	for _, c := range p.chunks {
		cEnd := off + int64(len(c.data))
		if cEnd <= cursor {
			off = cEnd
			continue
		}
		data := c.data[cursor-off:]
		if room := limit - taken; len(data) > room {
			data = data[:cutUTF8(data, room)]
			out.more = true
		}
		if c.stream == sandbox.Stderr {
			out.stderr = append(out.stderr, data...)
		} else {
			out.stdout = append(out.stdout, data...)
		}
		taken += len(data)
		cursor += int64(len(data))
		off = cEnd
		if out.more {
			break
		}
	}
	out.next = cursor
	if out.more {
		out.finished = false // not all read yet: the exit comes with the last read
	}
	return out
}

// kill ends the exec and waits, up to ctx and killWait, for its stream's
// end.
func (p *process) kill(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, killWait)
	defer cancel()
	if err := p.h.Kill(ctx); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("process %s: killed, but its output did not end within %v", p.id, killWait)
	}
}

// cutUTF8 returns n, or less by up to 3 bytes so that b[:n] does not end
// in the middle of a character (when b is text at all).
func cutUTF8(b []byte, n int) int {
	if n <= 0 || n >= len(b) {
		return max(n, 0)
	}
	for i := n; i > 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return n // not text, or a cut that would leave nothing
}
