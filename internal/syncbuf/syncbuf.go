// Package syncbuf is a bytes.Buffer that one goroutine may read while
// others write to it: the log or output sink a test reads while the code
// under test still writes.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for concurrent use; its zero value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
