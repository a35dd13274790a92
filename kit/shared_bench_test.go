package kit_test

import (
	"context"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// What the ledger check costs an exec: a held session's Exec through a
// kit over a MemoryLedger, and over a shared one (its Get a map read).
func BenchmarkExecLedger(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		ledger func() kit.Ledger
	}{
		{"own", func() kit.Ledger { return kit.NewMemoryLedger() }},
		{"shared", func() kit.Ledger { return &view{w: newWorld()} }},
	} {
		b.Run(c.name, func(b *testing.B) {
			l := c.ledger()
			var w *world
			if v, ok := l.(*view); ok {
				w = v.w
			} else {
				w = newWorld()
			}
			p := &sharedProvider{fakeProvider: fakeProvider{iso: "none"}, w: w}
			sb, err := kit.New(p, kit.Options{Policy: open, ReapInterval: -1, Ledger: l})
			if err != nil {
				b.Fatal(err)
			}
			defer sb.Close(ctx)
			sess, err := sb.CreateSession(ctx, spec())
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := sess.Exec(ctx, []string{"x"}, sandbox.ExecOptions{Timeout: time.Second}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
