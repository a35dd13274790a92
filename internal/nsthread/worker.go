package nsthread

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Worker is an OS thread of its own (never the process's main thread)
// that runs the functions given to Do, one at a time, in the namespaces
// its setup put it in; a process it starts is born there. The thread
// never returns to the scheduler: it ends with Close, and a namespace
// only it holds with it.
type Worker struct {
	jobs chan func()
	done chan struct{}
}

// NewWorker starts a worker and runs setup on its thread, after
// unsharing the thread's filesystem attributes (which entering or
// unsharing a mount namespace needs). An error of setup is NewWorker's,
// the thread ended.
func NewWorker(setup func() error) (*Worker, error) {
	w := &Worker{jobs: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	var run func()
	run = func() {
		// Go parks a locked main thread instead of ending it, which would
		// leave the process's own thread in the namespace: there, start
		// again on another goroutine.
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			runtime.UnlockOSThread()
			go run()
			return
		}
		defer close(w.done)
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			ready <- fmt.Errorf("unshare the thread's filesystem attributes: %w", err)
			return
		}
		if err := setup(); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for job := range w.jobs {
			job()
		}
	}
	go run()
	if err := <-ready; err != nil {
		<-w.done
		return nil, err
	}
	return w, nil
}

// Do runs fn on the worker's thread and returns its error.
func (w *Worker) Do(fn func() error) error {
	errc := make(chan error, 1)
	w.jobs <- func() { errc <- fn() }
	return <-errc
}

// Close ends the worker's thread, once every Do has returned.
func (w *Worker) Close() {
	close(w.jobs)
	<-w.done
}

// NewMountNS is a worker in a new mount namespace, a slave of the
// host's: mounts from the host reach it; its own mounts and unmounts
// never reach the host. The mounts hide are detached in it (one that is
// not there is no error).
func NewMountNS(hide ...string) (*Worker, error) {
	return NewWorker(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare a mount namespace: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return fmt.Errorf("make the mount namespace a slave: %w", err)
		}
		for _, m := range hide {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("hide %s: %w", m, err)
			}
		}
		return nil
	})
}

// JoinMountNS is a worker in the mount namespace at path
// (/proc/PID/ns/mnt).
func JoinMountNS(path string) (*Worker, error) {
	return NewWorker(func() error {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open the mount namespace %s: %w", path, err)
		}
		defer func() { _ = unix.Close(fd) }()
		if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter the mount namespace %s: %w", path, err)
		}
		return nil
	})
}
