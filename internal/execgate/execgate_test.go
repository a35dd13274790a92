package execgate

import (
	"slices"
	"testing"
	"time"
)

func TestAdmitAddRemoveClose(t *testing.T) {
	var g Gate[int]
	if g.Closed() {
		t.Fatal("a zero gate is closed")
	}
	for _, p := range []int{1, 2, 3} {
		if !g.Admit() {
			t.Fatal("an open gate refused a start")
		}
		g.Add(p)
		g.Done()
	}
	g.Remove(2)
	g.Remove(7) // not held: ignored
	procs, first := g.Close()
	slices.Sort(procs)
	if !first || !slices.Equal(procs, []int{1, 3}) {
		t.Fatalf("Close = %v, %v; want [1 3], true", procs, first)
	}
	if !g.Closed() {
		t.Error("not closed after Close")
	}
	if g.Admit() {
		t.Error("a closed gate admitted a start")
	}
	if procs, first := g.Close(); first || procs != nil {
		t.Errorf("second Close = %v, %v; want nil, false", procs, first)
	}
}

// Close waits for a start admitted before it, and returns the exec that
// start added meanwhile.
func TestCloseWaitsForAdmitted(t *testing.T) {
	var g Gate[string]
	if !g.Admit() {
		t.Fatal("refused")
	}
	closed := make(chan []string)
	go func() {
		procs, _ := g.Close()
		closed <- procs
	}()
	for !g.Closed() {
		time.Sleep(time.Millisecond)
	}
	select {
	case procs := <-closed:
		t.Fatalf("Close returned %v before the admitted start was done", procs)
	case <-time.After(50 * time.Millisecond):
	}
	if g.Admit() {
		t.Error("a start was admitted while Close waited")
	}
	g.Add("late")
	g.Done()
	if procs := <-closed; !slices.Equal(procs, []string{"late"}) {
		t.Errorf("Close returned %v, want the exec added by the admitted start", procs)
	}
}
