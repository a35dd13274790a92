package execout

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// The first reason decides; a kill or a timeout after the command's exit
// is not one (its exit status stands); a destroy or a limit always is.
func TestEndReasonThen(t *testing.T) {
	all := []EndReason{EndKill, EndTimeout, EndDestroy, EndLimit}
	for _, next := range all {
		for _, exited := range []bool{false, true} {
			want := next
			if exited && (next == EndKill || next == EndTimeout) {
				want = EndNone
			}
			if got := EndNone.Then(next, exited); got != want {
				t.Errorf("EndNone.Then(%d, exited %v) = %d, want %d", next, exited, got, want)
			}
			for _, first := range all {
				if got := first.Then(next, exited); got != first {
					t.Errorf("%d.Then(%d, exited %v) = %d, want the first, %d", first, next, exited, got, first)
				}
			}
		}
	}
}

func TestEndReasonErr(t *testing.T) {
	e := Ended{SessionID: "s1", Timeout: 3 * time.Second, Limit: 10, Lens: [2]int64{11, 4}}
	for _, r := range []EndReason{EndNone, EndKill} {
		if err := r.Err(e); err != nil {
			t.Errorf("reason %d: %v, want the command's own end", r, err)
		}
	}
	var te *sandbox.ExecTimeoutError
	if err := EndTimeout.Err(e); !errors.As(err, &te) || te.Timeout != e.Timeout || te.StdoutLen != 11 || te.StderrLen != 4 || te.Note != "" {
		t.Errorf("timeout: %#v", err)
	}
	e.Held = true
	if err := EndTimeout.Err(e); !errors.As(err, &te) || !strings.Contains(te.Note, "still held the output") {
		t.Errorf("timeout with the output held: %#v", err)
	}
	var nf *sandbox.SessionNotFoundError
	if err := EndDestroy.Err(e); !errors.As(err, &nf) || nf.SessionID != "s1" || !strings.Contains(nf.Detail, "destroyed while the exec was running") {
		t.Errorf("destroy: %#v", err)
	}
	var le *sandbox.OutputLimitError
	if err := EndLimit.Err(e); !errors.As(err, &le) || le.Limit != 10 || le.StdoutLen != 11 || le.StderrLen != 4 {
		t.Errorf("limit: %#v", err)
	}
}
