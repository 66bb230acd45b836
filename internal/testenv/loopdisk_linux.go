package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Loop device control requests (linux/loop.h).
const (
	loopCtlAdd    = 0x4C80
	loopCtlRemove = 0x4C81
)

// NewLoopDisk makes a fresh loop disk (LOOP_CTL_ADD: a new gendisk, so
// blk-throttle is not set up on it) backed by a 160 MiB file with an ext4
// file system, and removes it at the end of the test (LOOP_CTL_REMOVE:
// whatever blk-throttle state it had goes with it). It returns the device
// node and its MAJ:MIN. Mount it only inside a private mount namespace
// (unshare --mount) that ends before the test does, so nothing holds it at
// the removal.
func NewLoopDisk(t testing.TB) (dev, majMin string) {
	t.Helper()
	Need(t, os.Geteuid() == 0, "needs root to make a loop disk (run the tests as root)")
	for _, tool := range []string{"losetup", "mkfs.ext4", "unshare"} {
		_, err := exec.LookPath(tool)
		Need(t, err == nil, "needs "+tool+" (apt-get install util-linux e2fsprogs)")
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	Need(t, err == nil, "needs /dev/loop-control (CONFIG_BLK_DEV_LOOP): "+fmt.Sprint(err))
	defer ctl.Close()
	idx := -1
	for i := 200 + os.Getpid()%500; i < 1000; i++ {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, ctl.Fd(), loopCtlAdd, uintptr(i)); e == 0 {
			idx = i
			break
		}
	}
	if idx < 0 {
		t.Fatal("LOOP_CTL_ADD: no free loop index")
	}
	dev = fmt.Sprintf("/dev/loop%d", idx)
	t.Cleanup(func() {
		c, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer c.Close()
		for range 50 { // the detach is asynchronous
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, c.Fd(), loopCtlRemove, uintptr(idx)); e == 0 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cleanup: LOOP_CTL_REMOVE %s failed", dev)
	})
	img := filepath.Join(t.TempDir(), "disk.img")
	for _, cmd := range [][]string{{"truncate", "-s", "160M", img}, {"losetup", dev, img}, {"mkfs.ext4", "-q", "-F", dev}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
		if cmd[0] == "losetup" {
			t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/dev", idx))
	if err != nil {
		t.Fatal(err)
	}
	return dev, strings.TrimSpace(string(b))
}
