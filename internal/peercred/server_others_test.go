//go:build !linux

package peercred

import (
	"errors"
	"testing"
)

func TestOthersUnsupported(t *testing.T) {
	if _, err := Of(nil); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Of = %v, want ErrUnsupported", err)
	}
}
