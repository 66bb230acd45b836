//go:build !linux

package gvisor

import "os"

// onCgroupFS: cgroups exist only on Linux.
func onCgroupFS(*os.File) bool { return false }
