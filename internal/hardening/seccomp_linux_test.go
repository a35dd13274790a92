package hardening

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The profile's numbers are written out so that the package builds
// anywhere; here they meet the kernel's headers.
func TestSeccompConstants(t *testing.T) {
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"EPERM", errnoEPERM, uint64(unix.EPERM)},
		{"ENOSYS", errnoENOSYS, uint64(unix.ENOSYS)},
		{"AF_UNIX", afUNIX, unix.AF_UNIX},
		{"AF_INET", afINET, unix.AF_INET},
		{"AF_INET6", afINET6, unix.AF_INET6},
		{"AF_NETLINK", afNETLINK, unix.AF_NETLINK},
		{"namespace flags", cloneNamespaceFlags, unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
			unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}
