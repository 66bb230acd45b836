package gvisor

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// netDevHeader is the two header lines of /proc/net/dev.
const netDevHeader = "Inter-|   Receive                                                |  Transmit\n" +
	" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"

func TestParseIOStat(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    []source.DeviceIO
		wantErr string
	}{
		{name: "two devices", in: "254:0 rbytes=4096 wbytes=67108864 rios=1 wios=128 dbytes=0 dios=0\n8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n",
			want: []source.DeviceIO{{Major: 254, Minor: 0, ReadBytes: 4096, WriteBytes: 67108864, ReadIOs: 1, WriteIOs: 128}, {Major: 8, ReadBytes: 1, WriteBytes: 2, ReadIOs: 3, WriteIOs: 4}}},
		{name: "device with no IO yet prints only the device", in: "259:0 \n", want: []source.DeviceIO{{Major: 259}}},
		{name: "iolatency and iocost keys tolerated", in: "8:16 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0 depth=max avg_lat=0 win=0 cost.vrate=100.00\n",
			want: []source.DeviceIO{{Major: 8, Minor: 16, ReadBytes: 1, WriteBytes: 2, ReadIOs: 3, WriteIOs: 4}}},
		{name: "empty file", in: ""},
		{name: "bad device", in: "sda rbytes=1\n", wantErr: `token "sda"`},
		{name: "bad counter", in: "8:0 rbytes=x wbytes=0 rios=0 wios=0\n", wantErr: `token "rbytes=x"`},
		{name: "max in a counter", in: "8:0 rbytes=max\n", wantErr: `token "rbytes=max"`},
		{name: "bare token", in: "8:0 rbytes\n", wantErr: `token "rbytes"`},
		{name: "device twice", in: "8:0 rbytes=1\n8:0 rbytes=2\n", wantErr: "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseIOStat([]byte(tc.in))
			if checkErr(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseBlkioRWStat(t *testing.T) {
	const counted = "254:0 Read 4096\n254:0 Write 67108864\n254:0 Sync 67108864\n254:0 Async 4096\n254:0 Discard 0\n254:0 Total 67112960\nTotal 67112960\n"
	for _, tc := range []struct {
		name      string
		in        string
		want      []rwStat
		wantTotal uint64
		wantErr   string
	}{
		{name: "one device", in: counted, want: []rwStat{{Major: 254, Read: 4096, Write: 67108864}}, wantTotal: 67112960},
		{name: "nothing counted", in: "Total 0\n", wantTotal: 0},
		{name: "two devices, no Discard (Linux < 4.19)", in: "8:0 Read 1\n8:0 Write 2\n8:0 Sync 3\n8:0 Async 0\n8:0 Total 3\n8:16 Read 5\n8:16 Write 0\n8:16 Total 5\nTotal 8\n",
			want: []rwStat{{Major: 8, Read: 1, Write: 2}, {Major: 8, Minor: 16, Read: 5}}, wantTotal: 8},
		{name: "a device with no name at the moment (the kernel's \"(unknown)\")", in: "(unknown) Read 0\n(unknown) Write 0\n(unknown) Total 0\n254:0 Read 7\nTotal 7\n",
			want: []rwStat{{Major: 254, Read: 7}}, wantTotal: 7},
		{name: "an (unknown) device's bad op", in: "(unknown) Trim 0\nTotal 0\n", wantErr: `token "Trim"`},
		{name: "no Total line", in: "254:0 Read 1\n", wantErr: "no Total line"},
		{name: "empty file", in: "", wantErr: "no Total line"},
		{name: "unknown op", in: "254:0 Trim 1\nTotal 1\n", wantErr: `token "Trim"`},
		{name: "bad count", in: "254:0 Read x\nTotal 0\n", wantErr: `token "x"`},
		{name: "line after Total", in: "Total 0\n254:0 Read 1\n", wantErr: "after the Total line"},
		{name: "bad device", in: "vda Read 1\nTotal 1\n", wantErr: `token "vda"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, total, err := parseBlkioRWStat([]byte(tc.in))
			if checkErr(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" || total != tc.wantTotal {
				t.Errorf("total %d (want %d); devices (-want +got):\n%s", total, tc.wantTotal, diff)
			}
		})
	}
}

func TestParseNetDev(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    []source.InterfaceCounters
		wantErr string
	}{
		{name: "loopback and a veth whose long name touches its counters",
			in: netDevHeader +
				"    lo:     120       2    0    0    0     0          0         0      120       2    0    0    0     0       0          0\n" +
				"sbsveth0a12345:10735384    7000    1    2    0     0          0         0  1502  21    3    4    0     0       0          0\n",
			want: []source.InterfaceCounters{
				{Name: "lo", RxBytes: 120, RxPackets: 2, TxBytes: 120, TxPackets: 2},
				{Name: "sbsveth0a12345", RxBytes: 10735384, RxPackets: 7000, RxErrors: 1, RxDropped: 2, TxBytes: 1502, TxPackets: 21, TxErrors: 3, TxDropped: 4},
			}},
		{name: "header only", in: netDevHeader},
		{name: "no header", in: "lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", wantErr: "header lines"},
		{name: "15 counters", in: netDevHeader + "lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", wantErr: "got 15"},
		{name: "bad counter", in: netDevHeader + "lo: 0 0 0 0 0 0 0 0 x 0 0 0 0 0 0 0\n", wantErr: `token "x"`},
		{name: "no colon", in: netDevHeader + "lo 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", wantErr: "want \"<interface>: <counters>\""},
		{name: "interface twice", in: netDevHeader + "lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\nlo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", wantErr: "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseNetDev([]byte(tc.in))
			if checkErr(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseIOStat(f *testing.F) {
	for _, s := range []string{"254:0 rbytes=4096 wbytes=67108864 rios=1 wios=128 dbytes=0 dios=0\n", "259:0 \n", "8:0 depth=max\n", "sda x\n", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		devs, err := parseIOStat([]byte(s))
		if err != nil {
			return
		}
		if n := len(strings.Fields(s)); len(devs) > n {
			t.Fatalf("%d devices from %d tokens", len(devs), n)
		}
	})
}

func FuzzParseBlkioRWStat(f *testing.F) {
	for _, s := range []string{"Total 0\n", "254:0 Read 1\n254:0 Write 2\n254:0 Total 3\nTotal 3\n", "254:0 Read 1\n", "x\n", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		devs, _, err := parseBlkioRWStat([]byte(s))
		if err != nil {
			return
		}
		seen := map[[2]uint32]bool{}
		for _, d := range devs {
			if seen[[2]uint32{d.Major, d.Minor}] {
				t.Fatalf("device %d:%d twice", d.Major, d.Minor)
			}
			seen[[2]uint32{d.Major, d.Minor}] = true
		}
	})
}

func FuzzParseNetDev(f *testing.F) {
	f.Add(netDevHeader + "    lo: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n")
	f.Add(netDevHeader + "veth0:1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n")
	f.Add(netDevHeader)
	f.Add("lo: 0\n")
	f.Fuzz(func(t *testing.T, s string) {
		ifaces, err := parseNetDev([]byte(s))
		if err != nil {
			return
		}
		// Round trip: the interfaces written back in the kernel's layout
		// parse to the same counters.
		var b strings.Builder
		b.WriteString(netDevHeader)
		for _, c := range ifaces {
			fmt.Fprintf(&b, "%6s: %d %d %d %d 0 0 0 0 %d %d %d %d 0 0 0 0\n", c.Name,
				c.RxBytes, c.RxPackets, c.RxErrors, c.RxDropped, c.TxBytes, c.TxPackets, c.TxErrors, c.TxDropped)
		}
		back, err := parseNetDev([]byte(b.String()))
		if err != nil {
			t.Fatalf("round trip: %v\n%s", err, b.String())
		}
		if diff := cmp.Diff(ifaces, back); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}
