package connlimit

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestListenerCap: two connections are served at a cap of two, a third is
// closed at accept (its peer reads EOF) and counted; once one closes
// (twice: its slot is freed once) a new one is served.
func TestListenerCap(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, 2, nil, "")
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	next := func() net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no connection accepted within 5 s")
			return nil
		}
	}
	dial()
	dial()
	first, _ := next(), next()
	if l.Open() != 2 || l.Max() != 2 {
		t.Fatalf("Open %d, Max %d; want 2 and 2", l.Open(), l.Max())
	}
	over := dial()
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := over.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the connection over the cap read %v, want EOF (closed at accept)", err)
	}
	if l.Refused() != 1 {
		t.Errorf("Refused = %d, want 1", l.Refused())
	}
	first.Close()
	first.Close()
	if l.Open() != 1 {
		t.Errorf("Open = %d after one Close (twice), want 1", l.Open())
	}
	dial()
	next()
	if l.Open() != 2 || l.Refused() != 1 {
		t.Errorf("Open %d, Refused %d after a new connection; want 2 and 1", l.Open(), l.Refused())
	}
}
