package peercred

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestPeerUID: both ends of a Unix socket connection see this process's
// credentials; a TCP connection has none.
func TestPeerUID(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	defer server.Close()
	for name, c := range map[string]net.Conn{"client": client, "server": server} {
		uid, gid, err := PeerUID(c)
		if err != nil || uid != uint32(os.Geteuid()) || gid != uint32(os.Getegid()) {
			t.Errorf("%s: PeerUID = %d, %d, %v; want %d, %d", name, uid, gid, err, os.Geteuid(), os.Getegid())
		}
	}

	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	tc, err := net.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if _, _, err := PeerUID(tc); !errors.Is(err, ErrNotUnix) {
		t.Errorf("PeerUID(tcp) = %v, want ErrNotUnix", err)
	}
}
