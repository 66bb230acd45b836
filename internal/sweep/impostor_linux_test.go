package sweep

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

const impostorEnv = "SWEEP_TEST_IMPOSTOR"

// TestImpostorChild is not a test: it is the statsd impostor that
// TestImpostorRefused starts as another user. It calls listen(2) on the
// bound socket it inherits as fd 3 (so its own credentials are the
// socket's peer credentials), serves a fake statsd answering a sample with
// 1 PiB of memory, says "ready" and serves until stdin closes.
func TestImpostorChild(t *testing.T) {
	if os.Getenv(impostorEnv) != "1" {
		t.Skip("helper process: the impostor TestImpostorRefused starts")
	}
	if err := syscall.Listen(3, 16); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(os.NewFile(3, "impostor"))
	if err != nil {
		t.Fatal(err)
	}
	d := statsdfake.Serve(t, ln, os.Getenv(impostorEnv+"_SOCKET"))
	s := sample("real", 1, 1<<50)
	d.Set(s)
	os.Stdout.WriteString("ready\n")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestImpostorRefused: a socket file owned by root (an allowed owner) whose
// listening end belongs to a process of another user (uid 65534): the
// poller checks the server's credentials after connecting (SO_PEERCRED)
// and refuses it, never reading its answer.
func TestImpostorRefused(t *testing.T) {
	testenv.Need(t, os.Geteuid() == 0, "needs root to run the impostor as another user (run the tests as root)")
	socket := filepath.Join(t.TempDir(), "statsd.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: socket}); err != nil { // the file is root's
		t.Fatal(err)
	}
	sockFile := os.NewFile(uintptr(fd), "bound")
	defer sockFile.Close()

	// The test binary, where uid 65534 can run it.
	binDir, err := os.MkdirTemp("", "sweep-impostor-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(binDir) })
	if err := os.Chmod(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "sweep.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestImpostorChild$", "-test.count=1")
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), impostorEnv+"=1", impostorEnv+"_SOCKET="+socket)
	cmd.ExtraFiles = []*os.File{sockFile}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan bool, 1)
	go func() { sc := bufio.NewScanner(stdout); ready <- sc.Scan() && sc.Text() == "ready" }()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("impostor did not start")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("impostor did not start within 10 s")
	}

	r := PollAll(context.Background(), []string{socket}, 1, 5*time.Second)[0]
	if r.Status != StatusError || r.Code != codes.PermissionDenied || len(r.Samples) != 0 {
		t.Fatalf("impostor (uid 65534 behind a root-owned socket): status %s code %s, %d samples (err %v); want refused: PermissionDenied, no sample",
			r.Status, r.Code, len(r.Samples), r.Err)
	}
	t.Logf("refused: %v", r.Err)

	// The node agent's polls, on connections it keeps: refused alike, and
	// nothing kept.
	pool := Config{Concurrency: 1, Timeout: 5 * time.Second}.NewPool()
	defer pool.Close()
	r = pool.PollAll(context.Background(), []string{socket})[0]
	if r.Status != StatusError || r.Code != codes.PermissionDenied || !r.PeerRefused || len(r.Samples) != 0 {
		t.Fatalf("impostor polled by a Pool: status %s code %s, peer refused %v, %d samples (err %v); want refused: PermissionDenied, no sample",
			r.Status, r.Code, r.PeerRefused, len(r.Samples), r.Err)
	}
	if n := len(pool.conns); n != 0 {
		t.Errorf("the Pool keeps %d connections to the impostor", n)
	}
}
