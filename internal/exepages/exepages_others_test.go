//go:build !linux

package exepages

import (
	"errors"
	"testing"
)

func TestReleaseUnsupported(t *testing.T) {
	if _, err := Release(DefaultProcRoot); !errors.Is(err, errUnsupported) {
		t.Errorf("Release = %v, want errUnsupported", err)
	}
}
