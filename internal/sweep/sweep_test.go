package sweep

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func sample(actor string, cpuUsec, memCur uint64) *sandboxstatsv1.WorkloadStatsSample {
	return &sandboxstatsv1.WorkloadStatsSample{
		ActorUid:              actor,
		ActorName:             actor + "-name",
		ActorNamespace:        "team-a",
		TemplateNamespace:     "templates",
		TemplateName:          "python",
		SandboxClass:          sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		Source:                sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
		MemoryCurrentBytes:    memCur,
		MemoryWorkingSetBytes: memCur / 2,
		MemoryPeakBytes:       proto.Uint64(memCur * 2),
		CpuUsageUsec:          proto.Uint64(cpuUsec),
		EpochUnixNano:         time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC).UnixNano(),
	}
}

// staleSocket leaves a socket file nobody listens on (a daemon killed
// without cleanup): connections are refused.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

func TestSweep(t *testing.T) {
	dir := t.TempDir()
	ok := statsdfake.Start(t, filepath.Join(dir, "a-ok.sock"))
	ok.Set(sample("actor-1", 5_000_000, 64<<20))
	statsdfake.Start(t, filepath.Join(dir, "b-idle.sock")) // answers no workload
	hung := statsdfake.Start(t, filepath.Join(dir, "c-hung.sock"))
	hung.Hang()
	failing := statsdfake.Start(t, filepath.Join(dir, "d-failing.sock"))
	failing.SetError(status.Error(codes.Internal, "malformed memory.stat"))
	staleSocket(t, filepath.Join(dir, "e-stale.sock"))
	if err := os.WriteFile(filepath.Join(dir, "f-not-a-socket.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	// slack absorbs scheduling delays on a loaded 2-core machine; the
	// timeout is above it so that a poll delayed until the hung daemon's
	// deadline, or a second timeout, still shows.
	const timeout, slack = 2500 * time.Millisecond, 2 * time.Second
	start := time.Now()
	results, err := Sweep(context.Background(), filepath.Join(dir, "*.sock"), 8, timeout)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		st   Status
		code codes.Code
	}{
		"a-ok.sock":      {StatusOK, codes.OK},
		"b-idle.sock":    {StatusNoSample, codes.OK},
		"c-hung.sock":    {StatusError, codes.DeadlineExceeded},
		"d-failing.sock": {StatusError, codes.Internal},
		"e-stale.sock":   {StatusError, codes.Unavailable},
	}
	if len(results) != len(want) {
		t.Fatalf("got %d results, want %d (the non-socket file must be skipped): %+v", len(results), len(want), results)
	}
	for _, r := range results {
		w := want[filepath.Base(r.Socket)]
		if r.Status != w.st || r.Code != w.code {
			t.Errorf("%s: status %s code %s (err %v), want %s %s", filepath.Base(r.Socket), r.Status, r.Code, r.Err, w.st, w.code)
		}
	}
	if got := results[0].Samples; len(got) != 1 || got[0].GetCpuUsageUsec() != 5_000_000 {
		t.Errorf("ok daemon samples = %v", got)
	}
	if got := results[1].NoSampleReason; got != sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD {
		t.Errorf("idle daemon reason = %v", got)
	}
	// The hung daemon costs its own timeout, once; the others answer at once.
	if took < timeout || took > timeout+slack {
		t.Errorf("sweep took %v, want about one timeout (%v)", took, timeout)
	}
	for _, r := range results {
		if r.Status != StatusError || r.Code != codes.DeadlineExceeded {
			if r.Took > slack {
				t.Errorf("%s took %v: delayed by the hung daemon", r.Socket, r.Took)
			}
		}
	}
}

func TestSweepHungDaemonsShareSlots(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"h1", "h2", "h3", "h4"} {
		statsdfake.Start(t, filepath.Join(dir, n+".sock")).Hang()
	}
	statsdfake.Start(t, filepath.Join(dir, "ok.sock")).Set(sample("a", 1, 1))
	// As in TestSweep: slack for a loaded machine, below one timeout so
	// that a third round still shows.
	const timeout, slack = 2500 * time.Millisecond, 2 * time.Second
	start := time.Now()
	results, err := Sweep(context.Background(), filepath.Join(dir, "*.sock"), 2, timeout)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	// 4 hung daemons, 2 slots: two rounds of one timeout each.
	if took < 2*timeout || took > 2*timeout+slack {
		t.Errorf("sweep took %v, want about 2 x %v", took, timeout)
	}
	if results[4].Status != StatusOK {
		t.Errorf("ok daemon: %+v", results[4])
	}
}

func TestPollVanished(t *testing.T) {
	dir := t.TempDir()
	d := statsdfake.Start(t, filepath.Join(dir, "gone.sock"))
	sockets, err := Discover(filepath.Join(dir, "*.sock"))
	if err != nil || len(sockets) != 1 {
		t.Fatalf("Discover = %v, %v", sockets, err)
	}
	d.Kill() // between discovery and the poll
	r := PollAll(context.Background(), sockets, 8, time.Second)[0]
	if r.Status != StatusVanished {
		t.Errorf("status %s (code %s, err %v), want vanished", r.Status, r.Code, r.Err)
	}
	if r.Took > 500*time.Millisecond {
		t.Errorf("a vanished daemon took %v; it must fail fast", r.Took)
	}
}

func TestSweepBadGlob(t *testing.T) {
	if _, err := Sweep(context.Background(), "[", 1, time.Second); err == nil {
		t.Fatal("want an error for a malformed glob")
	}
}

func TestSweepCancelled(t *testing.T) {
	dir := t.TempDir()
	statsdfake.Start(t, filepath.Join(dir, "h.sock")).Hang()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	results, _ := Sweep(ctx, filepath.Join(dir, "*.sock"), 1, time.Minute)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("cancelled sweep took %v", took)
	}
	if results[0].Code != codes.Canceled {
		t.Errorf("code %s, want Canceled", results[0].Code)
	}
}

func TestPollRelativePath(t *testing.T) {
	dir := t.TempDir()
	statsdfake.Start(t, filepath.Join(dir, "rel.sock")).Set(sample("a", 1, 1))
	t.Chdir(dir)
	results, err := Sweep(context.Background(), "*.sock", 1, time.Second)
	if err != nil || len(results) != 1 || results[0].Status != StatusOK {
		t.Fatalf("Sweep(relative glob) = %+v, %v", results, err)
	}
}

// TestFailed: how a failed call is classified. Unavailable on a socket that
// is gone is a vanished daemon; any other failure is an error. Either way
// the error names the socket and keeps the gRPC status.
func TestFailed(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "present.sock")
	staleSocket(t, present)
	gone := filepath.Join(dir, "gone.sock")
	for _, tc := range []struct {
		name   string
		socket string
		err    error
		want   Status
	}{
		{"refused, socket still there", present, status.Error(codes.Unavailable, "connection refused"), StatusError},
		{"refused, socket gone", gone, status.Error(codes.Unavailable, "no such file or directory"), StatusVanished},
		{"deadline, socket gone", gone, status.Error(codes.DeadlineExceeded, "context deadline exceeded"), StatusError},
		{"internal", present, status.Error(codes.Internal, "malformed memory.stat"), StatusError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := failed(tc.socket, tc.err)
			if r.Status != tc.want || r.Code != status.Code(tc.err) {
				t.Errorf("status %s code %s, want %s %s", r.Status, r.Code, tc.want, status.Code(tc.err))
			}
			if got := status.Code(r.Err); got != status.Code(tc.err) {
				t.Errorf("wrapped error has code %s, want %s", got, status.Code(tc.err))
			}
			if msg := r.Err.Error(); !strings.Contains(msg, tc.socket) {
				t.Errorf("error %q does not name the socket", msg)
			}
		})
	}
}
