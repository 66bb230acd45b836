package microvm

import (
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
)

// rateConsumer is how a poller must use cpu_usage_usec: rates only between
// two samples of the same epoch, and a decrease inside an epoch is a reset.
type rateConsumer struct {
	haveLast   bool
	lastEpoch  int64
	lastCPU    uint64
	lastAt     time.Time
	rates      []float64 // CPU seconds per second
	resets     int
	crossEpoch int // samples whose predecessor was of another epoch
}

func (c *rateConsumer) observe(epoch int64, cpuUsec uint64, at time.Time) {
	switch {
	case !c.haveLast:
	case epoch != c.lastEpoch:
		c.crossEpoch++
	case cpuUsec < c.lastCPU:
		c.resets++
	default:
		c.rates = append(c.rates, float64(cpuUsec-c.lastCPU)/1e6/at.Sub(c.lastAt).Seconds())
	}
	c.haveLast, c.lastEpoch, c.lastCPU, c.lastAt = true, epoch, cpuUsec, at
}

// A micro-VM's CPU counter is the guest's: it survives a checkpoint and
// restore with the guest's RAM, so the first sample of a restored workload
// continues from where the checkpoint left it, not from 0 as a fresh cgroup
// would. A restore from an older snapshot makes it go back. Each Run/Restore
// opens a new source under a new epoch_unix_nano (internal/server does
// that); a consumer keyed on the epoch never computes a rate across the
// restore, so it never sees a negative one.
func TestCPUAcrossRestore(t *testing.T) {
	dir := t.TempDir()
	guest := func(cpuSec float64) kataagentfake.Container {
		return kataagentfake.Container{UsageBytes: 64 * mib, MaxUsageBytes: 64 * mib, CPUTotal: uint64(cpuSec * 1e9)}
	}
	agent := kataagentfake.New(t, dir, kataagentfake.WithVersion("4.1.0"), kataagentfake.WithContainer("a", kataagentfake.V2(guest(10))))
	var (
		c     rateConsumer
		clock = time.Unix(1_700_000_000, 0)
		seen  []uint64
	)
	poll := func(s *guestSource, epoch int64, guestCPU float64) {
		t.Helper()
		agent.SetContainer("a", kataagentfake.V2(guest(guestCPU)))
		r := sample(t, s)
		seen = append(seen, *r.CPUUsageUsec)
		c.observe(epoch, *r.CPUUsageUsec, clock)
		clock = clock.Add(time.Second)
	}

	// Epoch 1 (RunWorkload): the guest burns 0.5 CPU.
	epoch1 := clock.UnixNano()
	s1 := mustOpen(t, agent.Address(), testConfig(), "a")
	poll(s1, epoch1, 10)
	poll(s1, epoch1, 10.5)
	poll(s1, epoch1, 11)
	s1.Close() // CheckpointWorkload; the snapshot holds the guest at 11 s.

	// Epoch 2 (RestoreWorkload of that snapshot in a new VMM): the guest
	// counter continues from 11 s.
	agent.Restart()
	clock = clock.Add(time.Minute)
	epoch2 := clock.UnixNano()
	s2 := mustOpen(t, agent.Address(), testConfig(), "a")
	poll(s2, epoch2, 11.25)
	poll(s2, epoch2, 11.75)
	s2.Close()

	// Epoch 3: the same snapshot restored again, so the counter is below
	// epoch 2's last value.
	agent.Restart()
	clock = clock.Add(time.Minute)
	epoch3 := clock.UnixNano()
	s3 := mustOpen(t, agent.Address(), testConfig(), "a")
	poll(s3, epoch3, 11.1)
	poll(s3, epoch3, 11.6)

	want := []uint64{10_000_000, 10_500_000, 11_000_000, 11_250_000, 11_750_000, 11_100_000, 11_600_000}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("cpu_usage_usec sequence %v, want %v (the guest's counter, carried across restores)", seen, want)
		}
	}
	for _, r := range c.rates {
		if r < 0 {
			t.Fatalf("negative rate %v", r)
		}
	}
	if len(c.rates) != 4 || c.crossEpoch != 2 || c.resets != 0 {
		t.Fatalf("rates %v, cross-epoch %d, resets %d; want 4 in-epoch rates, 2 epoch changes, 0 resets", c.rates, c.crossEpoch, c.resets)
	}
	if c.rates[0] != 0.5 || c.rates[2] != 0.5 || c.rates[3] != 0.5 {
		t.Fatalf("rates %v; want the guest's 0.5 CPU", c.rates)
	}
}
