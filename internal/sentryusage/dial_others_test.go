//go:build !linux

package sentryusage

import (
	"context"
	"errors"
	"testing"
)

func TestReadUnsupported(t *testing.T) {
	c, err := New(Config{RootDirs: []string{t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Read(context.Background(), Query{SandboxID: "a", ContainerID: "a"})
	if !errors.Is(err, errUnsupported) {
		t.Fatalf("Read on %v: %v, want errUnsupported", "this OS", err)
	}
}
