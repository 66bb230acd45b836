//go:build !linux

package peercred

import (
	"errors"
	"testing"
)

func TestPeerUIDUnsupported(t *testing.T) {
	if _, _, err := PeerUID(nil); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("PeerUID = %v, want ErrUnsupported", err)
	}
}
