package container

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStdioLog: what a process wrote to a container's stdout and stderr
// before it exited is in a failed start's error at once (text reads what
// the drain has not read yet); what is kept is bounded however much is
// written, and nothing is kept once the start is over; the drain ends
// when the last writer does.
func TestStdioLog(t *testing.T) {
	for range 20 { // the drain and text race for the pipe's content: try it often
		l, err := newStdioLog()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sh", "-c", `echo "the runtime's first line"; echo "its error" >&2; exit 1`)
		cmd.Stdout, cmd.Stderr = l.w, l.w
		_ = cmd.Run()
		l.handedOn()
		if got := l.text(2048); got != "the runtime's first line\nits error" {
			t.Fatalf("text = %q, want both lines the process wrote", got)
		}
		<-l.done // the writer is gone: the drain ends by itself
		l.close()
	}

	l, err := newStdioLog()
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	cmd := exec.Command("sh", "-c", `head -c 4000000 /dev/zero | tr '\0' x; echo; echo the end`)
	cmd.Stdout, cmd.Stderr = l.w, l.w
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	l.handedOn()
	<-l.done
	l.mu.Lock()
	kept := len(l.kept)
	l.mu.Unlock()
	if kept != stdioKeep {
		t.Errorf("kept %d bytes of 4 MB written, want the first %d", kept, stdioKeep)
	}
	if got := l.text(100); strings.Trim(got, "x") != "" || len(got) != 100 {
		t.Errorf("text(100) = %q, want the last 100 bytes kept", got)
	}
	l.settle()
	if got := l.text(100); got != "" {
		t.Errorf("text after settle = %q, want nothing kept", got)
	}
}
