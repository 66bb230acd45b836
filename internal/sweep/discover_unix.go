//go:build unix

package sweep

import (
	"io/fs"
	"syscall"
)

// fileOwner returns fi's identity and owner.
func fileOwner(fi fs.FileInfo) (fileID, uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, 0, false
	}
	return fileID{uint64(st.Dev), uint64(st.Ino)}, st.Uid, true
}
