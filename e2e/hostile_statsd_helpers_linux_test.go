package e2e

// Helpers of the hostile-peer tests of the statsd binary (so that its
// memory is its own, not the test's): its peak RSS and CPU, and the size of
// every answer and log line.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Bounds every hostile-peer test holds statsd to.
const (
	maxRSSBytes      = 64 << 20
	maxAnswerBytes   = 64 << 10
	maxLogLineBytes  = 64 << 10
	maxDriftFileSize = 64 << 10
)

// peakRSS is statsd's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, d *testenv.Statsd) int64 {
	_, peak := procMemory(t, d.Cmd.Process.Pid)
	return peak
}

// answerSize is the wire size of an answer: the message, or the status
// (message and details) of an error.
func answerSize(resp proto.Message, err error) int {
	if err != nil {
		st, _ := status.FromError(err)
		return proto.Size(st.Proto())
	}
	return proto.Size(resp)
}

// answerText is everything an answer says, for searching it.
func answerText(resp proto.Message, err error) string {
	if err != nil {
		st, _ := status.FromError(err)
		return st.Proto().String()
	}
	return fmt.Sprint(resp)
}

// checkLog fails the test for a log line over maxLogLineBytes or a raw
// ESC, and returns the log's size and line count.
func checkLog(t testing.TB, path string) (size int64, lines int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	longest := 0
	for {
		line, err := r.ReadSlice('\n')
		n := len(line)
		for err == bufio.ErrBufferFull {
			var more []byte
			more, err = r.ReadSlice('\n')
			n += len(more)
		}
		if n == 0 && err != nil {
			break
		}
		lines++
		size += int64(n)
		longest = max(longest, n)
		if bytes.IndexByte(line, 0x1b) >= 0 {
			t.Errorf("log line %d holds a raw ESC: %.200q", lines, line)
		}
		if err != nil {
			break
		}
	}
	if longest > maxLogLineBytes {
		t.Errorf("longest log line %d bytes, want under %d", longest, maxLogLineBytes)
	}
	return size, lines
}

// clients dials statsd's two sockets.
func clients(t testing.TB, d *testenv.Statsd) (sandboxstatsv1.WorkloadStatsServiceClient, sandboxstatsv1.WorkloadLifecycleServiceClient) {
	t.Helper()
	dialOne := func(p string) *grpc.ClientConn {
		cc, err := grpc.NewClient("unix://"+p, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	return sandboxstatsv1.NewWorkloadStatsServiceClient(dialOne(d.Stats)), sandboxstatsv1.NewWorkloadLifecycleServiceClient(dialOne(d.Lifecycle))
}

// answers records every answer's size and whether one held forbidden text.
type answers struct {
	mu      sync.Mutex
	n, errs int
	largest int
	bad     []string
}

func (a *answers) note(what string, resp proto.Message, err error, forbidden ...string) {
	size := answerSize(resp, err)
	text := answerText(resp, err)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	if err != nil {
		a.errs++
	}
	a.largest = max(a.largest, size)
	if strings.ContainsRune(text, 0x1b) {
		a.bad = append(a.bad, what+": a raw ESC")
	}
	for _, f := range forbidden {
		if strings.Contains(text, f) {
			a.bad = append(a.bad, fmt.Sprintf("%s: holds %q", what, f))
		}
	}
}

func (a *answers) check(t testing.TB) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.largest > maxAnswerBytes {
		t.Errorf("largest answer %d bytes, want under %d", a.largest, maxAnswerBytes)
	}
	for i, b := range a.bad {
		if i == 5 {
			t.Errorf("... and %d more", len(a.bad)-5)
			break
		}
		t.Error(b)
	}
}

// pollConcurrently runs n pollers, each calling poll rounds times.
func pollConcurrently(n, rounds int, poll func(ctx context.Context)) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				poll(ctx)
				cancel()
			}
		})
	}
	wg.Wait()
}

// cpuTime is statsd's user plus system CPU so far (/proc/<pid>/stat fields
// 14 and 15, USER_HZ ticks).
func cpuTime(t testing.TB, d *testenv.Statsd) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(d.Cmd.Process.Pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// driftEvery200ms makes the drift check read the hostile agent as often as
// a tight poller: what the agent sends also reaches drift's findings.
var driftEvery200ms = []string{"--drift-interval", "200ms", "--drift-grace", "0s"}

// statsdOnAgent starts the statsd binary with flags and binds actor
// "actor-vm" to the micro-VM whose guest agent listens at address, with
// containers ids; it returns the daemon and its clients.
func statsdOnAgent(t *testing.T, bin string, flags []string, address string, ids ...string) (*testenv.Statsd, sandboxstatsv1.WorkloadStatsServiceClient, sandboxstatsv1.WorkloadLifecycleServiceClient) {
	t.Helper()
	d := testenv.StartStatsd(t, bin, flags...)
	stats, life := clients(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := life.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-vm"},
		Sandbox:  &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, AgentAddress: address, ContainerIds: ids},
	}); err != nil {
		t.Fatal(err)
	}
	return d, stats, life
}
