package rate

import (
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// StallRates is one resource's pressure over an interval: microseconds of
// stall per second of wall time (1e6: stalled the whole interval).
type StallRates struct {
	WaitingUsecPerSec *float64 `json:"waiting_usec_per_sec,omitempty"` // PSI some
	StalledUsecPerSec *float64 `json:"stalled_usec_per_sec,omitempty"` // PSI full
}

// PressureRates are the pressure stall rates per resource.
type PressureRates struct {
	CPU    *StallRates `json:"cpu,omitempty"`
	Memory *StallRates `json:"memory,omitempty"`
	IO     *StallRates `json:"io,omitempty"`
}

// NetworkRates are the network total's rates (loopback excluded), per
// second.
type NetworkRates struct {
	RxBytesPerSec   *float64 `json:"rx_bytes_per_sec,omitempty"`
	TxBytesPerSec   *float64 `json:"tx_bytes_per_sec,omitempty"`
	RxPacketsPerSec *float64 `json:"rx_packets_per_sec,omitempty"`
	TxPacketsPerSec *float64 `json:"tx_packets_per_sec,omitempty"`
}

// BlockIORates are the block IO rates, per second.
type BlockIORates struct {
	ReadBytesPerSec  *float64 `json:"read_bytes_per_sec,omitempty"`
	WriteBytesPerSec *float64 `json:"write_bytes_per_sec,omitempty"`
	ReadOpsPerSec    *float64 `json:"read_ios_per_sec,omitempty"`
	WriteOpsPerSec   *float64 `json:"write_ios_per_sec,omitempty"`
}

// signalRates sets r's per-interval rates of the signal and traffic
// counters between prev and cur, dtNanos apart (a pair that gives a CPU
// rate). A counter absent from either sample, or that decreased (a reset),
// gives no rate.
func signalRates(r *Row, prev, cur *sandboxstatsv1.WorkloadStatsSample, dtNanos int64) {
	perSec := func(c Counter) *float64 {
		a, okA := valueOf(prev, CounterID{Counter: c})
		b, okB := valueOf(cur, CounterID{Counter: c})
		if !okA || !okB || b < a {
			return nil
		}
		v := float64(b-a) * 1e9 / float64(dtNanos)
		return &v
	}
	if v := perSec(CounterThrottledUsec); v != nil {
		f := *v / 1e6 // µs throttled per µs of wall time
		r.ThrottledFraction = &f
	}
	stall := func(some, full Counter) *StallRates {
		s := &StallRates{WaitingUsecPerSec: perSec(some), StalledUsecPerSec: perSec(full)}
		if s.WaitingUsecPerSec == nil && s.StalledUsecPerSec == nil {
			return nil
		}
		return s
	}
	p := &PressureRates{
		CPU:    stall(CounterPressureCPUSome, CounterPressureCPUFull),
		Memory: stall(CounterPressureMemSome, CounterPressureMemFull),
		IO:     stall(CounterPressureIOSome, CounterPressureIOFull),
	}
	if p.CPU != nil || p.Memory != nil || p.IO != nil {
		r.Pressure = p
	}
	n := &NetworkRates{RxBytesPerSec: perSec(CounterNetRxBytes), TxBytesPerSec: perSec(CounterNetTxBytes),
		RxPacketsPerSec: perSec(CounterNetRxPackets), TxPacketsPerSec: perSec(CounterNetTxPackets)}
	if n.RxBytesPerSec != nil || n.TxBytesPerSec != nil || n.RxPacketsPerSec != nil || n.TxPacketsPerSec != nil {
		r.Network = n
	}
	b := &BlockIORates{ReadBytesPerSec: perSec(CounterIOReadBytes), WriteBytesPerSec: perSec(CounterIOWriteBytes),
		ReadOpsPerSec: perSec(CounterIOReadOps), WriteOpsPerSec: perSec(CounterIOWriteOps)}
	if b.ReadBytesPerSec != nil || b.WriteBytesPerSec != nil || b.ReadOpsPerSec != nil || b.WriteOpsPerSec != nil {
		r.BlockIO = b
	}
}
