package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestVMParser: the guest's serial output, as the lane's init and a test
// binary's -test.v print it, becomes one result per planned test: kernel
// lines and other runs' tests are not taken for them, a test that never
// finished has no status, a panic is noticed once.
func TestVMParser(t *testing.T) {
	serial := strings.Join([]string{
		"[    0.000000] Linux version 6.1.0",
		"=== RUN   TestA", // before any run: not a planned test's
		"SBSVM-READY cpuset cpu io memory pids",
		"SBSVM-BEGIN gvisor",
		"=== RUN   TestA",
		"    a_test.go:10: figures",
		"=== RUN   TestA/sub",
		"    --- PASS: TestA/sub (0.00s)",
		"--- PASS: TestA (1.50s)",
		"=== RUN   TestB",
		"    b_test.go:3: boom",
		"--- FAIL: TestB (0.10s)",
		"=== RUN   TestC",
		"--- SKIP: TestC (0.00s)",
		"=== RUN   TestUnplanned",
		"--- PASS: TestUnplanned (0.00s)",
		"FAIL",
		"SBSVM-END gvisor 1",
		"SBSVM-BEGIN e2e",
		"=== RUN   TestD",
		"    d_test.go:1: started",
		"[   12.3] Kernel panic - not syncing: Attempted to kill init!",
		"[   12.3] Kernel panic - not syncing: again",
	}, "\n") + "\n"
	p := newVMParser([]VMRun{{Name: "gvisor", Tests: []string{"TestA", "TestB", "TestC"}}, {Name: "e2e", Tests: []string{"TestD", "TestE"}}})
	panics := 0
	p.consume(strings.NewReader(serial), func() { panics++ })
	got := map[string]VMResult{}
	for k, v := range p.results {
		got[k] = *v
	}
	want := map[string]VMResult{
		"gvisor/TestA": {Status: "PASS", Dur: "(1.50s)", Out: []string{"=== RUN   TestA", "    a_test.go:10: figures", "=== RUN   TestA/sub", "    --- PASS: TestA/sub (0.00s)", "--- PASS: TestA (1.50s)"}},
		"gvisor/TestB": {Status: "FAIL", Dur: "(0.10s)", Out: []string{"=== RUN   TestB", "    b_test.go:3: boom", "--- FAIL: TestB (0.10s)"}},
		"gvisor/TestC": {Status: "SKIP", Dur: "(0.00s)", Out: []string{"=== RUN   TestC", "--- SKIP: TestC (0.00s)"}},
		"e2e/TestD": {Out: []string{"=== RUN   TestD", "    d_test.go:1: started", "[   12.3] Kernel panic - not syncing: Attempted to kill init!",
			"[   12.3] Kernel panic - not syncing: again"}},
		"e2e/TestE": {},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"gvisor": "1"}, p.exits); diff != "" {
		t.Errorf("exit statuses (-want +got):\n%s", diff)
	}
	if panics != 1 || !p.panicked || p.done {
		t.Errorf("panics noticed %d (panicked %v, done %v), want 1, true, false", panics, p.panicked, p.done)
	}
	if why := p.why(false, 0, nil, ""); why != "the guest kernel panicked" {
		t.Errorf("why = %q", why)
	}
	if tail := p.tail(); !strings.HasSuffix(tail, "again") || strings.Count(tail, "\n") != len(strings.Split(serial, "\n"))-2 {
		t.Errorf("tail:\n%s", tail)
	}
}

// TestVMParserSilentGuest: a guest that prints nothing leaves every test
// without a status, and the reason is the deadline when it was reached.
func TestVMParserSilentGuest(t *testing.T) {
	p := newVMParser([]VMRun{{Name: "gvisor", Tests: []string{"TestA"}}})
	p.consume(strings.NewReader(""), func() { t.Error("no panic printed") })
	if r := p.results["gvisor/TestA"]; r.Status != "" {
		t.Errorf("status %q, want none", r.Status)
	}
	if why := p.why(true, 8*60e9, nil, ""); why != "killed at the 8m0s deadline" {
		t.Errorf("why = %q", why)
	}
	if why := p.why(false, 0, os.ErrClosed, "qemu: no kernel"); !strings.Contains(why, "QEMU exited before the guest was done") || !strings.Contains(why, "qemu: no kernel") {
		t.Errorf("why = %q", why)
	}
}

// TestModuleOrder: each module after its dependencies (modules.dep lists the
// ones loaded last first), each once.
func TestModuleOrder(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n" +
		"kernel/drivers/virtio/virtio_pci_legacy_dev.ko:\nkernel/drivers/virtio/virtio_pci_modern_dev.ko:\nkernel/drivers/virtio/virtio.ko:\nkernel/drivers/virtio/virtio_ring.ko:\n" +
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n"
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := moduleOrder(dir, []string{"virtio_pci", "virtio_blk"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
		"kernel/drivers/virtio/virtio_pci_legacy_dev.ko", "kernel/drivers/virtio/virtio_pci.ko", "kernel/drivers/block/virtio_blk.ko"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if _, err := moduleOrder(dir, []string{"nosuch"}); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Errorf("unknown module: err = %v", err)
	}
}

// TestInitramfsArchive: the archive lists every file, link and parent
// directory, parents first, as cpio itself reads it.
func TestInitramfsArchive(t *testing.T) {
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		if cpio = BusyboxStatic(); cpio == "" {
			t.Skip("no cpio and no static busybox to read the archive back")
		}
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, []byte("odd length"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := newInitramfs()
	fs.copyFile("/usr/bin/tool", src, 0o755)
	fs.writeFile("/init", []byte("#!/bin/sh\n"), 0o755)
	fs.symlink("/bin/sh", "busybox")
	fs.mkdir("/proc")
	var buf bytes.Buffer
	if err := fs.write(&buf); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4", buf.Len())
	}
	args := []string{"-t"}
	if filepath.Base(cpio) == "busybox" {
		args = []string{"cpio", "-t"}
	}
	cmd := exec.Command(cpio, args...)
	cmd.Stdin = &buf
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v", cpio, args, err)
	}
	want := []string{"bin", "bin/sh", "init", "proc", "usr", "usr/bin", "usr/bin/tool"}
	if diff := cmp.Diff(want, strings.Fields(string(out))); diff != "" {
		t.Errorf("cpio -t (-want +got):\n%s", diff)
	}
}
