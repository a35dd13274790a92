// Package imagestore keeps the images of the container provider: OCI
// images pulled from registries (see Pull) or imported from local files
// (an OCI image layout, a tar of one, or a `docker save` tarball), in a
// store directory (<state-dir>/images) where each layer is unpacked once,
// in overlayfs's format, and shared by every image that has it over the
// same layers below (see chainKeys); sessions stack an image's layers as
// their overlay's lower directories. It also
// builds the provider's built-in image "host" (see BuildHost): a
// read-only view of the host's system directories.
//
// Unpacking is safe against hostile archives: it is confined to the new
// layer's directory by os.Root, never writes through a symlink, refuses
// hard links out of the image and paths that climb out, and streams every
// file. Layer and image directories are named by digest (never by image
// name, so no ':' from a tag reaches an overlayfs mount option), and an
// image in use by a session (of any process) stays on disk, its layers
// too, until released, even when its name is replaced or removed.
package imagestore
