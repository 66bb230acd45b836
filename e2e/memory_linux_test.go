package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The bounds of TestIntegrationStatsdMemory: statsd's anonymous memory as a
// ratio to the smallest Go gRPC daemon's, measured in the same run.
const (
	// idleMemoryBound holds an idle statsd, bound to its workload, against
	// an idle floor that has answered one RPC; idleMemoryGoal is the goal
	// (issue 33), printed held or MISSED. An idle statsd has never
	// collected: every byte it allocated since its start is resident. Its
	// heap beyond the floor's, by a heap profile at idle (2026-12-07, after
	// the cuts below): protobuf-go's descriptors of sandboxstats/v1, its
	// files' init (about 110 KiB), the Kata agent's files' init (19 KiB),
	// encoding/json's encoders of binding.json (25 KiB), the second gRPC
	// server, the releaser's GCStats (11 KiB) and the state directory's
	// sweep (an 8 KiB directory buffer). No longer paid at idle: the whole
	// stats.proto built in full with the message infos at the first RPC
	// (the lifecycle socket's codec reads a bind and writes its epoch by
	// hand, internal/lifecyclewire: about 0.2 MiB; the first poll builds
	// them), the release of the binary's pages reading smaps into strings
	// (internal/exepages reads it through one 4 KiB buffer: 0.27 MiB),
	// procfs's regular expressions (0.15 MiB resident; statsd reads /proc
	// through internal/process), the encoders of source.Reading (a
	// baseline is encoded behind a MarshalJSON: 70 KiB), errdetails'
	// descriptors (ErrorInfo written by hand), the read gate's refusal and
	// runtime/metrics. A collection to free the garbage would cost more:
	// the collector's first mark touches about 0.4 MiB of its own
	// metadata, which is why --release-after waits for a collection the
	// heap made itself. The bound catches a
	// regression.
	idleMemoryBound = 1.6
	idleMemoryGoal  = 1.3
	// burstMemoryBound holds statsd 10 s after 20,000 polls against the
	// floor 10 s after as many: statsd gives the burst back once no RPC has
	// come for --release-after (5 s), the floor keeps what it grew to.
	burstMemoryBound = 0.8
	burstPolls       = 20_000
	burstConns       = 4
	quietAfter       = 10 * time.Second
)

// TestIntegrationStatsdMemory measures statsd's anonymous memory
// (smaps_rollup Anonymous; Pss logged) against the smallest Go gRPC daemon
// (e2e/testdata/grpcfloor: health and reflection on a Unix socket), both
// started here and treated alike. statsd is bound by --cgroup-path to a
// real cgroup through its lifecycle socket while the floor answers one
// health Check, so each has served one RPC; both then sit idle for 10 s.
// Then each gets 20,000 polls at the same time (StatsWorkload, a health
// Check), 5,000 on each of 4 connections, and both sit quiet for 10 s.
// Idle, statsd must stay within idleMemoryBound of the floor; after the
// polls, within burstMemoryBound of the floor after its own.
func TestIntegrationStatsdMemory(t *testing.T) {
	needCgroups(t)
	bin := testenv.BuildBinaries(t)
	floorBin := testenv.BuildProgram(t, "e2e/testdata/grpcfloor")
	cg := fmt.Sprintf("/sandboxstats-memory-%d", os.Getpid())
	dirs := cgroupDirs(cg)
	if !testenv.CgroupV2() {
		// Every v1 hierarchy a sample reads, so that it reads all 15 files.
		for _, h := range []string{"cpu", "pids", "blkio"} {
			if _, err := os.Stat(filepath.Join(testenv.CgroupRoot, h, "cgroup.procs")); err == nil {
				dirs = append(dirs, filepath.Join(testenv.CgroupRoot, h, cg))
			}
		}
	}
	testenv.MakeCgroup(t, dirs...)

	d := testenv.StartStatsd(t, bin)
	floorSock := filepath.Join(t.TempDir(), "floor.sock")
	floor := exec.Command(floorBin, floorSock)
	floor.Stderr = os.Stderr
	if err := floor.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { floor.Process.Kill(); floor.Wait() })
	waitForSocket(t, floorSock)

	// One RPC each, on a connection that stays open: the launcher's.
	floorConn := dialUnix(t, floorSock)
	run(t, lifecycleClient(t, d.Lifecycle), "memory-actor",
		&sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: cg})
	if _, err := healthpb.NewHealthClient(floorConn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("floor: %v", err)
	}

	time.Sleep(quietAfter)
	idle := measure(t, d.Cmd.Process.Pid, floor.Process.Pid)

	var wg sync.WaitGroup
	wg.Go(func() {
		burst(t, d.Stats, func(cc *grpc.ClientConn) error {
			_, err := sandboxstatsv1.NewWorkloadStatsServiceClient(cc).StatsWorkload(context.Background(),
				&sandboxstatsv1.StatsWorkloadRequest{ActorUid: "memory-actor"})
			return err
		})
	})
	wg.Go(func() {
		burst(t, floorSock, func(cc *grpc.ClientConn) error {
			_, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
			return err
		})
	})
	wg.Wait()
	time.Sleep(quietAfter)
	after := measure(t, d.Cmd.Process.Pid, floor.Process.Pid)

	t.Logf("idle: statsd %s, floor %s: %.2fx (bound %.2gx; goal %.2gx: %s)", idle.statsd, idle.floor, idle.ratio(), idleMemoryBound, idleMemoryGoal, goalState(idle.ratio(), idleMemoryGoal))
	t.Logf("%v after %d polls each: statsd %s, floor %s: %.2fx (bound %.2gx)", quietAfter, burstPolls, after.statsd, after.floor, after.ratio(), burstMemoryBound)
	if idle.ratio() > idleMemoryBound {
		t.Errorf("idle statsd has %.2fx the floor's anonymous memory, want at most %.2gx", idle.ratio(), idleMemoryBound)
	}
	if after.ratio() > burstMemoryBound {
		t.Errorf("%v after the polls statsd has %.2fx the floor's anonymous memory, want at most %.2gx", quietAfter, after.ratio(), burstMemoryBound)
	}
}

// goalState says whether a ratio holds its goal, as benchtable prints it.
func goalState(ratio, goal float64) string {
	if ratio <= goal {
		return "held"
	}
	return "MISSED"
}

// memory is one process's smaps_rollup Anonymous and Pss.
type memory struct{ anon, pss uint64 }

func (m memory) String() string {
	return fmt.Sprintf("anonymous %.2f MiB (Pss %.2f MiB)", float64(m.anon)/(1<<20), float64(m.pss)/(1<<20))
}

// pair is statsd's and the floor's memory read at the same moment.
type pair struct{ statsd, floor memory }

func (p pair) ratio() float64 { return float64(p.statsd.anon) / float64(p.floor.anon) }

func measure(t *testing.T, statsd, floor int) pair {
	t.Helper()
	read := func(pid int) memory {
		anon, pss, err := testenv.ProcAnonymous(pid)
		if err != nil {
			t.Fatal(err)
		}
		return memory{anon, pss}
	}
	return pair{read(statsd), read(floor)}
}

// burst sends burstPolls calls through poll, spread over burstConns
// connections to the Unix socket sock.
func burst(t *testing.T, sock string, poll func(*grpc.ClientConn) error) {
	var wg sync.WaitGroup
	for range burstConns {
		cc := dialUnix(t, sock)
		wg.Go(func() {
			defer cc.Close()
			for range burstPolls / burstConns {
				if err := poll(cc); err != nil {
					t.Errorf("poll %s: %v", sock, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func dialUnix(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func waitForSocket(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("no socket %s after 10 s", path)
}
