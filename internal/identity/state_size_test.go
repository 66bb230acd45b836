package identity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

type bigBaselineSource struct{}

func (bigBaselineSource) Sample(context.Context) (source.Reading, error) {
	cpu := uint64(1000)
	r := source.Reading{Kind: source.KindGuestAgent, CPUUsageUsec: &cpu, Network: &source.Network{Total: &source.InterfaceCounters{Name: "total"}}, BlockIO: &source.BlockIO{}}
	for i := range 64 {
		r.Network.Interfaces = append(r.Network.Interfaces, source.InterfaceCounters{Name: fmt.Sprintf("eth%d", i), RxBytes: 1 << 40, TxBytes: 1 << 40, RxPackets: 1 << 30, TxPackets: 1 << 30})
		r.BlockIO.Devices = append(r.BlockIO.Devices, source.DeviceIO{Major: 254, Minor: uint32(i), ReadBytes: 1 << 40, WriteBytes: 1 << 40, ReadIOs: 1 << 30, WriteIOs: 1 << 30})
	}
	return r, nil
}
func (bigBaselineSource) Close() error { return nil }

// TestStateFileHoldsEveryLargeBinding: 64 micro-VM bindings (the limit),
// each with a first-read baseline of 64 interfaces and 64 devices (what the
// micro-VM source admits) and 25 exited containers at the caps, all come
// back after a restart. With a 256 KiB
// cap on read only, 32 of them wrote a file the restart moved aside as
// corrupt, losing every binding.
func TestStateFileHoldsEveryLargeBinding(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := Config{StateDir: dir, MaxWorkloads: LimitMaxWorkloads, Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) {
		return bigBaselineSource{}, nil, nil
	}}
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range LimitMaxWorkloads {
		hex := strings.Repeat(fmt.Sprintf("%02x", i), 32)
		var ids []string
		for k := range 4 {
			ids = append(ids, fmt.Sprintf("%s%02d", hex[:62], k))
		}
		ref := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/vc/vm/" + hex + "/kata.hvsock:1024", ContainerIDs: ids}
		if _, _, err := s.Bind(ctx, OpRun, Identity{ActorUID: fmt.Sprintf("actor-%02d", i)}, ref); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, b := range s.Bindings() {
		for b.Activation.Baseline() == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	// And each at its most exited containers: 25 named at the caps (a
	// 128-byte id, a 253-byte name), with two absent reasons at theirs.
	for _, b := range s.Bindings() {
		var ex exitedState
		for k := range MaxExited {
			id := fmt.Sprintf("%s-%02d", b.Identity.ActorUID, k)
			ex.Containers = append(ex.Containers, source.Container{ID: id + strings.Repeat("i", 128-len(id)), Name: strings.Repeat("n", maxNameBytes),
				CPUUsageUsec: u64(1 << 60), Exited: true, Absent: []source.Absent{{Field: "cpu_user_usec", Reason: strings.Repeat("r", maxExitedReasonBytes)},
					{Field: "cpu_system_usec", Reason: strings.Repeat("r", maxExitedReasonBytes)}}})
		}
		ex.Folded = 1 << 20
		b.Activation.restoreExited(b.Activation.Containers(), ex)
	}
	s.persistSoon()
	time.Sleep(200 * time.Millisecond)
	s.Close()
	fi, _ := os.Stat(filepath.Join(dir, stateFileName))
	t.Logf("binding.json: %d bytes (read cap %d)", fi.Size(), maxStateBytes)
	s2, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if n := len(s2.Bindings()); n != LimitMaxWorkloads {
		t.Errorf("after a restart %d bindings of %d", n, LimitMaxWorkloads)
	}
	for _, b := range s2.Bindings() {
		if n := len(b.Activation.exitedNow().Containers); n != MaxExited {
			t.Errorf("%s: %d exited containers after a restart, want %d", b.Identity.ActorUID, n, MaxExited)
		}
	}
}
