package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestNSRootRetriedAtResolve: a source opened while the scan for statsd's
// namespace root failed is not refused for good: the scan is asked again
// at each resolve (review F1), and its failure is retried after nsRetry.
func TestNSRootRetriedAtResolve(t *testing.T) {
	const statsd = "/kubepods/podS/statsd"
	cg := t.TempDir()
	writeFile(t, filepath.Join(cg, statsd, "cgroup.procs"), "0\n") // statsd not listed yet
	if err := os.CopyFS(filepath.Join(cg, "kubepods/podR/leaf"), os.DirFS("testdata/cgroup/v2/sandbox")); err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	writeFile(t, filepath.Join(proc, "42", "cgroup"), "0::/../../podR/leaf\n")
	writeStat(t, proc, 42, 5000)
	writeFile(t, filepath.Join(proc, "self", "cgroup"), "0::/\n")
	writeFile(t, filepath.Join(proc, "self", "mountinfo"), fmt.Sprintf(
		"1 0 0:1 / / rw - ext4 /dev/vda rw\n987654 1 0:32 /../../.. %s ro,relatime - cgroup2 cgroup2 rw\n", cg))
	s := openSentry(t, cg, proc, source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42})
	checkSentrySample(t, s, cg, "/kubepods/podR/leaf", "mount the host's whole cgroup file system")

	writeFile(t, filepath.Join(cg, statsd, "cgroup.procs"), strconv.Itoa(os.Getpid())+"\n")
	checkSentrySample(t, s, cg, "/kubepods/podR/leaf", "mount the host's whole cgroup file system") // within nsRetry: the cached failure
	nsRoots.mu.Lock()
	for k, r := range nsRoots.m {
		if k.dir == cg {
			r.at = r.at.Add(-nsRetry)
			nsRoots.m[k] = r
		}
	}
	nsRoots.mu.Unlock()
	checkSentrySample(t, s, cg, "/kubepods/podR/leaf", "")
}

// TestNSRootTimeoutNotCached: a caller that gives up at its timeout is
// refused by that cause (no advice to mount anything), the timeout is not
// cached, and the scan, going on alone, caches its own answer.
func TestNSRootTimeoutNotCached(t *testing.T) {
	dir := t.TempDir()
	pid := os.Getpid()
	// a/x/cgroup.procs is a FIFO: the scan blocks in it until a writer
	// comes; b/y is statsd's cgroup.
	fifo := filepath.Join(dir, "a", "x", "cgroup.procs")
	if err := os.MkdirAll(filepath.Dir(fifo), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	unblock := func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}
	t.Cleanup(unblock)
	writeFile(t, filepath.Join(dir, "b", "y", "cgroup.procs"), strconv.Itoa(pid)+"\n")
	k := nsKey{dir: dir, root: "/../..", own: "/", pid: pid}
	mr := mountRoots{mem: mountRoot{dir: dir, root: "/../..", ns: &k}}

	got := mr.withNS(context.Background(), 50*time.Millisecond)
	_, err := got.mem.inMount("/x")
	if err == nil || !strings.Contains(err.Error(), "did not end in time") || strings.Contains(err.Error(), "hostPath") || !errors.Is(got.mem.nsErr, source.ErrTimeout) {
		t.Fatalf("inMount after a timed-out scan = %v; want the timeout named, no mount advice", err)
	}
	nsRoots.mu.Lock()
	_, cached := nsRoots.m[k]
	nsRoots.mu.Unlock()
	if cached {
		t.Fatal("a caller's timeout was cached as the scan's answer")
	}

	// Wait for the FIFO's reader, then let the scan go on.
	for i := 0; ; i++ {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			f.Close()
			break
		}
		if i > 500 {
			t.Fatalf("the scan never opened the FIFO: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		nsRoots.mu.Lock()
		r, ok := nsRoots.m[k]
		nsRoots.mu.Unlock()
		if ok {
			if r.err != nil || r.nsRoot != "/b/y" {
				t.Fatalf("the scan cached %q, %v; want /b/y", r.nsRoot, r.err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the scan's own answer was never cached")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got = mr.withNS(context.Background(), 50*time.Millisecond)
	if p, err := got.mem.inMount("/x"); err != nil || p != "/b/y/x" {
		t.Fatalf("inMount after the scan ended = %q, %v; want /b/y/x", p, err)
	}
}

// TestFindNSRootManyFiles: the scan's cap counts cgroups, not their
// interface files (review F2): 300 pod cgroups of 75 files each, listed on
// the way four levels below the mount's root, are scanned (22800 entries:
// refused before).
func TestFindNSRootManyFiles(t *testing.T) {
	dir := t.TempDir()
	one := filepath.Join(t.TempDir(), "f")
	writeFile(t, one, "")
	files := func(d string) { // hard links: cheaper to make than files
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 75 {
			if err := os.Link(one, filepath.Join(d, "f"+strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	n := 0
	for _, d := range []string{"", "/kubepods", "/kubepods/burstable"} {
		files(dir + d)
		n++
	}
	for p := range 300 { // each listed: the scan goes four levels down
		files(fmt.Sprintf("%s/kubepods/burstable/pod%d", dir, p))
		n++
	}
	pid := os.Getpid()
	writeFile(t, filepath.Join(dir, "kubepods/burstable/pod7/c3/cgroup.procs"), "0\n"+strconv.Itoa(pid)+"\n")
	got, err := findNSRoot(dir, "/../../../..", "/", pid, time.Now().Add(time.Minute))
	if err != nil || got != "/kubepods/burstable/pod7/c3" {
		t.Fatalf("findNSRoot over %d cgroups of 75 files = %q, %v; want /kubepods/burstable/pod7/c3", n, got, err)
	}
	t.Logf("%d cgroups, %d files", n, n*75)
}
