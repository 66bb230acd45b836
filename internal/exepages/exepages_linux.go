package exepages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// exeFile stats path (procRoot/self/exe) and names the file by the device
// and inode maps prints.
func exeFile(path string) (file, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return file{}, fmt.Errorf("exepages: %w", &os.PathError{Op: "stat", Path: path, Err: err})
	}
	target, err := os.Readlink(path)
	if err != nil {
		target = "" // matched by device and inode only
	}
	return file{dev: fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev)), ino: st.Ino, path: target}, nil
}

// dontNeed advises MADV_DONTNEED on s.
func dontNeed(s span) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, s.start, s.end-s.start, unix.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}
