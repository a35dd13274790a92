package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tai42/sandbox/internal/imagestore"
)

// imageCmd is "tai42 image": the local image store of the container
// provider, in <state-dir>/images.
func (c *cli) imageCmd() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Import, list and remove the container provider's local images",
		Long: `Image manages the images sessions of the container provider can use
("--image NAME"): OCI images imported from local files into the state
directory (<state-dir>/images); no registry is ever contacted. The image
"host", a read-only view of this machine's system directories, is built in
and cannot be imported, listed or removed.

Names are registry references without a digest, [REGISTRY/]PATH[:TAG]; a
name without a tag means ":latest", and docker.io/library/ may be left
out, as with docker ("busybox" is "busybox:latest").

The state directory is --state-dir, else $TAI42_STATE_DIR, else
$XDG_STATE_HOME/tai42, else ~/.local/state/tai42: the one "tai42 serve" and
"tai42 run" use. The store may be changed while a daemon uses it; an image
a session uses stays until the session ends.`,
		Example: `  docker save busybox:1.36 -o busybox.tar && tai42 image import busybox.tar
  skopeo copy docker://alpine:3 oci:alpine-oci && tai42 image import alpine-oci --name alpine:3
  tai42 image ls
  tai42 image rm busybox:1.36`,
		Args: cobra.NoArgs, // an unknown subcommand is a usage error
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&stateDir, "state-dir", "", "state directory holding the images (default: $"+stateDirEnv+", else $XDG_STATE_HOME/tai42, else ~/.local/state/tai42)")
	open := func() (*imagestore.Store, error) {
		dir, err := resolveStateDir(stateDir, c.lookupEnv)
		if err != nil {
			return nil, &exitError{code: exitUsage, err: err}
		}
		s, err := imagestore.Open(filepath.Join(dir, imagestore.DirName))
		if err != nil {
			return nil, &exitError{code: exitFailure, err: err}
		}
		return s, nil
	}
	cmd.AddCommand(c.imageImportCmd(open), c.imageLsCmd(open), c.imageRmCmd(open))
	return cmd
}

// imageJSON is an image as "tai42 image" prints it with --json. The
// config's environment is left out: an image's ENV may carry credentials.
type imageJSON struct {
	Name       string    `json:"name"`
	ID         string    `json:"id"`
	Size       int64     `json:"size"`
	Imported   time.Time `json:"imported"`
	WorkingDir string    `json:"working_dir,omitempty"`
	Rootfs     string    `json:"rootfs"`
}

func toImageJSON(img imagestore.Image) imageJSON {
	return imageJSON{Name: img.Name, ID: img.ID, Size: img.Size, Imported: img.Pulled, WorkingDir: img.WorkingDir, Rootfs: singleLayer(img)}
}

// singleLayer is the layer of a one-layer image, "" for another.
func singleLayer(img imagestore.Image) string {
	if len(img.Layers) == 1 {
		return img.Layers[0]
	}
	return ""
}

// imageErr maps a store error to the command's exit: 2 for what the user
// gave (an invalid name, a missing or unusable file), 1 for the rest.
func imageErr(err error) error {
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee
	case errors.Is(err, imagestore.ErrInvalidName), errors.Is(err, imagestore.ErrInvalidImage), errors.Is(err, fs.ErrNotExist):
		return &exitError{code: exitUsage, err: err}
	}
	return &exitError{code: exitFailure, err: err}
}

// imageImportCmd is "tai42 image import FILE [--name NAME]".
func (c *cli) imageImportCmd(open func() (*imagestore.Store, error)) *cobra.Command {
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

Exit codes: 0 imported; 2 for an invalid name, a missing FILE or one that
is not a usable image; 1 for another failure (e.g. disk full).`,
		Example: `  tai42 image import busybox.tar
  tai42 image import ./alpine-oci --name alpine:3
  tai42 image import images.tar.gz --name tools/linter:1.2 --json`,
		Args: exactArgs(1, "image import: name the file to import, e.g. tai42 image import busybox.tar"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := open()
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
				return writeJSON(cmd.OutOrStdout(), toImageJSON(img))
			}
			return writeLines(cmd.OutOrStdout(), img.Name)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "import the image under this `NAME` (default: its own name); with several images in FILE, the one to import")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the imported image as JSON instead of its name")
	return cmd
}

// imageLsCmd is "tai42 image ls".
func (c *cli) imageLsCmd(open func() (*imagestore.Store, error)) *cobra.Command {
	var asJSON, quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the imported images",
		Long: `Ls lists the imported images by name as a table: NAME, ID (the config
digest, shortened), SIZE (on disk, unpacked) and IMPORTED (relative to
now). --json prints a JSON array of {name, id, size (bytes), imported,
working_dir, rootfs} instead ([] when there is none); -q the names alone.`,
		Example: `  tai42 image ls
  tai42 image ls --json | jq -r '.[] | select(.size > 1e9) | .name'
  tai42 image rm $(tai42 image ls -q)   # remove every image`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := open()
			if err != nil {
				return err
			}
			imgs, err := s.List()
			if err != nil {
				return imageErr(err)
			}
			out := cmd.OutOrStdout()
			switch {
			case asJSON:
				js := make([]imageJSON, len(imgs))
				for i, img := range imgs {
					js[i] = toImageJSON(img)
				}
				return writeJSON(out, js)
			case quiet:
				names := make([]string, len(imgs))
				for i, img := range imgs {
					names[i] = img.Name
				}
				return writeLines(out, names...)
			}
			return writeImageTable(out, imgs, time.Now())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of the images")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the names, one per line")
	return cmd
}

// writeImageTable writes imgs as the table of "tai42 image ls", import
// times relative to now; a header alone when there is none.
func writeImageTable(w io.Writer, imgs []imagestore.Image, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	_, _ = io.WriteString(tw, "NAME\tID\tSIZE\tIMPORTED\n")
	for _, img := range imgs {
		_, _ = io.WriteString(tw, img.Name+"\t"+shortImageID(img.ID)+"\t"+humanBytes(img.Size)+"\t"+relativeTime(img.Pulled, now)+"\n")
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
func (c *cli) imageRmCmd(open func() (*imagestore.Store, error)) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove"},
		Short:   "Remove imported images",
		Long: `Rm removes each image named, and its files. An image a running session
uses is refused (remove it once the session ends); a name the store does
not hold is an error. Either is reported per name, and the other images
are still removed. It prints nothing.

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
		RunE: func(_ *cobra.Command, args []string) error {
			s, err := open()
			if err != nil {
				return err
			}
			var errs []error
			code := exitOK
			for _, name := range args {
				if err := s.Remove(name); err != nil {
					errs = append(errs, err)
					code = max(code, imageErr(err).(*exitError).code)
				}
			}
			if len(errs) == 0 {
				return nil
			}
			return &exitError{code: code, err: errors.Join(errs...)}
		},
	}
	return cmd
}
