package gvisor

import (
	"os"

	"golang.org/x/sys/unix"
)

// onCgroupFS says whether the open directory dir is on a cgroup (v1) or
// cgroup2 file system.
func onCgroupFS(dir *os.File) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(dir.Fd()), &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP_SUPER_MAGIC || st.Type == unix.CGROUP2_SUPER_MAGIC
}
