package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"

	"github.com/dustin/go-humanize"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"
	"github.com/tai42/sandbox/internal/imagestore"
	"github.com/tai42/sandbox/provider/kubernetes"
)

// agentImageCmd is "tai42 agent-image": the kubernetes provider's agent
// image.
func (c *cli) agentImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent-image",
		Short: "Push this tai42 as the kubernetes provider's agent image",
		Long: `Agent-image manages the image the kubernetes provider's session Pods copy
the agent from (tai42 serve --provider kubernetes --agent-image REF): one
layer holding this tai42 binary as /tai42, its entrypoint. A session Pod's
init container runs it to copy the agent into the Pod, where it is the
session container's PID 1, whatever the session's image.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.agentImagePushCmd())
	return cmd
}

// agentImagePushCmd is "tai42 agent-image push REF".
func (c *cli) agentImagePushCmd() *cobra.Command {
	var f imageFlags
	cmd := &cobra.Command{
		Use:   "push REF [--insecure-registry HOST[:PORT]]",
		Short: "Push the running tai42 as the agent image to REF",
		Long: `Push builds the agent image of the running executable (this tai42) and
pushes it to REF, a registry the cluster's nodes pull from, then prints
REF pinned by digest (REPO@sha256:...), what --agent-image takes. The same
build always makes the same image (the same digest).

The binary must be static (CGO_ENABLED=0 go build ./cmd/tai42): the agent
runs in every session's image, which may have no C library; a
dynamically linked tai42 is refused, saying so.

Registries are reached as "tai42 image pull" reaches them: over HTTPS,
verifying the certificate, with the docker config's credentials
($DOCKER_CONFIG/config.json, else ~/.docker/config.json);
--insecure-registry HOST[:PORT] allows plain HTTP or an unverified
certificate for that registry alone (also $TAI42_INSECURE_REGISTRY and the
[registry] insecure key of the config file $TAI42_CONFIG names).

Exit codes: 0 pushed; 2 for an invalid reference or flag, or a binary that
is not static; 1 for another failure (refused credentials, an unreachable
registry), the message naming the cause; 130 on SIGINT.`,
		Example: `  CGO_ENABLED=0 go build -o tai42 ./cmd/tai42
  ./tai42 agent-image push registry.example:5000/tai42-agent:1
  ./tai42 agent-image push --insecure-registry 127.0.0.1:5000 127.0.0.1:5000/tai42-agent:dev
  tai42 serve --provider kubernetes --agent-image "$(./tai42 agent-image push 127.0.0.1:5000/tai42-agent:dev --insecure-registry 127.0.0.1:5000)"`,
		Args: exactArgs(1, "agent-image push: name the reference to push to, e.g. tai42 agent-image push registry.example:5000/tai42-agent:1"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := resolveImageSettings(cmd.Flags(), &f, c.lookupEnv)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			return c.pushAgentImage(cmd, args[0], cfg.registry.Insecure)
		},
	}
	cmd.Flags().StringSliceVar(&f.insecure, "insecure-registry", nil, "a registry `HOST[:PORT]` reached over plain HTTP, or over TLS without verifying its certificate; repeatable (default: none)")
	return cmd
}

// pushAgentImage pushes the running executable's agent image to ref and
// prints ref pinned by its digest.
func (c *cli) pushAgentImage(cmd *cobra.Command, ref string, insecure []string) error {
	bin, err := c.executable()
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("agent-image push: finding this executable: %w", err)}
	}
	if err := checkStatic(bin); err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	rt, isInsecure, done, err := imagestore.Transport(imagestore.RegistryOptions{Insecure: insecure})
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	defer done()
	r, err := name.ParseReference(ref)
	if err == nil && isInsecure(r.Context().RegistryStr()) {
		// Plain HTTP to a registry that is not on loopback needs the
		// reference to say so (go-containerregistry tries only HTTPS).
		r, err = name.ParseReference(ref, name.Insecure)
	}
	if err != nil {
		return &exitError{code: exitUsage, err: fmt.Errorf("agent-image push: %q is not an image reference: %w", ref, err)}
	}
	img, err := kubernetes.AgentImage(bin)
	if err != nil {
		return &exitError{code: exitFailure, err: err}
	}
	digest, err := img.Digest()
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("agent image: %w", err)}
	}
	ctx, in, stop := c.interruptible()
	defer stop()
	err = ggcrremote.Write(r, img, ggcrremote.WithContext(ctx), ggcrremote.WithAuthFromKeychain(authn.DefaultKeychain), ggcrremote.WithTransport(rt))
	if err != nil {
		if code, ok := in.code(); ok {
			return &exitError{code: code}
		}
		return &exitError{code: exitFailure, err: c.insecureHint(fmt.Errorf("pushing the agent image to %s: %w", r, err), ref, insecure)}
	}
	size := ""
	if st, err := os.Stat(bin); err == nil {
		size = " (" + humanize.IBytes(uint64(st.Size())) + ")"
	}
	fmt.Fprintf(c.stderr, "tai42: pushed the agent image of %s%s to %s\n", bin, size, r)
	return writeLines(cmd.OutOrStdout(), r.Context().Digest(digest.String()).String())
}

// executable is the running tai42's path (a test's own, in tests).
func (c *cli) executable() (string, error) {
	if c.exe != "" {
		return c.exe, nil
	}
	return os.Executable()
}

// checkStatic refuses a binary that needs a dynamic loader: the agent
// image has none, and the session's image may have none either.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("agent-image push: %s is not an ELF executable: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("agent-image push: this tai42 (" + bin + ") is dynamically linked (built with cgo): the agent runs in every session's image, which may have no C library; push a static build: CGO_ENABLED=0 go build -o tai42 ./cmd/tai42 && ./tai42 agent-image push REF")
		}
	}
	return nil
}
