package mcpserver

import (
	"strings"
	"testing"
)

// TestReadFileLengthCapped: a read_file length over the result limit is
// cut to the limit (the rest is paged with next_offset), so that one call
// cannot put a whole large file into the agent's context.
func TestReadFileLengthCapped(t *testing.T) {
	const limit = 1000
	e := newEnv(t, Options{MaxResultBytes: limit})
	cs := e.connect()
	id := createSession(t, cs, nil)
	ok[writeOut](t, cs, "write_file", map[string]any{"session_id": id, "path": "big.txt", "content": strings.Repeat("x", 5000)})
	for _, length := range []int{0, limit + 1, 5000, 1 << 30} {
		r := ok[readOut](t, cs, "read_file", map[string]any{"session_id": id, "path": "big.txt", "offset": 100, "length": length})
		if r.Length != limit || len(r.Content) != limit || r.NextOffset != 100+limit || r.EOF || r.Size != 5000 {
			t.Errorf("read_file length %d: length %d, content %d bytes, next_offset %d, eof %v, size %d; want the limit of %d bytes from 100",
				length, r.Length, len(r.Content), r.NextOffset, r.EOF, r.Size, limit)
		}
	}
	r := ok[readOut](t, cs, "read_file", map[string]any{"session_id": id, "path": "big.txt", "offset": 4500, "length": 600})
	if r.Length != 500 || !r.EOF {
		t.Errorf("read_file of the last 500 bytes: %+v", r)
	}
}
