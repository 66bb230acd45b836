package hoststat

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

func TestClassifyThread(t *testing.T) {
	vcpu := source.VMMThreadClassVCPU
	other := source.VMMThreadClassOther
	for _, tc := range []struct {
		name  string
		class source.VMMThreadClass
		idx   int32
	}{
		{"CPU 0/KVM", vcpu, 0},
		{"CPU 13/KVM", vcpu, 13},
		{"CPU 1/TCG", vcpu, 1},
		{"vcpu0", vcpu, 0},
		{"vcpu7", vcpu, 7},
		{"fc_vcpu 0", vcpu, 0},
		{"fc_vcpu 11", vcpu, 11},
		{"qemu-system-x86", other, 0},
		{"IO mon_iothread", other, 0},
		{"call_rcu", other, 0},
		{"kvm-nx-lpage-re", other, 0},
		{"vhost-4242", other, 0},
		{"vcpu", other, 0},
		{"vcpu-1", other, 0},
		{"vcpu+1", other, 0},
		{"CPU x/KVM", other, 0},
		{"CPU /KVM", other, 0},
		{"fc_vcpu", other, 0},
		{"virtio-blk0", other, 0},
		{"fc_api", other, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			class, idx, isVCPU := classifyThread(tc.name)
			if class != tc.class || idx != tc.idx || isVCPU != (tc.class == vcpu) {
				t.Errorf("classifyThread(%q) = %v, %d, %v; want %v, %d", tc.name, class, idx, isVCPU, tc.class, tc.idx)
			}
		})
	}
}

func TestParseQEMUGuestName(t *testing.T) {
	nul := func(args ...string) string { return strings.Join(args, "\x00") + "\x00" }
	for _, tc := range []struct {
		name, in, want string
	}{
		{"guest key", nul("qemu-system-x86_64", "-accel", "kvm", "-name", "guest=srv1,debug-threads=on"), "srv1"},
		{"implied key", nul("qemu", "-name", "srv2,debug-threads=on"), "srv2"},
		{"guest key not first", nul("qemu", "-name", "debug-threads=on,guest=srv3"), "srv3"},
		{"double dash and equals", nul("qemu", "--name=guest=srv4"), "srv4"},
		{"escaped comma", nul("qemu", "-name", "guest=a,,b,debug-threads=on"), "a,b"},
		{"only options", nul("qemu", "-name", "debug-threads=on"), ""},
		{"no -name", nul("qemu-system-x86_64", "-m", "128"), ""},
		{"-name last", nul("qemu", "-name"), ""},
		{"empty guest", nul("qemu", "-name", "guest="), ""},
		{"control characters", nul("qemu", "-name", "guest=a\nb"), ""},
		{"firecracker", nul("firecracker", "--api-sock", "/run/fc.sock"), ""},
		{"empty cmdline (zombie or kernel thread)", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseQEMUGuestName([]byte(tc.in)); got != tc.want {
				t.Errorf("parseQEMUGuestName = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestGuestNameFromPIDFile(t *testing.T) {
	for in, want := range map[string]string{
		"/run/vms/srv1/qemu.pid": "srv1",
		"srv1/qemu.pid":          "srv1",
		"/run/qemu.pid":          "",
		"/tmp/qemu.pid":          "",
		"/qemu.pid":              "",
		"qemu.pid":               "",
		"":                       "",
		"/var/lib/vm7/fc.pid":    "vm7",
	} {
		if got := guestNameFromPIDFile(in); got != want {
			t.Errorf("guestNameFromPIDFile(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseVMDirName(t *testing.T) {
	for _, tc := range []struct {
		in      string
		pid, fd int32
		ok      bool
	}{
		{"786263-25", 786263, 25, true},
		{"14470-11", 14470, 11, true},
		{"112-5", 112, 5, true},
		{"exits", 0, 0, false},
		{"12-", 0, 0, false},
		{"-5", 0, 0, false},
		{"1-2-3", 0, 0, false},
		{"0-4", 0, 0, false},
		{"+1-2", 0, 0, false},
	} {
		pid, fd, ok := parseVMDirName(tc.in)
		if pid != tc.pid || fd != tc.fd || ok != tc.ok {
			t.Errorf("parseVMDirName(%q) = %d, %d, %v; want %d, %d, %v", tc.in, pid, fd, ok, tc.pid, tc.fd, tc.ok)
		}
	}
}

func TestParseDebugfsValue(t *testing.T) {
	if v, err := parseDebugfsValue([]byte("18446744073709551615\n")); err != nil || v != 1<<64-1 {
		t.Errorf("max u64 = %d, %v", v, err)
	}
	for _, bad := range []string{"", "\n", "-1\n", "1 2\n", "abc"} {
		if _, err := parseDebugfsValue([]byte(bad)); !errors.Is(err, source.ErrMalformed) {
			t.Errorf("parseDebugfsValue(%q) err = %v, want ErrMalformed", bad, err)
		}
	}
}

// TestThreadOf: the Cloud Hypervisor vmm thread 5001 is a thread of 5000
// (testdata/proc/5000/task/5001), of no other process.
func TestThreadOf(t *testing.T) {
	r := debugfsReader{procRoot: filepath.Join("testdata", "proc")}
	for _, tc := range []struct {
		tid, pid int32
		want     bool
	}{
		{5001, 5000, true},
		{5000, 5000, true},
		{5001, 4242, false},
		{9999, 5000, false},
		{5001, 9999, false},
		{-1, 5000, false},
	} {
		if got := r.threadOf(tc.tid, tc.pid); got != tc.want {
			t.Errorf("threadOf(%d, %d) = %v, want %v", tc.tid, tc.pid, got, tc.want)
		}
	}
}

func TestKVMKindUnitScope(t *testing.T) {
	cum, gauge, peak := source.KVMCounterKindCumulative, source.KVMCounterKindGauge, source.KVMCounterKindPeak
	for _, tc := range []struct {
		name  string
		mode  os.FileMode
		kind  source.KVMCounterKind
		unit  string
		scope string
	}{
		{"exits", 0o644, cum, "count", "vcpu-sum"},
		{"halt_wait_ns", 0o644, cum, "ns", "vcpu-sum"},
		{"blocking", 0o444, gauge, "count", "vcpu-sum"},
		{"pages_4k", 0o444, gauge, "count", "vm"},
		{"largepages", 0o644, gauge, "count", "vm"},
		{"max_mmu_rmap_size", 0o644, peak, "count", "vm"},
		{"remote_tlb_flush", 0o644, cum, "count", "vm"},
		{"some_future_gauge", 0o444, gauge, "count", "vcpu-sum"},
		{"some_future_counter", 0o644, cum, "count", "vcpu-sum"},
	} {
		if k, u, s := kvmKind(tc.name, tc.mode), kvmUnit(tc.name), kvmScope(tc.name); k != tc.kind || u != tc.unit || s != tc.scope {
			t.Errorf("%s: kind %v unit %q scope %q; want %v %q %q", tc.name, k, u, s, tc.kind, tc.unit, tc.scope)
		}
	}
}

func TestQMPUnit(t *testing.T) {
	for _, tc := range []struct {
		s    qmpSchema
		want string
	}{
		{qmpSchema{}, "count"},
		{qmpSchema{Unit: "seconds", Base: 10, Exponent: -9}, "ns"},
		{qmpSchema{Unit: "seconds", Base: 10, Exponent: -6}, "usec"},
		{qmpSchema{Unit: "bytes", Base: 2, Exponent: 12}, "bytes*2^12"},
		{qmpSchema{Unit: "boolean"}, "boolean"},
	} {
		if got := qmpUnit(tc.s); got != tc.want {
			t.Errorf("qmpUnit(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// TestQMPStatsUnknownVCPU: a vCPU whose QOM path query-cpus-fast did not
// list is scoped by that path, not by its position in the reply (which can
// equal a real vCPU's index).
func TestQMPStatsUnknownVCPU(t *testing.T) {
	raw := []byte(`[
		{"provider": "kvm", "qom-path": "/machine/unattached/device[9]", "stats": [{"name": "exits", "value": 7}]},
		{"provider": "kvm", "qom-path": "/machine/unattached/device[0]", "stats": [{"name": "exits", "value": 100}]}
	]`)
	cpus := map[string]int32{"/machine/unattached/device[0]": 0}
	got, err := parseQMPStats(raw, "vcpu", nil, cpus)
	if err != nil {
		t.Fatal(err)
	}
	scopes := map[string]uint64{}
	for _, c := range got {
		if _, dup := scopes[c.Scope]; dup {
			t.Errorf("scope %q given twice", c.Scope)
		}
		scopes[c.Scope] = c.Value
	}
	want := map[string]uint64{"vcpu0": 100, "qom:/machine/unattached/device[9]": 7}
	if diff := cmp.Diff(want, scopes); diff != "" {
		t.Errorf("scopes (-want +got):\n%s", diff)
	}
}
