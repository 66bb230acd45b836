//go:build !linux

package main

import (
	"errors"
	"fmt"
)

// ownDir needs Linux (O_PATH, AT_EMPTY_PATH, /proc/self/fd): the init
// container it is for runs on a Linux node.
func ownDir(dir string, _, _ int, _ uint32) error {
	return fmt.Errorf("own-dir %s: %w", dir, errors.ErrUnsupported)
}
