package bounded

import (
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// openat opens name in dir for reading, never following a symlink. It is
// syscall.Openat without its allocation of the C string per call: the name
// goes through the batch's own buffer.
func (b *Batch) openat(dir *os.File, name string) (int, error) {
	b.cname = append(append(b.cname[:0], name...), 0)
	for {
		fd, _, errno := syscall.Syscall6(syscall.SYS_OPENAT, dir.Fd(), uintptr(unsafe.Pointer(&b.cname[0])),
			uintptr(syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW), 0, 0, 0)
		runtime.KeepAlive(dir)
		switch errno {
		case 0:
			return int(fd), nil
		case syscall.EINTR:
			continue
		}
		return -1, errno
	}
}
