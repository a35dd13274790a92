package sandboxtest

import (
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

// An exec handle that implements sandbox.ExitWatcher closes Exited once
// its command has exited, its output read or not, and not before. (A
// relay that enforces deadlines itself relies on it to tell a timeout from
// an exec that exited in time.) The clause applies only to handles that
// implement it; for others it checks nothing and says so in the log.
func (s *suite) testStreamExitWatcher(t *testing.T) {
	ctx := s.testContext(t)
	_, sess := s.fresh(t, nil)
	r := start(t, ctx, sess, sandbox.StartOptions{}, shArgv("read x; head -c 200000 /dev/zero")...)
	defer func() { _ = r.h.Kill(ctx) }()
	w, ok := r.h.(sandbox.ExitWatcher)
	if !ok {
		t.Logf("the handle (%T) does not implement sandbox.ExitWatcher (optional): nothing to check", r.h)
		return
	}
	select {
	case <-w.Exited():
		t.Fatal("Exited closed while the command still waits on its stdin")
	case <-time.After(300 * time.Millisecond):
	}
	if err := r.h.WriteStdin(ctx, []byte("go\n")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	select {
	case <-w.Exited():
	case <-time.After(execTimeout):
		t.Fatal("Exited did not close after the command exited with its output unread")
	}
	r.drain(ctx, execTimeout)
	r.wantExit(0, "the command exits 0")
	if len(r.stdout) != 200000 {
		t.Errorf("stdout after Exited: %d bytes; want all 200000, still delivered", len(r.stdout))
	}
}
