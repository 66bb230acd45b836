package peercred

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// serve listens on a Unix socket under policy and returns its path and
// listener; admitted connections get "hello".
func serve(t *testing.T, p Policy, logs io.Writer) (string, *Listener) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	pl := Listen(l, Config{Policy: p, Logger: slog.New(slog.NewTextHandler(logs, nil)), Name: "read"})
	t.Cleanup(func() { pl.Close() })
	go func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	return sock, pl
}

func read(t *testing.T, sock string) string {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

func TestListenerAdmitsAndRefuses(t *testing.T) {
	me, mygid := uint32(os.Geteuid()), uint32(os.Getegid())
	for _, tc := range []struct {
		name   string
		policy Policy
		want   string
	}{
		{"own uid", Policy{UIDs: []uint32{me}}, "hello"},
		{"own primary gid", Policy{UIDs: []uint32{me + 1}, GIDs: []uint32{mygid}}, "hello"},
		{"neither", Policy{UIDs: []uint32{me + 1}, GIDs: []uint32{mygid + 1}}, ""},
		{"empty policy", Policy{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			sock, pl := serve(t, tc.policy, &logs)
			if got := read(t, sock); got != tc.want {
				t.Fatalf("read %q, want %q", got, tc.want)
			}
			refused := int64(0)
			if tc.want == "" {
				refused = 1
			}
			if n := pl.Refused(); n != refused {
				t.Errorf("refused %d, want %d", n, refused)
			}
		})
	}
}

// TestRefusalsCountedLogRateLimited: every refusal counts; the log says so
// once per interval, with the running total.
func TestRefusalsCountedLogRateLimited(t *testing.T) {
	var logs bytes.Buffer
	sock, pl := serve(t, Policy{UIDs: []uint32{uint32(os.Geteuid()) + 1}}, &logs)
	for range 50 {
		read(t, sock)
	}
	if n := pl.Refused(); n != 50 {
		t.Fatalf("refused %d, want 50", n)
	}
	if n := strings.Count(logs.String(), "peer refused"); n != 1 {
		t.Fatalf("%d log lines for 50 refusals in under 10 s, want 1:\n%s", n, logs.String())
	}
}

// TestSupplementaryGroupAdmits: a peer whose supplementary groups (read
// from /proc/<pid>/status) hold an allowed gid is admitted.
func TestSupplementaryGroupAdmits(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	pl := Listen(l, Config{Policy: Policy{GIDs: []uint32{4242}}})
	defer pl.Close()
	pl.groups = func(pid int32) ([]uint32, error) {
		if pid != int32(os.Getpid()) {
			return nil, errors.New("unexpected pid")
		}
		return []uint32{27, 4242}, nil
	}
	go func() {
		if c, err := pl.Accept(); err == nil {
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	if got := read(t, sock); got != "hello" {
		t.Fatalf("read %q: a peer in an allowed supplementary group was refused", got)
	}
}

// TestGroupsOfBounded: a status file is read up to maxStatusBytes; a longer
// one is refused whole, never parsed from a cut Groups line (a cut id could
// be another, allowed one).
func TestGroupsOfBounded(t *testing.T) {
	root := t.TempDir()
	write := func(pid, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "status"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("7", "Name:\tx\nGroups:\t4 24 27\n")
	if got, err := groupsOf(root, 7); err != nil || !cmp.Equal([]uint32{4, 24, 27}, got) {
		t.Errorf("groupsOf = %v, %v; want [4 24 27]", got, err)
	}
	// The cap falls inside the last id: 4242 would be read as 42.
	long := "Groups:\t" + strings.Repeat("1 ", (maxStatusBytes-len("Groups:\t")-2)/2) + "4242\n"
	write("8", long)
	if got, err := groupsOf(root, 8); err == nil {
		t.Errorf("groupsOf of a %d-byte status = %d groups, want an error (cap %d)", len(long), len(got), maxStatusBytes)
	}
	if _, err := groupsOf(root, 9); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("groupsOf of a gone pid = %v, want ErrNotExist", err)
	}
}

func TestParseGroups(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []uint32
		err      bool
	}{
		{"groups", "Name:\tx\nGroups:\t4 24 27 \nNSpid:\t1\n", []uint32{4, 24, 27}, false},
		{"none", "Groups:\t\n", nil, false},
		{"missing", "Name:\tx\n", nil, true},
		{"garbage", "Groups:\tx\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseGroups([]byte(tc.in))
			if (err != nil) != tc.err {
				t.Fatalf("err = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseIDs(t *testing.T) {
	got, err := ParseIDs(" 0, 1000,0,")
	if err != nil || !cmp.Equal([]uint32{0, 1000}, got) {
		t.Fatalf("ParseIDs = %v, %v", got, err)
	}
	if _, err := ParseIDs("root"); err == nil {
		t.Fatal("a name parsed as an id")
	}
}
