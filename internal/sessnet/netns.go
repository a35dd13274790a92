package sessnet

import (
	"fmt"
	"os"

	"github.com/tai42/sandbox/internal/netns"

	"golang.org/x/sys/unix"
)

// nsID identifies a network namespace (the nsfs inode).
type nsID struct{ dev, ino uint64 }

func nsIDOf(f *os.File) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nsID{}, fmt.Errorf("stat of network namespace: %w", err)
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// threadNS reports the network namespace of the calling thread, which must
// be locked to its goroutine.
func threadNS() (nsID, error) {
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nsID{}, err
	}
	defer f.Close()
	return nsIDOf(f)
}

// nsOptions make a session's namespace: a rtnetlink socket inside it to
// add its veth without a thread switch, and IPv6 off for that veth.
var nsOptions = netns.Options{Netlink: true, NoIPv6: true}
