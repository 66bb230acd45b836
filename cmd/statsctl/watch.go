package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runWatch(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "watch", "Sample repeatedly and print CPU cores used per interval and memory; an epoch reset is marked, never a negative rate")
	var (
		conn     connFlags
		out      outputFlag
		actorUID string
		interval time.Duration
		count    int
	)
	conn.register(fs, defaultSocket, "stats")
	out.register(fs)
	fs.StringVar(&actorUID, "actor-uid", "", "the actor you believe runs there (empty: whatever the discovery read returns)")
	fs.DurationVar(&interval, "interval", 5*time.Second, "time between samples")
	fs.IntVar(&count, "count", 0, "stop after this many samples (0: until interrupted)")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	if interval <= 0 || count < 0 {
		return usageError{fmt.Errorf("--interval must be positive and --count not negative")}
	}
	cc, err := conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	client := sandboxstatsv1.NewWorkloadStatsServiceClient(cc)

	rows := newTableWriter(e.stdout)
	if out.format == "json" {
		rows = newJSONWriter(e.stdout)
	}
	watchers := map[string]*rate.Watcher{} // one series per actor
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for n := 0; count == 0 || n < count; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return nil // Ctrl-C ends a watch normally
			case <-ticker.C:
			}
		}
		samples, err := watchOnce(ctx, client, actorUID, conn.timeout)
		if err != nil {
			// One failed poll is a line, not the end of the watch.
			fmt.Fprintf(e.stderr, "statsctl watch: %s\n", describeError(err))
			continue
		}
		for _, s := range samples {
			w := watchers[s.GetActorUid()]
			if w == nil {
				w = &rate.Watcher{}
				watchers[s.GetActorUid()] = w
			}
			if err := rows.WriteRow(w.Observe(s)); err != nil {
				return err
			}
		}
	}
	return nil
}

func watchOnce(ctx context.Context, client sandboxstatsv1.WorkloadStatsServiceClient, actorUID string, timeout time.Duration) ([]*sandboxstatsv1.WorkloadStatsSample, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if actorUID != "" {
		resp, err := client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: actorUID, KnownAbsent: true})
		if err != nil {
			return nil, err
		}
		api.ExpandKnownAbsent(resp.GetSample())
		return []*sandboxstatsv1.WorkloadStatsSample{resp.GetSample()}, nil
	}
	resp, err := client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		return nil, err
	}
	if len(resp.GetSamples()) == 0 {
		return nil, fmt.Errorf("no sample: %s", resp.GetNoSampleDetail())
	}
	return resp.GetSamples(), nil
}

// rowWriter writes rate.Rows one at a time, so that watch prints each as
// it arrives.
type rowWriter interface {
	WriteRow(rate.Row) error
}

// newTableWriter returns a rowWriter printing fixed-width columns, with a
// header before the first row. Memory is printed in MiB (2^20 bytes) with
// one decimal, CPU in cores with three; "-" marks an absent value, and NOTE
// says why a row has no rate.
func newTableWriter(w io.Writer) rowWriter { return &tableWriter{w: w} }

type tableWriter struct {
	w          io.Writer
	headerDone bool
}

const watchRowFormat = "%-24s  %-20s  %-11s  %10s  %10s  %10s  %10s  %s"

func (t *tableWriter) WriteRow(r rate.Row) error {
	if !t.headerDone {
		if err := t.line("TIME(UTC)", "ACTOR", "SOURCE",
			"CPU(cores)", "MEM(MiB)", "WSET(MiB)", "PEAK(MiB)", "NOTE"); err != nil {
			return err
		}
		t.headerDone = true
	}
	if err := t.line(r.ObservedAt.Format("2006-01-02T15:04:05.000Z"), safe(r.ActorUID), safe(r.Source),
		fmtFloat(r.CPUCores, 3), fmtMiB(r.MemoryCurrentBytes), fmtMiB(r.MemoryWorkingSetBytes),
		fmtMiB(r.MemoryPeakBytes), string(r.Event)); err != nil {
		return err
	}
	if more := signalRateCols(r); more != "" {
		if _, err := fmt.Fprintf(t.w, "%-24s  %s\n", "", more); err != nil {
			return err
		}
	}
	return t.writeContainers(r)
}

// signalRateCols returns the row's per-interval signal and traffic rates on
// one line ("" when it has none): the throttled fraction of the wall time,
// pressure stall in µs per second (waiting/stalled: PSI some/full), network
// and block IO in MiB per second; "-" marks an absent one.
func signalRateCols(r rate.Row) string {
	var parts []string
	if r.ThrottledFraction != nil {
		parts = append(parts, fmt.Sprintf("throttled %.1f%%", 100**r.ThrottledFraction))
	}
	if p := r.Pressure; p != nil {
		cols := []string{"pressure(us/s waiting/stalled)"}
		for _, res := range []struct {
			name string
			s    *rate.StallRates
		}{{"cpu", p.CPU}, {"memory", p.Memory}, {"io", p.IO}} {
			if res.s != nil {
				cols = append(cols, fmt.Sprintf("%s %s/%s", res.name, fmtFloat(res.s.WaitingUsecPerSec, 0), fmtFloat(res.s.StalledUsecPerSec, 0)))
			}
		}
		parts = append(parts, strings.Join(cols, " "))
	}
	mibs := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", *v/(1<<20))
	}
	if n := r.Network; n != nil {
		parts = append(parts, fmt.Sprintf("net(MiB/s) rx %s tx %s", mibs(n.RxBytesPerSec), mibs(n.TxBytesPerSec)))
	}
	if b := r.BlockIO; b != nil {
		parts = append(parts, fmt.Sprintf("io(MiB/s) read %s write %s", mibs(b.ReadBytesPerSec), mibs(b.WriteBytesPerSec)))
	}
	return strings.Join(parts, "  ")
}

func (t *tableWriter) line(cols ...any) error {
	_, err := fmt.Fprintln(t.w, strings.TrimRight(fmt.Sprintf(watchRowFormat, cols...), " "))
	return err
}

func fmtFloat(v *float64, prec int) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, *v)
}

func fmtMiB(v *uint64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(*v)/(1<<20))
}

// newJSONWriter returns a rowWriter emitting one JSON object per line.
func newJSONWriter(w io.Writer) rowWriter { return jsonWriter{enc: json.NewEncoder(jsonSafeWriter{w})} }

type jsonWriter struct{ enc *json.Encoder }

func (j jsonWriter) WriteRow(r rate.Row) error { return j.enc.Encode(r) }
