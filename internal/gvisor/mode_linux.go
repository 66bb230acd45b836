package gvisor

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// detectMode looks at the file system types of root and root/unified, like
// containerd/cgroups' Mode() but for an injectable root (Mode() only ever
// looks at /sys/fs/cgroup).
func detectMode(root string) (Mode, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return ModeAuto, fmt.Errorf("gvisor: %w: cgroup root %s: %w", source.ErrNotMeasurable, root, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return ModeUnified, nil
	}
	if err := unix.Statfs(filepath.Join(root, "unified"), &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return ModeHybrid, nil
	}
	if err := unix.Statfs(filepath.Join(root, "memory"), &st); err == nil && st.Type == unix.CGROUP_SUPER_MAGIC {
		return ModeLegacy, nil
	}
	return ModeAuto, fmt.Errorf("gvisor: %w: %s is neither a cgroup2 mount nor holds a v1 memory hierarchy", source.ErrNotMeasurable, root)
}

// mountID returns the id of the mount holding path (statx STATX_MNT_ID,
// Linux 5.8+), as /proc/<pid>/mountinfo numbers mounts.
func mountID(path string) (int, bool) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil || stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, false
	}
	return int(stx.Mnt_id), true
}
