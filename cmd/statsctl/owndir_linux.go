package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ownDir makes dir (if missing) and gives it to uid:gid with perm, with
// CAP_CHOWN alone, as the init container runs: no CAP_DAC_OVERRIDE,
// CAP_DAC_READ_SEARCH or CAP_FOWNER. It holds the directory by an O_PATH
// descriptor (no permission on the directory itself is needed, and a
// symbolic link is not followed) and does nothing when the owner and mode
// are already right, the case of every pod start after the first. Else it
// chowns to root, chmods as the owner then is (through /proc/self/fd: an
// O_PATH descriptor takes no fchmod), and chowns to uid:gid.
func ownDir(dir string, uid, gid int, perm uint32) error {
	if err := os.Mkdir(dir, os.FileMode(perm)); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("own-dir %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("own-dir %s: open: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("own-dir %s: stat: %w", dir, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return fmt.Errorf("own-dir %s: a symbolic link, refused: want a directory", dir)
	default:
		return fmt.Errorf("own-dir %s: not a directory (mode %#o)", dir, st.Mode)
	}
	if int(st.Uid) == uid && int(st.Gid) == gid && uint32(st.Mode)&0o7777 == perm {
		return nil
	}
	if err := unix.Fchownat(fd, "", 0, 0, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("own-dir %s: chown 0:0 (before the chmod): %w", dir, err)
	}
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), perm); err != nil {
		return fmt.Errorf("own-dir %s: chmod %04o: %w", dir, perm, err)
	}
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("own-dir %s: chown %d:%d: %w", dir, uid, gid, err)
	}
	return nil
}
