package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/internal/wsdir"
	"github.com/tai42/sandbox/kit"
)

var _ kit.WorkspaceStore = (*provider)(nil)

// migrateMark ends the names of what a workspace's move from a plain
// directory into an image makes under a name of its own: the image being
// made (KEY.img+new) and its mount point (+mnt/KEY+new). No workspace key
// holds a '+', so neither can be a key's directory, image or mount point;
// a crash leaves them, the next start removes them.
const migrateMark = "+new"

// oldMigrateSuffix ended the name of the image being made by a migration
// of an earlier version (KEY.img.new; its mount point was +mnt/KEY.new). A
// key may end so too ("notes.img.new"): the start-up sweep removes only a
// regular file of the name, which no key's plain directory is; a mount
// point +mnt/NAME it removes unless NAME is the key of a session brought
// back.
const oldMigrateSuffix = imageSuffix + ".new"

// wsImage is the image file of persistent workspace key.
func (p *provider) wsImage(key string) string { return filepath.Join(p.perDir, key+imageSuffix) }

// openWorkspace readies persistent workspace key for session r and returns
// the host directory to bind at /workspace. A key with an image (or, with
// the disk cap on, any key) has its image mounted (r.wsDisk, unmounted at
// the destroy); a plain directory of an earlier version is moved into a
// new image first, with the cap on. With the cap off a key without an
// image is a plain directory, as before. Either way, the files' owners are
// shifted once when the user namespace mode changed since.
func (p *provider) openWorkspace(ctx context.Context, r *session, key string) (string, error) {
	remap := p.userns != nil
	img, dir := p.wsImage(key), filepath.Join(p.perDir, key)
	_, err := os.Lstat(img)
	hasImg := err == nil
	if !hasImg && !p.diskOn {
		if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
			return "", fmt.Errorf("the persistent workspace %q: %s is not a directory", key, dir)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", err
		}
		if err := shiftOwners(dir, remap); err != nil {
			return "", fmt.Errorf("the persistent workspace %q, made with the other user namespace mode: %w", key, err)
		}
		return dir, nil
	}
	d := &disk{img: img, mnt: filepath.Join(p.perDir, wsMountDir, key), owner: p.rootUID()}
	legacy := false
	if !hasImg {
		fi, err := os.Lstat(dir)
		legacy = err == nil && fi.IsDir()
		if err := p.makeWorkspaceImage(ctx, d, key, dir, legacy); err != nil {
			return "", fmt.Errorf("the persistent workspace %q: %w", key, err)
		}
	}
	if err := os.Mkdir(d.mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("the persistent workspace %q: its mount point: %w", key, err)
	}
	if d.loop, err = p.openDisk(img, d.mnt, true); err != nil {
		os.Remove(d.mnt)
		return "", fmt.Errorf("the persistent workspace %q: %w", key, err)
	}
	r.wsDisk = d
	ws := d.path(diskWorkspace)
	err = p.rt.do(func() error {
		if err := shiftOwners(ws, remap); err != nil {
			return fmt.Errorf("made with the other user namespace mode: %w", err)
		}
		// A put_file in flight when an earlier session's container was
		// killed left its temporary file.
		if err := oscmd.RemoveTemps(ctx, ws, putTempPrefix, nil); err != nil {
			p.log.Warn("container: cannot remove interrupted put_file temporaries from a persistent workspace", "key", key, "err", err)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("the persistent workspace %q: %w", key, err)
	}
	if hasImg {
		// A migration a crash interrupted after the image was in place.
		if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
			if err := oscmd.RemoveAll(dir); err != nil {
				p.log.Warn("container: cannot remove the old directory of a persistent workspace moved into its image", "key", key, "dir", dir, "err", err)
			}
		}
	}
	return ws, nil
}

// makeWorkspaceImage makes the image of persistent workspace key at
// d.img: an ext4 filesystem (with a journal) of the disk cap, its
// workspace the directory diskWorkspace in it. With legacy, the plain
// directory dir is copied in (modes, owners, symlinks and times kept) and
// removed once the image is in place. The image is made under another name
// and renamed into place, so a crash leaves the directory or the image,
// never half of one.
func (p *provider) makeWorkspaceImage(ctx context.Context, d *disk, key, dir string, legacy bool) (err error) {
	tmp := filepath.Join(p.perDir, key+imageSuffix+migrateMark)
	os.Remove(tmp) // an earlier attempt's
	if err := mkfs(ctx, tmp, p.disk, d.owner, true); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	mnt := d.mnt + migrateMark
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return fmt.Errorf("a mount point for the new image: %w", err)
	}
	defer os.Remove(mnt)
	nd := &disk{img: tmp, mnt: mnt, owner: d.owner}
	if nd.loop, err = p.openDisk(tmp, mnt, true); err != nil {
		return err
	}
	err = p.rt.do(func() error {
		ws := nd.path(diskWorkspace)
		if legacy {
			// cp -a keeps modes, owners, symlinks and times; the copy is
			// the workspace itself, so its top keeps its owner and mode.
			cmd := exec.CommandContext(ctx, "cp", "-a", "--", dir, ws)
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("copying the old directory %s into its image: %w: %s", dir, err, strings.TrimSpace(string(out)))
			}
			return nil
		}
		if err := os.Mkdir(ws, 0o700); err != nil {
			return err
		}
		return os.Chown(ws, d.owner, d.owner)
	})
	// Flushed by the unmount.
	if cerr := p.closeDisk(nd, false); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, d.img); err != nil {
		return fmt.Errorf("putting the new image in place: %w", err)
	}
	if legacy {
		if err := oscmd.RemoveAll(dir); err != nil {
			p.log.Warn("container: cannot remove the old directory of a persistent workspace moved into its image; it is removed at the key's next create", "key", key, "dir", dir, "err", err)
		} else {
			p.log.Info("container: moved a persistent workspace from its directory into an image of the disk cap", "key", key, "image", d.img, "cap_mb", p.disk.mb)
		}
	}
	return nil
}

// Workspaces implements kit.WorkspaceStore: the workspace images
// (KEY.img) and the plain directories of keys without one under
// <state>/container/workspaces. An image's SizeBytes is the space it takes
// on the host (its allocated blocks, st_blocks × 512: the journal and the
// filesystem's own tables included, what its sessions deleted not, once
// discarded) and its ModifiedAt the image file's mtime, its last write; a
// directory's are as [wsdir.Store.Workspaces] says.
func (p *provider) Workspaces(ctx context.Context) ([]sandbox.WorkspaceInfo, error) {
	dirs, err := wsdir.Store{Dir: p.perDir}.Workspaces(ctx)
	if err != nil {
		return nil, err
	}
	imgs, err := p.workspaceImages()
	if err != nil {
		return nil, err
	}
	out := imgs
	for _, w := range dirs {
		if !slices.ContainsFunc(imgs, func(i sandbox.WorkspaceInfo) bool { return i.Key == w.Key }) {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b sandbox.WorkspaceInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// workspaceImages lists the workspace images of perDir.
func (p *provider) workspaceImages() ([]sandbox.WorkspaceInfo, error) {
	entries, err := os.ReadDir(p.perDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, sandbox.WrapError("list_workspaces", "cannot read the workspace directory "+p.perDir, err)
	}
	var out []sandbox.WorkspaceInfo
	for _, e := range entries {
		key, ok := strings.CutSuffix(e.Name(), imageSuffix)
		if !ok || !e.Type().IsRegular() || sandbox.ValidWorkspaceKey(key) != nil {
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, sandbox.WrapError("list_workspaces", "cannot stat workspace image "+filepath.Join(p.perDir, e.Name()), err)
		}
		var size int64
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			size = st.Blocks * 512
		}
		out = append(out, sandbox.WorkspaceInfo{Key: key, SizeBytes: size, ModifiedAt: fi.ModTime().UTC()})
	}
	return out, nil
}

// RemoveWorkspace implements kit.WorkspaceStore: it deletes the key's
// image, refused while a loop device still has it (a session's mount), and
// the key's plain directory, whichever it has.
func (p *provider) RemoveWorkspace(ctx context.Context, key string) error {
	if err := sandbox.ValidWorkspaceKey(key); err != nil {
		return sandbox.Errorf("remove_workspace", "%v; no workspace can have it", err)
	}
	img := p.wsImage(key)
	fi, err := os.Lstat(img)
	if err != nil || !fi.Mode().IsRegular() {
		return wsdir.Store{Dir: p.perDir}.RemoveWorkspace(ctx, key)
	}
	if dev := loopOf(img); dev != "" {
		return sandbox.Errorf("remove_workspace", "workspace %q is still attached to /dev/%s (a session's mount of it); destroy that session first", key, dev)
	}
	if err := os.Remove(img); err != nil {
		return sandbox.WrapError("remove_workspace", "cannot remove workspace image "+img, err)
	}
	if err := (wsdir.Store{Dir: p.perDir}).RemoveWorkspace(ctx, key); err != nil && !errors.As(err, new(*sandbox.WorkspaceNotFoundError)) {
		return err
	}
	return nil
}
