package hoststat

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// hostileQMP serves a QMP peer that misbehaves after the greeting (or in
// it): answer writes whatever it wants for each command.
func hostileQMP(t *testing.T, greeting string, answer func(c net.Conn, cmd string)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				go func() { <-done; c.Close() }()
				if _, err := c.Write([]byte(greeting)); err != nil {
					return
				}
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					cmd := sc.Text()
					if strings.Contains(cmd, "qmp_capabilities") {
						c.Write([]byte(`{"return": {}}` + "\n"))
						continue
					}
					answer(c, cmd)
				}
			}()
		}
	}()
	return sock
}

const qmpGreeting = `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}}` + "\n"

// TestHostileQMP: a QMP peer flooding events, sending huge replies or
// banners, or echoing escapes: each sample ends fast, allocates a bounded
// amount, and the reason quotes the peer's bytes cut.
func TestHostileQMP(t *testing.T) {
	// The peer's bytes are made before the measurement: only statsd's
	// side is counted.
	event := []byte(`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RTC_CHANGE", "data": {"offset": 0, "pad": "` + strings.Repeat("p", 1<<20) + `"}}` + "\n")
	smallEvent := []byte(`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RTC_CHANGE", "data": {"offset": 0}}` + "\n")
	hugeReply := []byte(`{"return": [` + strings.Repeat(`{"provider": "kvm"},`, 2<<20))
	for _, tc := range []struct {
		name     string
		greeting string
		answer   func(c net.Conn, cmd string)
		reason   string // fragment of the unavailable reason
	}{
		{"flood of 1 MiB events", qmpGreeting, func(c net.Conn, _ string) {
			for {
				if _, err := c.Write(event); err != nil {
					return
				}
			}
		}, "longer than 8388608 bytes"},
		{"flood of small events", qmpGreeting, func(c net.Conn, _ string) {
			for {
				if _, err := c.Write(smallEvent); err != nil {
					return
				}
			}
		}, "more than 16 events"},
		{"huge reply", qmpGreeting, func(c net.Conn, _ string) {
			c.Write(hugeReply)
			time.Sleep(10 * time.Second)
		}, "longer than"},
		{"huge banner", `{"QMP": {"banner": "` + strings.Repeat("b", 8<<20) + `"}}` + "\n", nil, "longer than"},
		{"error with an escape", qmpGreeting, func(c net.Conn, _ string) {
			c.Write([]byte("{\"error\": {\"class\": \"GenericError\", \"desc\": \"\x1b]0;pwned\x07" + strings.Repeat("d", 4000) + "\"}}\n"))
		}, "qmp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := hostileQMP(t, tc.greeting, tc.answer)
			s, err := newSampler(source.SandboxRef{QMPSocket: sock}, Config{ProcRoot: filepath.Join("testdata", "proc"), ReadTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			hs, _ := s.SampleHost(context.Background())
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			q := hs.KVM.QMP
			t.Logf("measured: %v, %d MiB allocated, reason %d bytes", took.Round(time.Millisecond), alloc>>20, len(q.Reason))
			if q.State != source.KVMSourceStateUnavailable || !strings.Contains(q.Reason, tc.reason) {
				t.Errorf("qmp %v %.300q, want unavailable with %q", q.State, q.Reason, tc.reason)
			}
			bound := 500 * time.Millisecond
			if raceEnabled {
				bound *= 3
			}
			if took > bound {
				t.Errorf("took %v (want under %v) with a 2 s read timeout: the peer sets the pace", took, bound)
			}
			if alloc > 48<<20 {
				t.Errorf("%d MiB allocated for one sample", alloc>>20)
			}
			if len(q.Reason) > 2<<10 || strings.ContainsRune(q.Reason, 0x1b) {
				t.Errorf("reason is %d bytes (raw ESC %v)", len(q.Reason), strings.ContainsRune(q.Reason, 0x1b))
			}
		})
	}
}

// TestQMPSchemaCut: a schema's unit and type (copied into every counter of
// the statistic) are cut where they enter, like the names: a 1 MiB unit on
// 256 counters allocated 836 MiB when it was copied whole into each.
func TestQMPSchemaCut(t *testing.T) {
	long := strings.Repeat("u", 1<<20)
	schemas, err := parseQMPSchemas([]byte(`[{"provider": "kvm", "target": "vcpu", "stats": [{"name": "exits", "type": "cumulative", "unit": "` + long + `", "base": 10, "exponent": -3}]}]`))
	if err != nil {
		t.Fatal(err)
	}
	var stats strings.Builder
	stats.WriteString(`[`)
	for i := range 256 {
		if i > 0 {
			stats.WriteString(",")
		}
		stats.WriteString(`{"provider": "kvm", "qom-path": "/machine/cpu` + strconv.Itoa(i) + `", "stats": [{"name": "exits", "value": 1}]}`)
	}
	stats.WriteString(`]`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	counters, err := parseQMPStats([]byte(stats.String()), "vcpu", schemas, nil)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if len(counters) != 256 {
		t.Fatalf("%d counters, want 256", len(counters))
	}
	for _, c := range counters {
		if len(c.Unit) > 2*maxQMPName {
			t.Fatalf("unit of %s is %d bytes", c.Scope, len(c.Unit))
		}
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("%d MiB allocated for 256 counters", alloc>>20)
	}
}
