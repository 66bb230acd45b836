package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// stoppedHarness serves both services over bufconn with statsd's drift
// check wired as cmd/statsd wires it (the real SystemObserver over a bound
// source, cycles run by the test) and one clock, a millisecond further at
// every look, for the store and the check.
type stoppedHarness struct {
	src       *fakeSource
	checker   *drift.Checker
	client    sandboxstatsv1.WorkloadStatsServiceClient
	lifecycle sandboxstatsv1.WorkloadLifecycleServiceClient
	logs      *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newStoppedHarness(t *testing.T) *stoppedHarness {
	t.Helper()
	h := &stoppedHarness{src: &fakeSource{reading: cgroupRdg}, logs: &lockedBuffer{}}
	var (
		mu  sync.Mutex
		now = fixedNow
	)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Millisecond)
		return now
	}
	store, err := identity.NewStore(identity.Config{Now: clock,
		Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) { return h.src, nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	h.checker, err = drift.New(drift.Config{Store: store, Observer: drift.NewSystemObserver(t.TempDir(), time.Second, time.Minute, clock),
		Interval: time.Minute, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(h.logs, nil))
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(UnaryInterceptors(logger))
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, NewStatsService(store, clock, logger).WithDrift(h.checker))
	sandboxstatsv1.RegisterWorkloadLifecycleServiceServer(srv, NewLifecycleService(store, logger).WithDrift(h.checker))
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h.client = sandboxstatsv1.NewWorkloadStatsServiceClient(conn)
	h.lifecycle = sandboxstatsv1.NewWorkloadLifecycleServiceClient(conn)
	return h
}

// TestCheckpointRuntimeStopped: CheckpointWorkload with runtime_stopped
// over the wire, against the drift check statsd runs: a sandbox found dead
// at the end is checkpointed, unless OOM-killed or seen dead by a drift
// cycle before the call; the provenance is as without the flag; a retry
// returns the same record.
func TestCheckpointRuntimeStopped(t *testing.T) {
	noProcess := cgroupRdg
	noProcess.SandboxProcesses = new(uint32(0))
	oom := noProcess
	oom.Memory = &source.MemorySignals{OOMKills: new(uint64(1))}
	gone := fmt.Errorf("gvisor: no such cgroup: %w", source.ErrSandboxGone)
	const (
		checkpointed = sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED
		sandboxDead  = sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_SANDBOX_DEAD
		oomKilled    = sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_OOM_KILLED
		readAtEnd    = sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END
		lastGoodPoll = sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL
	)
	// answer is what the source answers.
	type answer struct {
		r   source.Reading
		err error
	}
	type end struct {
		Outcome    sandboxstatsv1.ActivationOutcome
		Provenance sandboxstatsv1.FinalProvenance
	}
	for _, tc := range []struct {
		name string
		// cycle: what the source answers a drift cycle run before the call
		// (nil: no cycle runs).
		cycle   *answer
		final   source.Reading
		err     error
		stopped bool
		want    end
		wantLog string
	}{
		{name: "no process, stopped", final: noProcess, stopped: true, want: end{checkpointed, readAtEnd}, wantLog: "outcome=checkpointed final=read_at_end runtime_stopped=true"},
		{name: "no process, not stopped", final: noProcess, want: end{sandboxDead, readAtEnd}, wantLog: "outcome=sandbox_dead final=read_at_end"},
		{name: "oom killed, stopped", final: oom, stopped: true, want: end{oomKilled, readAtEnd}},
		{name: "seen dead before, stopped", cycle: &answer{r: noProcess}, final: noProcess, stopped: true, want: end{sandboxDead, readAtEnd},
			wantLog: `outcome=sandbox_dead final=read_at_end runtime_stopped=true seen_dead="SANDBOX_DEAD /statstest"`},
		{name: "seen oom-killed before, stopped", cycle: &answer{r: oom}, final: oom, stopped: true, want: end{oomKilled, readAtEnd}},
		{name: "seen alive before, stopped", cycle: &answer{r: cgroupRdg}, final: noProcess, stopped: true, want: end{checkpointed, readAtEnd}},
		{name: "seen dead before, alive at the end, stopped", cycle: &answer{r: noProcess}, final: cgroupRdg, stopped: true, want: end{checkpointed, readAtEnd}},
		{name: "gone, stopped", err: gone, stopped: true, want: end{checkpointed, lastGoodPoll}},
		{name: "gone, not stopped", err: gone, want: end{sandboxDead, lastGoodPoll}},
		{name: "seen gone before, stopped", cycle: &answer{err: gone}, err: gone, stopped: true, want: end{sandboxDead, lastGoodPoll}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newStoppedHarness(t)
			if _, err := h.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: identA, Sandbox: gvRef}); err != nil {
				t.Fatal(err)
			}
			// A poll while it runs: the last good sample.
			if _, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"}); err != nil {
				t.Fatal(err)
			}
			if tc.cycle != nil {
				h.src.set(tc.cycle.r, tc.cycle.err)
				h.checker.Cycle(ctx)
			}
			h.src.set(tc.final, tc.err)
			req := &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a", RuntimeStopped: tc.stopped}
			resp, err := h.lifecycle.CheckpointWorkload(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			got := end{resp.GetEnded().GetOutcome(), resp.GetEnded().GetFinalProvenance()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ended (-want +got):\n%s", diff)
			}
			if tc.wantLog != "" && !strings.Contains(h.logs.String(), tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, h.logs.String())
			}
			// A retry, with the flag flipped, returns the same record.
			h.src.set(cgroupRdg, nil)
			again, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a", RuntimeStopped: !tc.stopped})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(resp, again, protocmp.Transform()); diff != "" {
				t.Errorf("retry (-first +retry):\n%s", diff)
			}
		})
	}
}

// TestCheckpointRuntimeStoppedDuringCycles: checkpoints asking the drift
// state while cycles run, with the race detector: neither waits for the
// other's reads, and every checkpoint ends its activation.
func TestCheckpointRuntimeStoppedDuringCycles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h := newStoppedHarness(t)
	noProcess := cgroupRdg
	noProcess.SandboxProcesses = new(uint32(0))
	h.src.set(noProcess, nil)
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			h.checker.Cycle(ctx)
		}
	})
	defer wg.Wait()
	defer cancel()
	for i := range 50 {
		id := &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("actor-%d", i)}
		if _, err := h.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: id, Sandbox: gvRef}); err != nil {
			t.Fatal(err)
		}
		resp, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: id.GetActorUid(), RuntimeStopped: true})
		if err != nil {
			t.Fatal(err)
		}
		// Dead either way: checkpointed, or sandbox-dead when a cycle saw it
		// first.
		switch o := resp.GetEnded().GetOutcome(); o {
		case sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED, sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_SANDBOX_DEAD:
		default:
			t.Fatalf("actor %d: outcome %v", i, o)
		}
	}
}
