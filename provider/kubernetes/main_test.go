package kubernetes

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tai42/sandbox/internal/escapeprobe/escapeprobetest"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

// TestMain runs the package's tests on one harness cluster (kubetest),
// then checks, with the cluster closed, that no goroutine is left.
func TestMain(m *testing.M) {
	flag.Parse()
	// The clauses wait on the cluster (a Pod scheduled, pulled, started),
	// not on the CPU: more of them at once than -parallel's default of
	// GOMAXPROCS keeps the package's run short. An explicit -parallel wins.
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", "4")
	}
	code := kubetest.Run(m)
	// The escape battery's probe binary, where a test built it.
	if err := escapeprobetest.Cleanup(); err != nil {
		fmt.Fprintf(os.Stderr, "removing the escape probe: %v\n", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(leakOptions...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var leakOptions = []goleak.Option{
	// klog's flush daemon starts with the package, not with a test.
	goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	// The cluster tests' clientset keeps its HTTP/2 connection to the
	// apiserver (the tunnel's own connections are not HTTP/2).
	goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
	// spdystream's Close hands the close error of a connection already
	// closed to nobody for 1 s, in a goroutine of its own; bounded.
	goleak.IgnoreTopFunction("github.com/moby/spdystream.(*Connection).shutdown"),
	// A stream creation in flight when its connection closed waits
	// out spdystream's 30 s reply timeout (see tunnel.dialPair).
	goleak.IgnoreTopFunction("github.com/moby/spdystream.(*Stream).WaitTimeout"),
	// The fake apiserver's port-forward server (the kubelet's code)
	// waits out its stream creation timeout for a pair whose
	// connection died half-made.
	goleak.IgnoreTopFunction("k8s.io/cri-streaming/pkg/streaming/portforward.(*httpStreamHandler).monitorStreamPair"),
	// ... and may block for good writing its error message on a stream
	// it never got to reply to (only streams the peer opened wait for
	// their own reply; the tunnel opens every stream it uses).
	goleak.IgnoreAnyFunction("github.com/moby/spdystream.(*Stream).waitWriteReply"),
	// ... and its stream handler blocks for good on a stream that
	// arrives after its connection's loop ended, which holds that
	// connection's spdystream workers (Serve, shutdown) too. These
	// are the fake server's; the tunnel's own goroutines (watch,
	// pump, readErrors, creators in this package) stay checked.
	goleak.IgnoreAnyFunction("k8s.io/cri-streaming/pkg/streaming/portforward.handleHTTPStreams.httpStreamReceived.func1"),
	goleak.IgnoreTopFunction("sync.runtime_SemacquireWaitGroup"),
	goleak.IgnoreAnyFunction("github.com/moby/spdystream.(*Connection).shutdown.func1"),
	// kubetest forks the cluster's processes from one locked thread that
	// lives as long as the test binary (their Pdeathsig follows it).
	goleak.IgnoreAnyFunction("github.com/tai42/sandbox/provider/kubernetes/kubetest.spawn.func1.1"),
}
