package gvisor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// Loop device control requests (linux/loop.h).
const (
	loopCtlAdd    = 0x4C80
	loopCtlRemove = 0x4C81
)

// newLoopDisk makes a fresh loop disk (LOOP_CTL_ADD: a new gendisk, so
// blk-throttle is not set up on it) backed by a 160 MiB file with an ext4
// file system, and removes it at the end of the test (LOOP_CTL_REMOVE:
// whatever blk-throttle state it had goes with it). It returns the device
// node and its MAJ:MIN.
func newLoopDisk(t *testing.T) (dev, majMin string) {
	t.Helper()
	for _, tool := range []string{"losetup", "mkfs.ext4", "unshare"} {
		_, err := exec.LookPath(tool)
		testenv.Need(t, err == nil, "needs "+tool+" (apt-get install util-linux e2fsprogs)")
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	testenv.Need(t, err == nil, "needs /dev/loop-control (CONFIG_BLK_DEV_LOOP): "+fmt.Sprint(err))
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

func deviceIO(b *source.BlockIO, majMin string) (source.DeviceIO, bool) {
	if b == nil {
		return source.DeviceIO{}, false
	}
	for _, d := range b.Devices {
		if fmt.Sprintf("%d:%d", d.Major, d.Minor) == majMin {
			return d, true
		}
	}
	return source.DeviceIO{}, false
}

// TestIntegrationBlockIOPerDevice shows what decides v1 block IO counting,
// on a fresh loop disk: a 64 MiB direct write from the test cgroup to it is
// not counted (the disk is absent from the sample, or block IO is absent
// altogether when no disk counts); once the test sets a throttle rule
// (10 GB/s, far above what the write needs) for that disk in its own cgroup,
// the same write raises the disk's write bytes by 64 MiB ± 10 %.
func TestIntegrationBlockIOPerDevice(t *testing.T) {
	name := testCgroupName()
	dirs := v1Cgroups(t, name, "memory", "cpuacct", "blkio")
	dev, majMin := newLoopDisk(t)
	mnt := t.TempDir()
	s := openByPath(t, name)
	file := filepath.Join(mnt, "f")

	r0 := mustSample(t, s)
	ddDirect(t, dirs, dev, file)
	r1 := mustSample(t, s)
	d1, listed := deviceIO(r1.BlockIO, majMin)
	t.Logf("no rule: loop disk %s listed %v (%+v); block_io %s", majMin, listed, d1, blockIOLine(r1))
	if listed && d1.WriteBytes > 0 {
		t.Fatalf("a disk without blk-throttle counted %d write bytes", d1.WriteBytes)
	}
	if r0.BlockIO == nil && r1.BlockIO != nil {
		t.Fatalf("block IO appeared without any rule: %+v", r1.BlockIO)
	}

	rule := filepath.Join(dirs["blkio"], "blkio.throttle.write_bps_device")
	if err := os.WriteFile(rule, []byte(majMin+" 10000000000"), 0o644); err != nil {
		t.Fatalf("set a 10 GB/s rule for %s in the test's own cgroup: %v", majMin, err)
	}
	t.Cleanup(func() { os.WriteFile(rule, []byte(majMin+" 0"), 0o644) })
	r2 := mustSample(t, s)
	ddDirect(t, dirs, dev, file)
	r3 := mustSample(t, s)
	d2, _ := deviceIO(r2.BlockIO, majMin)
	d3, listed := deviceIO(r3.BlockIO, majMin)
	grew := int64(d3.WriteBytes - d2.WriteBytes)
	t.Logf("with a rule: loop disk %s write bytes +%.1f MiB, write IOs +%d; block_io %s", majMin, float64(grew)/mib, d3.WriteIOs-d2.WriteIOs, blockIOLine(r3))
	if !listed || !within(grew, 64*mib, 0.10) {
		t.Errorf("with a throttle rule, the disk's write bytes rose by %.1f MiB (listed %v), want 64 MiB ± 10 %%", float64(grew)/mib, listed)
	}
}

func blockIOLine(r source.Reading) string {
	if r.BlockIO == nil {
		return "absent: " + absentWhy(r, "block_io")
	}
	return fmt.Sprintf("write %d bytes (%s)", r.BlockIO.WriteBytes, r.BlockIO.Origin)
}
