package sandboxtest_test

import (
	"testing"

	"github.com/tai42/sandbox/sandboxtest"
)

// Every Linux machine's /etc/passwd has root (0:0); a name nobody gives a
// user has no entry.
func TestHostUser(t *testing.T) {
	root := sandboxtest.HostUser("root")
	if root == nil || root.Name != "root" || root.UID != 0 || root.GID != 0 || root.Home == "" {
		t.Errorf("HostUser(root) = %+v, want root, 0, 0 and its home", root)
	}
	if u := sandboxtest.HostUser("tai42-no-such-user"); u != nil {
		t.Errorf("HostUser of a user the machine does not have = %+v, want nil", u)
	}
}
