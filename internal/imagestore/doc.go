// Package imagestore keeps the images of the container provider: OCI
// images imported from local files (an OCI image layout, a tar of one, or
// a `docker save` tarball) and unpacked, flattened, into a store
// directory (<state-dir>/images), for sessions to use as their overlay's
// lower layer; no registry is ever contacted. It also builds the
// provider's built-in image "host" (see BuildHost): a read-only view of
// the host's system directories.
//
// Unpacking is safe against hostile archives: it is confined to the new
// image's directory by os.Root, never writes through a symlink, refuses
// hard links out of the image and paths that climb out, skips device
// nodes, and streams every file. Image directories are named by image ID
// (never by image name, so no ':' from a tag reaches an overlayfs mount
// option), and an image in use by a session (of any process) stays on
// disk until released, even when its name is replaced or removed.
package imagestore
