package sessnet

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
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
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if filepath.Dir(mp) == dir {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
