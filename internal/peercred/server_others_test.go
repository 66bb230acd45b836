//go:build !linux

package peercred

import (
	"errors"
	"testing"
)

func TestOthersUnsupported(t *testing.T) {
	if _, err := of(nil); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("of = %v, want ErrUnsupported", err)
	}
}
