package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/internal/imagestore"
)

// imageCmd is "tai42 image": the container provider's images, in the
// local store (<state-dir>/images) or, with a daemon named, the daemon's.
func (c *cli) imageCmd() *cobra.Command {
	t := &imageTarget{}
	cmd := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images"},
		Short:   "Pull, import, list and remove the container provider's images",
		Long: `Image manages the images sessions of the container provider can use
("--image NAME"): pulled from registries by reference, or imported from
local files. Layers are stored once, each shared by every image that has
it. The image "host", a read-only view of this machine's system
directories, is built in and cannot be pulled, imported, listed or
removed.

References are those docker takes: [REGISTRY/]PATH[:TAG][@DIGEST]; a
reference without a tag means ":latest", and Docker Hub's docker.io/library/
may be left out ("python:3.12-slim"). A registry's credentials come from
the docker config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json:
its auths and credential helpers), never from a flag.

Pull, ls, rm and prune act on the daemon's store when one is named
($TAI42_URL or --url, with $TAI42_TOKEN or --token, as for "tai42 run"),
else on the local store in the state directory: --state-dir, else
$TAI42_STATE_DIR, else $XDG_STATE_HOME/tai42, else ~/.local/state/tai42, the
one "tai42 serve" and "tai42 run" use. Import always writes the local store
(a daemon on this machine with the same state directory sees the image at
once). The store may be changed while a daemon uses it; an image a session
uses stays until the session ends.`,
		Example: `  tai42 image pull python:3.12-slim
  tai42 image pull --insecure-registry localhost:5000 localhost:5000/tools/linter:1.2
  docker save busybox:1.36 -o busybox.tar && tai42 image import busybox.tar
  tai42 image ls
  tai42 image rm busybox:1.36 && tai42 image prune`,
		Args: cobra.NoArgs, // an unknown subcommand is a usage error
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&t.stateDir, "state-dir", "", "state directory holding the local store (default: $"+stateDirEnv+", else $XDG_STATE_HOME/tai42, else ~/.local/state/tai42)")
	cmd.AddCommand(c.imageImportCmd(t), c.imagePullCmd(t), c.imageLsCmd(t), c.imageRmCmd(t), c.imagePruneCmd(t))
	return cmd
}

// imageTarget is where "tai42 image" acts: the local store of stateDir, or
// the daemon rf names.
type imageTarget struct {
	stateDir string
	rf       remoteFlags
}

// openStore opens the local store.
func (c *cli) openStore(t *imageTarget) (*imagestore.Store, error) {
	dir, err := resolveStateDir(t.stateDir, c.lookupEnv)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	s, err := imagestore.Open(filepath.Join(dir, imagestore.DirName))
	if err != nil {
		return nil, &exitError{code: exitFailure, err: err}
	}
	return s, nil
}

// localOnlyImageFlags are the flags of "tai42 image" that shape the local
// store's pulls: a daemon has its own.
var localOnlyImageFlags = []string{"state-dir", "registry-mirror", "insecure-registry", "registries"}

// imageCall runs fn on the images of t, under a context a signal cancels:
// the daemon's when one is named (--state-dir and the registry flags are
// then usage errors), else the local store's, pulling with reg. fn's error
// is mapped to the command's exit by imageErr, explained for a daemon.
func (c *cli) imageCall(cmd *cobra.Command, t *imageTarget, reg imagestore.RegistryOptions, fn func(ctx context.Context, im sandbox.ImageManager) error) error {
	r, ok, err := c.resolveRemote(t.rf)
	if err != nil {
		return &exitError{code: errorExitCode(err), err: err}
	}
	var im sandbox.ImageManager
	if ok {
		for _, name := range localOnlyImageFlags {
			if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
				return &exitError{code: exitUsage, err: fmt.Errorf("--%s does not apply to a daemon (%s names one): its store and how it reaches registries are set by `tai42 serve`; for the local store, leave --url out and set %s empty", name, r.urlFrom, urlEnv)}
			}
		}
		cl, err := c.dial(r)
		if err != nil {
			return &exitError{code: errorExitCode(err), err: err}
		}
		defer cl.Close()
		var sb sandbox.Sandbox = cl
		if im, ok = sb.(sandbox.ImageManager); !ok {
			return &exitError{code: exitFailure, err: errors.New("this build of tai42 cannot manage a daemon's images (its client has no image calls): use the local store, leaving --url and " + urlEnv + " unset")}
		}
	} else {
		s, err := c.openStore(t)
		if err != nil {
			return err
		}
		im = imagestore.Manager{Store: s, Registry: reg}
	}
	ctx, in, stop := c.interruptible()
	defer stop()
	err = fn(ctx, im)
	if err == nil {
		return nil
	}
	if code, ok := in.code(); ok {
		return &exitError{code: code}
	}
	return imageErr(c.routeErr(c.explain(err), "image"))
}

// imageErr maps an image error to the command's exit: 2 for what the user
// gave (an invalid name or reference, a missing or unusable file), 1 for
// the rest.
func imageErr(err error) error {
	var ee *exitError
	var ue *usageError
	var pe *sandbox.ImagePullError
	switch {
	case errors.As(err, &ee):
		return ee
	case errors.As(err, &pe):
		if pe.Reason == sandbox.PullInvalidReference {
			return &exitError{code: exitUsage, err: err}
		}
		return &exitError{code: exitFailure, err: err}
	case errors.As(err, &ue), errors.Is(err, imagestore.ErrInvalidName), errors.Is(err, imagestore.ErrInvalidImage), errors.Is(err, fs.ErrNotExist):
		return &exitError{code: exitUsage, err: err}
	}
	return &exitError{code: exitFailure, err: err}
}

// imageImportCmd is "tai42 image import FILE [--name NAME]".
func (c *cli) imageImportCmd(t *imageTarget) *cobra.Command {
	var name string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "import FILE [--name NAME]",
		Short: "Import an image from an OCI layout or a docker save tarball",
		Long: `Import unpacks the image in FILE into the store and prints its name.
FILE is an OCI image layout directory, a tar of one, or a "docker save"
tarball (either tar may be gzip-compressed); the format is told from the
content.

Without --name the image keeps its own name: a docker save tarball's repo
tag, an OCI layout's org.opencontainers.image.ref.name (or
io.containerd.image.name) annotation. A FILE holding several images needs
--name to choose one (the error lists them); a FILE holding one image is
imported under --name whatever its own name. Importing a name that exists
replaces that image; sessions using the old one keep it until they end.
It writes the local store, with a daemon named or not. --json prints the
image as "tai42 image ls --json" lists it.

Exit codes: 0 imported; 2 for an invalid name, a missing FILE or one that
is not a usable image; 1 for another failure (e.g. disk full).`,
		Example: `  tai42 image import busybox.tar
  tai42 image import ./alpine-oci --name alpine:3
  tai42 image import images.tar.gz --name tools/linter:1.2 --json`,
		Args: exactArgs(1, "image import: name the file to import, e.g. tai42 image import busybox.tar"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := c.openStore(t)
			if err != nil {
				return err
			}
			ctx, in, stop := c.interruptible()
			defer stop()
			img, err := s.Import(ctx, args[0], name)
			if err != nil {
				if code, ok := in.code(); ok {
					return &exitError{code: code}
				}
				if errors.Is(err, imagestore.ErrNeedName) {
					err = fmt.Errorf("%w (with --name NAME)", err)
				}
				return imageErr(err)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), imagestore.Info(img))
			}
			return writeLines(cmd.OutOrStdout(), img.Name)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "import the image under this `NAME` (default: its own name); with several images in FILE, the one to import")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the imported image as JSON instead of its name")
	return cmd
}

// imagePullCmd is "tai42 image pull REF".
func (c *cli) imagePullCmd(t *imageTarget) *cobra.Command {
	var f imageFlags
	var platform string
	var quiet, asJSON bool
	cmd := &cobra.Command{
		Use:   "pull REF [--platform OS/ARCH[/VARIANT]]",
		Short: "Pull an image from its registry",
		Long: `Pull fetches the image REF from its registry into the store, fetching
and unpacking only the layers the store does not hold yet, and prints its
name (what --image takes). A multi-platform image resolves to this
machine's platform (linux/` + runtime.GOARCH + `), or to --platform's.

On a terminal it draws a bar per layer on stderr (bytes fetched, speed);
on another stderr it prints a line per layer once held, then a summary.
--quiet prints the name alone; --json prints each event as a JSON object
on a line of its own ({ref, status, layer, done, total, digest}; status
resolved, exists, fetching, done or complete), then the image as "tai42
image ls --json" lists it, the one line without a "status".

Registries are reached over HTTPS, verifying their certificates, with the
docker config's credentials; --insecure-registry HOST[:PORT] allows plain
HTTP or an unverified certificate for that registry alone. Images of
Docker Hub are tried on each --registry-mirror first. Both are also
$TAI42_REGISTRY_MIRROR and $TAI42_INSECURE_REGISTRY (comma-separated) and
the [registry] mirrors and insecure keys of the config file $TAI42_CONFIG
names. With a daemon named, the daemon pulls, with its own settings.

Exit codes: 0 pulled; 2 for an invalid reference or flag; 1 for another
failure (no such image, refused credentials, no image for the platform, an
unreachable registry, a full disk), the message naming the cause; 130 on
SIGINT (nothing partial is kept).`,
		Example: `  tai42 image pull python:3.12-slim
  tai42 image pull ghcr.io/o/r:tag --platform linux/arm64
  tai42 image pull --insecure-registry localhost:5000 localhost:5000/python:3.12-slim
  tai42 image pull -q localhost:5000/python@sha256:<digest> --insecure-registry localhost:5000
  tai42 image pull --json busybox:1.36 | jq -c 'select(.status == "done")'`,
		Args: exactArgs(1, "image pull: name the image to pull, e.g. tai42 image pull python:3.12-slim"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if quiet && asJSON {
				return &exitError{code: exitUsage, err: errors.New("image pull: give --quiet or --json, not both")}
			}
			if err := validPlatform(platform); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			cfg, err := resolveImageSettings(cmd.Flags(), &f, c.lookupEnv)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			return c.imageCall(cmd, t, cfg.registry, func(ctx context.Context, im sandbox.ImageManager) error {
				r := newPullRenderer(asJSON, quiet, cmd.OutOrStdout(), c.stderr)
				info, err := im.PullImage(ctx, args[0], sandbox.PullOptions{Platform: platform, Progress: r.event})
				if err != nil && ctx.Err() == nil {
					err = c.insecureHint(err, args[0], cfg.registry.Insecure)
				}
				return r.finish(info, err)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&platform, "platform", "", "the platform to take from a multi-platform image, `OS/ARCH[/VARIANT]` (default: linux/"+runtime.GOARCH+")")
	fl.BoolVarP(&quiet, "quiet", "q", false, "print only the image's name")
	fl.BoolVar(&asJSON, "json", false, "print each event, then the image, as a JSON object per line")
	addRegistryFlags(fl, &f)
	addRemoteFlags(fl, &t.rf)
	return cmd
}

// validPlatform checks --platform: OS/ARCH[/VARIANT], or empty.
func validPlatform(p string) error {
	if p == "" {
		return nil
	}
	parts := strings.Split(p, "/")
	if len(parts) < 2 || len(parts) > 3 || slices.Contains(parts, "") {
		return fmt.Errorf("--platform %q: want OS/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm64/v8", p)
	}
	return nil
}

// insecureHint adds to a pull's error what to do when the registry may
// speak plain HTTP or show a certificate this machine does not trust and
// is not an insecure registry already: the error alone names TLS, not the
// setting.
func (c *cli) insecureHint(err error, ref string, insecure []string) error {
	msg := err.Error()
	if strings.Contains(msg, "insecure") {
		return err // the error says it already
	}
	tlsTrouble := strings.Contains(msg, "HTTP response to HTTPS client") || strings.Contains(msg, "certificate") ||
		strings.Contains(msg, "tls: ") || strings.Contains(msg, "x509: ")
	host := registryOf(ref)
	if !tlsTrouble || host == "" || slices.Contains(insecure, host) {
		return err
	}
	if c.remote != nil {
		return fmt.Errorf("%w (if %s serves plain HTTP or a certificate the daemon does not trust and you trust it, start the daemon with --insecure-registry %s)", err, host, host)
	}
	return fmt.Errorf("%w (if %s serves plain HTTP or a certificate this machine does not trust and you trust it, add --insecure-registry %s)", err, host, host)
}

// registryOf is the registry host of ref, "" when it does not parse.
func registryOf(ref string) string {
	r, err := name.ParseReference(ref)
	if err != nil {
		return ""
	}
	return r.Context().RegistryStr()
}

// imageLsCmd is "tai42 image ls".
func (c *cli) imageLsCmd(t *imageTarget) *cobra.Command {
	var asJSON, quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the images",
		Long: `Ls lists the images by name as a table: NAME, DIGEST (the manifest digest
it was pulled by, shortened; "-" for an import without one), PLATFORM,
SIZE (its layers on disk, unpacked), SHARED (the part of SIZE in layers
other images use too; the rest is its own) and PULLED (when it was pulled
or imported, relative to now). --json prints a JSON array of {name, id,
digest, platform, size, shared_size, layers, pulled} instead (sizes in
bytes; [] when there is none); -q the names alone. With a daemon named,
its images.`,
		Example: `  tai42 image ls
  tai42 image ls --json | jq -r '.[] | select(.size - .shared_size > 1e9) | .name'
  tai42 image rm $(tai42 image ls -q)   # remove every image`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.imageCall(cmd, t, imagestore.RegistryOptions{}, func(ctx context.Context, im sandbox.ImageManager) error {
				infos, err := im.ListImages(ctx)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				switch {
				case asJSON:
					if infos == nil {
						infos = []sandbox.ImageInfo{}
					}
					return writeJSON(out, infos)
				case quiet:
					names := make([]string, len(infos))
					for i, in := range infos {
						names[i] = in.Name
					}
					return writeLines(out, names...)
				}
				return writeImageTable(out, infos, time.Now())
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of the images")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the names, one per line")
	addRemoteFlags(cmd.Flags(), &t.rf)
	return cmd
}

// writeImageTable writes infos as the table of "tai42 image ls", times
// relative to now; a header alone when there is none.
func writeImageTable(w io.Writer, infos []sandbox.ImageInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	_, _ = io.WriteString(tw, "NAME\tDIGEST\tPLATFORM\tSIZE\tSHARED\tPULLED\n")
	for _, in := range infos {
		_, _ = io.WriteString(tw, in.Name+"\t"+orDash(shortImageID(in.Digest))+"\t"+orDash(in.Platform)+"\t"+
			humanBytes(in.Size)+"\t"+humanBytes(in.SharedSize)+"\t"+relativeTime(in.Pulled, now)+"\n")
	}
	return outputErr(tw.Flush())
}

// shortImageID shortens "sha256:<64 hex>" to its algorithm and first 12
// hex digits, as docker shows image IDs.
func shortImageID(id string) string {
	alg, hex, ok := strings.Cut(id, ":")
	if !ok || len(hex) <= 12 {
		return id
	}
	return alg + ":" + hex[:12]
}

// humanBytes prints a size in decimal units with three significant
// digits: "512B", "1.98MB", "43.2MB", "1.07GB".
func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v := float64(n)
	for _, u := range []string{"kB", "MB", "GB", "TB", "PB"} {
		v /= unit
		if v < unit || u == "PB" {
			switch {
			case v < 10:
				return fmt.Sprintf("%.2f%s", v, u)
			case v < 100:
				return fmt.Sprintf("%.1f%s", v, u)
			}
			return fmt.Sprintf("%.0f%s", v, u)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// imageRmCmd is "tai42 image rm NAME...".
func (c *cli) imageRmCmd(t *imageTarget) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove"},
		Short:   "Remove images",
		Long: `Rm removes each image named, and the layers no other image uses. An
image a running session uses is refused (remove it once the session
ends); a name the store does not hold is an error. Either is reported per
name, and the other images are still removed. It prints nothing. With a
daemon named, its images.

Exit codes: 0 all removed; 1 when one was missing, in use or failed; 2 for
an invalid name.`,
		Example: `  tai42 image rm busybox:1.36
  tai42 image rm $(tai42 image ls -q)   # remove every image`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("image rm: name the images to remove, e.g. tai42 image rm busybox:latest")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.imageCall(cmd, t, imagestore.RegistryOptions{}, func(ctx context.Context, im sandbox.ImageManager) error {
				var errs []error
				code := exitOK
				for _, n := range args {
					err := im.RemoveImage(ctx, n)
					if err == nil {
						continue
					}
					var op *net.OpError
					var te *api.TransportError
					if ctx.Err() != nil || errors.As(err, &op) || errors.As(err, &te) {
						// Interrupted, no daemon to try the others on, or the
						// daemon refused the request itself (a token, a route).
						return err
					}
					errs = append(errs, err)
					code = max(code, imageErr(err).(*exitError).code)
				}
				if len(errs) == 0 {
					return nil
				}
				return &exitError{code: code, err: errors.Join(errs...)}
			})
		},
	}
	addRemoteFlags(cmd.Flags(), &t.rf)
	return cmd
}

// imagePruneCmd is "tai42 image prune".
func (c *cli) imagePruneCmd(t *imageTarget) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove the layers no image uses",
		Long: `Prune removes the layers no image uses: left by an interrupted pull, or
by images removed or replaced while a session used them. Layers of a pull
in progress, and of an image a session runs, are kept. It prints the
number of layers removed and the bytes freed; --json prints {layers,
bytes}. With a daemon named, its store.`,
		Example: `  tai42 image prune
  tai42 image rm busybox:1.36 && tai42 image prune --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.imageCall(cmd, t, imagestore.RegistryOptions{}, func(ctx context.Context, im sandbox.ImageManager) error {
				res, err := im.PruneImages(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), res)
				}
				return writeLines(cmd.OutOrStdout(), fmt.Sprintf("removed %d layer(s), freed %s", res.Layers, humanBytes(res.Bytes)))
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {layers, bytes} as JSON")
	addRemoteFlags(cmd.Flags(), &t.rf)
	return cmd
}
