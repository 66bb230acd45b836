package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// agentLife is one statsagent process of an agentLives: when it started
// and ended, how it ended, and its log.
type agentLife struct {
	start, end time.Time // end zero while it runs
	how        string    // how it was killed ("" while it runs, "stopped" at the cleanup)
	log        string
}

// agentLives runs the statsagent binary again and again with the same
// arguments and the same metrics address (a Prometheus scrape target names
// one address; the port was free when the test began and is taken back at
// every start: a start that cannot bind it fails the test), each life's
// output in its own log. The test's cleanup stops the running life with
// SIGTERM and fails the test if it does not exit cleanly.
type agentLives struct {
	bin, dir, addr string
	args           []string

	mu    sync.Mutex
	cmd   *exec.Cmd
	lives []agentLife
}

// startAgentLives starts the first life of binDir/statsagent with args and
// --metrics-listen on a free loopback port.
func startAgentLives(t *testing.T, binDir, dir string, args ...string) *agentLives {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	a := &agentLives{bin: filepath.Join(binDir, "statsagent"), dir: dir, addr: addr, args: append(args, "--metrics-listen", addr)}
	t.Cleanup(func() {
		a.mu.Lock()
		cmd := a.cmd
		a.mu.Unlock()
		if cmd != nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := a.wait(cmd, 10*time.Second); err != nil {
				t.Errorf("statsagent after SIGTERM: %v", err)
			}
			a.ended("stopped")
		}
		if t.Failed() {
			a.logTails(t)
		}
	})
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	return a
}

// url is the agent's base URL, the same in every life.
func (a *agentLives) url() string { return "http://" + a.addr }

// start starts a new life and waits (up to 10 s) until it serves /metrics.
// It returns an error rather than failing the test: the chaos goroutine
// calls it.
func (a *agentLives) start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return errors.New("statsagent is already running")
	}
	logPath := filepath.Join(a.dir, fmt.Sprintf("statsagent-%02d.log", len(a.lives)))
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return err
	}
	a.cmd = cmd
	a.lives = append(a.lives, agentLife{start: time.Now(), log: logPath})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(logPath); strings.Contains(string(b), `msg="statsagent serving"`) {
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("statsagent life %d did not serve on %s within 10 s:\n%s", len(a.lives)-1, a.addr, b)
		}
	}
}

// kill SIGKILLs the running life and waits for it; how says where it was
// killed.
func (a *agentLives) kill(how string) error {
	a.mu.Lock()
	cmd := a.cmd
	a.mu.Unlock()
	if cmd == nil {
		return errors.New("no statsagent to kill")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	if err := a.wait(cmd, 10*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		return fmt.Errorf("statsagent after SIGKILL: %v", err)
	}
	a.ended(how)
	return nil
}

func (a *agentLives) wait(cmd *exec.Cmd, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not exit within %v", timeout)
	}
}

func (a *agentLives) ended(how string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cmd = nil
	l := &a.lives[len(a.lives)-1]
	l.end, l.how = time.Now(), how
}

// lifeAt returns the index of the life running at ts (unix ns), or -1.
func (a *agentLives) lifeAt(ts uint64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := time.Unix(0, int64(ts))
	for i, l := range a.lives {
		if !at.Before(l.start) && (l.end.IsZero() || at.Before(l.end)) {
			return i
		}
	}
	return -1
}

// describeLife says which life i is and how it ended.
func (a *agentLives) describeLife(i int) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i < 0 || i >= len(a.lives) {
		return "no life (the agent was down)"
	}
	l := a.lives[i]
	if l.end.IsZero() {
		return fmt.Sprintf("life %d (still running)", i)
	}
	return fmt.Sprintf("life %d (killed: %s, at %s)", i, l.how, l.end.Format("15:04:05.000"))
}

// logTails logs the last lines of every life's log.
func (a *agentLives) logTails(t *testing.T) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, l := range a.lives {
		b, _ := os.ReadFile(l.log)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		lines = lines[max(0, len(lines)-15):]
		t.Logf("statsagent life %d (%s to %s, %s), last lines of %s:\n%s", i, l.start.Format("15:04:05.000"),
			l.end.Format("15:04:05.000"), l.how, l.log, strings.Join(lines, "\n"))
	}
}

// agentGauge reads one unlabelled series of the agent's /metrics, without
// failing the test (the chaos goroutine calls it, and the agent may be
// down).
func agentGauge(base, name string) (float64, bool) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}
