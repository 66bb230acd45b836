package e2e

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// bridgeProc is the statsnri binary, started and restarted by the test,
// its output appended to one log across starts.
type bridgeProc struct {
	exe  string
	args []string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	url  string
}

// newBridgeProc prepares statsnri with args and --metrics-listen
// 127.0.0.1:0; the cleanup stops it (SIGTERM: it must exit 0 within 10 s)
// and logs its output when the test failed.
func newBridgeProc(t testing.TB, bin, dir string, args ...string) *bridgeProc {
	t.Helper()
	b := &bridgeProc{exe: filepath.Join(bin, "statsnri"), args: append(args, "--metrics-listen", "127.0.0.1:0"),
		log: filepath.Join(dir, "statsnri.log")}
	t.Cleanup(func() {
		b.stop(t)
		if t.Failed() {
			t.Logf("statsnri log:\n%s", b.logTail(20000))
		}
	})
	return b
}

var bridgeServing = regexp.MustCompile(`msg="statsnri serving" addr=(\S+)`)

// start starts statsnri and waits for its metrics listener.
func (b *bridgeProc) start(t testing.TB) {
	t.Helper()
	if b.running() {
		t.Fatal("statsnri is already running")
	}
	var off int64
	if st, err := os.Stat(b.log); err == nil {
		off = st.Size()
	}
	logf, err := os.OpenFile(b.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(b.exe, b.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.cmd, b.done = cmd, done
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		all, _ := os.ReadFile(b.log)
		if int64(len(all)) > off {
			if m := bridgeServing.FindSubmatch(all[off:]); m != nil {
				b.url = "http://" + string(m[1])
				return
			}
		}
		select {
		case <-done:
			t.Fatalf("statsnri exited at start: %v\n%s", cmd.ProcessState, b.logTail(4000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("statsnri did not start within 10 s:\n%s", b.logTail(4000))
		}
	}
}

func (b *bridgeProc) running() bool {
	if b.cmd == nil {
		return false
	}
	select {
	case <-b.done:
		return false
	default:
		return true
	}
}

// kill SIGKILLs statsnri and waits for it.
func (b *bridgeProc) kill(t testing.TB) {
	t.Helper()
	if !b.running() {
		t.Fatal("statsnri is not running")
	}
	_ = b.cmd.Process.Kill()
	<-b.done
}

// stop stops statsnri with SIGTERM (SIGCONT first, in case it was
// stopped): it must exit 0 within 10 s.
func (b *bridgeProc) stop(t testing.TB) {
	t.Helper()
	if !b.running() {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGCONT)
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
		if !b.cmd.ProcessState.Success() {
			t.Errorf("statsnri exited with %v after SIGTERM", b.cmd.ProcessState)
		}
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
		t.Errorf("statsnri did not exit within 10 s of SIGTERM")
	}
}

// health GETs /healthz: its status and body.
func (b *bridgeProc) health() (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(b.url + "/healthz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// waitHealthy waits up to d for /healthz to answer 200 (connected to NRI
// and synchronized) and returns how long it took.
func (b *bridgeProc) waitHealthy(t testing.TB, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var code int
	var body string
	for deadline := start.Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if code, body = b.health(); code == http.StatusOK {
			return time.Since(start)
		}
	}
	t.Fatalf("statsnri /healthz not 200 within %v: %d %q\n%s", d, code, body, b.logTail(4000))
	return 0
}

// metrics scrapes statsnri's /metrics (the sandboxstats_ series).
func (b *bridgeProc) metrics(t testing.TB) map[string]float64 {
	t.Helper()
	return testenv.Scrape(t, b.url)
}

// waitIdle waits up to d until no pod waits for a statsd call
// (sandboxstats_nri_statsd_pending is 0 for every statsd).
func (b *bridgeProc) waitIdle(t testing.TB, d time.Duration) {
	t.Helper()
	waitFor(t, d, func() bool {
		for k, v := range b.metrics(t) {
			if strings.HasPrefix(k, "sandboxstats_nri_statsd_pending{") && v != 0 {
				return false
			}
		}
		return true
	}, "statsnri to have no pod waiting")
}

// logTail is the last n bytes of statsnri's log.
func (b *bridgeProc) logTail(n int) string {
	all, _ := os.ReadFile(b.log)
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return string(all)
}
