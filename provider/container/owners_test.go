package container_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tai42/sandbox/provider/container"
)

// TestOwners: the owners of sessions' user namespaces are handed out one
// per session, from their range, in turn; a held uid (a recovered
// session's) is not handed out, a released one is again, and when all are
// held a take fails saying so.
func TestOwners(t *testing.T) {
	var o container.Owners
	base, n := container.UserNamespaceOwnerBase, container.UserNamespaceOwners
	if o.Hold(0) || o.Hold(base-1) || o.Hold(base+n) {
		t.Error("Hold took a uid outside the owners' range")
	}
	if !o.Hold(base + 1) {
		t.Fatal("Hold refused a uid of the owners' range")
	}
	seen := map[int]bool{}
	for range n - 1 {
		uid, err := o.Take()
		if err != nil {
			t.Fatalf("take %d of %d: %v", len(seen)+1, n-1, err)
		}
		if uid < base || uid >= base+n {
			t.Fatalf("Take gave %d, outside %d-%d", uid, base, base+n-1)
		}
		if uid == base+1 || seen[uid] {
			t.Fatalf("Take gave %d, which is held", uid)
		}
		seen[uid] = true
	}
	if uid, err := o.Take(); err == nil {
		t.Fatalf("Take gave %d with every uid held", uid)
	}
	o.Release(base + 7)
	if uid, err := o.Take(); err != nil || uid != base+7 {
		t.Errorf("Take after releasing %d: %d, %v", base+7, uid, err)
	}
}

// TestCheckSubIDs: a subordinate id file that hands out any id of the
// sessions' range or of their namespaces' owners' is refused, naming the
// user and the ranges; one that hands out ids next to them is not.
func TestCheckSubIDs(t *testing.T) {
	base, end := container.UserNamespaceBase, container.UserNamespaceOwnerBase+container.UserNamespaceOwners
	for _, c := range []struct {
		line string
		bad  bool
	}{
		{fmt.Sprintf("alice:%d:%d", base-65536, 65536), false},
		{fmt.Sprintf("alice:%d:%d", end, 65536), false},
		{fmt.Sprintf("alice:%d:%d", base-1, 2), true},
		{fmt.Sprintf("alice:%d:%d", container.UserNamespaceOwnerBase+5, 1), true},
		{fmt.Sprintf("alice:%d:%d", end-1, 10), true},
		{"# alice:1000000:10", false},
	} {
		f := filepath.Join(t.TempDir(), "subuid")
		if err := os.WriteFile(f, []byte("root:100000:65536\n"+c.line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := container.CheckSubIDs(f)
		if c.bad && (err == nil || !strings.Contains(err.Error(), "alice")) {
			t.Errorf("%q: %v; want it refused, naming alice", c.line, err)
		}
		if !c.bad && err != nil {
			t.Errorf("%q: %v; want it accepted", c.line, err)
		}
	}
	if err := container.CheckSubIDs(filepath.Join(t.TempDir(), "none")); err != nil {
		t.Errorf("a missing file: %v", err)
	}
}
