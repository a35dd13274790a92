package container

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// mountOverlay mounts the session's root: lower read-only, writes going
// to upper.
func mountOverlay(lower, upper, work, target string) error {
	for _, d := range []string{lower, upper, work} {
		// overlayfs splits its options at ',' and its layers at ':'.
		if strings.ContainsAny(d, ",:") {
			return fmt.Errorf("the path %q holds ',' or ':', which overlayfs cannot take", d)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
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
