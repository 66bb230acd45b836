//go:build !linux

package bounded

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// openat opens name in dir for reading, never following a symlink.
func (b *Batch) openat(dir *os.File, name string) (int, error) {
	var fd int
	err := retryEINTR(func() (err error) {
		fd, err = unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		return err
	})
	runtime.KeepAlive(dir)
	return fd, err
}
