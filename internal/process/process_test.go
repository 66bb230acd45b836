package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

func TestParsePIDFile(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"4242\n", 4242, true},
		{"  17  \n", 17, true},
		{"2147483647", 2147483647, true},
		{"", 0, false},
		{"0", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{"2147483648", 0, false},
		{"12 34", 0, false},
		{"0x10", 0, false},
		{"root:$6$secret:19000:0:99999:7:::", 0, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePIDFile([]byte(tc.in))
			if tc.ok != (err == nil) || got != tc.want {
				t.Fatalf("ParsePIDFile(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, ErrNotPID) {
					t.Errorf("err %v does not wrap ErrNotPID", err)
				}
				if tc.in != "" && strings.Contains(err.Error(), strings.TrimSpace(tc.in)) {
					t.Errorf("err %q echoes the content", err)
				}
			}
		})
	}
}

func FuzzParsePIDFile(f *testing.F) {
	for _, s := range []string{"4242\n", "", "-1", "99999999999", " 7 ", "secret", "pid: 4 b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		pid, err := ParsePIDFile(b)
		if err != nil {
			if pid != 0 {
				t.Fatalf("pid %d with error", pid)
			}
			// The error depends on the content's length alone, so no
			// byte of the content can reach it. (Checking that the text
			// is not a substring of the error was wrong: content such as
			// "pid: 4 b" is a substring of the fixed words; CI's fuzzer
			// found one.)
			if want := fmt.Sprintf("%v: %d bytes", ErrNotPID, len(b)); err.Error() != want {
				t.Fatalf("error %q, want %q: it must not depend on the content", err, want)
			}
			return
		}
		if pid <= 0 {
			t.Fatalf("accepted pid %d", pid)
		}
	})
}

// TestReadPIDFileRefuses: what a launcher (or an attacker with the lifecycle
// socket) may name as a pid file is read only if it is a small regular
// file, and its content never reaches an error.
func TestReadPIDFileRefuses(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "shadow")
	if err := os.WriteFile(secret, []byte("root:$6$SECRET:19000:0:99999:7:::\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.pid")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.pid")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.pid")
	if err := os.WriteFile(big, []byte(strings.Repeat("1", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "qemu.pid")
	if err := os.WriteFile(good, []byte("4242\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pid, err := ReadPIDFile(good); err != nil || pid != 4242 {
		t.Fatalf("ReadPIDFile(good) = %d, %v", pid, err)
	}
	for _, tc := range []struct {
		name, path string
		want       error
	}{
		{"secret content", secret, ErrNotPID},
		{"symlink", link, bounded.ErrNotRegular},
		{"fifo", fifo, bounded.ErrNotRegular},
		{"directory", dir, bounded.ErrNotRegular},
		{"over the size cap", big, nil},
		{"missing", filepath.Join(dir, "none"), os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadPIDFile(tc.path)
			if err == nil {
				t.Fatal("read")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("err %q carries the file's content", err)
			}
		})
	}
}

func TestStartTimeAndPin(t *testing.T) {
	pin, err := pinOf("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if pin.StartTicks == 0 {
		t.Fatal("start time 0")
	}
	if ok, err := pin.Running("/proc"); !ok || err != nil {
		t.Fatalf("Running = %v, %v for this process", ok, err)
	}
	other := pin
	other.StartTicks++
	if ok, err := other.Running("/proc"); ok || err != nil {
		t.Fatalf("a reused pid (other start time) reads as running: %v, %v", ok, err)
	}
	if _, err := StartTime(t.TempDir(), 1); !IsGone(err) {
		t.Fatalf("missing pid: err = %v, want gone", err)
	}
}

// FuzzStartTime feeds arbitrary stat lines through StartTime: it never
// panics, and an error is either malformed or gone (a zombie's state Z).
func FuzzStartTime(f *testing.F) {
	line := "4242 (CPU 0/KVM) S 1 4242 4242 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0 86000 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 9 0 0 0 0 0 0 0 0 0\n"
	for _, s := range []string{line, "9 (x)", "9 (a) (b) S", "", "9 (x) S 1", strings.Replace(line, ") S ", ") Z ", 1)} {
		f.Add([]byte(s))
	}
	// One directory for the worker's inputs, rewritten for each (inputs run
	// one at a time in a worker): a directory per input made the target
	// slow enough to trip the fuzz coordinator's deadline.
	root := f.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "9"), 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(filepath.Join(root, "9", "stat"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := StartTime(root, 9); err != nil && !errors.Is(err, ErrMalformedStat) && !IsGone(err) {
			t.Fatalf("err %v is neither malformed nor gone", err)
		}
	})
}

// TestZombieIsGone: a process that exited but is not reaped is gone (the
// kernel has moved it to the root cgroups already).
func TestZombieIsGone(t *testing.T) {
	root := t.TempDir()
	for pid, state := range map[string]string{"7": "Z", "8": "S"} {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		line := pid + " (sentry) " + state + " 1 7 7 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0 86000 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 9 0 0 0 0 0 0 0 0 0\n"
		if err := os.WriteFile(filepath.Join(root, pid, "stat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := StartTime(root, 7); !IsGone(err) || !errors.Is(err, ErrExited) {
		t.Errorf("zombie: err = %v, want gone (ErrExited)", err)
	}
	if v, err := StartTime(root, 8); err != nil || v != 86000 {
		t.Errorf("sleeping: %d, %v", v, err)
	}
}
