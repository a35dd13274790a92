package container_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox/provider/container"
)

// TestAhead: what is made ahead is made up to its count, taken one at a
// time, made again once no create runs, and, at close, let go of (not at
// abandon, as a process's death would not); a refill that fails says why.
func TestAhead(t *testing.T) {
	var mu sync.Mutex
	next, fail := 0, false
	var discarded []int
	mk := func() (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return 0, errors.New("no more")
		}
		next++
		return next, nil
	}
	discard := func(v int) {
		mu.Lock()
		defer mu.Unlock()
		discarded = append(discarded, v)
	}
	wait := func(a *container.AheadInts) []int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ready, err := a.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ready
	}

	a := container.NewAheadInts(2, mk, discard)
	if got := wait(a); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("made ahead: %v, want [1 2]", got)
	}
	// While a create runs, what it took is not made again.
	a.BeginCreate()
	if v, ok := a.Take(); !ok || v != 2 {
		t.Errorf("Take = %d, %v; want 2, true", v, ok)
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	made := next
	mu.Unlock()
	if made != 2 {
		t.Errorf("made %d while a create ran; want 2", made)
	}
	a.EndCreate()
	if got := wait(a); !slices.Equal(got, []int{1, 3}) {
		t.Errorf("made again after the create: %v, want [1 3]", got)
	}
	// A refill that fails says why.
	mu.Lock()
	fail = true
	mu.Unlock()
	a.Take()
	a.Take()
	if v, ok := a.Take(); ok {
		t.Errorf("Take of an empty pool gave %d", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Wait(ctx); err == nil || !strings.Contains(err.Error(), "no more") {
		t.Errorf("Wait after a failed refill: %v; want its error", err)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	a.Take() // the refill tries again
	wait(a)
	a.Close()
	mu.Lock()
	if len(discarded) != 2 {
		t.Errorf("Close discarded %v; want the 2 ready", discarded)
	}
	discarded = nil
	mu.Unlock()
	if _, err := a.Wait(ctx); err == nil {
		t.Error("Wait on a closed pool: no error")
	}

	b := container.NewAheadInts(1, mk, discard)
	wait(b)
	b.Abandon()
	mu.Lock()
	defer mu.Unlock()
	if len(discarded) != 0 {
		t.Errorf("Abandon discarded %v; want none", discarded)
	}
}
