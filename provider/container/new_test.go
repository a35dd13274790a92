package container_test

import (
	"sync/atomic"
	"testing"

	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/container"
)

// closeCountingLedger counts its Closes.
type closeCountingLedger struct {
	*kit.MemoryLedger
	closes atomic.Int32
}

func (l *closeCountingLedger) Close() error { l.closes.Add(1); return nil }

// TestNewClosesLedgerOnFailure: New owns the ledger it is given, so a
// caller never closes it after a failed New. A New that fails before the
// kit (here: no state directory) closes it exactly once; kit.New closes it
// when it fails (the kit's tests).
func TestNewClosesLedgerOnFailure(t *testing.T) {
	l := &closeCountingLedger{MemoryLedger: kit.NewMemoryLedger()}
	if _, err := container.New(container.Options{Options: kit.Options{Ledger: l}}); err == nil {
		t.Fatal("New without a state directory succeeded")
	}
	if n := l.closes.Load(); n != 1 {
		t.Errorf("ledger closed %d times, want 1", n)
	}
}
