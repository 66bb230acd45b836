package drift

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestForeignTextBounded: a finding's detail and a skipped comparison's
// reason carry what a guest or a file said (4 MB of it made drift.json 36
// MB and log lines 12 MB). Every finding, event, status line and the state
// file stay small, hold no raw ESC, and the open findings are capped.
func TestForeignTextBounded(t *testing.T) {
	huge := strings.Repeat("E", 4<<20) + "\x1b]0;pwned\x07"
	big := strings.Repeat("D", 64<<10) + "\x1b]0;pwned\x07"
	var many []Finding
	for i := range 200 {
		many = append(many, Finding{Kind: KindStrayVMM, Subject: fmt.Sprintf("pid %d", 1000+i), Detail: big})
	}
	withMany := obs(all, map[comparison]string{cmpAgentContainers: huge}, many...)
	none := obs(all, nil)
	var script []Observation
	for range 5 { // open and clear: the event list fills up
		script = append(script, withMany, none)
	}
	script = append(script, withMany)
	dir := t.TempDir()
	f := newFixture(t, dir, script...)
	for range len(script) {
		f.cycle()
	}
	f.checker.Cycle(context.Background()) // the last one left open
	if n := len(f.checker.Open()); n > maxOpenFindings {
		t.Errorf("%d open findings, want at most %d", n, maxOpenFindings)
	}
	check := func(what, s string, max int) {
		t.Helper()
		if len(s) > max || strings.ContainsRune(s, 0x1b) {
			t.Errorf("%s is %d bytes (raw ESC %v), want under %d", what, len(s), strings.ContainsRune(s, 0x1b), max)
		}
	}
	for _, fd := range f.checker.Open() {
		check("finding detail", fd.Detail, 2*maxDetailBytes)
	}
	for _, e := range f.checker.Events() {
		check("event message", e.Message, 3*maxDetailBytes)
		check("event finding detail", e.Finding.Detail, 2*maxDetailBytes)
	}
	for _, s := range f.checker.Status().Skipped {
		check("skipped", s, 2*maxDetailBytes)
	}
	fi, err := os.Stat(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > maxStateFileBytes {
		t.Errorf("drift.json is %d bytes, want at most %d", fi.Size(), maxStateFileBytes)
	}
	for line := range strings.Lines(f.logs.String()) {
		check("log line", line, 8*maxDetailBytes)
	}
	t.Logf("measured: %d open findings, %d events, drift.json %d bytes, log %d bytes", len(f.checker.Open()), len(f.checker.Events()), fi.Size(), f.logs.Len())
}

// TestAgentAnsweringErrorsIsNotSilent: an agent that answers every call
// with an error status did answer; AGENT_SILENT is for silence.
func TestAgentAnsweringErrorsIsNotSilent(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	o := NewSystemObserver(t.TempDir(), time.Second, time.Minute, func() time.Time { return now })
	vm := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///run/a.sock:1024", ContainerIDs: []string{"c1"}}
	err := &source.UnreadError{
		Containers: []source.ContainerError{{ID: "c1", Reason: `agent answered Internal: "boom"`}},
		Err:        fmt.Errorf("microvm: %w: %w: no container could be read", source.ErrNotMeasurable, source.ErrAnswered),
	}
	b := &identity.Binding{Ref: vm, EpochUnixNano: now.Add(-time.Hour).UnixNano(), Source: stubSource{err: err}}
	got := o.Observe(context.Background(), b)
	for _, fd := range got.Findings {
		if fd.Kind == KindAgentSilent {
			t.Fatalf("AGENT_SILENT for an agent answering errors: %s", fd.Detail)
		}
	}
	if !got.Ran[cmpAgentAnswer] {
		t.Errorf("the agent-answer comparison did not run: %+v", got)
	}
}

// TestVMMPidReused: the VMM named by vmm_pid is pinned at the first look of
// the epoch; once another process has the pid (another start time, or
// another executable) the VMM is gone, not "still running".
func TestVMMPidReused(t *testing.T) {
	qemu := "qemu-system-x86_64\x00-name\x00guest=srv1\x00"
	for _, tc := range []struct {
		name  string
		reuse func(root string)
	}{
		{"another start time", func(root string) { writeStat(t, root, 4242, 99000) }},
		{"another executable", func(root string) {
			os.Remove(filepath.Join(root, "4242", "exe"))
			os.Symlink("/usr/bin/sleep", filepath.Join(root, "4242", "exe"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := procTree(t, map[int]string{4242: qemu})
			os.Symlink("/usr/bin/qemu-system-x86_64", filepath.Join(root, "4242", "exe"))
			o := NewSystemObserver(root, time.Second, time.Minute, nil)
			ref := source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "hvsock:///a:1", ContainerIDs: []string{"c"}, VMMPID: 4242}
			b := &identity.Binding{Ref: ref, EpochUnixNano: 1, Source: stubSource{}}
			if got := summary(o.Observe(context.Background(), b)); len(got) != 0 {
				t.Fatalf("first look: %v", got)
			}
			tc.reuse(root)
			got := o.Observe(context.Background(), b)
			if s := summary(got); len(s) != 1 || s[0] != "VMM_GONE pid 4242" {
				t.Fatalf("after reuse: %v, want VMM_GONE pid 4242", s)
			}
			t.Logf("detail: %s", got.Findings[0].Detail)
		})
	}
}

// TestStateFileMustBeRegular: a FIFO at drift.json would hang statsd's
// start (an os.ReadFile blocks until a writer comes); it is refused at
// once, as identity refuses one at binding.json.
func TestStateFileMustBeRegular(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, stateFileName), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(filepath.Join(dir, stateFileName), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	store, _ := identity.NewStore(identity.Config{})
	done := make(chan error, 1)
	go func() {
		_, err := New(Config{Store: store, Observer: &scriptedObserver{}, StateDir: dir})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("New = %v, want a refusal naming the FIFO", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("New hung on a FIFO at drift.json")
	}
}

// TestStateTempsSweptAndOversizedMovedAside: temp files an interrupted
// write left are removed at start; a state file over the cap is corrupt
// (moved aside), not read.
func TestStateTempsSweptAndOversizedMovedAside(t *testing.T) {
	dir := t.TempDir()
	tmp := filepath.Join(dir, stateFileName+".tmp-12345")
	os.WriteFile(tmp, []byte("{"), 0o600)
	other := filepath.Join(dir, "unrelated.tmp-1")
	os.WriteFile(other, nil, 0o600)
	big, _ := json.Marshal(stateFile{Version: stateVersion, Events: []Event{{Message: strings.Repeat("x", 2*maxStateFileBytes)}}})
	os.WriteFile(filepath.Join(dir, stateFileName), big, 0o600)
	store, _ := identity.NewStore(identity.Config{})
	c, err := New(Config{Store: store, Observer: &scriptedObserver{}, StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind", tmp)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("an unrelated file was removed: %v", err)
	}
	if len(c.Events()) != 0 {
		t.Errorf("an oversized state file was read")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, stateFileName+".corrupt-*")); len(m) != 1 {
		t.Errorf("oversized state not moved aside: %v", m)
	}
}
