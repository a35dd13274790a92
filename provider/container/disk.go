package container

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/sessionlock"
	"github.com/tai42/sandbox/kit"
)

// Defaults of the disk cap's options (see [Options.DiskMB]).
const (
	DefaultDiskMB        = 10240
	DefaultDiskPool      = 2
	DefaultDiskReserveMB = 1024
	// diskBytesPerInode is the default inode ratio: one inode per 16 KiB
	// of the cap.
	diskBytesPerInode = 16 << 10
)

// Where a session's disk keeps what the session writes: the root
// overlay's upper and work directories (the upper holding /tmp), and an
// ephemeral workspace. A persistent workspace image holds its workspace
// in diskWorkspace too.
const (
	diskUpper     = "upper"
	diskWork      = "work"
	diskWorkspace = "ws"
)

// wsMountDir, under the persistent workspaces directory, holds the mount
// points of their images, one per key; '+' is in no workspace_key, so no
// key can name it.
const wsMountDir = "+mnt"

// imageSuffix ends the name of an image file.
const imageSuffix = ".img"

// diskCfg is the geometry of the disks the provider makes.
type diskCfg struct {
	mb     int // the cap, in MiB
	inodes int // the inode count
}

// disk is one ext4 filesystem in an image file, on a loop device, mounted
// where the runtime runs. Nothing of it is safe for concurrent use: it is
// one session's, or the pool's.
type disk struct {
	img   string // the image file
	mnt   string // its mount point
	loop  string // the loop device it was attached to, e.g. "loop3"
	owner int    // the host uid (and gid) its directories are owned by
	// lock is an ephemeral disk's lock, by its name, held from before its
	// image is made until it is removed: another process starting on the
	// state directory sweeps only the disks whose lock it can take (see
	// sweepDisks). nil for a workspace image.
	lock *sessionlock.Lock
}

// name is the disk's name in the disks directory (its image's base name
// less the suffix).
func (d *disk) name() string { return strings.TrimSuffix(filepath.Base(d.img), imageSuffix) }

// path is rel on the disk, where the runtime runs.
func (d *disk) path(rel string) string { return filepath.Join(d.mnt, rel) }

// newDiskName is a fresh random name for an ephemeral disk.
func newDiskName() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("container: crypto/rand failed: %v", err)) // never on Linux ≥ 3.17
	}
	return "d-" + hex.EncodeToString(b[:])
}

// mkfs makes img, a sparse file of cfg.mb MiB, into an ext4 filesystem of
// cfg.inodes inodes whose root directory is owner's. An ephemeral disk has
// no journal (it does not outlive a crash of the machine that matters); a
// persistent one has a small one. Neither has the blocks reserved for an
// online resize (resize_inode: 4 MiB written at each mkfs of a 10 GiB
// disk, for a growth a cap never has). An ephemeral one keeps its
// checksums' seed apart from its UUID (metadata_csum_seed), so that each
// copy of the disk template can be given a UUID of its own once mounted
// (see setDiskUUID). img must not exist.
func mkfs(ctx context.Context, img string, cfg diskCfg, owner int, persistent bool) (err error) {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("the disk image: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(img)
		}
	}()
	terr := f.Truncate(int64(cfg.mb) << 20)
	if cerr := f.Close(); terr == nil {
		terr = cerr
	}
	if terr != nil {
		return fmt.Errorf("the disk image %s: %w", img, terr)
	}
	args := []string{"-q", "-F", "-b", "4096", "-m", "0", "-N", strconv.Itoa(cfg.inodes),
		"-E", fmt.Sprintf("lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=%d:%d", owner, owner)}
	if persistent {
		args = append(args, "-O", "^resize_inode", "-J", "size=4")
	} else {
		args = append(args, "-O", "^resize_inode,^has_journal,metadata_csum_seed")
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, mkfsBinary, append(args, img)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err = cmd.Run(); err != nil {
		return fmt.Errorf("mkfs.ext4 of %s (%d MiB, %d inodes): %w: %s", img, cfg.mb, cfg.inodes, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// lowPriority gives process (or thread) id the lowest CPU priority (nice
// 19) and the idle I/O class, best effort.
func lowPriority(id int) {
	_ = unix.Setpriority(unix.PRIO_PROCESS, id, 19)
	// ioprio_set(IOPRIO_WHO_PROCESS, id, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT)
	const ioprioWhoProcess, ioprioClassIdle, ioprioClassShift = 1, 3, 13
	_, _, _ = unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(id), ioprioClassIdle<<ioprioClassShift)
}

// mkfsBinary is e2fsprogs' mkfs.ext4, looked up in PATH.
const mkfsBinary = "mkfs.ext4"

// loopControl is the kernel's allocator of loop devices.
const loopControl = "/dev/loop-control"

// loopMu serializes this process's loop device attaches (attachLoop).
var loopMu sync.Mutex

// attachLoop attaches img to a free loop device, which detaches itself
// once nothing holds it open any more (autoclear: the mount that follows
// is its holder), and returns the device's name ("loop3") and an open
// descriptor on it, to close once the device is mounted.
func attachLoop(img string) (string, int, error) {
	file, err := unix.Open(img, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("the disk image: %w", err)
	}
	defer unix.Close(file)
	ctl, err := unix.Open(loopControl, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("the loop device allocator %s: %w", loopControl, err)
	}
	defer unix.Close(ctl)
	// LOOP_CTL_GET_FREE hands every caller the same lowest free device
	// until one configures it: this process's attaches take turns, so
	// that a burst of creates does not spend its retries on itself (50 at
	// once did). The retries are for other processes.
	loopMu.Lock()
	defer loopMu.Unlock()
	for range 16 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("a free loop device (LOOP_CTL_GET_FREE): %w", err)
		}
		name := "loop" + strconv.Itoa(n)
		dev, err := unix.Open("/dev/"+name, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", -1, fmt.Errorf("the loop device /dev/%s: %w", name, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(file)}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], img)
		err = unix.IoctlLoopConfigure(dev, &cfg)
		if err == nil {
			return name, dev, nil
		}
		unix.Close(dev)
		if !errors.Is(err, unix.EBUSY) {
			return "", -1, fmt.Errorf("attaching %s to /dev/%s (LOOP_CONFIGURE): %w", img, name, err)
		}
		// Another process took it between GET_FREE and CONFIGURE.
	}
	return "", -1, errors.New("no free loop device: each one found was taken before it could be attached")
}

// loopsBacking lists the loop devices whose backing file is under dir (or
// is dir), as name → backing file, from /sys/block.
func loopsBacking(dir string) (map[string]string, error) {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		f := backingFile(e.Name())
		if f != "" && (f == dir || strings.HasPrefix(f, dir+"/")) {
			out[e.Name()] = f
		}
	}
	return out, nil
}

// backingFile is the image loop device name is attached to; "": none.
func backingFile(name string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return "" // not attached
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
}

// loopOf is the loop device backed by img, or "".
func loopOf(img string) string {
	loops, err := loopsBacking(filepath.Dir(img))
	if err != nil {
		return ""
	}
	for name, f := range loops {
		if f == img {
			return name
		}
	}
	return ""
}

// detachLoop detaches loop device name now, or, when something still
// holds it, marks it to detach once nothing does.
func detachLoop(name string) error {
	fd, err := unix.Open("/dev/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENXIO) {
			return nil
		}
		return fmt.Errorf("the loop device /dev/%s: %w", name, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detaching /dev/%s (LOOP_CLR_FD): %w", name, err)
	}
	return nil
}

// waitDetached waits up to 2 s for img to back no loop device: the kernel
// detaches an autoclear device once its last holder (the mount) is gone,
// which can come just after the unmount returns. dev is the device img
// was attached to, when known: only it is looked at, not every loop
// device of the host (milliseconds a look on a host with hundreds).
func waitDetached(img, dev string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		name := dev
		if dev == "" {
			name = loopOf(img)
		} else if backingFile(dev) != img {
			name = ""
		}
		if name == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the image %s is still attached to /dev/%s 2s after its unmount (something else holds the device open)", img, name)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// mountDisk mounts loop device dev's ext4 at mnt: nodev, nosuid, and with
// noinit_itable, so that the kernel does not write out the inode tables
// mkfs left uninitialised (on a sparse image that would give it real
// blocks for nothing). A persistent image is mounted with discard, so that
// what its session deletes frees space on the host.
func mountDisk(dev, mnt string, persistent bool) error {
	opts := "noinit_itable"
	if persistent {
		opts += ",discard"
	}
	if err := unix.Mount("/dev/"+dev, mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mount /dev/%s (ext4) on %s: %w", dev, mnt, err)
	}
	return nil
}

// openDisk attaches image img (made already) to a loop device and mounts
// it at mnt (made already) where the runtime runs. An image already on a
// loop device (an earlier session's, whose device is still detaching, or
// one a kept session holds) is mounted from that device, never attached a
// second time: two loop devices on one ext4 image would corrupt it.
func (p *provider) openDisk(img, mnt string, persistent bool) (string, error) {
	if dev := loopOf(img); dev != "" {
		err := p.rt.do(func() error { return mountDisk(dev, mnt, persistent) })
		if err == nil {
			return dev, nil
		}
		// Detaching since: it frees the image.
		if werr := waitDetached(img, dev); werr != nil {
			return "", fmt.Errorf("%w (%w)", werr, err)
		}
	}
	return p.attachMount(img, mnt, persistent)
}

// attachMount attaches image img, on no loop device, to one and mounts it
// at mnt (made already) where the runtime runs.
func (p *provider) attachMount(img, mnt string, persistent bool) (string, error) {
	dev, fd, err := attachLoop(img)
	if err != nil {
		return "", err
	}
	// Mounted, the device is held by the mount; closed, by nothing else.
	defer unix.Close(fd)
	if err := p.rt.do(func() error { return mountDisk(dev, mnt, persistent) }); err != nil {
		return "", err
	}
	return dev, nil
}

// closeDisk unmounts d where the runtime runs, removes its mount point and
// waits for its loop device to detach; with remove, it removes the image
// too.
//
// The mount point goes before the wait: a mount namespace made while the
// disk was mounted in this process's (runc's disks are; another process's
// namespace, or crun's of another provider of this process) holds a copy
// of the mount, which holds the filesystem and so the device, for as long
// as that namespace lives, since the host's mounts propagate nothing. The
// kernel detaches every mount on a directory when the directory is
// removed, in whatever namespace.
func (p *provider) closeDisk(d *disk, remove bool) error {
	if err := p.rt.do(func() error { return unmount(d.mnt) }); err != nil {
		return fmt.Errorf("unmount the session's disk: %w", err)
	}
	var errs []error
	if err := os.Remove(d.mnt); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("the disk's mount point: %w", err))
	}
	if err := waitDetached(d.img, d.loop); err != nil {
		errs = append(errs, err)
	}
	if remove && len(errs) == 0 {
		if err := os.Remove(d.img); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("the disk's image: %w", err))
		}
	}
	if remove && len(errs) == 0 {
		d.lock.Release(true)
		d.lock = nil
	}
	return errors.Join(errs...)
}

// newDisk names a new disk in the disks directory and takes its lock;
// nothing else of it exists yet.
func (p *provider) newDisk() (*disk, error) {
	name := newDiskName()
	l, err := p.locks.Hold(name)
	if err != nil {
		return nil, fmt.Errorf("the disk's lock: %w", err)
	}
	return &disk{img: filepath.Join(p.diskDir, name+imageSuffix), mnt: filepath.Join(p.diskDir, name), owner: p.rootUID(), lock: l}, nil
}

// mountNewDisk attaches and mounts d's image, made already, at its mount
// point, which it makes. On error nothing of it is left but the image.
// The image is new, so on no loop device yet: the search for one (see
// openDisk) reads every loop device's backing file, milliseconds on a
// host with hundreds.
func (p *provider) mountNewDisk(d *disk) (err error) {
	if err := os.Mkdir(d.mnt, 0o700); err != nil {
		return fmt.Errorf("the disk's mount point: %w", err)
	}
	if d.loop, err = p.attachMount(d.img, d.mnt, false); err != nil {
		os.Remove(d.mnt)
		return err
	}
	return nil
}

// makeEphemeralDisk makes a session disk in the disks directory, mounted:
// a copy of the disk template, its upper (its /tmp in it), work and
// workspace directories in it, with a UUID of its own. On error nothing
// of it is left.
func (p *provider) makeEphemeralDisk() (_ *disk, err error) {
	d, err := p.newDisk()
	if err != nil {
		return nil, err
	}
	if err := p.template.write(d.img); err != nil {
		d.lock.Release(true)
		return nil, err
	}
	if err := p.mountNewDisk(d); err != nil {
		os.Remove(d.img)
		d.lock.Release(true)
		return nil, err
	}
	if !p.diskUUIDs {
		return d, nil
	}
	if err := p.rt.do(func() error { return setDiskUUID(d.mnt) }); err != nil {
		if cerr := p.closeDisk(d, true); cerr != nil {
			p.log.Warn("container: removing a disk that could not be readied", "disk", d.name(), "err", cerr)
		}
		return nil, err
	}
	return d, nil
}

// makeDiskTemplate makes the disk every ephemeral disk is a copy of (see
// diskTemplate): mkfs.ext4 of the cap's geometry, mounted where the
// runtime runs, given the directories a session's disk holds, unmounted
// and read back.
func (p *provider) makeDiskTemplate(ctx context.Context) (*diskTemplate, error) {
	d, err := p.newDisk()
	if err != nil {
		return nil, err
	}
	defer d.lock.Release(true) // after the image's removal
	if err := mkfs(ctx, d.img, p.disk, d.owner, false); err != nil {
		return nil, err
	}
	defer os.Remove(d.img)
	if err := p.mountNewDisk(d); err != nil {
		return nil, err
	}
	err = p.rt.do(func() error {
		// The upper layer's top is the session's "/": 0755, as a root
		// is; its /tmp is 1777, as a /tmp is.
		for _, dir := range []struct {
			rel  string
			mode os.FileMode
		}{
			{diskUpper, 0o755},
			{filepath.Join(diskUpper, "tmp"), 0o777 | os.ModeSticky},
			{diskWork, 0o700},
			{diskWorkspace, 0o700},
		} {
			path := d.path(dir.rel)
			if err := os.Mkdir(path, 0o700); err != nil {
				return err
			}
			if err := os.Chown(path, d.owner, d.owner); err != nil {
				return err
			}
			if err := os.Chmod(path, dir.mode); err != nil {
				return err
			}
		}
		return nil
	})
	// Unmounted, the filesystem is written out to the image (and its
	// loop device detached) before the image is read.
	if cerr := p.closeDisk(d, false); err == nil && cerr != nil {
		err = fmt.Errorf("unmounting it: %w", cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("readying the session disks' template: %w", err)
	}
	return readDiskTemplate(d.img)
}

// diskTemplate is an empty session disk as the provider made it once, at
// New: the blocks mkfs.ext4 and its directories wrote (about 200 KiB of a
// 10 GiB image; the rest is a hole). An ephemeral disk is a copy of those
// blocks into a sparse file of the same size: a create that finds the
// pool empty, and each refill, writes them instead of running mkfs.ext4
// (a process, ~5 ms). The copies' UUIDs are made their own once mounted
// (setDiskUUID): a UUID names one filesystem to the kernel (statfs'
// f_fsid, fanotify) and to blkid.
type diskTemplate struct {
	size    int64
	extents []diskExtent
}

// diskExtent is a run of an image's data, at off.
type diskExtent struct {
	off  int64
	data []byte
}

// readDiskTemplate reads image img's data extents (SEEK_DATA, SEEK_HOLE).
func readDiskTemplate(img string) (*diskTemplate, error) {
	f, err := os.Open(img)
	if err != nil {
		return nil, fmt.Errorf("the session disks' template: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("the session disks' template: %w", err)
	}
	t := &diskTemplate{size: st.Size()}
	for off := int64(0); off < t.size; {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data after off
			break
		}
		if err != nil {
			return nil, fmt.Errorf("the session disks' template %s: %w", img, err)
		}
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("the session disks' template %s: %w", img, err)
		}
		data := make([]byte, end-start)
		if _, err := f.ReadAt(data, start); err != nil {
			return nil, fmt.Errorf("the session disks' template %s: %w", img, err)
		}
		t.extents = append(t.extents, diskExtent{off: start, data: data})
		off = end
	}
	return t, nil
}

// write makes img, which must not exist, a copy of the template, as
// sparse; on error it removes it.
func (t *diskTemplate) write(img string) (err error) {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("the disk image: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(img)
			err = fmt.Errorf("the disk image %s: %w", img, err)
		}
	}()
	if err := f.Truncate(t.size); err != nil {
		return err
	}
	for _, e := range t.extents {
		if _, err := f.WriteAt(e.data, e.off); err != nil {
			return err
		}
	}
	return nil
}

// ext4IocSetFSUUID is EXT4_IOC_SETFSUUID, _IOW('f', 44, struct fsuuid):
// a mounted ext4's new UUID (Linux 6.0; the filesystem must keep its
// checksums' seed apart, see mkfs).
const ext4IocSetFSUUID = 0x4008662c

// setDiskUUID gives the ext4 mounted at mnt a new random UUID; the kernel
// writes it into its superblocks.
func setDiskUUID(mnt string) error {
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the disk's new UUID: %w", err)
	}
	defer unix.Close(fd)
	// struct fsuuid { __u32 fsu_len; __u32 fsu_flags; __u8 fsu_uuid[]; }
	var arg [8 + 16]byte
	binary.NativeEndian.PutUint32(arg[0:], 16)
	u := uuid.New() // random (version 4)
	copy(arg[8:], u[:])
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ext4IocSetFSUUID, uintptr(unsafe.Pointer(&arg[0]))); errno != 0 {
		return fmt.Errorf("the disk's new UUID (EXT4_IOC_SETFSUUID on %s): %w", mnt, errno)
	}
	return nil
}

// WaitDiskPool waits until the container provider of sb has what it
// makes ahead ready: its pool of disks full (Options.DiskPool), so that
// its next create takes one, and its sessions' user namespaces made ahead
// (on crun, remapped). It returns the disks' mount points (each one's
// image is the mount point followed by ".img"): benchmarks and tests use
// it to see a provider at rest, and to tell its pool's disks, which no
// session has, from a session's. It returns at once when the provider
// makes nothing ahead (the cap off, DiskPool negative, not remapped on
// crun, or sb not a container provider's), and an error when a refill
// failed since the last create, the provider is closed, or ctx ends. Safe
// for concurrent use, once Recover is done (kit.New returns then).
func WaitDiskPool(ctx context.Context, sb *kit.Sandbox) ([]string, error) {
	p, ok := sb.Provider().(*provider)
	if !ok {
		return nil, nil
	}
	if p.nsPool != nil {
		if _, err := p.nsPool.wait(ctx); err != nil {
			return nil, err
		}
	}
	if p.pool == nil {
		return nil, nil
	}
	disks, err := p.pool.wait(ctx)
	var out []string
	for _, d := range disks {
		out = append(out, d.mnt)
	}
	return out, err
}

// discardDisk removes an ephemeral disk no session took, logging a
// failure.
func (p *provider) discardDisk(d *disk) {
	if err := p.closeDisk(d, true); err != nil {
		p.log.Warn("container: cannot remove a session disk made ahead; the next start tries again", "disk", d.name(), "err", err)
	}
}

// sessionDisk is an ephemeral session's disk: one from the pool, or one
// made now when the pool has none ready.
func (p *provider) sessionDisk() (*disk, error) {
	if p.pool != nil {
		if d, ok := p.pool.take(); ok {
			return d, nil
		}
	}
	return p.makeEphemeralDisk()
}

// checkReserve refuses a create when the state directory's filesystem has
// less free space than the reserve: the sessions' disks are sparse, so
// many of them together can still fill it.
func (p *provider) checkReserve() error {
	if p.opts.DiskReserveMB <= 0 {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p.root, &st); err != nil {
		return sandbox.WrapError("create_session", "cannot read the free space of the state directory "+p.root, err)
	}
	free := int64(st.Bavail) * st.Bsize >> 20
	if free < int64(p.opts.DiskReserveMB) {
		return sandbox.Errorf("create_session", "the state directory's filesystem (%s) has %d MiB free, less than the disk reserve of %d MiB (tai42 serve --disk-reserve-mb; container.Options.DiskReserveMB): free space there, or lower the reserve", p.root, free, p.opts.DiskReserveMB)
	}
	return nil
}

// Disk is the disk cap the provider enforces, for the daemon to report;
// MB 0 when the cap is off.
func (p *provider) Disk() DiskInfo {
	if !p.diskOn {
		return DiskInfo{ReserveMB: max(p.opts.DiskReserveMB, 0)}
	}
	return DiskInfo{MB: p.disk.mb, Inodes: int64(p.disk.inodes), ReserveMB: max(p.opts.DiskReserveMB, 0)}
}

// DiskInfo is the disk cap per session (see Options.DiskMB): MB 0 when it
// is off; ReserveMB 0 when creates are not refused for want of space.
type DiskInfo struct {
	MB        int
	Inodes    int64
	ReserveMB int
}

// checkDisks checks, at New, that session disks can be made here: the
// e2fsprogs binary, the loop device allocator, and one disk made, mounted
// where the runtime runs, and removed. Its error says what is missing and
// that the operator may turn the cap off.
func (p *provider) checkDisks() error {
	off := "; install what is missing, or run without a disk cap (tai42 serve --disk-mb 0; container.Options.DiskOff), which leaves a session's writes limited by the host's disk alone"
	if _, err := exec.LookPath(mkfsBinary); err != nil {
		return fmt.Errorf("the session disk cap needs %s (apt-get install -y e2fsprogs): %w%s", mkfsBinary, err, off)
	}
	if _, err := os.Stat(loopControl); err != nil {
		return fmt.Errorf("the session disk cap needs loop devices (%s): %w%s", loopControl, err, off)
	}
	var err error
	if p.template, err = p.makeDiskTemplate(context.Background()); err != nil {
		return fmt.Errorf("the session disk cap (%d MiB, %d inodes): cannot make a session disk: %w%s", p.disk.mb, p.disk.inodes, err, off)
	}
	// One disk as a create makes it, which also finds whether this
	// kernel gives it a UUID of its own.
	p.diskUUIDs = true
	d, err := p.makeEphemeralDisk()
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) {
		p.log.Info("container: this kernel cannot change a mounted ext4's UUID (EXT4_IOC_SETFSUUID, Linux 6.0): the session disks share their template's", "err", err)
		p.diskUUIDs = false
		d, err = p.makeEphemeralDisk()
	}
	if err != nil {
		return fmt.Errorf("the session disk cap: cannot make a session disk: %w%s", err, off)
	}
	if err := p.closeDisk(d, true); err != nil {
		return fmt.Errorf("the session disk cap: cannot remove a session disk: %w%s", err, off)
	}
	return nil
}
