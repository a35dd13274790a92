package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/client"
	"golang.org/x/sys/unix"
)

// openPty opens a pseudo-terminal pair: the master (the "terminal
// emulator" side) and the slave (what a program reads as its terminal).
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking the pty: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the pty's slave: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

func TestTerminalDetection(t *testing.T) {
	if _, tty := terminalFd(strings.NewReader("x")); tty {
		t.Error("a strings.Reader is a terminal")
	}
	if _, tty := terminalFd(nil); tty {
		t.Error("no stdin is a terminal")
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if _, tty := terminalFd(pr); tty {
		t.Error("a pipe is a terminal")
	}
	_, slave := openPty(t)
	fd, tty := terminalFd(slave)
	if !tty || fd != int(slave.Fd()) {
		t.Errorf("a pty slave: fd %d, tty %v", fd, tty)
	}
}

func TestRawModeRestored(t *testing.T) {
	master, slave := openPty(t)
	fd := int(slave.Fd())
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 33, Col: 101}); err != nil {
		t.Fatal(err)
	}
	if r, c := terminalSize(fd); r != 33 || c != 101 {
		t.Errorf("terminalSize = %dx%d, want 33x101", r, c)
	}
	if r, c := terminalSize(-1); r != 24 || c != 80 {
		t.Errorf("terminalSize of no terminal = %dx%d, want 24x80", r, c)
	}
	before, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	restore, err := rawMode(fd)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := unix.IoctlGetTermios(fd, unix.TCGETS)
	if raw.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
		t.Errorf("raw mode keeps lflag %#x", raw.Lflag)
	}
	restore()
	restore() // twice is harmless
	after, _ := unix.IoctlGetTermios(fd, unix.TCGETS)
	if *after != *before {
		t.Errorf("termios not restored:\n before %+v\n after  %+v", before, after)
	}
	if _, err := rawMode(-1); err == nil {
		t.Error("raw mode on no terminal: no error")
	}
}

func TestScriptArgvAndCRLF(t *testing.T) {
	got := strings.Join(scriptArgv(40, 120), "|")
	if got != "script|-qfec|stty rows 40 cols 120 2>/dev/null; exec sh -i|/dev/null" {
		t.Errorf("scriptArgv = %q", got)
	}
	var b bytes.Buffer
	n, err := crlfWriter{&b}.Write([]byte("a\nb\n"))
	if n != 4 || err != nil || b.String() != "a\r\nb\r\n" {
		t.Errorf("crlfWriter: %d, %v, %q", n, err, b.String())
	}
}

// TestShellOnTerminal runs "tai42 shell" with a real pseudo-terminal as
// stdin: the terminal goes raw while the shell runs (keys reach the
// session's own terminal, which echoes them), the session's terminal has
// this one's size, the exit code is the shell's, and the mode is restored.
func TestShellOnTerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script(1) (util-linux) is not installed")
	}
	d := startDaemon(t)
	id := d.create(t)
	master, slave := openPty(t)
	fd := int(slave.Fd())
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 33, Col: 101}); err != nil {
		t.Fatal(err)
	}
	before, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuffer
	c := &cli{stdin: slave, stdout: &out, stderr: &errb, lookupEnv: lookupFrom(map[string]string{
		urlEnv: d.url, tokenEnv: testToken, "TERM": "dumb"})}
	done := make(chan int, 1)
	go func() { done <- c.main([]string{"shell", id}) }()

	waitFor(t, "raw mode", func() bool {
		tio, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		return err == nil && tio.Lflag&unix.ICANON == 0
	})
	// Typed keys: a command, then one that exits. \r is Enter in raw mode.
	if _, err := master.WriteString("stty size; echo \"T=$TERM\"\r"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shell's answer", func() bool { return strings.Contains(out.String(), "T=dumb") })
	if _, err := master.WriteString("exit 3\r"); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 3 {
			t.Errorf("exit %d, want 3; stdout %q stderr %q", code, out.String(), errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the shell did not end; stdout %q", out.String())
	}
	o := out.String()
	if !strings.Contains(o, "33 101") {
		t.Errorf("the session's terminal is not 33x101: %q", o)
	}
	if !strings.Contains(o, "stty size;") {
		t.Errorf("the session's terminal did not echo the keys: %q", o)
	}
	after, _ := unix.IoctlGetTermios(fd, unix.TCGETS)
	if *after != *before {
		t.Errorf("terminal mode not restored:\n before %+v\n after  %+v", before, after)
	}
}

// noScriptSession is a session whose PATH has no script(1), as the probe
// of "tai42 shell" sees it.
type noScriptSession struct{ sandbox.Session }

func (s noScriptSession) Exec(ctx context.Context, argv []string, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if strings.Join(argv, " ") == "sh -c command -v script" {
		return sandbox.ExecResult{ExitCode: 1}, nil
	}
	return s.Session.Exec(ctx, argv, opts)
}

// TestShellOnTerminalWithoutScript: without script(1) in the session the
// shell runs as "sh -i" with no terminal, this one left in its own mode
// (which echoes and edits lines), and tai42 says so.
func TestShellOnTerminalWithoutScript(t *testing.T) {
	d := startDaemon(t)
	id := d.create(t)
	master, slave := openPty(t)
	fd := int(slave.Fd())
	before, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuffer
	c := &cli{stdin: slave, stdout: &out, stderr: &errb, lookupEnv: lookupFrom(nil)}
	cl := client.New(d.url, testToken)
	defer cl.Close()
	sess, err := cl.GetSession(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := master.WriteString("echo hi; exit 4\n"); err != nil {
		t.Fatal(err)
	}
	code := c.shell(context.Background(), &interruption{}, noScriptSession{sess}, sandbox.StartOptions{Timeout: time.Minute})
	if code != 4 || !strings.Contains(out.String(), "hi\n") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "script(1) is not in the session") {
		t.Errorf("no word of the fallback on stderr: %q", errb.String())
	}
	after, _ := unix.IoctlGetTermios(fd, unix.TCGETS)
	if *after != *before {
		t.Error("the terminal's mode changed")
	}
}
