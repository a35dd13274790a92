package sessnet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/tai42/sandbox/internal/oscmd"
	"golang.org/x/sys/unix"
)

// sweep removes what a run of this Dir and Prefix left, except the kept
// namespace files (paths) and links (names) of the adopted Nets: the veths
// (which takes their namespace ends along), the bridges, the namespace
// files, and last the table, so that no bridge stands without its rules.
// The table stays when a bridge is kept (restoreInfra replaces it). Only
// New calls it, before the Manager is shared.
func (m *Manager) sweep(keepFiles, keepLinks map[string]bool) error {
	var errs []error
	links, err := listLinks(m.host)
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	var bridges []string
	for _, l := range links {
		name := l.Attrs().Name
		switch {
		case !m.ours(name) || keepLinks[name]:
		case name == m.internal.bridge || name == m.egress.bridge:
			bridges = append(bridges, name)
		default:
			if err := m.host.LinkDel(l); err != nil && !isGone(err) {
				errs = append(errs, fmt.Errorf("deleting the link %s: %w", name, err))
			}
		}
	}
	for _, name := range bridges {
		if err := m.delLink(name); err != nil {
			errs = append(errs, err)
		}
	}
	mounts, err := mountsUnder(m.dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, mp := range mounts {
		if keepFiles[mp] {
			continue
		}
		if err := unmountRemove(mp); err != nil {
			errs = append(errs, err)
		}
	}
	files, err := nsFiles(m.dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range files {
		if keepFiles[f] {
			continue
		}
		if err := unmountRemove(f); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && !keepLinks[m.internal.bridge] && !keepLinks[m.egress.bridge] {
		if err := m.delTable(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isGone(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// mountsUnder lists the mount points directly inside dir, from
// /proc/self/mountinfo, once per mount (stacked mounts repeat).
func mountsUnder(dir string) ([]string, error) {
	all, err := oscmd.MountPoints("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, mp := range all {
		if filepath.Dir(mp) == dir {
			out = append(out, mp)
		}
	}
	return out, nil
}

// nsFiles lists the namespace files in dir: the empty regular files a
// namespace is (or was) bind-mounted on. Anything else there is not ours
// and is left alone.
func nsFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the namespace directory: %w", err)
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		st, err := os.Stat(p) // through a mount: the namespace's nsfs inode
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("namespace file %s: %w", p, err)
		}
		if st.Mode().IsRegular() && st.Size() == 0 {
			out = append(out, p)
		}
	}
	return out, nil
}
