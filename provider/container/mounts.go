package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountOverlay mounts the session's root at target: lowers read-only
// (lowest first, as an image lists its layers), writes going to upper.
//
// It uses the new mount API (fsopen, fsconfig, fsmount, move_mount) and
// hands overlayfs one "lowerdir+" per layer, so that an image of many
// layers never meets the page-sized limit of mount(2)'s option string,
// and a layer's path needs no escaping. overlayfs stacks the lowerdir+
// layers in the order given, the first on top: the image's top layer goes
// first.
func mountOverlay(lowers []string, upper, work, target string) error {
	if len(lowers) == 0 {
		return errors.New("an overlay needs at least one lower layer")
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("the overlay on %s (fsopen): %w", target, err)
	}
	defer unix.Close(fsfd)
	set := func(key, value string) error {
		if err := unix.FsconfigSetString(fsfd, key, value); err != nil {
			return fmt.Errorf("the overlay on %s: %s %s: %w%s", target, key, value, err, fsError(fsfd))
		}
		return nil
	}
	for i, l := range slices.Backward(lowers) {
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", l); err != nil {
			if i == len(lowers)-1 && errors.Is(err, unix.EINVAL) && fsError(fsfd) == "" {
				// An unknown key (before Linux 6.8) is refused without a
				// word; a refused layer has overlayfs say why.
				return mountOverlayOptions(lowers, upper, work, target)
			}
			return fmt.Errorf("the overlay on %s: lowerdir+ %s: %w%s", target, l, err, fsError(fsfd))
		}
	}
	if err := set("upperdir", upper); err != nil {
		return err
	}
	if err := set("workdir", work); err != nil {
		return err
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("the overlay on %s (%d lower layers): %w%s", target, len(lowers), err, fsError(fsfd))
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("the overlay on %s (fsmount): %w", target, err)
	}
	defer unix.Close(mfd)
	return attach(mfd, target)
}

// overlayOptionsMax is the longest option string mount(2) passes on: one
// page, its terminating NUL included.
const overlayOptionsMax = 4095

// mountOverlayOptions is mountOverlay through mount(2), for a kernel
// without overlayfs's lowerdir+ (before Linux 6.8): every layer in one
// option string, which a page bounds.
func mountOverlayOptions(lowers []string, upper, work, target string) error {
	for _, d := range slices.Concat(lowers, []string{upper, work}) {
		// overlayfs splits its options at ',' and its layers at ':'.
		if strings.ContainsAny(d, ",:") {
			return fmt.Errorf("the path %q holds ',' or ':', which overlayfs's mount options cannot take (and this kernel has no lowerdir+, Linux 6.8)", d)
		}
	}
	top := slices.Clone(lowers)
	slices.Reverse(top)
	opts := "lowerdir=" + strings.Join(top, ":") + ",upperdir=" + upper + ",workdir=" + work
	if len(opts) > overlayOptionsMax {
		return fmt.Errorf("the overlay on %s: its %d lower layers make %d bytes of mount options, past mount(2)'s %d; a kernel with overlayfs's lowerdir+ (Linux 6.8) takes any number", target, len(lowers), len(opts), overlayOptionsMax)
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}

// fsError is what the kernel logged on the filesystem context fsfd about
// its last failure ("; " and the message), or "": overlayfs says there
// which layer it refused and why, where the errno alone says EINVAL.
func fsError(fsfd int) string {
	buf := make([]byte, 1024)
	var msgs []string
	for {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return "; the kernel: " + strings.Join(msgs, "; ")
}

// lowerDir is the directory of a remapped session's bundle whose entries
// 0..N-1 are the mount points of its image's layers, idmapped, lowest
// first. A session made before images had layers has one idmapped mount
// at lowerDir itself.
const lowerDir = "lower"

// layerMountPoint is the mount point of layer i under a bundle's lowerDir.
func layerMountPoint(bundle string, i int) string {
	return filepath.Join(bundle, lowerDir, strconv.Itoa(i))
}

// lowerMounts are the mount points of a session bundle's idmapped layers
// that may be mounted, in the order to unmount them: each numbered one
// under lowerDir (as read from the directory, top first), then lowerDir
// itself (the single idmapped image of a session an earlier version made).
func lowerMounts(bundle string) []string {
	dir := filepath.Join(bundle, lowerDir)
	var idx []int
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if i, err := strconv.Atoi(e.Name()); err == nil && i >= 0 && strconv.Itoa(i) == e.Name() {
				idx = append(idx, i)
			}
		}
	}
	slices.Sort(idx)
	out := make([]string, 0, len(idx)+1)
	for _, i := range slices.Backward(idx) {
		out = append(out, layerMountPoint(bundle, i))
	}
	return append(out, dir)
}

// unmount detaches the mount at target; a target not mounted (or gone) is
// not an error.
func unmount(target string) error {
	err := unix.Unmount(target, unix.MNT_DETACH)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}
