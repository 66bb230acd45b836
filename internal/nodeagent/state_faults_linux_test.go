package nodeagent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxstats/sandboxstats/internal/sweep"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// mountTmpfs mounts a tmpfs of size bytes on a new directory and returns
// it; unmounted at the test's end.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	testenv.Need(t, os.Geteuid() == 0, "mounting a small tmpfs (a full disk, a read-only directory) needs root")
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.Itoa(size)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestStateFaults: a torn, corrupt, foreign or other-version state file,
// a temp file an interrupted write left, a full disk and a read-only
// directory: the agent starts, says in its log what it did, and loses at
// most what the file held (it starts as a first start: its start is its
// origin, and it charges from the first sample on).
func TestStateFaults(t *testing.T) {
	restarted := faultT0.Add(time.Minute)
	for _, tc := range []struct {
		name string
		// setup prepares the state directory and returns it.
		setup func(t *testing.T) string
		// continued: the restarted agent continues from the state.
		continued bool
		wantLog   string
		// aside: the unusable file was moved aside.
		aside bool
	}{
		{"good", func(t *testing.T) string {
			dir := t.TempDir()
			writeGoodState(t, dir)
			return dir
		}, true, "agent state restored", false},
		{"a temp file an interrupted write left", func(t *testing.T) string {
			dir := t.TempDir()
			b := writeGoodState(t, dir)
			if err := os.WriteFile(filepath.Join(dir, agentStateFile+".tmp-12345"), b[:len(b)/2], 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, true, "removed a temp file an interrupted state write left", false},
		{"torn", func(t *testing.T) string {
			dir := t.TempDir()
			b := writeGoodState(t, dir)
			if err := os.WriteFile(filepath.Join(dir, agentStateFile), b[:len(b)/2], 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, false, "agent state unusable; moved aside", true},
		{"corrupt", func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, agentStateFile), []byte("\x00\xffnot json"), 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, false, "agent state unusable; moved aside", true},
		{"another version", func(t *testing.T) string {
			dir := t.TempDir()
			b := writeGoodState(t, dir)
			b = []byte(strings.Replace(string(b), `"version":1`, `"version":0`, 1))
			if err := os.WriteFile(filepath.Join(dir, agentStateFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, false, "state version 0, this build reads 1", true},
		{"foreign: a counter this build does not know", func(t *testing.T) string {
			dir := t.TempDir()
			b := writeGoodState(t, dir)
			b = []byte(strings.Replace(string(b), `"counters":[{"counter":0,`, `"counters":[{"counter":99,`, 1))
			if err := os.WriteFile(filepath.Join(dir, agentStateFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, false, "not known", true},
		{"full disk", func(t *testing.T) string {
			dir := mountTmpfs(t, 64<<10)
			writeGoodState(t, dir)
			fill, err := os.Create(filepath.Join(dir, "filler"))
			if err != nil {
				t.Fatal(err)
			}
			defer fill.Close()
			chunk := make([]byte, 4096)
			for {
				if _, err := fill.Write(chunk); err != nil {
					break // ENOSPC: the disk is full
				}
			}
			return dir
		}, false, "cannot be written back: starting as a first start", false},
		{"read-only directory", func(t *testing.T) string {
			dir := mountTmpfs(t, 1<<20)
			writeGoodState(t, dir)
			if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				t.Fatalf("remount read-only: %v", err)
			}
			return dir
		}, false, "cannot be written back: starting as a first start", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.setup(t)
			h := newStatefulHarness(t, dir, restarted)
			logged := h.log.String()
			if !strings.Contains(logged, tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, logged)
			}
			wantStarted := restarted
			if tc.continued {
				wantStarted = faultT0
			}
			if !h.m.cfg.Started.Equal(wantStarted) {
				t.Errorf("accountant's start %v, want %v", h.m.cfg.Started, wantStarted)
			}
			asides, _ := filepath.Glob(filepath.Join(dir, agentStateFile+".corrupt-*"))
			if got := len(asides) > 0; got != tc.aside {
				t.Errorf("file moved aside: %v, want %v", got, tc.aside)
			}
			temps, _ := filepath.Glob(filepath.Join(dir, agentStateFile+".tmp-*"))
			if len(temps) > 0 {
				t.Errorf("temp files left: %v", temps)
			}
			// The next sweep: a continued agent charges the 3 s used while
			// it was down; one starting afresh charges nothing of a (begun
			// before its start) and goes on.
			at := restarted.Add(10 * time.Second)
			h.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", faultT0.Add(time.Second), at, 5_000_000))}, at, time.Millisecond)
			want := 0.0
			if tc.continued {
				want = 5
			}
			if got := cpuTotals(t, h.otelHarness)["a"]; got != want {
				t.Errorf("a's CPU after the restart: %v, want %v", got, want)
			}
		})
	}
}

// TestStateSaveFailsThenRecovers: a save that fails (a full disk) is
// counted and logged once, and the file is removed so that a restart does
// not continue from counters older than those served; once the disk has
// room again the next save succeeds.
func TestStateSaveFailsThenRecovers(t *testing.T) {
	dir := mountTmpfs(t, 64<<10)
	h := newStatefulHarness(t, dir, faultT0)
	sweepAt := func(sec int, cpu uint64) {
		at := faultT0.Add(time.Duration(sec) * time.Second)
		h.m.Apply([]sweep.DaemonResult{okResult("s", signalSample("a", faultT0.Add(time.Second), at, cpu))}, at, time.Millisecond)
	}
	sweepAt(10, 1_000_000)
	filler := filepath.Join(dir, "filler")
	// fill takes what room is left (a failed save frees the page of the
	// file it removes).
	fill := func() {
		f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for chunk := make([]byte, 4096); ; {
			if _, err := f.Write(chunk); err != nil {
				return
			}
		}
	}
	fill()
	sweepAt(20, 2_000_000)
	fill()
	sweepAt(30, 3_000_000)
	saves := func(result string) float64 { return gather(t, h.reg)[metricStateSaves+"{result="+result+"}"] }
	if got := saves("failed"); got != 2 {
		t.Errorf("failed saves %v, want 2", got)
	}
	if _, err := os.Stat(filepath.Join(dir, agentStateFile)); !os.IsNotExist(err) {
		t.Errorf("the state file outlived a failed save: %v", err)
	}
	if n := strings.Count(h.log.String(), "agent state not saved"); n != 1 {
		t.Errorf("failure logged %d times, want once until a save succeeds", n)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	sweepAt(40, 4_000_000)
	if _, err := os.Stat(filepath.Join(dir, agentStateFile)); err != nil || saves("ok") != 2 {
		t.Errorf("after room came back: %v, ok saves %v (want 2)", err, saves("ok"))
	}
	if !strings.Contains(h.log.String(), "agent state saved again") {
		t.Errorf("the recovery is not logged:\n%s", h.log.String())
	}
}
