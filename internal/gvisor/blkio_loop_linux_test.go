package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

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
	dev, majMin := testenv.NewLoopDisk(t)
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
