package sentryusage_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/sentryusage"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationSessionKeepsConnection reads a real sentry several times
// on one Session: one connection carries every call (urpc serves calls on
// a connection in a loop). Then it ends the sandbox (its root container
// killed) with a connection kept, and times how long the sentry takes to
// exit: the sentry waits for its control clients (urpc Server.Stop, 15 s
// in runsc) and KeepFor bounds how long we are one.
func TestIntegrationSessionKeepsConnection(t *testing.T) {
	p := testenv.StartRunscPod(t, []string{"idle"}, map[string][]string{"idle": {"sleep", "100000"}})
	sid := p.IDs[0]
	pid := p.SentryPID(t)
	const keepFor = 2 * time.Second
	c, err := sentryusage.New(sentryusage.Config{RootDirs: []string{p.Root}, Abstract: true, Timeout: 2 * time.Second, KeepFor: keepFor})
	if err != nil {
		t.Fatal(err)
	}
	s := c.Session()
	defer s.Close()
	q := sentryusage.Query{SandboxID: sid, ContainerID: sid, Containers: p.IDs}
	// The first Read learns the socket's argument form (maybe on two
	// connections); the kept one then carries the rest.
	if _, err := s.Read(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	kept := sentryusage.KeptConn(s)
	if kept == nil {
		t.Fatal("no connection kept after a Read")
	}
	var reads []time.Duration
	for i := range 20 {
		start := time.Now()
		u, err := s.Read(context.Background(), q)
		reads = append(reads, time.Since(start))
		if err != nil {
			t.Fatalf("read %d on the kept connection: %v", i, err)
		}
		if _, ok := u.CPU[p.IDs[1]]; !ok {
			t.Fatalf("read %d: no CPU for %s: %v", i, p.IDs[1], u.CPU)
		}
		if got := sentryusage.KeptConn(s); got != kept {
			t.Fatalf("read %d: another connection (%v, was %v)", i, got, kept)
		}
	}
	t.Logf("20 Reads on one kept connection, median %v", median(reads))
	// The same with a dial each (Client.Read: what a Session's Read costs
	// once KeepFor has passed, as at statsagent's 15 s interval), and this
	// process's CPU a Read for each form, over 200 Reads.
	var dialled []time.Duration
	cpu0 := selfCPU()
	for i := range 200 {
		start := time.Now()
		if _, err := c.Read(context.Background(), q); err != nil {
			t.Fatalf("read %d with a dial: %v", i, err)
		}
		dialled = append(dialled, time.Since(start))
	}
	cpuDial := (selfCPU() - cpu0) / 200
	cpu0 = selfCPU()
	for i := range 200 {
		if _, err := s.Read(context.Background(), q); err != nil {
			t.Fatalf("read %d on the kept connection: %v", i, err)
		}
	}
	cpuKept := (selfCPU() - cpu0) / 200
	t.Logf("200 Reads with a dial each, median %v; CPU a Read %v with a dial, %v kept", median(dialled), cpuDial, cpuKept)

	// End the sandbox while the connection is kept.
	start := time.Now()
	if out, err := p.Runsc(t, "", "kill", sid, "KILL"); err != nil {
		t.Fatalf("runsc kill: %v: %s", err, out)
	}
	for alive(pid) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("sentry pid %d still there after 30s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("the sentry exited %v after its root container was killed, a connection kept (KeepFor %v)", took.Round(time.Millisecond), keepFor)
	if took > keepFor+5*time.Second {
		t.Errorf("the sentry took %v to exit: a kept connection held it past KeepFor (%v)", took, keepFor)
	}
}

// alive reports whether pid runs (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
