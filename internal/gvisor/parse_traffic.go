package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// The parsers of the traffic files: v2 io.stat, v1 blkio.throttle
// io_service_bytes/io_serviced and /proc/<pid>/net/dev. Pure, like those in
// parse.go: errors name the token, callers add the path.

// parseDevice parses "MAJ:MIN".
func parseDevice(tok string) (major, minor uint32, err error) {
	ma, mi, ok := strings.Cut(tok, ":")
	if ok {
		var a, b uint64
		if a, err = strconv.ParseUint(ma, 10, 32); err == nil {
			if b, err = strconv.ParseUint(mi, 10, 32); err == nil {
				return uint32(a), uint32(b), nil
			}
		}
	}
	return 0, 0, fmt.Errorf("token %q: want a device MAJ:MIN", tok)
}

// parseIOStat parses v2 io.stat: one line per device, "MAJ:MIN" then
// key=value fields. rbytes, wbytes, rios and wios must be numbers; a line
// without them is a device with no IO yet (the kernel prints only the
// device); other keys (dbytes, dios, and those of iocost or iolatency, which
// may be "max" or decimals) are left as they are.
func parseIOStat(b []byte) ([]source.DeviceIO, error) {
	var out []source.DeviceIO
	seen := map[[2]uint32]bool{}
	for n, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		bad := func(err error) ([]source.DeviceIO, error) {
			return nil, fmt.Errorf("line %d %q: %w", n+1, line, err)
		}
		var d source.DeviceIO
		var err error
		if d.Major, d.Minor, err = parseDevice(f[0]); err != nil {
			return bad(err)
		}
		if seen[[2]uint32{d.Major, d.Minor}] {
			return bad(fmt.Errorf("device %s listed twice", f[0]))
		}
		seen[[2]uint32{d.Major, d.Minor}] = true
		for _, tok := range f[1:] {
			k, v, ok := strings.Cut(tok, "=")
			if !ok || k == "" || v == "" {
				return bad(fmt.Errorf("token %q: want key=value", tok))
			}
			var dst *uint64
			switch k {
			case "rbytes":
				dst = &d.ReadBytes
			case "wbytes":
				dst = &d.WriteBytes
			case "rios":
				dst = &d.ReadIOs
			case "wios":
				dst = &d.WriteIOs
			default:
				continue
			}
			if *dst, err = strconv.ParseUint(v, 10, 64); err != nil {
				return bad(fmt.Errorf("token %q: %w", tok, err))
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// rwStat is one device's Read and Write of a v1 blkio rwstat file.
type rwStat struct {
	Major, Minor uint32
	Read, Write  uint64
}

// blkioOps are the operations a v1 rwstat file lists per device (Discard
// since Linux 4.19).
var blkioOps = map[string]bool{"Read": true, "Write": true, "Sync": true, "Async": true, "Discard": true, "Total": true}

// unknownBlkioDevice is what the kernel prints for a device whose disk has
// no name at that moment (bdi_dev_name's "(unknown)": a loop device being
// set up or torn down): seen in the root blkio cgroup while another test
// attached a loop device.
const unknownBlkioDevice = "(unknown)"

// parseBlkioRWStat parses a v1 blkio rwstat file
// (blkio.throttle.io_service_bytes, io_serviced): "MAJ:MIN <op> <n>" lines
// per device and a last "Total <n>" line, which must be there; a line of an
// "(unknown)" device counts in Total only. It returns each device's Read
// and Write and the file's Total.
func parseBlkioRWStat(b []byte) (devs []rwStat, total uint64, err error) {
	var index map[[2]uint32]int // made at the first device line
	sawTotal := false
	for n := 1; len(b) > 0; n++ {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		f0, rest := nextField(line)
		if len(f0) == 0 {
			continue
		}
		bad := func(err error) ([]rwStat, uint64, error) {
			return nil, 0, fmt.Errorf("line %d %q: %w", n, line, err)
		}
		if sawTotal {
			return bad(errors.New("a line after the Total line"))
		}
		f1, rest := nextField(rest)
		f2, rest := nextField(rest)
		f3, _ := nextField(rest)
		if string(f0) == "Total" && len(f1) > 0 && len(f2) == 0 {
			if total, err = strconv.ParseUint(string(f1), 10, 64); err != nil {
				return bad(fmt.Errorf("token %q: %w", f1, err))
			}
			sawTotal = true
			continue
		}
		if len(f2) == 0 || len(f3) > 0 {
			return bad(fmt.Errorf("want \"MAJ:MIN <op> <n>\" or \"Total <n>\", got %d fields", countFields(line)))
		}
		if !blkioOps[string(f1)] {
			return bad(fmt.Errorf("token %q: not an operation", f1))
		}
		v, err := strconv.ParseUint(string(f2), 10, 64)
		if err != nil {
			return bad(fmt.Errorf("token %q: %w", f2, err))
		}
		if string(f0) == unknownBlkioDevice {
			continue // a disk being added or removed: counted in Total only
		}
		ma, mi, err := parseDevice(string(f0))
		if err != nil {
			return bad(err)
		}
		if index == nil {
			index = map[[2]uint32]int{}
		}
		key := [2]uint32{ma, mi}
		i, ok := index[key]
		if !ok {
			i = len(devs)
			index[key] = i
			devs = append(devs, rwStat{Major: ma, Minor: mi})
		}
		switch string(f1) {
		case "Read":
			devs[i].Read = v
		case "Write":
			devs[i].Write = v
		}
	}
	if !sawTotal {
		return nil, 0, errors.New("no Total line")
	}
	return devs, total, nil
}

// netDevFields is the number of counters per interface in /proc/net/dev:
// receive bytes packets errs drop fifo frame compressed multicast, transmit
// bytes packets errs drop fifo colls carrier compressed.
const netDevFields = 16

// parseNetDev parses /proc/<pid>/net/dev: two header lines, then
// "<name>: <16 counters>" per interface (a long name may touch its colon and
// first number; a name cannot hold ':').
func parseNetDev(b []byte) ([]source.InterfaceCounters, error) {
	lines := strings.Split(string(b), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "Inter-|") || !strings.Contains(lines[1], "face |") {
		return nil, errors.New("no \"Inter-|\" and \" face |\" header lines")
	}
	var out []source.InterfaceCounters
	seen := map[string]bool{}
	for n, line := range lines[2:] {
		if strings.TrimSpace(line) == "" {
			continue
		}
		bad := func(err error) ([]source.InterfaceCounters, error) {
			return nil, fmt.Errorf("line %d %q: %w", n+3, line, err)
		}
		name, rest, ok := strings.Cut(line, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return bad(errors.New("want \"<interface>: <counters>\""))
		}
		if seen[name] {
			return bad(fmt.Errorf("interface %q listed twice", name))
		}
		seen[name] = true
		f := strings.Fields(rest)
		if len(f) != netDevFields {
			return bad(fmt.Errorf("want %d counters, got %d", netDevFields, len(f)))
		}
		var v [netDevFields]uint64
		for i, tok := range f {
			var err error
			if v[i], err = strconv.ParseUint(tok, 10, 64); err != nil {
				return bad(fmt.Errorf("token %q: %w", tok, err))
			}
		}
		out = append(out, source.InterfaceCounters{
			Name:    name,
			RxBytes: v[0], RxPackets: v[1], RxErrors: v[2], RxDropped: v[3],
			TxBytes: v[8], TxPackets: v[9], TxErrors: v[10], TxDropped: v[11],
		})
	}
	return out, nil
}
