package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// agentMaxRSS bounds the agent's peak resident set under a flood of its
// metrics port (it idles at about 15 MiB; the DaemonSet's limit is 128 MiB).
const agentMaxRSS = 48 << 20

// agentMaxConns is statsagent's default --metrics-max-connections; the
// tests run the agent with its defaults, as the DaemonSet does.
const agentMaxConns = 64

// raiseNofile raises this process's RLIMIT_NOFILE to at least n (the
// agent, its child, inherits it: a limit far above its connection cap, as
// in a container).
func raiseNofile(t *testing.T, n uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	rl.Cur, rl.Max = n, max(rl.Max, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatalf("raise RLIMIT_NOFILE to %d: %v", n, err)
	}
}

// openSockets counts pid's open sockets (/proc/<pid>/fd).
func openSockets(t *testing.T, pid int) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// scrapeWithin GETs base/metrics and returns how long the answer took (a
// connection closed at accept, when the cap is full, is retried within the
// second).
func scrapeWithin(t *testing.T, base string, d time.Duration) (time.Duration, error) {
	t.Helper()
	c := &http.Client{Timeout: d, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	var err error
	for time.Since(start) < d {
		var resp *http.Response
		resp, err = c.Get(base + "/metrics")
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("GET /metrics: %s", resp.Status)
			}
			if err == nil {
				return time.Since(start), nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start), err
}

// flood opens n connections to addr from 64 goroutines, each sending what
// send writes, and keeps them open (closed by the cleanup). It returns how
// many connected.
func flood(t *testing.T, addr string, n int, send func(net.Conn)) int {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	work := make(chan int)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range work {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				send(c)
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return len(conns)
}

// TestIntegrationHostileAgentHTTP: a pod that reaches the agent's metrics
// port floods it. Before: 15,000 keep-alive connections that sent one
// request each took the agent from 15 to 300 MiB and stayed open; 300
// connections each sending 1 MB of headers took it to 345 MiB. Now the
// agent holds at most --metrics-max-connections, its peak RSS stays under
// 48 MiB, and a scrape still answers within a second.
func TestIntegrationHostileAgentHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end with the statsagent binary; not under -short")
	}
	bin := testenv.BuildBinaries(t, "statsagent")
	raiseNofile(t, 16384)
	start := func(t *testing.T) (string, string, int) {
		dir := t.TempDir()
		base, proc := testenv.StartStatsagentProcess(t, bin, dir, "--sockets", filepath.Join(dir, "*.sock"),
			"--interval", "1s", "--min-interval", "100ms", "--timeout", "500ms")
		testenv.WaitSweeps(t, base, 1)
		return base, strings.TrimPrefix(base, "http://"), proc.Pid
	}
	// check holds the agent to its bounds within a, then reports.
	check := func(t *testing.T, base string, pid int, connected int, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		held := openSockets(t, pid)
		for held > agentMaxConns+2 && time.Now().Before(deadline) { // + the listener and a spare
			time.Sleep(200 * time.Millisecond)
			held = openSockets(t, pid)
		}
		took, err := scrapeWithin(t, base, time.Second)
		rss, hwm := procMemory(t, pid)
		t.Logf("%d connections made: the agent holds %d sockets after at most %v; RSS %.1f MiB, peak %.1f MiB; a scrape took %v (err %v)",
			connected, held, within, float64(rss)/(1<<20), float64(hwm)/(1<<20), took.Round(time.Millisecond), err)
		if held > agentMaxConns+2 {
			t.Errorf("the agent holds %d sockets, want at most its cap %d (+ its listener)", held, agentMaxConns)
		}
		if hwm > agentMaxRSS {
			t.Errorf("agent peak RSS %.1f MiB, want under %d MiB", float64(hwm)/(1<<20), agentMaxRSS>>20)
		}
		if err != nil {
			t.Errorf("no scrape answered within 1 s: %v", err)
		}
	}

	t.Run("4000 keep-alive connections", func(t *testing.T) {
		base, addr, pid := start(t)
		n := flood(t, addr, 4000, func(c net.Conn) {
			// One request each, then idle (the answer is left unread).
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
		})
		check(t, base, pid, n, 20*time.Second)
	})

	t.Run("300 connections sending 1 MB of headers", func(t *testing.T) {
		base, addr, pid := start(t)
		chunk := "X-Pad: " + strings.Repeat("a", 64<<10) + "\r\n"
		n := flood(t, addr, 300, func(c net.Conn) {
			// Never ends the headers: 15 lines of 64 KiB (under the default 1 MiB), no blank line.
			if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: agent\r\n"); err != nil {
				return
			}
			for range 15 {
				if _, err := io.WriteString(c, chunk); err != nil {
					return
				}
			}
		})
		check(t, base, pid, n, 5*time.Second)
	})
}
