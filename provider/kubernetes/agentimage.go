package kubernetes

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// AgentPath is where the agent image holds the agent binary, and its
// entrypoint: the init container runs it to copy itself into the Pod.
const AgentPath = "/tai42"

// agentEpoch dates the layer's entry and the config, so the image (and
// its digest) depends on the binary alone: the same build pushes the same
// image.
var agentEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// AgentImage is the agent image of the executable at binary: one layer
// holding AgentPath (mode 0755, owned by root), Entrypoint [AgentPath],
// platform linux/GOARCH. binary must be a static tai42 (CGO_ENABLED=0):
// the image has no libc, and the agent runs in any session image.
func AgentImage(binary string) (v1.Image, error) {
	st, err := os.Stat(binary)
	if err != nil {
		return nil, fmt.Errorf("agent image: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("agent image: %s is not a regular file", binary)
	}
	// The layer is read from the file each time it is asked for (digest,
	// then upload): the tar is not kept in memory.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return agentLayerTar(binary) })
	if err != nil {
		return nil, fmt.Errorf("agent image: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("agent image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("agent image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: agentEpoch}
	cf.Config.Entrypoint = []string{AgentPath}
	cf.Config.Cmd = nil
	cf.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cf)
}

// agentLayerTar is the layer's uncompressed tar: the one file AgentPath
// with binary's content, streamed through a pipe.
func agentLayerTar(binary string) (io.ReadCloser, error) {
	f, err := os.Open(binary)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		defer f.Close()
		tw := tar.NewWriter(pw)
		h := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     AgentPath[1:],
			Mode:     0o755,
			Size:     st.Size(),
			ModTime:  agentEpoch,
			Format:   tar.FormatPAX,
		}
		err := tw.WriteHeader(h)
		if err == nil {
			var n int64
			n, err = io.Copy(tw, f)
			if err == nil && n != st.Size() {
				err = fmt.Errorf("%s changed size while being read (%d of %d bytes)", binary, n, st.Size())
			}
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// PushAgentImage pushes the agent image of binary to ref (a tag or
// digest reference). opts are go-containerregistry's (auth, transport);
// a registry on loopback is reached over plain HTTP (go-containerregistry
// picks http for loopback and private addresses).
func PushAgentImage(ctx context.Context, ref, binary string, opts ...remote.Option) error {
	nr, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("agent image reference %q: %w", ref, err)
	}
	img, err := AgentImage(binary)
	if err != nil {
		return err
	}
	opts = append([]remote.Option{remote.WithContext(ctx)}, opts...)
	if err := remote.Write(nr, img, opts...); err != nil {
		return fmt.Errorf("pushing the agent image to %s: %w", nr, err)
	}
	return nil
}
