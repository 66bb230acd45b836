package hoststat

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// isDebugfs reports whether root is a mounted debugfs.
func isDebugfs(root string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", root, err)
	}
	return st.Type == unix.DEBUGFS_MAGIC, nil
}

// inPrivateDebugfs runs fn on a fresh OS thread that has its own mount
// namespace, all mounts made private, and debugfs mounted at root. The
// thread is locked and never unlocked, so when the goroutine ends the Go
// runtime discards the thread, and its namespace and mount die with it:
// nothing is ever mounted in the process's or the host's namespace.
func inPrivateDebugfs(root string, fn func()) error {
	errc := make(chan error, 1)
	go privateDebugfsThread(root, fn, errc)
	return <-errc
}

// privateDebugfsThread does the work of inPrivateDebugfs on the current
// goroutine's thread, unless that is the main thread: Go never discards the
// main thread (it would stay wedged in the private namespace, and
// /proc/self/mountinfo shows the main thread's mounts), so there it holds the
// main thread locked while a new goroutine, which then cannot run on it, does
// the work, and releases it unchanged.
func privateDebugfsThread(root string, fn func(), errc chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		done := make(chan error, 1)
		go privateDebugfsThread(root, fn, done)
		err := <-done
		runtime.UnlockOSThread() // the main thread was not touched
		errc <- err
		return
	}
	// No UnlockOSThread from here on: this thread must die with the goroutine.
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		errc <- fmt.Errorf("unshare mount namespace: %w", err)
		return
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		errc <- fmt.Errorf("make / rprivate: %w", err)
		return
	}
	if err := unix.Mount("debugfs", root, "debugfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		errc <- fmt.Errorf("mount debugfs at %s: %w", root, err)
		return
	}
	fn()
	errc <- nil
}
