package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// boundState is what binding.json says: bound (to which actor, ref and op)
// or cleared.
type boundState struct {
	Actor, Cgroup, Op string // Actor "" when nothing is bound
}

func (s boundState) String() string {
	if s.Actor == "" {
		return "cleared"
	}
	return fmt.Sprintf("%s %s %s", s.Op, s.Actor, s.Cgroup)
}

// readStateFiles reads binding.json (version 2: every binding, and its
// epoch, by actor) and ended.json (the epochs it holds) as a restarted
// statsd left them; a file that does not parse fails the test. An actor
// with no binding is absent from the maps.
func readStateFiles(t *testing.T, dir string) (bound map[string]boundState, epochs map[string]int64, ended map[int64]bool) {
	t.Helper()
	var st struct {
		Version  int `json:"version"`
		Bindings []struct {
			Identity struct {
				ActorUID string `json:"actor_uid"`
			} `json:"identity"`
			Ref struct {
				CgroupPath string `json:"cgroup_path"`
			} `json:"ref"`
			Op    string `json:"op"`
			Epoch int64  `json:"epoch_unix_nano"`
		} `json:"bindings"`
	}
	bound, epochs = map[string]boundState{}, map[string]int64{}
	if b, err := os.ReadFile(filepath.Join(dir, "binding.json")); err == nil {
		if err := json.Unmarshal(b, &st); err != nil || st.Version != 2 {
			t.Fatalf("binding.json is corrupt (%v):\n%s", err, b)
		}
		for _, b := range st.Bindings {
			if _, dup := bound[b.Identity.ActorUID]; dup {
				t.Fatalf("binding.json binds %s twice", b.Identity.ActorUID)
			}
			bound[b.Identity.ActorUID] = boundState{Actor: b.Identity.ActorUID, Cgroup: b.Ref.CgroupPath, Op: b.Op}
			epochs[b.Identity.ActorUID] = b.Epoch
		}
	} else if !os.IsNotExist(err) {
		t.Fatal(err)
	}
	ended = map[int64]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "ended.json")); err == nil {
		var ef struct {
			Version int    `json:"version"`
			Next    uint64 `json:"next_sequence"`
			Ended   []struct {
				Epoch    int64  `json:"epoch_unix_nano"`
				Sequence uint64 `json:"sequence"`
			} `json:"ended"`
		}
		if err := json.Unmarshal(b, &ef); err != nil || ef.Version != 3 {
			t.Fatalf("ended.json is corrupt (%v):\n%s", err, b)
		}
		var last uint64
		for _, e := range ef.Ended {
			ended[e.Epoch] = true
			if e.Sequence <= last || e.Sequence >= ef.Next {
				t.Fatalf("ended.json numbers epoch %d #%d after #%d, next %d:\n%s", e.Epoch, e.Sequence, last, ef.Next, b)
			}
			last = e.Sequence
		}
	} else if !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return bound, epochs, ended
}

// TestIntegrationKillLoop: statsd killed with SIGKILL at least 100 times,
// each time in the middle of a stream of lifecycle writes (Run, Checkpoint,
// Restore, Checkpoint, ...). After every restart binding.json holds the
// state of the last acknowledged call or of the one in flight (never
// anything else, never a torn file), every acknowledged Checkpoint's
// ended record is in ended.json, and no temp file is left.
// noLeftovers fails unless the state dir a restart after kill found holds
// no temp file an interrupted write left and no file moved aside as
// corrupt.
func noLeftovers(t *testing.T, stateDir string, kill int) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(stateDir, "*.tmp-*"))
	corrupt, _ := filepath.Glob(filepath.Join(stateDir, "*.corrupt-*"))
	if len(left) > 0 || len(corrupt) > 0 {
		t.Fatalf("restart after kill %d: temp files %v, corrupt files %v", kill, left, corrupt)
	}
}

func TestIntegrationKillLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts the statsd binary 100 times")
	}
	bin := testenv.BuildBinaries(t)
	dir := t.TempDir()
	d := testenv.StartStatsdAt(t, bin, filepath.Join(dir, "stats.sock"), filepath.Join(dir, "life.sock"), filepath.Join(dir, "state"),
		"--drift-interval", "0", "--ended-max", "100000")
	var (
		acked    boundState // after the last acknowledged call
		inFlight *boundState
		epochs   = map[int64]string{} // epoch of each acknowledged Run/Restore -> actor
		mustEnd  = map[int64]bool{}   // epochs whose Checkpoint was acknowledged
		seq      int
		// How often the in-flight call was found done, how often the kill
		// left a temp file that the restart swept, and how many restarts
		// were checked.
		foundInFlight, tempsLeft, checked int
	)
	// restartAndCheck restarts statsd after the kill-th kill (counted from
	// 1) and checks what it found: one of the two allowed states, whole,
	// every acknowledged end kept, no temp or corrupt file left.
	restartAndCheck := func(kill int) {
		t.Helper()
		if m, _ := filepath.Glob(filepath.Join(d.StateDir, "*.tmp-*")); len(m) > 0 {
			tempsLeft++
		}
		restart(t, d)
		states, _, ended := readStateFiles(t, d.StateDir)
		if len(states) > 1 {
			t.Fatalf("restart after kill %d: binding.json binds %d actors, this loop binds one at a time: %v", kill, len(states), states)
		}
		var got boundState // cleared unless one actor is bound
		for _, s := range states {
			got = s
		}
		switch {
		case got == acked:
		case inFlight != nil && got == *inFlight:
			acked = got // the call in flight was done after all
			foundInFlight++
		default:
			want := acked.String()
			if inFlight != nil {
				want += " or " + inFlight.String()
			}
			t.Fatalf("restart after kill %d: binding.json holds %s, want %s", kill, got, want)
		}
		for e := range mustEnd {
			if !ended[e] {
				t.Fatalf("restart after kill %d: the acknowledged end of epoch %d is not in ended.json", kill, e)
			}
		}
		noLeftovers(t, d.StateDir, kill)
		checked++
	}
	const kills = 100
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	for kill := range kills {
		if kill > 0 {
			restartAndCheck(kill)
		}
		inFlight = nil
		// A fresh connection: the last one may still be backing off from
		// the kill.
		cc, err := grpc.NewClient("unix://"+d.Lifecycle, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		lc := sandboxstatsv1.NewWorkloadLifecycleServiceClient(cc)
		// Lifecycle calls, back to back, until the kill lands among them.
		killAt := time.Now().Add(time.Duration(5+rng.IntN(40)) * time.Millisecond)
		killed := make(chan struct{}) // closed just before the kill
		go func() {
			time.Sleep(time.Until(killAt))
			close(killed)
			d.Cmd.Process.Kill()
		}()
		for running := true; running; {
			seq++
			actor := fmt.Sprintf("actor-%d", seq/4)
			next := boundState{}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var epoch int64
			var err error
			switch {
			case acked.Actor != "": // Checkpoint the bound workload
				_, err = lc.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: acked.Actor})
			case seq%2 == 0:
				next = boundState{Actor: actor, Cgroup: fmt.Sprintf("/kill-%d", seq), Op: "run"}
				var r *sandboxstatsv1.RunWorkloadResponse
				r, err = lc.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: actor},
					Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: next.Cgroup}})
				epoch = r.GetEpochUnixNano()
			default:
				next = boundState{Actor: actor, Cgroup: fmt.Sprintf("/kill-%d", seq), Op: "restore"}
				var r *sandboxstatsv1.RestoreWorkloadResponse
				r, err = lc.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: actor},
					Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: next.Cgroup}})
				epoch = r.GetEpochUnixNano()
			}
			cancel()
			if err != nil {
				select {
				case <-killed:
				default:
					t.Fatalf("call %d before the kill: %v", seq, err)
				}
				inFlight, running = &next, false
				continue
			}
			if next.Actor != "" {
				epochs[epoch] = next.Actor
			} else {
				for e, a := range epochs {
					if a == acked.Actor {
						mustEnd[e] = true
						delete(epochs, e)
					}
				}
			}
			acked = next
		}
		<-killed
		d.Cmd.Wait()
		cc.Close()
	}
	// The last kill's restart is checked as every other.
	restartAndCheck(kills)
	if checked != kills {
		t.Fatalf("%d restarts checked after %d kills", checked, kills)
	}
	t.Logf("measured: %d SIGKILLs among %d lifecycle calls; all %d restarts found the acknowledged or the in-flight state (the in-flight one %d times), "+
		"%d kills left a temp file, all swept; %d acknowledged ends all kept; last %s", kills, seq, checked, foundInFlight, tempsLeft, len(mustEnd), acked)
	if logs, _ := os.ReadFile(d.Log); strings.Contains(string(logs), "unreadable") {
		t.Errorf("a state file was found unreadable:\n%s", logs)
	}
}

// restart starts the killed statsd again and waits until it serves (its
// socket files outlived it: their presence says nothing).
func restart(t *testing.T, d *testenv.Statsd) {
	t.Helper()
	d.Restart(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		cc, err := grpc.NewClient("unix://"+d.Lifecycle, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			cc.Close()
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("statsd did not serve again after the kill: %v", err)
		}
	}
}
