// This file reads v1 block IO (blkio.throttle.io_service_bytes and
// io_serviced) and decides whether the kernel counts it at all.
//
// v1 blk-throttle counts a bio in a cgroup's throttle stats only when
// blk-throttle is active on the bio's device (blk_should_throtl in
// block/blk-throttle.h returns before counting while q->td is NULL). Since
// "blk-throttle: delay initialization until configuration" (Linux 6.10)
// that happens when some cgroup first writes a throttle rule
// (blkio.throttle.{read,write}_{bps,iops}_device) for the device, and lasts
// until the device goes away, whatever happens to the rule. It is per
// device, not per cgroup: a rule in any cgroup makes every cgroup's IO to
// that device count from then on. The root cgroup has a blkg on every
// device, and the file prints a device only where the policy is active, so
// the root's io_service_bytes lists exactly the devices that count. None
// listed: the sandbox's counters would stay 0 whatever it writes, so block
// IO is absent, never 0. See docs/signals.md for the evidence.

package gvisor

import (
	"fmt"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// whyUncounted is the absent reason when no device has blk-throttle active.
const whyUncounted = "cgroup v1 blk-throttle counts IO only on block devices for which some cgroup has set a " +
	"throttle rule (blkio.throttle.{read,write}_{bps,iops}_device) since the device appeared (Linux 6.10+ " +
	"sets blk-throttle up lazily); %s lists no such device, so this cgroup's counters would stay 0 whatever it " +
	"writes (see docs/signals.md)"

// fillBlkioV1 fills r.BlockIO from the sandbox's io_service_bytes and
// io_serviced, counting only if root (the hierarchy root's
// io_service_bytes) lists a device.
func fillBlkioV1(r *source.Reading, bytesF, iosF, rootF *fileReq, whyNil string) error {
	type parsed struct {
		devs  []rwStat
		total uint64
	}
	parse := func(b []byte) (parsed, error) {
		d, t, err := parseBlkioRWStat(b)
		return parsed{d, t}, err
	}
	var files [3]parsed
	for i, f := range []*fileReq{bytesF, iosF, rootF} {
		v, ok, why, err := optParse(f, whyNil, parse)
		if err != nil {
			return err
		}
		if !ok {
			if i == 2 {
				why = "cannot tell which devices blk-throttle counts: " + why
			}
			absent(r, "block_io", why)
			return nil
		}
		files[i] = v
	}
	if len(files[2].devs) == 0 {
		absent(r, "block_io", fmt.Sprintf(whyUncounted, rootF.path()))
		return nil
	}
	var counted []string
	for _, d := range files[2].devs {
		counted = append(counted, fmt.Sprintf("%d:%d", d.Major, d.Minor))
	}
	b := &source.BlockIO{Origin: fmt.Sprintf("%s, %s (blk-throttle counts only devices with a throttle rule "+
		"set since they appeared: %s; IO to any other device is not counted)",
		bytesF.path(), iosF.name, strings.Join(counted, " "))}
	index := map[[2]uint32]int{}
	dev := func(ma, mi uint32) *source.DeviceIO {
		k := [2]uint32{ma, mi}
		i, ok := index[k]
		if !ok {
			i = len(b.Devices)
			index[k] = i
			b.Devices = append(b.Devices, source.DeviceIO{Major: ma, Minor: mi})
		}
		return &b.Devices[i]
	}
	for _, d := range files[0].devs {
		x := dev(d.Major, d.Minor)
		x.ReadBytes, x.WriteBytes = d.Read, d.Write
		b.ReadBytes, b.WriteBytes = source.AddSat(b.ReadBytes, d.Read), source.AddSat(b.WriteBytes, d.Write)
	}
	for _, d := range files[1].devs {
		x := dev(d.Major, d.Minor)
		x.ReadIOs, x.WriteIOs = d.Read, d.Write
		b.ReadIOs, b.WriteIOs = source.AddSat(b.ReadIOs, d.Read), source.AddSat(b.WriteIOs, d.Write)
	}
	r.BlockIO = b
	return nil
}
