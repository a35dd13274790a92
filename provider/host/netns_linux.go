package host

import (
	"os"

	"github.com/tai42/sandbox/internal/netns"
	"github.com/tai42/sandbox/internal/nsthread"
)

// probeNetns opens the host's network namespace and proves a new one can be
// made here; the error says why not.
//
// The host's namespace is read from a thread of our own, locked while it
// reads: /proc/self names the main thread, which may at that moment be
// running another sandbox's namespace setup, and recording that throwaway
// namespace as the host's would later send threads back into it.
func probeNetns() (*os.File, error) {
	var host *os.File
	err := nsthread.Locked(func() (bool, error) {
		var err error
		host, err = os.Open("/proc/thread-self/ns/net")
		return false, err
	})
	if err != nil {
		return nil, err
	}
	ns, err := netns.New(netnsOptions)
	if err != nil {
		host.Close()
		return nil, err
	}
	ns.Close()
	return host, nil
}

// netnsOptions make a session's network "none": loopback alone, nothing
// to configure afterwards.
var netnsOptions = netns.Options{}
