package server

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestListenUnixNeverWider: while Listen makes the socket, whoever watches
// the path only ever sees mode 0600; nothing is left beside it; the
// listener's address is the path; Close removes the socket, but not a file
// that replaced it.
func TestListenUnixNeverWider(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tai42.sock")

	var wider atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 && fi.Mode().Perm() != 0o600 {
				wider.Store(fi.Mode())
			}
		}
	})
	for range 50 {
		ln, err := Listen("unix:" + path)
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
	}
	close(stop)
	wg.Wait()
	if m := wider.Load(); m != nil {
		t.Fatalf("the socket was seen with mode %v", m)
	}

	ln, err := Listen("unix:" + path)
	if err != nil {
		t.Fatal(err)
	}
	if a := ln.Addr(); a.Network() != "unix" || a.String() != path {
		t.Errorf("address %s %s", a.Network(), a)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "tai42.sock" {
		t.Errorf("beside the socket: %v", ents)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		t.Fatalf("dial the socket: %v", err)
	}
	c.Close()
	<-done
	if err := ln.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket is left after Close: %v", err)
	}

	// A file that took the path since is not the listener's to remove.
	ln, err = Listen("unix:" + path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("other"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if b, err := os.ReadFile(path); err != nil || string(b) != "other" {
		t.Errorf("Close removed another file: %q %v", b, err)
	}
	if _, err := Listen("unix:" + path); err == nil {
		t.Errorf("Listen over a regular file succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("a failed Listen left %v", ents)
	}
}
