package gvisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// stateFixtures are runsc 20221219's state files of a sandbox (gvx-sbx, the
// CRI sandbox container) and one container joined to it (gvx-busy),
// captured on this host (testdata/runsc/README.md). Stored without their
// real names (a ':' has no place in a module's file names).
var stateFixtures = map[string]string{
	"gvx-sbx_sandbox:gvx-sbx.state":  "gvx-sbx.state",
	"gvx-busy_sandbox:gvx-sbx.state": "gvx-busy.state",
}

// getRunscRoot makes a runsc root of the fixtures in a short temp dir (a
// control socket's path must fit sockaddr_un), with edit applied to each
// file's bytes.
func getRunscRoot(t testing.TB, edit func([]byte) []byte) string {
	t.Helper()
	root, err := os.MkdirTemp("", "gvw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	for name, f := range stateFixtures {
		b, err := os.ReadFile(filepath.Join("testdata", "runsc", f))
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			b = edit(b)
		}
		if err := os.WriteFile(filepath.Join(root, name), b, 0o640); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(root, strings.TrimSuffix(name, ".state")+".lock"), nil, 0o600)
	}
	return root
}

func TestStateFileName(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cid, sid string
		ok       bool
	}{
		{"gvx-busy_sandbox:gvx-sbx.state", "gvx-busy", "gvx-sbx", true},
		{"gvx-sbx_sandbox:gvx-sbx.state", "gvx-sbx", "gvx-sbx", true},
		{"gvx-busy_sandbox:gvx-sbx.lock", "", "", false},
		{"runsc-gvx-sbx.sock", "", "", false},
		{"_sandbox:x.state", "", "", false},
		{"a_sandbox:.state", "", "", false},
		{"a_sandbox:b_sandbox:c.state", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cid, sid, ok := stateFileName(tc.name)
			if cid != tc.cid || sid != tc.sid || ok != tc.ok {
				t.Errorf("stateFileName(%q) = %q, %q, %v; want %q, %q, %v", tc.name, cid, sid, ok, tc.cid, tc.sid, tc.ok)
			}
		})
	}
}

func TestParseRunscState(t *testing.T) {
	read := func(f string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", "runsc", f))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	created := func(s string) time.Time { v, _ := time.Parse(time.RFC3339Nano, s); return v }
	for _, tc := range []struct {
		name    string
		in      []byte
		want    runscState
		wantErr error
	}{
		{"runsc 20221219 CRI sandbox", read("gvx-sbx.state"), runscState{
			ID: "gvx-sbx", SandboxID: "gvx-sbx", SandboxPID: 21385, CgroupPath: "/gvwire-exp/pause", GoferPID: 21384,
			Name: "pause", Type: "sandbox", Created: created("2026-12-07T02:39:17.506703005Z"),
		}, nil},
		{"runsc 20221219 CRI container", read("gvx-busy.state"), runscState{
			ID: "gvx-busy", SandboxID: "gvx-sbx", SandboxPID: 21385, CgroupPath: "/gvwire-exp/pause", GoferPID: 21436,
			Name: "busy", Type: "container", Created: created("2026-12-07T02:39:17.685890591Z"),
		}, nil},
		{"cgroup v2 shape, no annotations", []byte(`{"id":"c","sandbox":{"id":"s","pid":7,"cgroup":{"cgroupv2":{"path":"/kubepods/pod1"}}}}`),
			runscState{ID: "c", SandboxID: "s", SandboxPID: 7, CgroupPath: "/kubepods/pod1"}, nil},
		{"no sandbox", []byte(`{"id":"c"}`), runscState{}, ErrRunscState},
		{"negative pid", []byte(`{"id":"c","sandbox":{"id":"s","pid":-1}}`), runscState{}, ErrRunscState},
		{"negative gofer pid", []byte(`{"id":"c","goferPid":-1,"sandbox":{"id":"s","pid":1}}`), runscState{}, ErrRunscState},
		{"pid not a number", []byte(`{"id":"c","sandbox":{"id":"s","pid":"1"}}`), runscState{}, ErrRunscState},
		{"truncated", read("gvx-sbx.state")[:100], runscState{}, ErrRunscState},
		{"empty", nil, runscState{}, ErrRunscState},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRunscState(tc.in)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func FuzzParseRunscState(f *testing.F) {
	for _, name := range []string{"gvx-sbx.state", "gvx-busy.state"} {
		b, err := os.ReadFile(filepath.Join("testdata", "runsc", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"id":"c","sandbox":{"id":"s","pid":7,"cgroup":{"cgroupv2":{"path":"/p"}}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseRunscState(b)
		if err != nil {
			if !errors.Is(err, ErrRunscState) {
				t.Fatalf("error without the sentinel: %v", err)
			}
			return
		}
		if st.ID == "" || st.SandboxID == "" || st.SandboxPID < 0 {
			t.Fatalf("accepted %+v", st)
		}
	})
}

// fakeSentry is a control server at <root>/runsc-<sid>.sock (runsc >=
// release-20230130's layout) answering every call with reply, or never
// when reply is nil. It records the requests (read them once the sample
// is done).
func fakeSentry(t testing.TB, root, sid string, reply []byte) func() []string {
	t.Helper()
	if reply == nil {
		return fakeSentryFunc(t, root, sid, nil)
	}
	return fakeSentryFunc(t, root, sid, func() []byte { return reply })
}

// fakeSentryFunc is fakeSentry answering each call with what reply returns
// then (never when reply is nil).
func fakeSentryFunc(t testing.TB, root, sid string, reply func() []byte) func() []string {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(root, "runsc-"+sid+".sock"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		reqs []string
	)
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); close(done) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var req json.RawMessage
				if json.NewDecoder(c).Decode(&req) != nil {
					return
				}
				mu.Lock()
				reqs = append(reqs, string(req))
				mu.Unlock()
				if reply == nil {
					<-done
					return
				}
				c.Write(reply())
			}()
		}
	}()
	return func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(reqs) }
}

// v2Sandbox is the v2 fixture's sandbox cgroup: 255682 usec of CPU.
const v2SandboxCPU = 255682

func openWithRoot(t testing.TB, root string, sentryTimeout time.Duration) source.Source {
	t.Helper()
	return openWithProc(t, root, filepath.Join("testdata", "proc"), sentryTimeout)
}

// openWithProc opens the v2 fixture's sandbox with the runsc root and the
// /proc given.
func openWithProc(t testing.TB, root, proc string, sentryTimeout time.Duration) source.Source {
	t.Helper()
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"}, Config{
		CgroupRoot: filepath.Join("testdata", "cgroup", "v2"), ProcRoot: proc,
		ReadTimeout: time.Second, Logger: discard(), Mode: ModeUnified,
		RunscRoots: []string{root}, SentryTimeout: sentryTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// boundToV2 rewrites the fixtures' sandbox cgroup to the v2 fixture's.
func boundToV2(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte(`"name":"/gvwire-exp/pause"`), []byte(`"name":"/sandbox"`))
}

func TestSampleContainers(t *testing.T) {
	busyAbsent := []source.Absent{
		{Field: "cpu_user_usec", Reason: whyUserSystem},
		{Field: "cpu_system_usec", Reason: whyUserSystem},
		{Field: "memory_current_bytes", Reason: whyMemory},
		{Field: "memory_working_set_bytes", Reason: whyMemory},
	}
	// The sentry says busy 3 s, the sandbox 1 s: with no sentry or gofer in
	// this /proc (own processes 0), busy gets 3/4 of the cgroup's 255,682
	// usec at the first sample, as runsc events would print, and the pause
	// container's quarter is the sandbox's own share.
	reply := []byte(`{"success":true,"err":"","result":{"event":{"type":"stats","id":"gvx-sbx","data":{"pids":{"current":3}}},"containerUsage":{"gvx-busy":3000000000,"gvx-sbx":1000000000}}}`)
	t.Run("busy container rescaled to the sandbox cgroup", func(t *testing.T) {
		root := getRunscRoot(t, boundToV2)
		reqs := fakeSentry(t, root, "gvx-sbx", reply)
		r, err := openWithRoot(t, root, 0).Sample(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		want := []source.Container{{ID: "gvx-busy", Name: "busy", CPUUsageUsec: u64(v2SandboxCPU * 3 / 4),
			Absent: append(busyAbsent, source.Absent{Field: "pids_current", Reason: whyPids})}}
		if diff := cmp.Diff(want, r.Containers); diff != "" {
			t.Errorf("containers (-want +got)\n%s", diff)
		}
		if r.SandboxOwnCPUUsec == nil || *r.SandboxOwnCPUUsec != v2SandboxCPU/4 {
			t.Errorf("sandbox_own_cpu_usec %v, want the pause container's quarter %d; absent %v", r.SandboxOwnCPUUsec, v2SandboxCPU/4, r.Absent)
		}
		if r.CPUUsageUsec == nil || *r.CPUUsageUsec != v2SandboxCPU {
			t.Errorf("the sandbox's CPU changed: %v", r.CPUUsageUsec)
		}
		if want := []string{`{"method":"containerManager.Event","arg":"gvx-sbx"}`}; !cmp.Equal(want, reqs()) {
			t.Errorf("requests %q, want %q", reqs(), want)
		}
	})
	t.Run("one connection to the sentry across samples, closed by Close", func(t *testing.T) {
		root := getRunscRoot(t, boundToV2)
		l, err := net.Listen("unix", filepath.Join(root, "runsc-gvx-sbx.sock"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		var accepts atomic.Int32
		closed := make(chan struct{}, 8)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepts.Add(1)
				go func() { // calls one after another, as urpc serves them
					defer c.Close()
					dec := json.NewDecoder(c)
					for {
						var req json.RawMessage
						if dec.Decode(&req) != nil {
							closed <- struct{}{}
							return
						}
						c.Write(reply)
					}
				}()
			}
		}()
		src := openWithRoot(t, root, 0)
		for i := range 3 {
			r, err := src.Sample(t.Context())
			if err != nil || len(r.Containers) != 1 {
				t.Fatalf("sample %d: %v, containers %v, absent %v", i, err, r.Containers, r.Absent)
			}
		}
		if n := accepts.Load(); n != 1 {
			t.Errorf("%d connections for 3 samples, want 1", n)
		}
		src.Close()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("the connection to the sentry still open after Close")
		}
	})
	t.Run("hung sentry: the sample in time, containers absent", func(t *testing.T) {
		root := getRunscRoot(t, boundToV2)
		fakeSentry(t, root, "gvx-sbx", nil)
		start := time.Now()
		r, err := openWithRoot(t, root, 200*time.Millisecond).Sample(t.Context())
		if took := time.Since(start); took > 600*time.Millisecond {
			t.Errorf("sample took %v with a 200ms sentry bound", took)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Containers) != 0 || !hasAbsent(r.Absent, "containers", "deadline") || r.SandboxOwnCPUUsec != nil || !hasAbsent(r.Absent, "sandbox_own_cpu_usec", "deadline") {
			t.Errorf("containers %v, absent %v", r.Containers, r.Absent)
		}
		if r.CPUUsageUsec == nil || r.MemoryCurrentBytes == 0 {
			t.Errorf("the sandbox's figures lost: %+v", r)
		}
	})
	t.Run("hung sentry, the cgroup read failed: the sample's error at once", func(t *testing.T) {
		root := getRunscRoot(t, boundToV2)
		fakeSentry(t, root, "gvx-sbx", nil)
		cg := t.TempDir()
		if err := os.CopyFS(cg, os.DirFS(filepath.Join("testdata", "cgroup", "v2"))); err != nil {
			t.Fatal(err)
		}
		s, err := Open(source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sandbox"}, Config{
			CgroupRoot: cg, ProcRoot: filepath.Join("testdata", "proc"),
			ReadTimeout: time.Second, Logger: discard(), Mode: ModeUnified,
			RunscRoots: []string{root}, SentryTimeout: 500 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := os.Remove(filepath.Join(cg, "sandbox", "memory.current")); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = s.Sample(t.Context())
		if took := time.Since(start); err == nil || took > 250*time.Millisecond {
			t.Errorf("sample: %v after %v, want the cgroup read's error before the 500ms sentry bound", err, took)
		}
	})
	t.Run("lying sentry: another container's reply", func(t *testing.T) {
		root := getRunscRoot(t, boundToV2)
		fakeSentry(t, root, "gvx-sbx", bytes.Replace(reply, []byte(`"id":"gvx-sbx"`), []byte(`"id":"other"`), 1))
		r, err := openWithRoot(t, root, 0).Sample(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Containers) != 0 || !hasAbsent(r.Absent, "containers", "another container") {
			t.Errorf("containers %v, absent %v", r.Containers, r.Absent)
		}
	})
	t.Run("no sandbox of this cgroup in the root", func(t *testing.T) {
		root := getRunscRoot(t, nil) // the files name /gvwire-exp/pause
		r, err := openWithRoot(t, root, 0).Sample(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Containers) != 0 || !hasAbsent(r.Absent, "containers", `no runsc sandbox of this cgroup "/sandbox"`) {
			t.Errorf("containers %v, absent %v", r.Containers, r.Absent)
		}
	})
	t.Run("no runsc root: the sample as before", func(t *testing.T) {
		r, err := fixture(t, "v2", ModeUnified, source.SandboxRef{CgroupPath: "/sandbox"}).Sample(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Containers) != 0 || hasAbsent(r.Absent, "containers", "") || hasAbsent(r.Absent, "sandbox_own_cpu_usec", "") {
			t.Errorf("containers %v, absent %v", r.Containers, r.Absent)
		}
	})
}

func hasAbsent(as []source.Absent, field, has string) bool {
	for _, a := range as {
		if a.Field == field && strings.Contains(a.Reason, has) {
			return true
		}
	}
	return false
}
