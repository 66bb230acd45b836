package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// fakeProc writes <root>/<pid>/stat with the given start time and, unless
// exe is "", <root>/<pid>/exe as a symlink to it.
func fakeProc(t *testing.T, root string, pid int, start uint64, exe string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d (qemu) S 1 %d %d 0 -1 4194368 100 0 0 0 5 7 0 0 20 0 3 0 %d 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 9 0 0 0 0 0 0 0 0 0\n", pid, pid, pid, start)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if exe != "" {
		if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTracker: a pid is pinned (start time and executable) at its first
// check; a later check of the same pid refuses another process behind it.
func TestTracker(t *testing.T) {
	const qemu = "/usr/bin/qemu-system-x86_64"
	for _, tc := range []struct {
		name    string
		then    func(t *testing.T, root string)
		pid     int
		want    error // nil, ErrReused, or errGone (IsGone)
		wantPin Pin
	}{
		{"same process", func(*testing.T, string) {}, 4242, nil, Pin{PID: 4242, StartTicks: 100, Exe: qemu}},
		{"pid reused: another start time", func(t *testing.T, root string) { fakeProc(t, root, 4242, 900, qemu) }, 4242, ErrReused, Pin{}},
		{"pid reused: another executable", func(t *testing.T, root string) { fakeProc(t, root, 4242, 100, "/usr/bin/sleep") }, 4242, ErrReused, Pin{}},
		{"binary replaced on disk: still that process", func(t *testing.T, root string) { fakeProc(t, root, 4242, 100, qemu+" (deleted)") }, 4242, nil, Pin{PID: 4242, StartTicks: 100, Exe: qemu}},
		{"exe unreadable: start time decides", func(t *testing.T, root string) { fakeProc(t, root, 4242, 100, "") }, 4242, nil, Pin{PID: 4242, StartTicks: 100, Exe: qemu}},
		{"gone", func(t *testing.T, root string) { os.RemoveAll(filepath.Join(root, "4242")) }, 4242, errGone, Pin{}},
		{"another pid (a rewritten pid file) is pinned anew", func(t *testing.T, root string) { fakeProc(t, root, 5151, 300, qemu) }, 5151, nil, Pin{PID: 5151, StartTicks: 300, Exe: qemu}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			fakeProc(t, root, 4242, 100, qemu)
			tr := NewTracker(root)
			if _, err := tr.Check(4242); err != nil {
				t.Fatal(err)
			}
			tc.then(t, root)
			pin, err := tr.Check(tc.pid)
			switch {
			case tc.want == errGone && !IsGone(err), tc.want == nil && err != nil, tc.want == ErrReused && !errors.Is(err, ErrReused):
				t.Fatalf("Check = %v, want %v", err, tc.want)
			}
			if err == nil {
				if pin != tc.wantPin {
					t.Errorf("pin = %+v, want %+v", pin, tc.wantPin)
				}
			}
			// A reused pid stays refused: the pin is not moved to the newcomer.
			if tc.want == ErrReused {
				if _, err := tr.Check(tc.pid); !errors.Is(err, ErrReused) {
					t.Errorf("second check: %v, want ErrReused again", err)
				}
			}
		})
	}
}

var errGone = errors.New("gone")

func TestPinOfReadsExe(t *testing.T) {
	pin, err := pinOf("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	if pin.Exe == "" || pin.Exe != self {
		t.Errorf("exe %q, want %q", pin.Exe, self)
	}
}
